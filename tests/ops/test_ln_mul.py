"""Tests of stem ln_mul: fused LayerNorm · u forward and gradients."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.reference import ln_mul as ref
from recops_tf.testing import (FLOAT_DTYPES, MODES, assert_close, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient,
                               assert_second_order_raises, in_mode)
from recops_tf.testing.inputs import random_values


def args(dtype, shape=(7, 37), seed=0):
    c = shape[-1]
    # Rows with an offset and a scale, so the normalisation does real work.
    x = random_values(shape, dtype, seed, low=2.0, high=5.0)
    return [x, random_values(shape, dtype, seed + 1), random_values([c], dtype, seed + 2),
            random_values([c], dtype, seed + 3)]


@pytest.mark.parametrize("shape", [(7, 37), (3, 4, 130), (1, 1), (0, 8)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_reference(dtype, shape):
    a = args(dtype, shape)
    assert_matches_reference(recops_tf.ln_mul, ref.ln_mul, a, dtype, magnitude=4.0)
    assert_gradients_match_reference(recops_tf.ln_mul, ref.ln_mul, a, [0, 1, 2, 3], dtype,
                                     magnitude=8.0, reduction=shape[-1] * 4)


@pytest.mark.parametrize("mode", MODES)
def test_modes_and_epsilon(mode):
    a = args(tf.float32)
    f = in_mode(lambda *a: recops_tf.ln_mul(*a, epsilon=0.5), mode, a)
    assert_matches_reference(f, lambda *a: ref.ln_mul(*a, epsilon=0.5), a, tf.float32)


def test_numeric_gradient():
    assert_numeric_gradient(recops_tf.ln_mul, args(tf.float64, (3, 5)), [0, 1, 2, 3])


def test_ragged_input():
    x = tf.RaggedTensor.from_row_lengths(random_values([9, 6], tf.float32, 1), [4, 0, 5])
    u = x.with_flat_values(random_values([9, 6], tf.float32, 2))
    gamma, beta = random_values([6], tf.float32, 3), random_values([6], tf.float32, 4)
    out = recops_tf.ln_mul(x, u, gamma, beta)
    assert isinstance(out, tf.RaggedTensor)
    assert_close(out.flat_values, ref.ln_mul(x.flat_values, u.flat_values, gamma, beta),
                 tf.float32)


def test_parameter_gradients_are_deterministic():
    a = args(tf.float32, (300, 64))
    up = random_values([300, 64], tf.float32, 9)
    grads = []
    for _ in range(3):
        with tf.GradientTape() as tape:
            tape.watch(a)
            loss = tf.reduce_sum(recops_tf.ln_mul(*a) * up)
        grads.append([g.numpy() for g in tape.gradient(loss, a)])
    for g in grads[1:]:
        for x, y in zip(grads[0], g):
            np.testing.assert_array_equal(x, y)


def test_shape_function():
    f = tf.function(lambda *a: recops_tf.ln_mul(*a)).get_concrete_function(
        tf.TensorSpec([None, 5]), tf.TensorSpec([None, 5]), tf.TensorSpec([5]),
        tf.TensorSpec([5]))
    assert f.output_shapes.as_list() == [None, 5]


def test_second_order_gradient_raises():
    assert_second_order_raises(recops_tf.ln_mul, args(tf.float32))


def test_error_u_shape():
    a = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="u must have x's shape"):
        recops_tf.ln_mul(a[0], a[1][:, :5], a[2], a[3])


def test_error_gamma_shape():
    a = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"gamma must have shape \[37\]"):
        recops_tf.ln_mul(a[0], a[1], a[2][:5], a[3])


def test_error_beta_shape():
    a = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="beta must have shape"):
        recops_tf.ln_mul(a[0], a[1], a[2], tf.zeros([37, 1]))


def test_error_rank_zero():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank"):
        recops_tf.ln_mul(1.0, 1.0, [1.0], [0.0])


def test_error_empty_axis():
    with pytest.raises(tf.errors.InvalidArgumentError, match="must not be empty"):
        recops_tf.ln_mul(tf.zeros([3, 0]), tf.zeros([3, 0]), tf.zeros([0]), tf.zeros([0]))


@pytest.mark.parametrize("epsilon", [0.0, -1e-5, float("inf")])
def test_error_epsilon(epsilon):
    a = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="epsilon"):
        recops_tf.ln_mul(*a, epsilon=epsilon)
