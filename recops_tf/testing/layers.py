"""What the Keras layer tests share: a ragged batch with increasing timestamps, a target only
a time-aware attention bias can learn, and a short Adam fit to check that a layer learns."""
import numpy as np
import tensorflow as tf


def ragged_time_batch(lengths, d_model, seed=0, max_gap=5000):
    """(x, timestamps): ragged ``[B, (L), d_model]`` rows in [-1, 1) and increasing int64
    ``[B, (L)]`` timestamps with gaps in [0, max_gap) (for the relative-bias layers)."""
    rng = np.random.default_rng(seed)
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    x = rng.uniform(-1, 1, size=(int(sum(lengths)), d_model)).astype(np.float32)
    ts = np.concatenate([np.cumsum(rng.integers(0, max_gap, size=n)) for n in lengths])
    return (tf.RaggedTensor.from_row_splits(x, splits),
            tf.RaggedTensor.from_row_splits(ts.astype(np.int64), splits))


def time_span_target(timestamps):
    """``[B, 1]`` float32 targets log1p(last - first timestamp) / 5: a quantity only a
    time-aware attention bias can see."""
    span = [float(r[-1] - r[0]) if len(r) else 0.0 for r in timestamps.to_list()]
    return tf.constant(np.log1p(span)[:, None] / 5.0, tf.float32)


def fit_briefly(loss_fn, variables_fn, steps=80, learning_rate=0.03):
    """Adam steps on ``loss_fn()`` (traced once); returns (initial loss, last loss).
    ``variables_fn()`` gives the trained variables; it is called after the first loss, so
    that lazily built Keras layers have their weights."""
    import keras  # local: the op tests do not need Keras

    optimizer = keras.optimizers.Adam(learning_rate)
    first = float(loss_fn())
    variables = variables_fn()

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn()
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    last = first
    for _ in range(steps):
        last = float(step())
    return first, last
