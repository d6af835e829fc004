"""Tests of stem multislice_concat."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

import recops_tf
from recops_tf.reference import multislice_concat as ref
from recops_tf.testing import (FLOAT_DTYPES, MODES, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient, in_mode)
from recops_tf.testing.inputs import random_values

# Overlapping, repeated and to-the-end (-1) slices.
SIZES, BEGINS, LENGTHS = [2, 1, 3], [0, 3, 1, 2, 2, 6], [3, 2, -1, 4, 1, 1]


def fused(x):
    return recops_tf.multislice_concat(x, SIZES, BEGINS, LENGTHS)


def reference(x):
    return ref.multislice_concat(x, SIZES, BEGINS, LENGTHS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_reference(dtype, mode):
    args = [random_values([5, 7], dtype)]
    outs = assert_matches_reference(in_mode(fused, mode, args), reference, args, dtype)
    assert [o.shape.as_list() for o in outs] == [[5, 5], [5, 6], [5, 6]]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gradients_match_reference(dtype, mode):
    # Column 2 is used by four slices: the adjoint must accumulate them.
    args = [random_values([5, 7], dtype)]
    assert_gradients_match_reference(in_mode(fused, mode, args), reference, args, [0], dtype,
                                     reduction=4)


def test_numeric_gradient():
    assert_numeric_gradient(fused, [random_values([3, 7], tf.float64)], [0])


def test_backward_op_is_differentiable():
    # The gradient of MultisliceConcatGrad is MultisliceConcat: check the gradient of the
    # gradient numerically (it is linear in the upstream gradients).
    x = random_values([3, 7], tf.float64)
    ups = [random_values(o.shape, tf.float64, 10 + i) for i, o in enumerate(fused(x))]

    def grad_wrt_x(*upstream):
        with tf.GradientTape() as tape:
            tape.watch(x)
            outs = fused(x)
            loss = tf.add_n([tf.reduce_sum(o * u) for o, u in zip(outs, upstream)])
        return tape.gradient(loss, x)

    theoretical, numerical = tf.test.compute_gradient(grad_wrt_x, ups)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, atol=1e-7)


def test_gradient_with_unused_output():
    x = random_values([4, 7], tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(fused(x)[1])
    g = tape.gradient(loss, x).numpy()
    expected = np.zeros([4, 7], np.float32)
    expected[:, 1:] = 1.0  # output 1 is the single slice x[:, 1:]
    np.testing.assert_array_equal(g, expected)


def test_shape_function():
    f = tf.function(fused).get_concrete_function(tf.TensorSpec([None, 7]))
    assert [s.as_list() for s in f.output_shapes] == [[None, 5], [None, 6], [None, 6]]
    f = tf.function(fused).get_concrete_function(tf.TensorSpec([None, None]))
    assert [s.as_list() for s in f.output_shapes] == [[None, 5], [None, None], [None, 6]]


@st.composite
def slice_plans(draw):
    cols = draw(st.integers(1, 8))
    outputs = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(1, 3), min_size=outputs, max_size=outputs))
    begins, lengths = [], []
    for _ in range(sum(sizes)):
        b = draw(st.integers(0, cols - 1))
        begins.append(b)
        lengths.append(draw(st.one_of(st.just(-1), st.integers(1, cols - b))))
    rows = draw(st.integers(0, 4))
    return rows, cols, sizes, begins, lengths


@given(slice_plans())
def test_property_forward_and_gradient(plan):
    rows, cols, sizes, begins, lengths = plan
    x = random_values([rows, cols], tf.float32)
    f = lambda x: recops_tf.multislice_concat(x, sizes, begins, lengths)  # noqa: E731
    r = lambda x: ref.multislice_concat(x, sizes, begins, lengths)  # noqa: E731
    assert_matches_reference(f, r, [x], tf.float32)
    assert_gradients_match_reference(f, r, [x], [0], tf.float32, reduction=sum(sizes))


# ---- validation: one test per rule -------------------------------------------------------

def _call(sizes, begins, lengths, shape=(3, 7)):
    return recops_tf.multislice_concat(tf.zeros(shape), sizes, begins, lengths)


def test_error_begin_past_columns():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"slice_begins\[1\] = 7 is out of range \[0, 7\)"):
        _call([2], [0, 7], [1, 1])


def test_error_negative_begin():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"slice_begins\[0\] = -1 must be"):
        _call([1], [-1], [1])


def test_error_slice_runs_past_end():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"slice 0: .* = 5 \+ 3 exceeds the columns of input, 7"):
        _call([1], [5], [3])


@pytest.mark.parametrize("length", [0, -2])
def test_error_bad_length(length):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"slice_lengths\[0\] = {length} must be >= 1 or -1"):
        _call([1], [0], [length])


def test_error_counts_do_not_add_up():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sum\(concat_sizes\) = 3"):
        _call([1, 2], [0, 1], [1, 1])


def test_error_zero_concat_size():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"concat_sizes\[1\] = 0 must be >= 1"):
        _call([1, 0], [0], [1])


def test_error_empty_concat_sizes():
    with pytest.raises(ValueError, match="must not be empty"):
        _call([], [], [])


def test_error_input_rank():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank"):
        _call([1], [0], [1], shape=(3, 7, 1))
