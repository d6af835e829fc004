"""Tests of stem in_linear_silu: linear + SiLU + four-way split, forward and gradients."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.reference import in_linear_silu as ref
from recops_tf.testing import (FLOAT_DTYPES, MODES, assert_close, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient,
                               assert_second_order_raises, in_mode)
from recops_tf.testing.inputs import random_values

SIZES = [10, 0, 70, 33]  # any sizes: an empty split, none a multiple of 16


def args(dtype, m=40, k=37, sizes=SIZES, seed=0):
    nw = sum(sizes)
    return [random_values([m, k], dtype, seed), random_values([nw, k], dtype, seed + 1),
            random_values([nw], dtype, seed + 2)]


def fused(sizes=SIZES, **kw):
    return lambda x, w, b: recops_tf.in_linear_silu(x, w, b, sizes, **kw)


def reference(sizes=SIZES, **kw):
    return lambda x, w, b: ref.in_linear_silu(x, w, b, sizes, **kw)


@pytest.mark.parametrize("m", [40, 1, 0])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_reference(dtype, m):
    a = args(dtype, m=m)
    assert_matches_reference(fused(), reference(), a, dtype, magnitude=4.0, reduction=37)
    assert_gradients_match_reference(fused(), reference(), a, [0, 1, 2], dtype, magnitude=8.0,
                                     reduction=4 * 113)


@pytest.mark.parametrize("mode", MODES)
def test_modes(mode):
    a = args(tf.float32)
    assert_matches_reference(in_mode(fused(), mode, a), reference(), a, tf.float32,
                             magnitude=4.0, reduction=37)


def test_numeric_gradient():
    assert_numeric_gradient(fused([2, 1, 0, 3]), args(tf.float64, 5, 4, [2, 1, 0, 3]),
                            [0, 1, 2])


def test_keras_weight_layout_and_leading_dims():
    x, w, b = args(tf.float32)
    x3 = tf.reshape(x, [4, 10, 37])
    outs = recops_tf.in_linear_silu(x3, tf.transpose(w), b, SIZES, weight_layout="kn")
    for out, exp, s in zip(outs, fused()(x, w, b), SIZES):
        assert out.shape == [4, 10, s]
        assert_close(tf.reshape(out, [40, s]), exp, tf.float32)


def test_ragged_input():
    x, w, b = args(tf.float32)
    rx = tf.RaggedTensor.from_row_lengths(x, [15, 0, 25])
    outs = recops_tf.in_linear_silu(rx, w, b, SIZES)
    for out, exp in zip(outs, fused()(x, w, b)):
        assert isinstance(out, tf.RaggedTensor)
        np.testing.assert_array_equal(out.flat_values.numpy(), exp.numpy())


def test_bias_gradient_is_deterministic():
    a = args(tf.float32, m=500)
    ups = [random_values([500, s], tf.float32, 7 + i) for i, s in enumerate(SIZES)]
    grads = []
    for _ in range(3):
        with tf.GradientTape() as tape:
            tape.watch(a)
            loss = sum(tf.reduce_sum(o * u) for o, u in zip(fused()(*a), ups))
        grads.append(tape.gradient(loss, a)[2].numpy())
    np.testing.assert_array_equal(grads[0], grads[1])
    np.testing.assert_array_equal(grads[0], grads[2])


def test_error_split_sum():
    with pytest.raises(tf.errors.InvalidArgumentError, match="split_sizes must sum to Nw"):
        fused([10, 0, 70, 32])(*args(tf.float32))


def test_error_split_count():
    with pytest.raises(ValueError, match="four non-negative"):
        fused([10, 70, 33])(*args(tf.float32))


def test_error_negative_split():
    with pytest.raises(ValueError, match="four non-negative"):
        fused([10, -1, 71, 33])(*args(tf.float32))


def test_error_bias_shape():
    x, w, b = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bias must have shape \[113\]"):
        fused()(x, w, b[1:])


def test_error_k_mismatch():
    x, w, b = args(tf.float32)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        fused()(x, w[:, 1:], b)


def test_error_weight_layout():
    with pytest.raises(ValueError, match="weight_layout"):
        fused(weight_layout="nn")(*args(tf.float32))


def test_error_raw_op_xw_rank():
    from recops_tf import _loader

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"must be \[M, Nw\]"):
        _loader.load().recops_in_linear_silu(tf.zeros([2, 3, 4]), tf.zeros([4]),
                                             split_sizes=[1, 1, 1, 1])


def test_second_order_gradient_raises():
    assert_second_order_raises(fused(), args(tf.float32))
