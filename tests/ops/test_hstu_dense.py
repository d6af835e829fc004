"""Tests of stem hstu_dense: hstu_attention forward and gradients."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

import recops_tf
from recops_tf.reference import hstu_dense as ref
from recops_tf.testing import (FLOAT_DTYPES, MODES, assert_close, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient,
                               assert_second_order_raises, in_mode)
from recops_tf.testing.inputs import random_values

# Empty, length-1 and multi-tile (> 64) sequences; keys longer than queries for "delta".
LENS_Q = [5, 0, 70, 1]
LENS_K = [7, 2, 70, 1]
MAX_Q = MAX_K = 72


def offsets(lens, dtype=tf.int64):
    return tf.constant(np.concatenate([[0], np.cumsum(lens)]), dtype)


def make(dtype=tf.float32, nq=4, nk=2, dqk=8, dv=6, lens_q=LENS_Q, lens_k=None, seed=0,
         index_dtype=tf.int64):
    lens_k = lens_q if lens_k is None else lens_k
    q = random_values([sum(lens_q), nq, dqk], dtype, seed)
    k = random_values([sum(lens_k), nk, dqk], dtype, seed + 1)
    v = random_values([sum(lens_k), nk, dv], dtype, seed + 2)
    return q, k, v, offsets(lens_q, index_dtype), offsets(lens_k, index_dtype)


def plane(dtype, nq=4, seed=7, batch=4, low=-1.0):
    return random_values([batch, nq, MAX_Q, MAX_K], dtype, seed, low=low)


def fused_fn(oq, ok, **kw):
    def f(q, k, v, **more):
        return recops_tf.hstu_attention(q, k, v, seq_offsets=oq, seq_offsets_k=ok,
                                        max_seq_len=MAX_Q, max_seq_len_k=MAX_K, **kw, **more)
    return f


def ref_fn(oq, ok, **kw):
    window = kw.pop("window_size", None)
    if window is not None:
        kw["window_left"], kw["window_right"] = window

    def f(q, k, v, **more):
        return ref.hstu_attention(q, k, v, oq, ok, MAX_Q, MAX_K, **kw, **more)
    return f


VARIANTS = {
    "causal": {},
    "none": {"mask_type": "none"},
    "custom": {"mask_type": "custom", "_mask": True},
    "bias_alpha": {"alpha": 0.7, "_bias": True},
    "context_target_group1": {"num_context": [2, 0, 10, 0], "num_target": [2, 0, 5, 1],
                              "target_group_size": 1},
    "context_target_group3": {"num_context": [1, 0, 3, 0], "num_target": [3, 0, 9, 0],
                              "target_group_size": 3},
    "targets_plain_causal": {"num_target": [2, 0, 5, 0]},
    "window": {"window_size": (5, 0)},
    "window_both_sides": {"mask_type": "none", "window_size": (3, 2)},
    "silu_scale": {"silu_scale": 0.25},
}


def resolve(variant, dtype):
    kw = dict(VARIANTS[variant])
    if kw.pop("_mask", False):
        kw["mask"] = plane(dtype, seed=11)
    if kw.pop("_bias", False):
        kw["attn_bias"] = plane(dtype, seed=12)
    return kw


def _f64(kw):
    return {k: (tf.cast(v, tf.float64) if tf.is_tensor(v) and v.dtype.is_floating else v)
            for k, v in kw.items()}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_matches_reference(dtype, variant):
    q, k, v, oq, ok = make(dtype, lens_k=LENS_K)
    kw = resolve(variant, dtype)
    fused = fused_fn(oq, ok, **kw)(q, k, v)
    expected = ref_fn(oq, ok, **_f64(kw))(*[tf.cast(x, tf.float64) for x in (q, k, v)])
    assert_close(fused, expected, dtype, magnitude=2.0, reduction=70)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("nk", [4, 2, 1])
def test_gqa_and_modes(nk, index_dtype, mode):
    q, k, v, oq, ok = make(tf.float32, nk=nk, dv=8, index_dtype=index_dtype)
    args = [q, k, v]
    assert_matches_reference(in_mode(fused_fn(oq, ok), mode, args), ref_fn(oq, ok), args,
                             tf.float32, magnitude=2.0, reduction=70)


@pytest.mark.parametrize("variant", ["causal", "bias_alpha", "custom", "context_target_group3",
                                     "window"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gradients_match_reference(dtype, variant):
    q, k, v, oq, ok = make(dtype, lens_k=LENS_K)
    kw = resolve(variant, dtype)
    bias = kw.pop("attn_bias", None)
    if bias is None:
        assert_gradients_match_reference(fused_fn(oq, ok, **kw), ref_fn(oq, ok, **_f64(kw)),
                                         [q, k, v], [0, 1, 2], dtype, magnitude=3.0,
                                         reduction=70)
        return
    fused = lambda q, k, v, b: fused_fn(oq, ok, attn_bias=b, **kw)(q, k, v)  # noqa: E731
    reference = lambda q, k, v, b: ref_fn(oq, ok, attn_bias=b, **_f64(kw))(q, k, v)  # noqa
    assert_gradients_match_reference(fused, reference, [q, k, v, bias], [0, 1, 2, 3], dtype,
                                     magnitude=3.0, reduction=70)


def test_gradients_inside_function_with_unknown_shapes():
    q, k, v, oq, ok = make(tf.float32)
    args = [q, k, v]
    assert_gradients_match_reference(in_mode(fused_fn(oq, ok), "function", args), ref_fn(oq, ok),
                                     args, [0, 1, 2], tf.float32, magnitude=3.0, reduction=70)


def test_numeric_gradients():
    lens = [3, 0, 4]
    q, k, v, oq, ok = make(tf.float64, nq=2, nk=1, dqk=3, dv=2, lens_q=lens, lens_k=[4, 1, 4])
    bias = random_values([3, 2, MAX_Q, MAX_K], tf.float64, 5)
    f = lambda q, k, v, b: recops_tf.hstu_attention(  # noqa: E731
        q, k, v, seq_offsets=oq, seq_offsets_k=ok, max_seq_len=MAX_Q, max_seq_len_k=MAX_K,
        attn_bias=b, alpha=0.8, silu_scale=0.5)
    assert_numeric_gradient(f, [q, k, v, bias], [0, 1, 2])
    # The bias gradient on the valid blocks (checking all of the [B, N, S, S] plane
    # numerically would be slow): compare with the composite's.
    assert_gradients_match_reference(
        f, lambda q, k, v, b: ref.hstu_attention(q, k, v, oq, ok, MAX_Q, MAX_K, attn_bias=b,
                                                 alpha=0.8, silu_scale=0.5),
        [q, k, v, bias], [3], tf.float64)


def test_bias_gradient_is_zero_outside_valid_blocks():
    q, k, v, oq, ok = make(tf.float32, lens_k=LENS_K)
    bias = plane(tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(bias)
        out = fused_fn(oq, ok, attn_bias=bias)(q, k, v)
        loss = tf.reduce_sum(out)
    g = tape.gradient(loss, bias).numpy()
    for b, (lq, lk) in enumerate(zip(LENS_Q, LENS_K)):
        outside = np.ones([MAX_Q, MAX_K], bool)
        outside[:lq, :lk] = False
        assert not np.any(g[b][:, outside])
    assert np.any(g[2])


def test_second_order_gradient_raises():
    q, k, v, oq, ok = make(tf.float32)
    assert_second_order_raises(fused_fn(oq, ok), [q, k, v])


def test_dense_layout_matches_jagged():
    q = random_values([3, 9, 4, 8], tf.float32, 0)
    k = random_values([3, 9, 2, 8], tf.float32, 1)
    v = random_values([3, 9, 2, 5], tf.float32, 2)
    out = recops_tf.hstu_attention(q, k, v)
    assert out.shape == [3, 9, 4, 5]
    o = offsets([9, 9, 9])
    jagged = recops_tf.hstu_attention(tf.reshape(q, [27, 4, 8]), tf.reshape(k, [27, 2, 8]),
                                      tf.reshape(v, [27, 2, 5]), seq_offsets=o, max_seq_len=9)
    assert_close(tf.reshape(out, [27, 4, 5]), jagged, tf.float32)


def test_dense_delta_layout_queries_are_last_keys():
    q = random_values([2, 3, 2, 4], tf.float32, 0)
    k = random_values([2, 5, 2, 4], tf.float32, 1)
    v = random_values([2, 5, 2, 4], tf.float32, 2)
    out = recops_tf.hstu_attention(q, k, v)
    expected = ref.hstu_attention(tf.reshape(q, [6, 2, 4]), tf.reshape(k, [10, 2, 4]),
                                  tf.reshape(v, [10, 2, 4]), offsets([3, 3]), offsets([5, 5]),
                                  3, 5)
    assert_close(tf.reshape(out, [6, 2, 4]), expected, tf.float32)


def test_ragged_layout():
    q, k, v, oq, ok = make(tf.float32, lens_k=LENS_K)
    rq = tf.RaggedTensor.from_row_splits(q, oq)
    rk = tf.RaggedTensor.from_row_splits(k, ok)
    rv = tf.RaggedTensor.from_row_splits(v, ok)
    out = recops_tf.hstu_attention(rq, rk, rv, max_seq_len=MAX_Q, max_seq_len_k=MAX_K)
    assert isinstance(out, tf.RaggedTensor)
    assert_close(out.values, fused_fn(oq, ok)(q, k, v), tf.float32)
    np.testing.assert_array_equal(out.row_splits.numpy(), oq.numpy())


def test_shape_function():
    f = tf.function(lambda q, k, v, o: recops_tf.hstu_attention(
        q, k, v, seq_offsets=o, max_seq_len=8)).get_concrete_function(
        tf.TensorSpec([None, 4, 8]), tf.TensorSpec([None, 2, 8]), tf.TensorSpec([None, 2, 3]),
        tf.TensorSpec([None], tf.int64))
    assert f.output_shapes.as_list() == [None, 4, 3]


@st.composite
def jagged_problems(draw):
    batch = draw(st.integers(0, 4))
    lens_q = draw(st.lists(st.integers(0, 9), min_size=batch, max_size=batch))
    extra = draw(st.lists(st.integers(0, 3), min_size=batch, max_size=batch))
    mask_type = draw(st.sampled_from(["causal", "none"]))
    ratio = draw(st.sampled_from([1, 2]))
    return lens_q, [a + b for a, b in zip(lens_q, extra)], mask_type, ratio


@given(jagged_problems())
def test_property_matches_reference(problem):
    lens_q, lens_k, mask_type, ratio = problem
    q, k, v, oq, ok = make(tf.float64, nq=2, nk=2 // ratio, dqk=3, dv=2, lens_q=lens_q,
                           lens_k=lens_k)
    out = recops_tf.hstu_attention(q, k, v, seq_offsets=oq, seq_offsets_k=ok, max_seq_len=12,
                                   max_seq_len_k=12, mask_type=mask_type)
    assert_close(out, ref.hstu_attention(q, k, v, oq, ok, 12, 12, mask_type=mask_type),
                 tf.float64)


# ---- validation: one test per rule -------------------------------------------------------

def _call(q=None, k=None, v=None, oq=None, ok=None, **kw):
    dq, dk, dv, doq, dok = make(tf.float32, lens_k=LENS_K)
    kw.setdefault("max_seq_len", MAX_Q)
    kw.setdefault("max_seq_len_k", MAX_K)
    return recops_tf.hstu_attention(
        dq if q is None else q, dk if k is None else k, dv if v is None else v,
        seq_offsets=doq if oq is None else oq, seq_offsets_k=dok if ok is None else ok, **kw)


def test_error_offsets_not_starting_at_zero():
    q, k, v, oq, ok = make(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"seq_offsets\[0\] must be 0"):
        _call(q, k, v, oq + 1, ok)


def test_error_offsets_decreasing():
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-decreasing"):
        _call(oq=tf.constant([0, 5, 4, 75, 76], tf.int64))


def test_error_offsets_last_not_rows():
    with pytest.raises(tf.errors.InvalidArgumentError, match="must equal the number of rows"):
        _call(ok=tf.constant([0, 7, 9, 79, 81], tf.int64))


def test_error_offsets_lengths_differ():
    with pytest.raises(tf.errors.InvalidArgumentError, match="same length"):
        _call(ok=tf.constant([0, 80], tf.int64))


def test_error_sequence_longer_than_max_seq_len():
    with pytest.raises(tf.errors.InvalidArgumentError, match="length 70 > max_seq_len = 60"):
        _call(max_seq_len=60, attn_bias=None)


def test_error_key_sequence_longer_than_max_seq_len_k():
    with pytest.raises(tf.errors.InvalidArgumentError, match="> max_seq_len_k = 60"):
        _call(max_seq_len_k=60)


def test_error_more_queries_than_keys():
    q, k, v, oq, ok = make(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="more queries"):
        _call(q, k[:-1], v[:-1], oq, tf.constant([0, 5, 5, 75, 75], tf.int64))


def test_error_heads_not_divisible():
    q, k, v, _, _ = make(tf.float32, nq=3, nk=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="multiple of the number of key"):
        _call(q, k, v)


def test_error_head_dims_differ():
    q, _, _, _, _ = make(tf.float32, dqk=5)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="head dim|Dimension"):
        _call(q=q)


def test_error_k_v_rows_differ():
    _, _, v, _, _ = make(tf.float32, lens_q=[1, 2])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="same rows|Dimension"):
        _call(v=v)


def test_error_wrong_rank():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank"):
        _call(q=tf.zeros([76, 32]))


def test_error_ragged_q_without_heads_axis():
    # issue 19 item 8: a ragged [B, (L), D] (heads axis forgotten) names the layout expected.
    rq = tf.RaggedTensor.from_row_lengths(tf.ones([9, 16]), tf.constant([2, 3, 4], tf.int64))
    with pytest.raises(ValueError, match=r"a ragged q must be \[B, \(L\), N, D\] .* got a "
                       r"tf.RaggedTensor \[3, \(L\), 16\] \(ragged_rank 1\): add the heads axis"):
        recops_tf.hstu_attention(rq, rq, rq, max_seq_len=8)


def test_error_ragged_k_not_ragged():
    rq = tf.RaggedTensor.from_row_lengths(tf.ones([4, 1, 2]), tf.constant([4], tf.int64))
    with pytest.raises(TypeError, match=r"with a ragged q, k must be a tf.RaggedTensor too, got "
                       r"a dense tensor \[4, 1, 2\]"):
        recops_tf.hstu_attention(rq, rq.values, rq, max_seq_len=4)


def test_error_integer_q():
    # issue 19 item 9: one short message naming the argument, not the NodeDef.
    with pytest.raises(TypeError, match="^hstu_attention: q must be float32, float16, bfloat16 "
                       "or float64, got int32$"):
        _call(q=tf.ones([76, 4, 8], tf.int32))


def test_error_mixed_float_dtypes():
    q, k, v, _, _ = make(tf.float64, lens_k=LENS_K)
    with pytest.raises(TypeError, match="^hstu_attention: k is float32 but q is float64; they "
                       "must have the same dtype$"):
        _call(q, tf.cast(k, tf.float32), v)
    with pytest.raises(TypeError, match="attn_bias is float32 but q is float64"):
        _call(q, k, v, attn_bias=plane(tf.float32))


@pytest.mark.parametrize("arg", ["max_seq_len", "max_seq_len_k"])
def test_error_max_seq_len_not_positive(arg):
    with pytest.raises(ValueError, match=f"^hstu_attention: {arg} must be a positive int, got 0$"):
        _call(**{arg: 0})
    q, k, v, oq, ok = make(tf.float32)
    with pytest.raises(ValueError, match=f"^hstu_attention_paged: {arg} must be a positive int"):
        recops_tf.hstu_attention_paged(
            q, k, v, tf.zeros([1, 2, 4, 2, 8]), seq_offsets=oq, page_offsets=[0, 1, 2, 3, 4],
            page_ids=[0, 0, 0, 0], last_page_len=[1, 1, 1, 1], num_target=[0, 0, 0, 0],
            **{"max_seq_len": 72, "max_seq_len_k": 72, arg: 0})


def test_error_bias_shape():
    with pytest.raises(tf.errors.InvalidArgumentError, match="attn_bias must have shape"):
        _call(attn_bias=tf.zeros([4, 1, MAX_Q, MAX_K]))


def test_error_mask_shape():
    with pytest.raises(tf.errors.InvalidArgumentError, match="mask must have shape"):
        _call(mask_type="custom", mask=tf.zeros([4, 4, MAX_Q, 3]))


def test_error_custom_mask_missing():
    with pytest.raises(ValueError, match="needs a mask"):
        _call(mask_type="custom")


def test_error_mask_without_custom():
    with pytest.raises(ValueError, match="use 'custom'"):
        _call(mask=plane(tf.float32))


def test_error_upper_triangular_rejected():
    with pytest.raises(ValueError, match="not supported"):
        _call(mask_type="upper triangular")


def test_error_unknown_mask_type():
    with pytest.raises(ValueError, match="mask_type must be one of"):
        _call(mask_type="diagonal")


def test_error_counts_length():
    with pytest.raises(tf.errors.InvalidArgumentError, match="one entry per sequence"):
        _call(num_context=[1, 0])


def test_error_negative_count():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"num_target\[2\] = -1"):
        _call(num_target=[0, 0, -1, 0])


def test_error_context_plus_target_too_long():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"num_context\[0\] \+ num_target\[0\] = 4 \+ 2"):
        _call(num_context=[4, 0, 0, 0], num_target=[2, 0, 0, 0])


def test_error_counts_need_causal():
    with pytest.raises(tf.errors.InvalidArgumentError, match="need mask_type 'causal'"):
        _call(num_target=[1, 0, 1, 0], mask_type="none")


def test_error_negative_target_group_size():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="target_group_size"):
        _call(target_group_size=-1)


def test_error_bad_window():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="window_left"):
        _call(window_size=(-2, 0))


def test_error_grad_shape():
    q, k, v, oq, ok = make(tf.float32)
    from recops_tf import _loader

    with pytest.raises(tf.errors.InvalidArgumentError, match="grad must have shape"):
        _loader.load().recops_hstu_dense_backward(
            tf.zeros([3, 4, 6]), q, k, v, oq, ok, tf.zeros([0], tf.int64),
            tf.zeros([0], tf.int64), tf.zeros([0]), tf.zeros([0]), tf.zeros([0], tf.int64),
            tf.zeros([0]), tf.zeros([0]), max_seq_len=MAX_Q, max_seq_len_k=MAX_K)


# ---- paged KV-cache forward --------------------------------------------------------------

PAGE = 4


def paged_problem(dtype=tf.float32, nq=4, nk=2, dim=6, seed=0):
    # Three sequences: 6 cached keys (2 pages) + 3 new tokens (2 targets); 0 pages + 2 new
    # tokens (both targets); 4 cached (1 full page) + 1 new token (0 targets).
    new, targets = [3, 2, 1], [2, 2, 0]
    q = random_values([6, nq, dim], dtype, seed)
    k = random_values([6, nk, dim], dtype, seed + 1)
    v = random_values([6, nk, dim], dtype, seed + 2)
    cache = random_values([5, 2, PAGE, nk, dim], dtype, seed + 3)
    return dict(q=q, k=k, v=v, kv_cache=cache, seq_offsets=offsets(new),
                page_offsets=offsets([2, 0, 1]), page_ids=tf.constant([4, 1, 2], tf.int64),
                last_page_len=tf.constant([2, 1, 4], tf.int64),
                num_target=tf.constant(targets, tf.int64))


def paged(args, **kw):
    kw.setdefault("max_seq_len", 4)
    kw.setdefault("max_seq_len_k", 12)
    a = dict(args)
    return recops_tf.hstu_attention_paged(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("kv_cache"),
                                          **a, **kw)


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_paged_matches_reference(dtype, group):
    args = paged_problem(dtype)
    out = paged(args, target_group_size=group, alpha=0.9, silu_scale=0.5)
    a64 = {k: (tf.cast(v, tf.float64) if v.dtype.is_floating else v) for k, v in args.items()}
    expected = ref.hstu_attention_paged(a64["q"], a64["k"], a64["v"], a64["kv_cache"],
                                        a64["seq_offsets"], a64["page_offsets"],
                                        a64["page_ids"], a64["last_page_len"],
                                        a64["num_target"], 4, 12, alpha=0.9, silu_scale=0.5,
                                        target_group_size=group)
    assert_close(out, expected, dtype, magnitude=2.0, reduction=12)


def test_paged_equals_attention_on_the_assembled_keys():
    args = paged_problem(tf.float64)
    keys, values, offsets_k = ref.paged_keys(args["k"], args["v"], args["kv_cache"],
                                             args["seq_offsets"], args["page_offsets"],
                                             args["page_ids"], args["last_page_len"],
                                             args["num_target"])
    direct = recops_tf.hstu_attention(args["q"], keys, values, seq_offsets=args["seq_offsets"],
                                      seq_offsets_k=offsets_k, max_seq_len=4, max_seq_len_k=12,
                                      num_target=args["num_target"], target_group_size=1)
    assert_close(paged(args), direct, tf.float64)


def random_paged(dtype, lengths, page, nq=4, nk=2, dim=8, seed=0):
    """A paged problem of sequences (cached keys, new tokens, targets) = lengths."""
    rng = np.random.default_rng(seed)
    cache_len = np.array([c for c, _, _ in lengths])
    new = [n for _, n, _ in lengths]
    pages_per = -(-cache_len // page)
    num_pages = int(pages_per.sum()) + 1
    last = np.where(pages_per > 0, cache_len - (pages_per - 1) * page, 1)
    rows = int(sum(new))
    return dict(q=random_values([rows, nq, dim], dtype, seed),
                k=random_values([rows, nk, dim], dtype, seed + 1),
                v=random_values([rows, nk, dim], dtype, seed + 2),
                kv_cache=random_values([num_pages, 2, page, nk, dim], dtype, seed + 3),
                seq_offsets=offsets(new), page_offsets=offsets(pages_per),
                page_ids=tf.constant(rng.permutation(num_pages)[:pages_per.sum()], tf.int64),
                last_page_len=tf.constant(last, tf.int64),
                num_target=tf.constant([t for _, _, t in lengths], tf.int64))


# Decode steps (at most 16 query rows per kv head: 2 q heads x up to 4 tokens) read the pages
# in place; longer query sequences take the gathered-keys path. Caches span several 64-key
# chunks, partial last pages, no pages at all, and targets.
DECODE = [(150, 4, 2), (0, 2, 2), (64, 1, 0), (97, 3, 1), (33, 4, 4), (1, 1, 1)]
PREFILL = DECODE[:3] + [(40, 12, 3), (130, 9, 0)]


@pytest.mark.parametrize("page", [32, 128])
@pytest.mark.parametrize("lengths", [DECODE, PREFILL], ids=["decode", "prefill"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_paged_decode_and_prefill_match_reference(dtype, lengths, page):
    args = random_paged(dtype, lengths, page)
    kw = dict(max_seq_len=13, max_seq_len_k=170, target_group_size=1, alpha=0.7)
    out = paged(args, **kw)
    a64 = {k: (tf.cast(v, tf.float64) if v.dtype.is_floating else v) for k, v in args.items()}
    expected = ref.hstu_attention_paged(a64["q"], a64["k"], a64["v"], a64["kv_cache"],
                                        a64["seq_offsets"], a64["page_offsets"],
                                        a64["page_ids"], a64["last_page_len"],
                                        a64["num_target"], 13, 170, alpha=0.7,
                                        target_group_size=1)
    assert_close(out, expected, dtype, magnitude=2.0, reduction=170)


@pytest.mark.parametrize("dim", [3, 20, 64])
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_paged_decode_head_dims_match_reference(dtype, dim):
    # Head dimensions below, between and at whole vectors (the decode path's dot products run
    # in vectors over D with a scalar tail), 4 query heads on 2 kv heads.
    args = random_paged(dtype, DECODE, 32, dim=dim)
    kw = dict(max_seq_len=13, max_seq_len_k=170, target_group_size=1)
    a64 = {k: (tf.cast(v, tf.float64) if v.dtype.is_floating else v) for k, v in args.items()}
    expected = ref.hstu_attention_paged(a64["q"], a64["k"], a64["v"], a64["kv_cache"],
                                        a64["seq_offsets"], a64["page_offsets"],
                                        a64["page_ids"], a64["last_page_len"],
                                        a64["num_target"], 13, 170, target_group_size=1)
    assert_close(paged(args, **kw), expected, dtype, magnitude=2.0, reduction=170)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_paged_decode_agrees_with_the_gathered_path(dtype):
    # The same sequences, alone (the in-place decode path) and next to one with 12 new tokens
    # (every sequence then takes the gathered path): the decode path sums each score over the
    # head dimension in another order, and nothing else differs, so the shared rows agree to a
    # few units in the last place.
    kw = dict(max_seq_len=13, max_seq_len_k=170, target_group_size=1)
    both = random_paged(dtype, DECODE + [(50, 12, 2)], 32, dim=20)
    batch = len(DECODE)
    rows = int(both["seq_offsets"][batch])
    pages = int(both["page_offsets"][batch])
    alone = dict(both, q=both["q"][:rows], k=both["k"][:rows], v=both["v"][:rows],
                 seq_offsets=both["seq_offsets"][:batch + 1],
                 page_offsets=both["page_offsets"][:batch + 1],
                 page_ids=both["page_ids"][:pages], last_page_len=both["last_page_len"][:batch],
                 num_target=both["num_target"][:batch])
    decode, gathered = paged(alone, **kw).numpy(), paged(both, **kw).numpy()[:rows]
    eps = np.finfo(dtype.as_numpy_dtype).eps
    np.testing.assert_allclose(decode, gathered, rtol=0, atol=256 * eps * np.abs(gathered).max())
    assert not np.array_equal(decode, np.zeros_like(decode))


def test_paged_inside_function():
    args = paged_problem()
    f = tf.function(lambda a: paged(a))
    assert_close(f(args), paged(args), tf.float32)


def test_paged_has_no_gradient():
    args = paged_problem()
    with pytest.raises(NotImplementedError, match="inference"):
        with tf.GradientTape() as tape:
            tape.watch(args["q"])
            loss = tf.reduce_sum(paged(args))
        tape.gradient(loss, args["q"])


def test_paged_error_page_id_out_of_range():
    args = paged_problem()
    args["page_ids"] = tf.constant([4, 5, 2], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"page_ids\[1\] = 5 is out of range"):
        paged(args)


@pytest.mark.parametrize("bad", [0, PAGE + 1])
def test_paged_error_last_page_len(bad):
    args = paged_problem()
    args["last_page_len"] = tf.constant([bad, 1, 4], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"last_page_len\[0\] = {bad}"):
        paged(args)


def test_paged_error_too_many_targets():
    args = paged_problem()
    args["num_target"] = tf.constant([4, 2, 0], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"num_target\[0\] = 4 must lie"):
        paged(args)


def test_paged_error_cache_shape():
    args = paged_problem()
    args["kv_cache"] = tf.zeros([5, 3, PAGE, 2, 6])
    with pytest.raises(tf.errors.InvalidArgumentError, match="kv_cache must have shape"):
        paged(args)


def test_paged_error_page_offsets():
    args = paged_problem()
    args["page_offsets"] = offsets([2, 0, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"page_offsets\[-1\] = 4"):
        paged(args)


def test_paged_error_fewer_keys_than_queries():
    args = paged_problem()
    args["page_offsets"] = offsets([0, 0, 1])
    args["page_ids"] = tf.constant([2], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="more queries"):
        paged(args)


def test_paged_error_keys_longer_than_max_seq_len_k():
    with pytest.raises(tf.errors.InvalidArgumentError, match="> max_seq_len_k = 5"):
        paged(paged_problem(), max_seq_len_k=5)


# ---- cached forward (new tokens over cached rows, read in place) ---------------------------
CACHED_MAX = 80


def cached_problem(dtype=tf.float32, past=9, new=3, heads=2, dqk=6, dv=5, bias=True, seed=0):
    """Cached rows [past, W] with every head's keys at column 3 and values after a gap of 2."""
    width = 3 + heads * dqk + 2 + heads * dv
    args = dict(q=random_values([new, heads, dqk], dtype, seed),
                k=random_values([new, heads, dqk], dtype, seed + 1),
                v=random_values([new, heads, dv], dtype, seed + 2),
                rows=random_values([past, width], dtype, seed + 3),
                key_column=3, value_column=3 + heads * dqk + 2)
    if bias:
        rng = np.random.default_rng(seed)
        args.update(timestamps=tf.constant(np.cumsum(rng.integers(0, 90_000, past + new)),
                                           tf.int64),
                    time_bias_weights=random_values([24], dtype, seed + 4),
                    position_bias_weights=random_values([2 * CACHED_MAX - 1], dtype, seed + 5))
    return args


def cached(args, **kw):
    a = dict(args)
    return recops_tf.hstu_attention_cached(a.pop("q"), a.pop("k"), a.pop("v"), a["rows"],
                                           a.pop("rows"), max_seq_len=CACHED_MAX, alpha=0.8,
                                           **{**a, **kw})


def tiled_on_concatenated(args):
    """The tiled kernel's delta layout on the cached keys concatenated before the new ones."""
    q, k, v, rows = args["q"], args["k"], args["v"], args["rows"]
    heads, dqk, dv = q.shape[1], q.shape[2], v.shape[2]
    kc, vc = args["key_column"], args["value_column"]
    keys = tf.concat([tf.reshape(rows[:, kc:kc + heads * dqk], [-1, heads, dqk]), k], 0)
    values = tf.concat([tf.reshape(rows[:, vc:vc + heads * dv], [-1, heads, dv]), v], 0)
    bias = {key: args[key] for key in ("timestamps", "time_bias_weights",
                                       "position_bias_weights") if key in args}
    return recops_tf.hstu_attention(q, keys, values, seq_offsets=offsets([q.shape[0]]),
                                    seq_offsets_k=offsets([keys.shape[0]]),
                                    max_seq_len=CACHED_MAX, max_seq_len_k=CACHED_MAX, alpha=0.8,
                                    **bias)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("past,new,bias", [(9, 3, True), (9, 1, False), (0, 4, True),
                                           (70, 2, True)])
def test_cached_equals_the_tiled_kernel_on_concatenated_keys(dtype, past, new, bias):
    args = cached_problem(dtype, past, new, bias=bias)
    assert_close(cached(args), tiled_on_concatenated(args), dtype)
    assert_close(cached(args, kernel="reference"), tiled_on_concatenated(args), dtype)


def test_cached_equals_the_last_rows_of_the_whole_sequence():
    args = cached_problem(tf.float64, past=12, new=3, heads=1)
    whole = tiled_on_concatenated(dict(args, q=tf.concat([tf.zeros([12, 1, 6], tf.float64),
                                                          args["q"]], 0)))
    # queries of the whole sequence: the last 3 rows are the new tokens'
    np.testing.assert_allclose(cached(args).numpy(), whole.numpy()[12:], rtol=1e-12, atol=1e-14)


def test_cached_inside_function_and_no_gradient():
    args = cached_problem()
    assert_close(tf.function(lambda a: cached(a))(args), cached(args), tf.float32)
    with pytest.raises(NotImplementedError, match="inference"):
        with tf.GradientTape() as tape:
            tape.watch(args["q"])
            loss = tf.reduce_sum(cached(args))
        tape.gradient(loss, args["q"])


@pytest.mark.parametrize("change,message", [
    (dict(k=tf.zeros([2, 2, 6])), "k must have q's shape"),
    (dict(key_column=20), "columns: key_column 20"),
    (dict(value_column=20), "columns: value_column 20"),
    (dict(timestamps=tf.zeros([5], tf.int64)), "timestamps must have one entry per token"),
    (dict(position_bias_weights=tf.zeros([7])), r"position_bias_weights must have shape \[159\]"),
    (dict(q=tf.zeros([3, 2, 513]), k=tf.zeros([3, 2, 513])), "head dims must be at most 512"),
])
def test_cached_errors(change, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        cached({**cached_problem(), **change})


def test_cached_errors_before_the_op():
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than max_seq_len 80"):
        cached(cached_problem(past=79, new=2, bias=False))
    with pytest.raises(ValueError, match="key_column and value_column must be >= 0"):
        cached(cached_problem(), key_column=-1)
    with pytest.raises(ValueError, match="time_bias_weights need timestamps"):
        cached({**cached_problem(), "timestamps": None})


# ---- the two backward paths ---------------------------------------------------------------
# Many (sequence, kv head) pairs take the one-pass backward; a single sequence takes the
# two-pass one. Both must match the reference and each other bit for bit.

def _grads(q, k, v, oq, ok, bias, upstream):
    watched = [q, k, v] + ([bias] if bias is not None else [])
    with tf.GradientTape() as tape:
        tape.watch(watched)
        out = recops_tf.hstu_attention(q, k, v, seq_offsets=oq, seq_offsets_k=ok,
                                       max_seq_len=MAX_Q, max_seq_len_k=MAX_K, attn_bias=bias)
        loss = tf.reduce_sum(out * upstream)
    return tape.gradient(loss, watched)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_one_pass_backward_matches_reference(dtype):
    q, k, v, oq, ok = make(dtype, nq=4, nk=4, lens_k=LENS_K)  # 12 items: one-pass path
    kw = {"num_context": [1, 0, 6, 0], "num_target": [2, 0, 9, 1], "target_group_size": 2}
    bias = plane(dtype)
    fused = lambda q, k, v, b: fused_fn(oq, ok, attn_bias=b, **kw)(q, k, v)  # noqa: E731
    reference = lambda q, k, v, b: ref_fn(oq, ok, attn_bias=b, **kw)(q, k, v)  # noqa: E731
    assert_gradients_match_reference(fused, reference, [q, k, v, bias], [0, 1, 2, 3], dtype,
                                     magnitude=3.0, reduction=70)


# Without a bias, diagonal tiles are computed per row block up to each block's last visible
# key (a different code path from the whole-tile one a bias forces).
@pytest.mark.parametrize("with_bias", [True, False])
def test_backward_paths_agree_bit_for_bit(with_bias):
    q, k, v, oq, ok = make(tf.float32, nq=4, nk=4, lens_k=LENS_K)
    bias = plane(tf.float32) if with_bias else None
    upstream = random_values([76, 4, 6], tf.float32, 99)
    batch = _grads(q, k, v, oq, ok, bias, upstream)  # one-pass
    b = 2  # the 70-row sequence alone: two-pass
    q2, k2, v2 = q[5:75], k[9:79], v[9:79]
    alone = _grads(q2, k2, v2, offsets([70]), offsets([70]),
                   bias[b:b + 1] if with_bias else None, upstream[5:75])
    np.testing.assert_array_equal(batch[0][5:75].numpy(), alone[0].numpy())
    np.testing.assert_array_equal(batch[1][9:79].numpy(), alone[1].numpy())
    np.testing.assert_array_equal(batch[2][9:79].numpy(), alone[2].numpy())
    if with_bias:
        np.testing.assert_array_equal(batch[3][b].numpy(), alone[3][0].numpy())
    # Keys of the sequence without queries get zero gradients (the kernel writes them: output
    # memory is reused, so repeated calls would expose rows it left unwritten).
    for scale in [1.0, 2.0, 3.0, 4.0]:
        grads = _grads(q, k, v, oq, ok, bias, upstream * scale)
        np.testing.assert_array_equal(grads[1][7:9].numpy(), np.zeros([2, 4, 8], np.float32))
        np.testing.assert_array_equal(grads[2][7:9].numpy(), np.zeros([2, 4, 6], np.float32))


# Many short sequences (at least 4 per thread) run as one item per sequence, its heads in turn
# after its rows are prefetched (HstuGroupBySequence); a sequence alone runs head by head.
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_sequences_grouped_agree_with_sequences_alone_bit_for_bit(dtype):
    lens = [17, 0, 64, 3, 70, 1, 40, 9, 33, 5, 64, 2, 28, 11, 50, 7, 1, 66, 12, 30, 4, 45, 8, 20]
    q, k, v, oq, _ = make(dtype, nq=4, nk=2, lens_q=lens, seed=5)
    upstream = random_values([sum(lens), 4, 6], dtype, 98)
    batch = _grads(q, k, v, oq, oq, None, upstream)
    out = fused_fn(oq, oq)(q, k, v)
    start = 0
    for n in lens:
        rows = slice(start, start + n)
        alone = _grads(q[rows], k[rows], v[rows], offsets([n]), offsets([n]), None,
                       upstream[rows])
        np.testing.assert_array_equal(
            out[rows].numpy(), fused_fn(offsets([n]), offsets([n]))(q[rows], k[rows], v[rows]))
        for got, want in zip(batch, alone):
            np.testing.assert_array_equal(got[rows].numpy(), want.numpy())
        start += n
    assert_matches_reference(fused_fn(oq, oq), ref_fn(oq, oq), [q, k, v], dtype)


# ---- fused relative attention bias (time buckets + relative positions) -------------------

NUM_BUCKETS = 23


def rel_inputs(dtype, lens_k=LENS_K, seed=20, spread=10**6):
    """Sorted per-sequence timestamps (one per key row) and the two weight vectors."""
    rng = np.random.default_rng(seed)
    ts = np.concatenate([np.sort(rng.integers(0, spread, size=n)) for n in lens_k])
    time_w = random_values([NUM_BUCKETS], dtype, seed + 1)
    pos_w = random_values([2 * MAX_K - 1], dtype, seed + 2)
    return tf.constant(ts, tf.int64), time_w, pos_w


REL_VARIANTS = {
    "time_and_position": {},
    "time_only": {"_no_pos": True},
    "position_only": {"_no_time": True},
    "context_target_group2": {"num_context": [1, 0, 6, 0], "num_target": [2, 0, 9, 1],
                              "target_group_size": 2},
    "window_alpha": {"window_size": (9, 0), "alpha": 0.6},
}


def rel_case(variant, dtype, nk=2):
    q, k, v, oq, ok = make(dtype, nk=nk, lens_k=LENS_K)
    ts, time_w, pos_w = rel_inputs(dtype)
    kw = dict(REL_VARIANTS[variant])
    time_w = None if kw.pop("_no_time", False) else time_w
    pos_w = None if kw.pop("_no_pos", False) else pos_w
    args, names = [q, k, v], []
    for w, name in ((time_w, "time_bias_weights"), (pos_w, "position_bias_weights")):
        if w is not None:
            args.append(w)
            names.append(name)
    kw["timestamps"] = ts if time_w is not None else None

    def call(fn):
        def f(q, k, v, *weights):
            return fn(q, k, v, **dict(zip(names, weights)))
        return f
    return args, call(fused_fn(oq, ok, **kw)), call(ref_fn(oq, ok, **kw))


@pytest.mark.parametrize("variant", sorted(REL_VARIANTS))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_relative_bias_matches_reference(dtype, variant):
    args, fused, reference = rel_case(variant, dtype)
    assert_matches_reference(fused, reference, args, dtype, magnitude=2.0, reduction=70)
    assert_gradients_match_reference(fused, reference, args, list(range(len(args))), dtype,
                                     magnitude=3.0, reduction=400)


@pytest.mark.parametrize("nk", [4, 1])
def test_relative_bias_gqa_and_function(nk):
    args, fused, reference = rel_case("time_and_position", tf.float32, nk=nk)
    f = in_mode(fused, "function", args)
    assert_gradients_match_reference(f, reference, args, [0, 1, 2, 3, 4], tf.float32,
                                     magnitude=3.0, reduction=400)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_relative_bias_equals_dense_bias_from_the_separate_ops(dtype):
    """The fused bias equals attn_bias built by relative_attn_bias_time + the Toeplitz
    position bias (self-attention, so query i is key i): the same bits forward and for
    dq / dk / dv; the weights' gradients agree (the dense path sums dS in the input dtype)."""
    lens = [5, 0, 70, 1]
    q, k, v, oq, _ = make(dtype, lens_q=lens)
    ts, time_w, pos_w = rel_inputs(dtype, lens_k=lens)
    dense_ts = tf.RaggedTensor.from_row_splits(ts, oq).to_tensor(shape=[4, MAX_Q])

    def fused(q, k, v, tw, pw):
        return recops_tf.hstu_attention(q, k, v, seq_offsets=oq, max_seq_len=MAX_Q,
                                        timestamps=ts, time_bias_weights=tw,
                                        position_bias_weights=pw, alpha=0.8)

    def separate(q, k, v, tw, pw):
        time_bias, _ = recops_tf.relative_attn_bias_time(dense_ts, tw[None], duplicate=False)
        pos_bias, _ = recops_tf.toeplitz_position_bias(pw, duplicate=False)
        bias = tf.broadcast_to((time_bias[0] + pos_bias[None])[:, None], [4, 4, MAX_Q, MAX_Q])
        return recops_tf.hstu_attention(q, k, v, seq_offsets=oq, max_seq_len=MAX_Q,
                                        attn_bias=bias, alpha=0.8)

    args = [q, k, v, time_w, pos_w]
    upstream = random_values([sum(lens), 4, 6], dtype, 3)
    results = []
    for fn in (fused, separate):
        with tf.GradientTape() as tape:
            tape.watch(args)
            out = fn(*args)
            loss = tf.reduce_sum(tf.cast(out * upstream, tf.float32))
        results.append([out] + [tf.convert_to_tensor(g) for g in tape.gradient(loss, args)])
    for a, b in zip(results[0][:4], results[1][:4]):
        np.testing.assert_array_equal(tf.cast(a, tf.float32).numpy(),
                                      tf.cast(b, tf.float32).numpy())
    for a, b in zip(results[0][4:], results[1][4:]):
        assert_close(a, tf.cast(b, tf.float64), dtype, magnitude=3.0, reduction=400)


def test_relative_bias_layouts():
    args, fused, _ = rel_case("time_and_position", tf.float32)
    q, k, v, time_w, pos_w = args
    _, _, _, oq, ok = make(tf.float32, lens_k=LENS_K)
    ts = rel_inputs(tf.float32)[0]
    expected = fused(*args)
    rq, rk, rv, rts = (tf.RaggedTensor.from_row_splits(x, o)
                       for x, o in ((q, oq), (k, ok), (v, ok), (ts, ok)))
    out = recops_tf.hstu_attention(rq, rk, rv, max_seq_len=MAX_Q, max_seq_len_k=MAX_K,
                                   timestamps=rts, time_bias_weights=time_w,
                                   position_bias_weights=pos_w)
    np.testing.assert_array_equal(out.values.numpy(), expected.numpy())
    # Dense [B, S] timestamps with dense q / k / v (two sequences of 8).
    dense_args = [tf.reshape(x[:16], [2, 8, x.shape[1], x.shape[2]]) for x in (q, k, v)]
    dts = tf.reshape(ts[:16], [2, 8])
    weights = dict(time_bias_weights=time_w, position_bias_weights=pos_w[MAX_K - 8:MAX_K + 7])
    dense = recops_tf.hstu_attention(*dense_args, timestamps=dts, **weights)
    jagged = recops_tf.hstu_attention(q[:16], k[:16], v[:16], seq_offsets=[0, 8, 16],
                                      max_seq_len=8, timestamps=ts[:16], **weights)
    np.testing.assert_array_equal(tf.reshape(dense, [16, 4, 6]).numpy(), jagged.numpy())


@pytest.mark.parametrize("divisor", [0.301, 0.05, 0.002])  # 0.002: the exact (loop) buckets
def test_relative_bias_buckets_equal_relative_attn_bias_time(divisor):
    """Timestamps spanning the whole int64 range, unsorted: each score's time bias is the
    weight of relative_attn_bias_time's bucket (weights = distinct powers of two, read back
    through a one-key attention)."""
    rng = np.random.default_rng(5)
    n = 40
    ts = rng.integers(-2**63, 2**63 - 1, size=n, dtype=np.int64)
    ts[:6] = [-2**63, 2**63 - 1, 0, 1, -1, 2**62]
    ts[6:20] = rng.integers(-50, 50, size=14)
    num_buckets = 30000 if divisor < 0.01 else 300
    time_w = tf.constant(rng.normal(size=[num_buckets]), tf.float64)
    _, buckets = recops_tf.relative_attn_bias_time(ts[None], time_w[None], divisor,
                                                   duplicate=False)
    expected = tf.gather(time_w, buckets[0])  # [n, n]
    # z = q.k + bias with q.k = 0; alpha 1, scale 1, mask none: out[i] = sum_j silu(b_ij) v_j;
    # v = one-hot rows read each silu(b_ij) back.
    q = tf.zeros([n, 1, 1], tf.float64)
    v = tf.eye(n, dtype=tf.float64)[:, None, :]
    out = recops_tf.hstu_attention(q, q, v, seq_offsets=[0, n], max_seq_len=n, silu_scale=1.0,
                                   mask_type="none", timestamps=ts, time_bias_weights=time_w,
                                   bucket_divisor=divisor)
    silu = lambda x: x * tf.sigmoid(x)  # noqa: E731
    np.testing.assert_allclose(out[:, 0, :].numpy(), silu(expected).numpy(), rtol=1e-15)


def test_relative_bias_numeric_gradients():
    lens = [3, 0, 4]
    q, k, v, oq, ok = make(tf.float64, nq=2, nk=1, dqk=3, dv=2, lens_q=lens, lens_k=[4, 1, 4])
    ts = tf.constant([0, 5, 100, 3000, 7, 1, 2, 50, 51], tf.int64)
    time_w = random_values([6], tf.float64, 1)
    pos_w = random_values([2 * MAX_K - 1], tf.float64, 2)
    f = lambda q, k, v, tw, pw: recops_tf.hstu_attention(  # noqa: E731
        q, k, v, seq_offsets=oq, seq_offsets_k=ok, max_seq_len=MAX_Q, max_seq_len_k=MAX_K,
        alpha=0.8, silu_scale=0.5, timestamps=ts, time_bias_weights=tw,
        position_bias_weights=pw)
    assert_numeric_gradient(f, [q, k, v, time_w, pos_w], [0, 1, 2, 3])
    # The position weights (2 * 72 - 1 of them, few used): against the composite's.
    reference = lambda q, k, v, tw, pw: ref.hstu_attention(  # noqa: E731
        q, k, v, oq, ok, MAX_Q, MAX_K, alpha=0.8, silu_scale=0.5, timestamps=ts,
        time_bias_weights=tw, position_bias_weights=pw)
    assert_gradients_match_reference(f, reference, [q, k, v, time_w, pos_w], [4], tf.float64)


def test_relative_bias_gradient_is_deterministic():
    args, fused, _ = rel_case("time_and_position", tf.float32, nk=4)
    upstream = random_values([76, 4, 6], tf.float32, 9)
    grads = []
    for _ in range(3):
        with tf.GradientTape() as tape:
            tape.watch(args)
            loss = tf.reduce_sum(fused(*args) * upstream)
        grads.append([g.numpy() for g in tape.gradient(loss, args)])
    for again in grads[1:]:
        for a, b in zip(grads[0], again):
            np.testing.assert_array_equal(a, b)


def _rel_call(**kw):
    ts, time_w, pos_w = rel_inputs(tf.float32)
    kw = {"timestamps": ts, "time_bias_weights": time_w, "position_bias_weights": pos_w, **kw}
    return _call(**kw)


def test_error_relative_bias_timestamps_length():
    with pytest.raises(tf.errors.InvalidArgumentError, match="one entry per key row"):
        _rel_call(timestamps=tf.zeros([5], tf.int64))


def test_error_relative_bias_no_buckets():
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least one bucket"):
        _rel_call(time_bias_weights=tf.zeros([0]))


def test_error_relative_bias_position_weights_length():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"2 \* max_seq_len_k - 1"):
        _rel_call(position_bias_weights=tf.zeros([2 * MAX_K]))


@pytest.mark.parametrize("divisor", [0.0, -1.0, float("inf")])
def test_error_relative_bias_divisor(divisor):
    with pytest.raises(tf.errors.InvalidArgumentError, match="bucket_divisor"):
        _rel_call(bucket_divisor=divisor)


def test_error_relative_bias_with_attn_bias():
    with pytest.raises(ValueError, match="cannot be combined"):
        _rel_call(attn_bias=plane(tf.float32))


def test_error_relative_bias_timestamps_without_weights():
    with pytest.raises(ValueError, match="go together"):
        _call(timestamps=rel_inputs(tf.float32)[0])


def test_error_relative_bias_with_attn_bias_raw_op():
    q, k, v, oq, ok = make(tf.float32, lens_k=LENS_K)
    ts, time_w, pos_w = rel_inputs(tf.float32)
    from recops_tf import _loader

    empty = tf.zeros([0], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="cannot be combined"):
        _loader.load().recops_hstu_dense_forward(
            q, k, v, oq, ok, empty, empty, tf.zeros([0]), plane(tf.float32), ts, time_w, pos_w,
            max_seq_len=MAX_Q, max_seq_len_k=MAX_K, has_bias=True, has_time_bias=True,
            has_position_bias=True)
