"""Tests of stem gather_for_rank1: gather_for_rank1 and index_select_for_rank1_backward."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

import recops_tf
from recops_tf.reference import gather_for_rank1 as ref
from recops_tf.testing import (FLOAT_DTYPES, MODES, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient, in_mode,
                               outputs_at_thread_counts)
from recops_tf.testing.inputs import random_values

INDEX_DTYPES = (tf.int32, tf.int64)


def make(table, index, dtype=tf.float32, index_dtype=tf.int64, seed=0):
    return [random_values([table], dtype, seed), tf.constant(index, index_dtype)]


INDEX = [0, 4, 4, 1, 9, 0, 3]  # boundary (0, E-1) and duplicate indices


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gather_matches_reference(dtype, index_dtype, mode):
    args = make(10, INDEX, dtype, index_dtype)
    assert_matches_reference(in_mode(recops_tf.gather_for_rank1, mode, args),
                             ref.gather_for_rank1, args, dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_matches_reference(dtype, index_dtype, mode):
    x, index = make(10, INDEX, dtype, index_dtype)
    args = [random_values([len(INDEX)], dtype, 5), x, index]
    assert_matches_reference(in_mode(recops_tf.index_select_for_rank1_backward, mode, args),
                             ref.index_select_for_rank1_backward, args, dtype,
                             reduction=len(INDEX))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gradients_match_reference(dtype, mode):
    args = make(10, INDEX, dtype)
    assert_gradients_match_reference(in_mode(recops_tf.gather_for_rank1, mode, args),
                                     ref.gather_for_rank1, args, [0], dtype, reduction=len(INDEX))
    x, index = args
    bargs = [random_values([len(INDEX)], dtype, 5), x, index]
    assert_gradients_match_reference(in_mode(recops_tf.index_select_for_rank1_backward, mode,
                                             bargs),
                                     ref.index_select_for_rank1_backward, bargs, [0], dtype)


def test_numeric_gradients():
    x, index = make(6, [5, 0, 2, 2], tf.float64)
    assert_numeric_gradient(recops_tf.gather_for_rank1, [x, index], [0])
    # The backward op is differentiable (it is linear; its gradient is the gather).
    g = random_values([4], tf.float64, 3)
    assert_numeric_gradient(recops_tf.index_select_for_rank1_backward, [g, x, index], [0])


def test_backward_sums_in_ascending_index_order():
    # float32 sums whose value depends on the order: ascending k must be reproduced exactly,
    # whatever the threads do.
    rng = np.random.default_rng(0)
    n, k = 7, 5000
    index = rng.integers(0, n, size=k)
    grad = (rng.standard_normal(k) * 10.0 ** rng.integers(-4, 8, size=k)).astype(np.float32)
    expected = np.zeros(n, np.float32)
    for i in range(k):
        expected[index[i]] = np.float32(expected[index[i]] + grad[i])
    for _ in range(3):
        out = recops_tf.index_select_for_rank1_backward(grad, tf.zeros([n]), index)
        np.testing.assert_array_equal(out.numpy(), expected)


_DETERMINISM_SCRIPT = """
import numpy as np
import recops_tf
rng = np.random.default_rng(0)
n, k = 1000, 400_000  # several chunks
index = rng.integers(0, n, size=k)
grad = (rng.standard_normal(k) * 10.0 ** rng.integers(-4, 8, size=k)).astype(np.float32)
out = recops_tf.index_select_for_rank1_backward(grad, tf.zeros([n]), index).numpy()
sys.stdout.write(out.tobytes().hex())
"""


def test_backward_is_bitwise_identical_across_thread_counts():
    outs = outputs_at_thread_counts(_DETERMINISM_SCRIPT)
    assert outs[0] and outs[0] == outs[1]


def test_large_table_has_no_length_limit():
    args = make(100_000, [99_999, 0, 20_480, 50_000])
    assert_matches_reference(recops_tf.gather_for_rank1, ref.gather_for_rank1, args, tf.float32)


def test_shape_function():
    f = tf.function(recops_tf.gather_for_rank1).get_concrete_function(
        tf.TensorSpec([None]), tf.TensorSpec([7], tf.int32))
    assert f.output_shapes.as_list() == [7]
    g = tf.function(recops_tf.index_select_for_rank1_backward).get_concrete_function(
        tf.TensorSpec([None]), tf.TensorSpec([11]), tf.TensorSpec([None], tf.int64))
    assert g.output_shapes.as_list() == [11]


@given(st.integers(1, 20).flatmap(
    lambda e: st.tuples(st.just(e), st.lists(st.integers(0, e - 1), max_size=30))))
def test_property_gather_and_backward(case):
    table, index = case
    x, idx = make(table, np.array(index, np.int64))
    assert_matches_reference(recops_tf.gather_for_rank1, ref.gather_for_rank1, [x, idx],
                             tf.float32)
    g = random_values([len(index)], tf.float32, 2)
    assert_matches_reference(recops_tf.index_select_for_rank1_backward,
                             ref.index_select_for_rank1_backward, [g, x, idx], tf.float32,
                             reduction=max(1, len(index)))


# ---- validation: one test per rule -------------------------------------------------------

@pytest.mark.parametrize("bad", [10, -1])
def test_error_index_out_of_range(bad):
    x, _ = make(10, [0])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"index\[2\] = {bad} is out of range \[0, 10\)"):
        recops_tf.gather_for_rank1(x, tf.constant([1, 2, bad, 3], tf.int64))


@pytest.mark.parametrize("bad", [10, -3])
def test_error_backward_index_out_of_range(bad):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"index\[1\] = {bad} is out of range \[0, 10\)"):
        recops_tf.index_select_for_rank1_backward(tf.ones([3]), tf.zeros([10]), [0, bad, 1])


def test_error_x_rank():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank"):
        recops_tf.gather_for_rank1(tf.zeros([2, 3]), [0])


def test_error_index_rank():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank"):
        recops_tf.gather_for_rank1(tf.zeros([3]), [[0]])


def test_error_backward_length_mismatch():
    with pytest.raises(tf.errors.InvalidArgumentError, match="same length"):
        recops_tf.index_select_for_rank1_backward(tf.ones([3]), tf.zeros([10]), [0, 1])


def test_error_index_dtype():
    with pytest.raises(TypeError, match="index must be int32 or int64"):
        recops_tf.gather_for_rank1(tf.zeros([3]), tf.constant([0.0]))
