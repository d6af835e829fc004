"""Tests of stem norm_multiply_dropout: LayerNorm · u with a stateless seeded dropout."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.reference import norm_multiply_dropout as ref
from recops_tf.testing import (FLOAT_DTYPES, MODES, assert_close, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient,
                               assert_second_order_raises, in_mode)
from recops_tf.testing.inputs import random_values

SEED = tf.constant([1234, 7], tf.int64)


def args(dtype, shape=(9, 40), seed=0):
    c = shape[-1]
    x = random_values(shape, dtype, seed, low=-3.0, high=1.0)
    return [x, random_values(shape, dtype, seed + 1), random_values([c], dtype, seed + 2),
            random_values([c], dtype, seed + 3)]


def fused(rate, seed=SEED, **kw):
    return lambda x, u, w, b: recops_tf.norm_multiply_dropout(
        x, u, w, b, dropout_rate=rate, seed=seed, **kw)


def reference(rate, seed=SEED, **kw):
    return lambda x, u, w, b: ref.norm_multiply_dropout(
        x, u, w, b, dropout_rate=rate, seed=seed, **kw)


@pytest.mark.parametrize("rate", [0.0, 0.3])
@pytest.mark.parametrize("shape", [(9, 40), (2, 3, 130), (0, 4)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_reference(dtype, shape, rate):
    """The reference rebuilds the kernel's mask, so this checks the mask bit for bit too."""
    a = args(dtype, shape)
    assert_matches_reference(fused(rate), reference(rate), a, dtype, magnitude=6.0)
    assert_gradients_match_reference(fused(rate), reference(rate), a, [0, 1, 2, 3], dtype,
                                     magnitude=12.0, reduction=shape[-1] * 4)


@pytest.mark.parametrize("mode", MODES)
def test_modes(mode):
    a = args(tf.float32)
    f = in_mode(fused(0.25, epsilon=1e-3), mode, a)
    assert_matches_reference(f, reference(0.25, epsilon=1e-3), a, tf.float32, magnitude=6.0)


def test_numeric_gradient():
    assert_numeric_gradient(fused(0.4), args(tf.float64, (3, 6)), [0, 1, 2, 3])


def test_rate_zero_and_inference_equal_no_dropout():
    a = args(tf.float32)
    plain = recops_tf.ln_mul(*a)
    np.testing.assert_array_equal(fused(0.0)(*a).numpy(), plain.numpy())
    np.testing.assert_array_equal(fused(0.5, training=False)(*a).numpy(), plain.numpy())
    # Without a seed and without dropout nothing random happens either.
    np.testing.assert_array_equal(recops_tf.norm_multiply_dropout(*a).numpy(), plain.numpy())


def test_mask_statistics_and_scale():
    shape, rate = (512, 256), 0.3
    x = random_values(shape, tf.float32, 1)
    one = tf.ones(shape[-1:])
    y = recops_tf.norm_multiply_dropout(x, tf.ones(shape), one, one * 5.0, dropout_rate=rate,
                                        seed=[3, 4], epsilon=1e-5)
    y0 = recops_tf.ln_mul(x, tf.ones(shape), one, one * 5.0)  # all entries > 0
    kept = (y.numpy() != 0)
    n = kept.size
    # Dropped fraction within 5 standard deviations of the rate.
    assert abs((1 - kept.mean()) - rate) < 5 * np.sqrt(rate * (1 - rate) / n)
    np.testing.assert_allclose(y.numpy()[kept], y0.numpy()[kept] / (1 - rate), rtol=1e-6)


def test_seeded_masks_are_reproducible_and_differ_between_steps():
    a = args(tf.float32, (64, 64))
    y1 = fused(0.5, seed=[5, 0])(*a).numpy() != 0
    y2 = fused(0.5, seed=[5, 0])(*a).numpy() != 0
    y3 = fused(0.5, seed=[5, 1])(*a).numpy() != 0
    np.testing.assert_array_equal(y1, y2)
    assert (y1 != y3).mean() > 0.3
    # Unseeded calls draw a new mask each time.
    u1 = recops_tf.norm_multiply_dropout(*a, dropout_rate=0.5).numpy() != 0
    u2 = recops_tf.norm_multiply_dropout(*a, dropout_rate=0.5).numpy() != 0
    assert (u1 != u2).mean() > 0.3


def test_backward_uses_the_forward_mask():
    a = args(tf.float32, (16, 32))
    with tf.GradientTape() as tape:
        tape.watch(a[1])
        y = fused(0.5)(*a)
    du = tape.gradient(y, a[1]).numpy()
    np.testing.assert_array_equal(du == 0, y.numpy() == 0)


def test_ragged_input():
    x = tf.RaggedTensor.from_row_lengths(random_values([9, 6], tf.float32, 1), [4, 0, 5])
    u = x.with_flat_values(random_values([9, 6], tf.float32, 2))
    w, b = random_values([6], tf.float32, 3), random_values([6], tf.float32, 4)
    out = fused(0.2)(x, u, w, b)
    assert isinstance(out, tf.RaggedTensor)
    assert_close(out.flat_values, reference(0.2)(x.flat_values, u.flat_values, w, b),
                 tf.float32, magnitude=4.0)


def test_error_u_shape():
    a = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="u must have x's shape"):
        fused(0.1)(a[0], a[1][1:], a[2], a[3])


def test_error_weight_shape():
    a = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="weight must have shape"):
        fused(0.1)(a[0], a[1], a[2][1:], a[3])


def test_error_bias_shape():
    a = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bias must have shape"):
        fused(0.1)(a[0], a[1], a[2], a[3][1:])


def test_error_seed_shape():
    a = args(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"seed must have shape \[2\]"):
        fused(0.1, seed=[1, 2, 3])(*a)


@pytest.mark.parametrize("rate", [1.0, -0.1, 1.5])
def test_error_dropout_rate(rate):
    with pytest.raises(tf.errors.InvalidArgumentError, match="dropout_rate"):
        fused(rate)(*args(tf.float32))


@pytest.mark.parametrize("epsilon", [0.0, -1.0])
def test_error_epsilon(epsilon):
    with pytest.raises(tf.errors.InvalidArgumentError, match="epsilon"):
        fused(0.1, epsilon=epsilon)(*args(tf.float32))


def test_second_order_gradient_raises():
    assert_second_order_raises(fused(0.2), args(tf.float32))
