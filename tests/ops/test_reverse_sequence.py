"""Tests of stem reverse_sequence."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

import recops_tf
from recops_tf.reference import reverse_sequence as ref
from recops_tf.testing import (FLOAT_DTYPES, MODES, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient, in_mode)
from recops_tf.testing.inputs import random_values

DTYPES = FLOAT_DTYPES + (tf.int64,)
INDEX_DTYPES = (tf.int32, tf.int64)


def make(lens, steps=6, dim=3, dtype=tf.float32, index_dtype=tf.int64):
    return [random_values([len(lens), steps, dim], dtype, 0), tf.constant(lens, index_dtype)]


LENS = [0, 6, 3, 1]  # zero, full and partial lengths


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(dtype, index_dtype, mode):
    args = make(LENS, dtype=dtype, index_dtype=index_dtype)
    assert_matches_reference(in_mode(recops_tf.reverse_sequence, mode, args),
                             ref.reverse_sequence, args, dtype)


def test_definition():
    x = tf.reshape(tf.range(8, dtype=tf.int64), [2, 4, 1])
    out = recops_tf.reverse_sequence(x, [3, 0])
    assert out[:, :, 0].numpy().tolist() == [[2, 1, 0, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gradients_match_reference(dtype, mode):
    args = make(LENS, dtype=dtype)
    assert_gradients_match_reference(in_mode(recops_tf.reverse_sequence, mode, args),
                                     ref.reverse_sequence, args, [0], dtype)


def test_numeric_gradient():
    assert_numeric_gradient(recops_tf.reverse_sequence, make([2, 0, 3], 3, 2, tf.float64), [0])


def _second_order(fn, x, lens):
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            y = fn(x, lens)
            loss = tf.reduce_sum(y * y * x)
        g = inner.gradient(loss, x)
        loss2 = tf.reduce_sum(g)
    return outer.gradient(loss2, x)


def test_second_order_gradient():
    # The gradient is reverse_sequence itself, so it is differentiable again.
    x, lens = make(LENS, dtype=tf.float64)
    np.testing.assert_allclose(_second_order(recops_tf.reverse_sequence, x, lens).numpy(),
                               _second_order(ref.reverse_sequence, x, lens).numpy(), rtol=1e-12)


def test_shape_function():
    f = tf.function(recops_tf.reverse_sequence).get_concrete_function(
        tf.TensorSpec([None, 9, 4]), tf.TensorSpec([None], tf.int32))
    assert f.output_shapes.as_list() == [None, 9, 4]
    with pytest.raises(ValueError):
        tf.function(recops_tf.reverse_sequence).get_concrete_function(
            tf.TensorSpec([3, 9, 4]), tf.TensorSpec([2], tf.int32))


@given(st.integers(0, 5).flatmap(lambda t: st.tuples(
    st.just(t), st.lists(st.integers(0, t), max_size=5))))
def test_property_matches_reference(case):
    steps, lens = case
    args = make(np.array(lens, np.int64), steps=steps, dim=2)
    assert_matches_reference(recops_tf.reverse_sequence, ref.reverse_sequence, args, tf.float32)


# ---- validation: one test per rule -------------------------------------------------------

def test_error_length_above_steps():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"seq_lengths\[1\] = 7 must lie in \[0, 6\]"):
        recops_tf.reverse_sequence(*make([1, 7]))


def test_error_negative_length():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"seq_lengths\[0\] = -1 must lie in \[0, 6\]"):
        recops_tf.reverse_sequence(*make([-1, 2]))


def test_error_rank():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank"):
        recops_tf.reverse_sequence(tf.zeros([2, 3]), [1, 1])


def test_error_length_count():
    x, _ = make([1, 2])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match="one entry per batch row|Dimensions must be equal"):
        recops_tf.reverse_sequence(x, [1, 2, 3])
    f = tf.function(recops_tf.reverse_sequence,
                    input_signature=[tf.TensorSpec([None, None, None]),
                                     tf.TensorSpec([None], tf.int64)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="one entry per batch row"):
        f(x, tf.constant([1, 2, 3], tf.int64))
