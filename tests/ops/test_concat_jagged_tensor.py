"""Tests of stem concat_jagged_tensor: concat_jagged_tensor and split_jagged_tensor."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

import recops_tf
from recops_tf.reference import concat_jagged_tensor as ref
from recops_tf.testing import (FLOAT_DTYPES, MODES, assert_close, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient, in_mode)
from recops_tf.testing.inputs import random_values

ALL_DTYPES = FLOAT_DTYPES + (tf.int32, tf.int64)
INDEX_DTYPES = (tf.int32, tf.int64)


def make(lens_a, lens_b, dim=3, dtype=tf.float32, index_dtype=tf.int64, seed=0):
    oa = tf.constant(np.concatenate([[0], np.cumsum(lens_a, dtype=np.int64)]), index_dtype)
    ob = tf.constant(np.concatenate([[0], np.cumsum(lens_b, dtype=np.int64)]), index_dtype)
    a = random_values([int(sum(lens_a)), dim], dtype, seed)
    b = random_values([int(sum(lens_b)), dim], dtype, seed + 1)
    return a, oa, b, ob


LENS_A, LENS_B = [3, 0, 2, 5], [1, 4, 0, 2]


def concat(prefix):
    return lambda a, oa, b, ob: recops_tf.concat_jagged_tensor(a, oa, b, ob,
                                                               n_prefix_from_right=prefix)


def concat_ref(prefix):
    return lambda a, oa, b, ob: ref.concat_jagged_tensor(a, oa, b, ob, n_prefix_from_right=prefix)


def split(prefix):
    return lambda v, oa, ob: recops_tf.split_jagged_tensor(v, oa, ob, n_prefix_to_right=prefix)


def split_ref(prefix):
    return lambda v, oa, ob: ref.split_jagged_tensor(v, oa, ob, n_prefix_to_right=prefix)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prefix", [0, 2])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_concat_matches_reference(dtype, index_dtype, prefix, mode):
    args = make(LENS_A, LENS_B, dtype=dtype, index_dtype=index_dtype)
    assert_matches_reference(in_mode(concat(prefix), mode, args), concat_ref(prefix), args, dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prefix", [0, 2])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_split_matches_reference(dtype, index_dtype, prefix, mode):
    a, oa, b, ob = make(LENS_A, LENS_B, dtype=dtype, index_dtype=index_dtype)
    args = [ref.concat_jagged_tensor(a, oa, b, ob, n_prefix_from_right=prefix), oa, ob]
    out = assert_matches_reference(in_mode(split(prefix), mode, args), split_ref(prefix), args,
                                   dtype)
    assert_close(out, (a, b), dtype, what="split(concat) round trip")


def test_golden_prefix_layout():
    # The spec's golden: per sample, the B prefix, then A, then the rest of B.
    a = tf.constant([[1], [2], [3]])
    b = tf.constant([[10], [11], [12], [20]])
    out = recops_tf.concat_jagged_tensor(a, [0, 2, 3], b, [0, 3, 4], n_prefix_from_right=2)
    assert out[:, 0].numpy().tolist() == [10, 11, 1, 2, 12, 20, 3]
    out = recops_tf.concat_jagged_tensor(a, [0, 2, 3], b, [0, 3, 4])
    assert out[:, 0].numpy().tolist() == [1, 2, 10, 11, 12, 3, 20]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gradients_match_reference(dtype, prefix, mode):
    args = make(LENS_A, LENS_B, dtype=dtype)
    assert_gradients_match_reference(in_mode(concat(prefix), mode, args), concat_ref(prefix),
                                     args, [0, 2], dtype)
    a, oa, b, ob = args
    sargs = [ref.concat_jagged_tensor(a, oa, b, ob, n_prefix_from_right=prefix), oa, ob]
    assert_gradients_match_reference(in_mode(split(prefix), mode, sargs), split_ref(prefix),
                                     sargs, [0], dtype)


@pytest.mark.parametrize("prefix", [0, 2])
def test_numeric_gradients(prefix):
    a, oa, b, ob = make([2, 0, 1], [1, 2, 0], dim=2, dtype=tf.float64)
    assert_numeric_gradient(concat(prefix), [a, oa, b, ob], [0, 2])
    v = ref.concat_jagged_tensor(a, oa, b, ob, n_prefix_from_right=prefix)
    # The backward op (split) is differentiable too: its gradient is concat.
    assert_numeric_gradient(split(prefix), [v, oa, ob], [0])


def test_split_gradient_with_one_unused_output():
    a, oa, b, ob = make(LENS_A, LENS_B)
    v = ref.concat_jagged_tensor(a, oa, b, ob)
    with tf.GradientTape() as tape:
        tape.watch(v)
        part_a, _ = recops_tf.split_jagged_tensor(v, oa, ob)
        loss = tf.reduce_sum(part_a)
    g = tape.gradient(loss, v)
    expected = ref.concat_jagged_tensor(tf.ones_like(a), oa, tf.zeros_like(b), ob)
    assert_close(g, expected, tf.float32)


def test_ragged_form():
    a, oa, b, ob = make(LENS_A, LENS_B)
    rt_a = tf.RaggedTensor.from_row_splits(a, oa)
    rt_b = tf.RaggedTensor.from_row_splits(b, ob)
    out = recops_tf.concat_jagged_tensor(rt_a, rt_b)
    assert isinstance(out, tf.RaggedTensor)
    assert_close(out, tf.concat([rt_a, rt_b], axis=1), tf.float32)
    back_a, back_b = recops_tf.split_jagged_tensor(out, oa)
    assert_close((back_a, back_b), (rt_a, rt_b), tf.float32)
    back_a, back_b = recops_tf.split_jagged_tensor(out, oa, ob)
    assert_close((back_a, back_b), (rt_a, rt_b), tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="row_splits"):
        recops_tf.split_jagged_tensor(out, oa, ob[::-1] * 0 + ob[-1])


def test_ragged_form_in_function_and_gradient():
    a, oa, b, ob = make(LENS_A, LENS_B)
    spec = tf.RaggedTensorSpec([None, None, 3], tf.float32, 1, tf.int64)

    @tf.function(input_signature=[spec] * 2)
    def f(x, y):
        with tf.GradientTape() as tape:
            tape.watch(x.values)
            out = recops_tf.concat_jagged_tensor(x, y, n_prefix_from_right=1)
            loss = tf.reduce_sum(out.values * out.values)
        return out, tape.gradient(loss, x.values)

    out, g = f(tf.RaggedTensor.from_row_splits(a, oa), tf.RaggedTensor.from_row_splits(b, ob))
    assert_close(out.values, ref.concat_jagged_tensor(a, oa, b, ob, n_prefix_from_right=1),
                 tf.float32)
    assert_close(g, 2 * a, tf.float32)


def test_rank1_and_rank3_values():
    for shape_tail in ([], [2, 3]):
        oa, ob = tf.constant([0, 2, 3], tf.int64), tf.constant([0, 1, 1], tf.int64)
        a = random_values([3] + shape_tail, tf.float32, 1)
        b = random_values([1] + shape_tail, tf.float32, 2)
        assert_matches_reference(concat(1), concat_ref(1), [a, oa, b, ob], tf.float32)


def test_shape_function():
    f = tf.function(concat(0)).get_concrete_function(
        tf.TensorSpec([None, 5]), tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, 5]),
        tf.TensorSpec([None], tf.int64))
    assert f.output_shapes.as_list() == [None, 5]
    f = tf.function(concat(0)).get_concrete_function(
        tf.TensorSpec([4, 5]), tf.TensorSpec([3], tf.int64), tf.TensorSpec([6, 5]),
        tf.TensorSpec([3], tf.int64))
    assert f.output_shapes.as_list() == [10, 5]
    g = tf.function(split(0)).get_concrete_function(
        tf.TensorSpec([None, 5]), tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64))
    assert [s.as_list() for s in g.output_shapes] == [[None, 5], [None, 5]]
    with pytest.raises(ValueError):
        tf.function(concat(0)).get_concrete_function(
            tf.TensorSpec([4, 5]), tf.TensorSpec([3], tf.int64), tf.TensorSpec([6, 4]),
            tf.TensorSpec([3], tf.int64))


@st.composite
def jagged_pairs(draw):
    batch = draw(st.integers(0, 6))
    lens_a = draw(st.lists(st.integers(0, 4), min_size=batch, max_size=batch))
    lens_b = draw(st.lists(st.integers(0, 4), min_size=batch, max_size=batch))
    prefix = draw(st.integers(0, 5))
    return lens_a, lens_b, prefix


@given(jagged_pairs())
def test_property_concat_split_round_trip(case):
    lens_a, lens_b, prefix = case
    a, oa, b, ob = make(lens_a, lens_b, dim=2)
    out = assert_matches_reference(concat(prefix), concat_ref(prefix), [a, oa, b, ob], tf.float32)
    assert out.shape[0] == sum(lens_a) + sum(lens_b)
    assert_close(split(prefix)(out, oa, ob), (a, b), tf.float32, what="round trip")


# ---- validation: one test per rule -------------------------------------------------------

def _concat_raw(a, oa, b, ob, prefix=0):
    return recops_tf.concat_jagged_tensor(a, oa, b, ob, n_prefix_from_right=prefix)


def test_error_offsets_not_starting_at_zero():
    a, _, b, ob = make([2, 1], [1, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"offsets_a\[0\] must be 0, got 1"):
        _concat_raw(a, tf.constant([1, 2, 3], tf.int64), b, ob)


def test_error_offsets_decreasing():
    a, _, b, ob = make([2, 1], [1, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="offsets_a must be non-decreasing"):
        _concat_raw(a, tf.constant([0, 3, 2, 3], tf.int64), b, tf.constant([0, 1, 1, 2], tf.int64))


def test_error_offsets_last_not_rows():
    a, oa, b, _ = make([2, 1], [1, 1])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"offsets_b\[-1\] = 5 must equal the number of rows, 2"):
        _concat_raw(a, oa, b, tf.constant([0, 1, 5], tf.int64))


def test_error_offsets_lengths_differ():
    a, oa, b, _ = make([2, 1], [1, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="same length"):
        _concat_raw(a, oa, b, tf.constant([0, 2], tf.int64))


def test_error_empty_offsets():
    a, oa, b, _ = make([2, 1], [1, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least one entry"):
        _concat_raw(a, oa, b, tf.constant([], tf.int64))


def test_error_offsets_rank():
    a, oa, b, _ = make([2, 1], [1, 1])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank"):
        _concat_raw(a, oa, b, tf.constant([[0, 1, 2]], tf.int64))


def test_error_row_shapes_differ():
    a, oa, _, ob = make([2, 1], [1, 1])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="Dimension|row shape"):
        _concat_raw(a, oa, tf.zeros([2, 7]), ob)


def test_error_scalar_values():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank"):
        _concat_raw(tf.constant(1.0), [0], tf.constant(1.0), [0])


def test_error_split_rows_mismatch():
    a, oa, b, ob = make([2, 1], [1, 1])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"offsets_a\[-1\] \+ offsets_b\[-1\] = 3 \+ 2 must equal"):
        recops_tf.split_jagged_tensor(tf.zeros([4, 3]), oa, ob)


def test_error_negative_prefix():
    a, oa, b, ob = make([2, 1], [1, 1])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="n_prefix_from_right"):
        _concat_raw(a, oa, b, ob, prefix=-1)


def test_error_offsets_dtype():
    a, oa, b, ob = make([2, 1], [1, 1])
    with pytest.raises(TypeError, match="offsets_a must be int32 or int64"):
        _concat_raw(a, tf.cast(oa, tf.float32), b, ob)
