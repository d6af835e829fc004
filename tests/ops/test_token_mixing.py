"""Tests of stem token_mixing: LayerNorm of x + xᵀ, forward and gradients."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.reference import token_mixing as ref
from recops_tf.testing import (FLOAT_DTYPES, MODES, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient,
                               assert_second_order_raises, in_mode)
from recops_tf.testing.inputs import random_values


def args(dtype, batch=3, s=20, seed=0):
    return [random_values([batch, s, s], dtype, seed, low=-1.0, high=2.0),
            random_values([s], dtype, seed + 1), random_values([s], dtype, seed + 2)]


@pytest.mark.parametrize("batch,s", [(3, 20), (2, 67), (1, 1), (0, 4)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_reference(dtype, batch, s):
    a = args(dtype, batch, s)
    # epsilon 1e-5: the seed's 1e-7 is below float16's resolution of a variance.
    f = lambda *a: recops_tf.token_mixing(*a, epsilon=1e-5)  # noqa: E731
    r = lambda *a: ref.token_mixing(*a, epsilon=1e-5)  # noqa: E731
    assert_matches_reference(f, r, a, dtype, magnitude=4.0)
    assert_gradients_match_reference(f, r, a, [0, 1, 2], dtype, magnitude=8.0,
                                     reduction=4 * s)


@pytest.mark.parametrize("mode", MODES)
def test_modes_and_default_epsilon(mode):
    a = args(tf.float32)
    assert_matches_reference(in_mode(recops_tf.token_mixing, mode, a), ref.token_mixing, a,
                             tf.float32, magnitude=4.0)


def test_numeric_gradient():
    # Rows of x + xᵀ with a spread of ~10: the finite differences' step (1/1024) is then small
    # against the normalisation's curvature.
    x, gamma, beta = args(tf.float64, 2, 4)
    assert_numeric_gradient(recops_tf.token_mixing, [x * 5.0, gamma, beta], [0, 1, 2])


def test_gradients_are_deterministic():
    a = args(tf.float32, 70, 16)
    up = random_values([70, 16, 16], tf.float32, 5)
    grads = []
    for _ in range(3):
        with tf.GradientTape() as tape:
            tape.watch(a)
            loss = tf.reduce_sum(recops_tf.token_mixing(*a) * up)
        grads.append([g.numpy() for g in tape.gradient(loss, a)])
    for g in grads[1:]:
        for x, y in zip(grads[0], g):
            np.testing.assert_array_equal(x, y)


def test_second_order_gradient_raises():
    assert_second_order_raises(recops_tf.token_mixing, args(tf.float32))


def test_error_not_square():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[B, S, S\]"):
        recops_tf.token_mixing(tf.zeros([2, 3, 4]), tf.zeros([4]), tf.zeros([4]))


def test_error_rank():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank|B, S, S"):
        recops_tf.token_mixing(tf.zeros([3, 3]), tf.zeros([3]), tf.zeros([3]))


def test_error_gamma_shape():
    a = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"gamma must have shape \[20\]"):
        recops_tf.token_mixing(a[0], a[1][:4], a[2])


def test_error_beta_shape():
    a = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="beta must have shape"):
        recops_tf.token_mixing(a[0], a[1], a[2][:4])


def test_error_empty():
    with pytest.raises(tf.errors.InvalidArgumentError, match="must not be empty"):
        recops_tf.token_mixing(tf.zeros([2, 0, 0]), tf.zeros([0]), tf.zeros([0]))


@pytest.mark.parametrize("epsilon", [0.0, -1.0])
def test_error_epsilon(epsilon):
    with pytest.raises(tf.errors.InvalidArgumentError, match="epsilon"):
        recops_tf.token_mixing(*args(tf.float32), epsilon=epsilon)
