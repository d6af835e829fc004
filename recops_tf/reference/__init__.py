"""Pure-TensorFlow composite implementations of every op: the test oracles and the benchmark
baselines. Stock TF ops only; nothing here is shared with the kernels."""
