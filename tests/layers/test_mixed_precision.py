"""The sequence layers under Keras' mixed_bfloat16 policy: bfloat16 compute (the kernels' bf16
path), float32 variables, gradients for every weight, and outputs within bfloat16's tolerance
of the float32 layer with the same weights."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from recops_tf import testing
from recops_tf.layers import FuxiAttention, HSTUAttention, HSTUBlock, RelativeAttentionBias

X = tf.RaggedTensor.from_row_lengths(
    tf.constant(np.random.default_rng(3).uniform(-1, 1, (7, 16)), tf.float32), [3, 4])
TS = tf.RaggedTensor.from_row_lengths(tf.constant([1, 5, 30, 2, 9, 40, 41], tf.int64), [3, 4])

LAYERS = {
    "HSTUBlock": (lambda: HSTUBlock(2, 8, 8, relative_bias=RelativeAttentionBias(8)),
                  {"timestamps": TS}),
    "HSTUAttention": (lambda: HSTUAttention(2, 8, 8), {}),
    "FuxiAttention": (lambda: FuxiAttention(2, 8, 8), {"timestamps": TS}),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_runs_in_bfloat16_with_float32_variables(name, mixed_bfloat16):
    make, kwargs = LAYERS[name]
    layer = make()
    with tf.GradientTape() as tape:
        y = layer(X, **kwargs)
        loss = tf.reduce_sum(tf.cast(y.flat_values, tf.float32) ** 2)
    assert isinstance(y, tf.RaggedTensor) and y.dtype == tf.bfloat16
    assert {v.dtype for v in layer.weights if v.trainable} == {"float32"}
    grads = tape.gradient(loss, layer.trainable_variables)
    assert all(g is not None and g.dtype == tf.float32 for g in grads)
    keras.mixed_precision.set_dtype_policy("float32")
    reference = make()
    reference(X, **kwargs)
    for mine, theirs in zip(reference.weights, layer.weights):
        mine.assign(theirs)
    rtol, atol = testing.tolerance(tf.bfloat16, reduction=16)
    np.testing.assert_allclose(tf.cast(y.flat_values, tf.float32).numpy(),
                               reference(X, **kwargs).flat_values.numpy(), rtol=rtol,
                               atol=atol)
