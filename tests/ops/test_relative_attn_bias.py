"""Tests of stem relative_attn_bias: the time bias, its weight gradient, the position bias."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.reference import relative_attn_bias as ref
from recops_tf.testing import (FLOAT_DTYPES, MODES, assert_close, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient, in_mode,
                               outputs_at_thread_counts)
from recops_tf.testing.inputs import random_values

INDEX_DTYPES = (tf.int32, tf.int64)
# Gaps of 0 (same timestamp), 1, exact powers near bucket edges and large ones; unsorted rows.
TIMESTAMPS = [[0, 0, 1, 3, 100, 10_000, 86_400, 5],
              [7, 2, 2_000_000, 40, 41, 1_000, 0, 123_456_789]]


def time_args(dtype=tf.float32, index_dtype=tf.int64, layers=3, num_buckets=17, seed=0):
    return [tf.constant(TIMESTAMPS, index_dtype),
            random_values([layers, num_buckets], dtype, seed)]


@pytest.mark.parametrize("duplicate", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_time_bias_matches_reference(dtype, index_dtype, mode, duplicate):
    args = time_args(dtype, index_dtype)
    fused = lambda ts, w: recops_tf.relative_attn_bias_time(ts, w, duplicate=duplicate)  # noqa
    bias, buckets = in_mode(fused, mode, args)(*args)
    ref_bias, ref_buckets = ref.relative_attn_bias_time(*args, duplicate=duplicate)
    np.testing.assert_array_equal(buckets.numpy(), ref_buckets.numpy())
    np.testing.assert_array_equal(bias.numpy(), ref_bias.numpy())  # a gather: exact
    s = len(TIMESTAMPS[0]) * (2 if duplicate else 1)
    assert bias.shape == (3, 2, s, s)


@pytest.mark.parametrize("divisor", [0.301, 0.05, 1.0, 2.5])
def test_buckets_are_the_formula_in_float64(divisor):
    # Deltas that straddle every bucket edge: the exact integer edges of the formula itself.
    nb = 40
    edges = [int(np.ceil(np.exp(k * np.float64(np.float32(divisor))))) for k in range(1, nb)]
    deltas = sorted({d + e for e in edges for d in (-1, 0, 1) if 0 <= d + e < 2**40})
    ts = tf.constant([[0] + deltas], tf.int64)
    _, buckets = recops_tf.relative_attn_bias_time(ts, tf.zeros([1, nb]), divisor,
                                                   duplicate=False)
    d = np.asarray(deltas, np.float64)
    expect = np.minimum(np.floor(np.log(np.maximum(d, 1)) / np.float64(np.float32(divisor))),
                        nb - 1).astype(np.int32)
    np.testing.assert_array_equal(buckets.numpy()[0, 0, 1:], expect)


def test_extreme_timestamps_do_not_overflow():
    # Gaps up to 2^64 - 1 (int64 extremes): the last bucket, no undefined arithmetic.
    ts = tf.constant([[-2**63, 2**63 - 1, 0]], tf.int64)
    _, buckets = recops_tf.relative_attn_bias_time(ts, tf.zeros([1, 200]), 0.301,
                                                   duplicate=False)
    expect = np.floor(np.log(np.array([2.0**64 - 1, 2.0**63])) / np.float64(np.float32(0.301)))
    assert buckets.numpy()[0, 0, 1] == expect[0] and buckets.numpy()[0, 0, 2] == expect[1]
    assert buckets.numpy()[0, 1, 0] == buckets.numpy()[0, 0, 1]


def test_single_bucket_and_empty():
    bias, buckets = recops_tf.relative_attn_bias_time([[0, 5, 99]], [[2.5]])
    assert np.all(bias.numpy() == 2.5) and np.all(buckets.numpy() == 0)
    bias, buckets = recops_tf.relative_attn_bias_time(tf.zeros([0, 4], tf.int64),
                                                      tf.ones([2, 3]))
    assert bias.shape == (2, 0, 8, 8) and buckets.shape == (0, 4, 4)


def test_ragged_timestamps_are_padded():
    rt = tf.ragged.constant([[3, 9, 400], [7]], dtype=tf.int64)
    w = random_values([2, 9], tf.float32, 3)
    bias, _ = recops_tf.relative_attn_bias_time(rt, w)
    expect, _ = ref.relative_attn_bias_time(rt.to_tensor(), w)
    np.testing.assert_array_equal(bias.numpy(), expect.numpy())


@pytest.mark.parametrize("duplicate", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_time_bias_gradient_matches_reference(dtype, duplicate):
    args = time_args(dtype)
    fused = lambda ts, w: recops_tf.relative_attn_bias_time(  # noqa: E731
        ts, w, duplicate=duplicate)[0]
    reference = lambda ts, w: ref.relative_attn_bias_time(  # noqa: E731
        ts, w, duplicate=duplicate)[0]
    s = len(TIMESTAMPS[0]) * (2 if duplicate else 1)
    assert_gradients_match_reference(fused, reference, args, [1], dtype,
                                     reduction=2 * s * s)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_matches_reference(dtype, mode):
    _, buckets = ref.relative_attn_bias_time(*time_args())
    grad = random_values([3, 2, 16, 16], dtype, 4)
    fused = lambda g, b: recops_tf.relative_attn_bias_backward(g, b, 17)  # noqa: E731
    assert_matches_reference(in_mode(fused, mode, [grad, buckets]),
                             lambda g, b: ref.relative_attn_bias_backward(g, b, 17),
                             [grad, buckets], dtype, reduction=512)


def test_backward_is_deterministic_and_its_gradient_is_a_gather():
    _, buckets = ref.relative_attn_bias_time(*time_args())
    grad = random_values([3, 2, 16, 16], tf.float32, 4)
    first = recops_tf.relative_attn_bias_backward(grad, buckets, 17).numpy()
    for _ in range(3):
        np.testing.assert_array_equal(
            recops_tf.relative_attn_bias_backward(grad, buckets, 17).numpy(), first)
    assert_numeric_gradient(lambda g: recops_tf.relative_attn_bias_backward(g, buckets, 17),
                            [tf.cast(grad, tf.float64)], [0])


def test_time_bias_numeric_gradient():
    ts, w = time_args(tf.float64, layers=2, num_buckets=5)
    assert_numeric_gradient(lambda w: recops_tf.relative_attn_bias_time(ts, w)[0], [w], [0])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_pos_bias_matches_reference(dtype, index_dtype, mode):
    p, ident = recops_tf.toeplitz_position_bias(random_values([7], dtype, 1), candidate_len=2)
    lens = tf.constant([0, 3, 8, 10], index_dtype)  # 10 = S2: no clamping
    args = [p, ident, lens]
    assert_matches_reference(in_mode(recops_tf.relative_attn_bias_pos, mode, args),
                             ref.relative_attn_bias_pos, args, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_pos_bias_gradient_over_several_column_blocks(dtype):
    """The fused backward (RelativeAttnBiasPosBackward) owns blocks of 16 rows: S2 = 140 is nine
    blocks, the last partial. Lengths 0, 1, 70 and 139 clamp rows onto a row of an earlier
    block (whose sums add the later blocks' partial rows); 140 clamps none."""
    p = random_values([140, 140], dtype, 4)
    ident = tf.cast(tf.eye(140), dtype)
    args = [p, ident, tf.constant([0, 1, 70, 139, 140], tf.int64)]
    assert_gradients_match_reference(recops_tf.relative_attn_bias_pos,
                                      ref.relative_attn_bias_pos, args, [0, 1], dtype,
                                      reduction=5 * 140)


def test_pos_bias_gradient_is_deterministic_and_second_order_raises():
    p, ident = random_values([70, 70], tf.float32, 5), tf.eye(70)
    lens = tf.constant([3, 70, 12], tf.int64)
    grad = random_values([3, 70, 70], tf.float32, 6)
    lib = recops_tf.ops._common.lib()
    first = lib.recops_relative_attn_bias_pos_backward(grad, p, ident, lens)
    for _ in range(3):
        again = lib.recops_relative_attn_bias_pos_backward(grad, p, ident, lens)
        assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(first, again))
    with pytest.raises(tf.errors.InvalidArgumentError, match="grad must have the forward"):
        lib.recops_relative_attn_bias_pos_backward(grad[:, :69], p, ident, lens)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must lie in"):
        lib.recops_relative_attn_bias_pos_backward(grad, p, ident, tf.constant([3, 71, 1],
                                                                               tf.int64))
    with tf.GradientTape() as outer:
        outer.watch(p)
        with tf.GradientTape() as inner:
            inner.watch(p)
            y = recops_tf.relative_attn_bias_pos(p, ident, lens)
        g = inner.gradient(y, p)
    with pytest.raises(NotImplementedError, match="second-order"):
        outer.gradient(g, p)


_POS_DETERMINISM_SCRIPT = """
import numpy as np
import recops_tf
rng = np.random.default_rng(0)
n, batch = 200, 24  # 13 row blocks; repeated lengths share partial rows
p = tf.constant(rng.standard_normal([n, n]), tf.float32)
ident = tf.constant(rng.uniform(0, 1, [n, n]) < 0.1, tf.float32)
grad = tf.constant(rng.standard_normal([batch, n, n]) * 10.0 ** rng.integers(-3, 4, [batch, n, 1]),
                   tf.float32)
lens = tf.constant(rng.integers(0, 8, batch) * 25, tf.int64)
lib = recops_tf.ops._common.lib()
for out in lib.recops_relative_attn_bias_pos_backward(grad, p, ident, lens):
    sys.stdout.write(out.numpy().tobytes().hex())
"""


def test_pos_bias_gradient_is_bitwise_identical_across_thread_counts():
    outs = outputs_at_thread_counts(_POS_DETERMINISM_SCRIPT)
    assert outs[0] and outs[0] == outs[1]


def test_pos_bias_blends_a_non_binary_identity():
    p = random_values([5, 5], tf.float32, 2)
    ident = random_values([5, 5], tf.float32, 3, low=0.0)
    args = [p, ident, tf.constant([2, 5], tf.int64)]
    assert_matches_reference(recops_tf.relative_attn_bias_pos, ref.relative_attn_bias_pos, args,
                             tf.float32)
    assert_gradients_match_reference(recops_tf.relative_attn_bias_pos,
                                      ref.relative_attn_bias_pos, args, [0, 1], tf.float32,
                                      reduction=10)


@pytest.mark.parametrize("duplicate", [True, False])
def test_toeplitz_matches_elementwise_construction(duplicate):
    w = random_values([9], tf.float32, 5)
    p, ident = recops_tf.toeplitz_position_bias(w, candidate_len=4, duplicate=duplicate)
    rp, ri = ref.toeplitz_position_bias(w.numpy(), candidate_len=4, duplicate=duplicate)
    assert_close(p, rp, tf.float32)
    np.testing.assert_array_equal(ident.numpy(), ri.numpy())


# ---- validation ----------------------------------------------------------------------------

def test_error_timestamps_rank():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank"):
        recops_tf.relative_attn_bias_time(tf.constant([1, 2, 3], tf.int64), tf.ones([1, 3]))


def test_error_weights_rank():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank"):
        recops_tf.relative_attn_bias_time(tf.constant([[1, 2]], tf.int64), tf.ones([3]))


@pytest.mark.parametrize("divisor", [0.0, -0.3, float("inf"), float("nan")])
def test_error_divisor(divisor):
    with pytest.raises(tf.errors.InvalidArgumentError, match="bucket_divisor"):
        recops_tf.relative_attn_bias_time([[1, 2]], tf.ones([1, 3]), divisor)


def test_error_no_buckets():
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least one bucket"):
        recops_tf.relative_attn_bias_time([[1, 2]], tf.ones([1, 0]))


def test_error_backward_bucket_out_of_range():
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        recops_tf.relative_attn_bias_backward(tf.ones([1, 1, 4, 4]), [[[0, 3], [1, 0]]], 3)


def test_error_backward_shapes():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="grad must be"):
        recops_tf.relative_attn_bias_backward(tf.ones([1, 1, 3, 3]), [[[0, 1], [1, 0]]], 3)


def test_error_backward_num_buckets():
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_buckets"):
        recops_tf.relative_attn_bias_backward(tf.ones([1, 1, 4, 4]), [[[0, 0], [0, 0]]], 0)


@pytest.mark.parametrize("bad", [-1, 6])
def test_error_past_valid_lens_out_of_range(bad):
    with pytest.raises(tf.errors.InvalidArgumentError, match="past_valid_lens"):
        recops_tf.relative_attn_bias_pos(tf.ones([5, 5]), tf.zeros([5, 5]), [2, bad])


def test_error_pos_shapes():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        recops_tf.relative_attn_bias_pos(tf.ones([5, 5]), tf.zeros([4, 4]), [2])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="square"):
        recops_tf.relative_attn_bias_pos(tf.ones([5, 4]), tf.zeros([5, 4]), [2])


def test_error_toeplitz_even_length():
    with pytest.raises(ValueError, match="odd length"):
        recops_tf.toeplitz_position_bias(tf.ones([4]))
