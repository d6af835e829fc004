"""M-FALCON (recops_tf.recommender.mfalcon): many candidates scored against one cached history
equal the naive reruns and one call with every candidate as a target; and the target mask
(g = 1) of hstu_attention against a float64 reference built from the mask's definition."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from recops_tf.layers import HSTUBlock
from recops_tf.ops.hstu_dense import hstu_attention
from recops_tf.recommender import mfalcon
from recops_tf.reference import hstu_dense as ref
from recops_tf.testing import FLOAT_DTYPES, assert_close, assert_gradients_match_reference
from recops_tf.testing.inputs import random_values

D_MODEL, HEADS, HEAD_DIM, MAX_LEN = 16, 2, 8, 128


def make_blocks(n=2, seed=0, max_seq_len=MAX_LEN, **kw):
    """n built blocks with random (not default) norm weights and biases."""
    keras.utils.set_random_seed(seed)
    blocks = [HSTUBlock(HEADS, HEAD_DIM, max_seq_len, target_group_size=1, alpha=0.9, **kw)
              for _ in range(n)]
    rng = np.random.default_rng(seed)
    for block in blocks:
        block.build((None, D_MODEL))
        for w in (block.uvqk_bias, block.norm_weight, block.norm_bias, block.out_bias):
            w.assign(rng.uniform(-0.5, 0.5, w.shape) + (1.0 if w is block.norm_weight else 0))
    return blocks


def rows(n, seed, width=D_MODEL):
    return tf.constant(np.random.default_rng(seed).uniform(-1, 1, (n, width)), tf.float32)


def single_call(blocks, history, targets):
    """Every target in one sequence: call([history + targets], num_targets=[m])."""
    x = tf.RaggedTensor.from_row_lengths(tf.concat([history, targets], 0),
                                         [history.shape[0] + targets.shape[0]])
    for block in blocks:
        x = block(x, num_targets=[targets.shape[0]])
    return x.flat_values[history.shape[0]:]


@pytest.fixture(scope="module")
def blocks():
    return make_blocks()


# (L, m, b_m, page_size): m not a multiple of b_m, m < b_m, page_size not dividing L, one
# history token, one page exactly full.
CASES = [(37, 70, 16, 8), (40, 5, 16, 32), (33, 64, 64, 32), (1, 3, 2, 32), (32, 17, 4, 32)]


@pytest.mark.parametrize("L, m, b, page", CASES)
def test_score_equals_rerun_equals_single_call(blocks, L, m, b, page):
    history, targets = rows(L, 1), rows(m, 2)
    cache = mfalcon.history_cache(blocks, history, page_size=page)
    scored = mfalcon.score_targets(blocks, cache, targets, micro_batch=b)
    assert scored.shape == (m, D_MODEL) and scored.dtype == tf.float32
    full = single_call(blocks, history, targets)
    assert_close(scored, full, tf.float32, magnitude=2.0)
    assert_close(mfalcon.rerun_targets(blocks, history, targets, micro_batch=b), full,
                 tf.float32, magnitude=2.0)
    looped = mfalcon.score_targets(blocks, cache, targets, micro_batch=b,
                                   micro_batches_per_call=2)
    assert_close(looped, scored, tf.float32, magnitude=2.0)


def test_history_cache_holds_the_forward_keys_and_values(blocks):
    history = rows(37, 3)
    cache = mfalcon.history_cache(blocks, history, page_size=8)
    assert [int(cache.length), int(cache.last_page_len)] == [37, 5]
    np.testing.assert_array_equal(cache.page_ids.numpy(), np.arange(5))
    x = tf.RaggedTensor.from_row_lengths(history, [37])
    for block, kv in zip(blocks, cache.kv_caches):
        assert kv.shape == (5, 2, 8, HEADS, HEAD_DIM)
        _, v, _, k = block.project(x.flat_values)
        flat = tf.reshape(tf.transpose(kv, [1, 0, 2, 3, 4]), [2, 40, HEADS * HEAD_DIM])
        assert_close(flat[0, :37], k, tf.float32)
        assert_close(flat[1, :37], v, tf.float32)
        assert not np.any(flat[:, 37:].numpy())
        x = block(x)


def test_targets_do_not_see_each_other(blocks):
    history, targets = rows(30, 4), rows(50, 5)
    cache = mfalcon.history_cache(blocks, history)
    changed = tf.concat([rows(7, 6), targets[7:8], rows(42, 7)], 0)
    a = mfalcon.score_targets(blocks, cache, targets, micro_batch=16)
    b = mfalcon.score_targets(blocks, cache, changed, micro_batch=16)
    np.testing.assert_array_equal(a[7].numpy(), b[7].numpy())
    assert np.abs((a - b).numpy()).max() > 1e-2  # the others did change
    # The same through one call with all targets (another order of sums: close, not equal),
    # and alone.
    assert_close(single_call(blocks, history, changed)[7], a[7], tf.float32, magnitude=2.0)
    assert_close(single_call(blocks, history, targets[7:8])[0], a[7], tf.float32,
                 magnitude=2.0)


def test_inside_function_with_dynamic_lengths_traces_once(blocks):
    spec = tf.TensorSpec([None, D_MODEL], tf.float32)

    @tf.function(input_signature=[spec, spec])
    def rank(history, targets):
        return mfalcon.score_targets(blocks, mfalcon.history_cache(blocks, history, 8),
                                     targets, micro_batch=16)

    @tf.function(input_signature=[spec, spec])
    def rerun(history, targets):
        return mfalcon.rerun_targets(blocks, history, targets, micro_batch=16)

    for L, m in [(20, 3), (37, 70), (9, 64), (37, 0)]:
        history, targets = rows(L, L), rows(m, m + 1)
        eager = mfalcon.score_targets(blocks, mfalcon.history_cache(blocks, history, 8),
                                      targets, micro_batch=16)
        assert_close(rank(history, targets), eager, tf.float32, magnitude=2.0)
        assert_close(rerun(history, targets), eager, tf.float32, magnitude=2.0)
    assert rank.experimental_get_tracing_count() == 1
    assert rerun.experimental_get_tracing_count() == 1


def test_saved_model_signature(blocks, tmp_path):
    spec = tf.TensorSpec([None, D_MODEL], tf.float32)
    module = tf.Module()
    module.blocks = blocks
    module.rank = tf.function(
        lambda history, targets: mfalcon.score_targets(
            blocks, mfalcon.history_cache(blocks, history), targets, micro_batch=16),
        input_signature=[spec, spec])
    tf.saved_model.save(module, str(tmp_path), signatures={"rank": module.rank})
    loaded = tf.saved_model.load(str(tmp_path))
    for L, m in [(25, 40), (3, 7)]:
        history, targets = rows(L, 20 + L), rows(m, 30 + m)
        out = loaded.signatures["rank"](history=history, targets=targets)["output_0"]
        assert_close(out, single_call(blocks, history, targets), tf.float32, magnitude=2.0)


def test_bfloat16_policy(mixed_bfloat16):
    blocks = make_blocks(seed=1)
    assert blocks[0].compute_dtype == "bfloat16"
    history, targets = rows(37, 8), rows(45, 9)
    cache = mfalcon.history_cache(blocks, history, page_size=8)
    assert cache.kv_caches[0].dtype == tf.bfloat16
    scored = mfalcon.score_targets(blocks, cache, targets, micro_batch=16)
    assert scored.dtype == tf.bfloat16
    # Two blocks, each rounding to bfloat16 and summing ~L terms in another order.
    kw = dict(magnitude=2.0, reduction=16)
    assert_close(scored, single_call(blocks, history, targets), tf.bfloat16, **kw)
    assert_close(mfalcon.rerun_targets(blocks, history, targets, micro_batch=16), scored,
                 tf.bfloat16, **kw)
    keras.mixed_precision.set_dtype_policy("float32")
    f32 = make_blocks(seed=1)
    for mine, theirs in zip(f32, blocks):
        for a, b in zip(mine.weights, theirs.weights):
            a.assign(b)
    expected = mfalcon.score_targets(f32, mfalcon.history_cache(f32, history, 8), targets, 16)
    assert_close(scored, expected, tf.bfloat16, **kw)


def test_stock_tf_blocks(blocks):
    stock = make_blocks(use_fused=False)
    for mine, theirs in zip(stock, blocks):
        mine.set_weights(theirs.get_weights())
    history, targets = rows(21, 10), rows(19, 11)
    expected = mfalcon.score_targets(blocks, mfalcon.history_cache(blocks, history), targets, 8)
    assert_close(mfalcon.score_targets(stock, mfalcon.history_cache(stock, history), targets,
                                       8), expected, tf.float32, magnitude=2.0)
    assert_close(mfalcon.rerun_targets(stock, history, targets, 8), expected, tf.float32,
                 magnitude=2.0)


def test_error_empty_history(blocks):
    for fn in (lambda h: mfalcon.history_cache(blocks, h),
               lambda h: mfalcon.rerun_targets(blocks, h, rows(3, 0))):
        with pytest.raises(ValueError, match="history_rows is empty"):
            fn(tf.zeros([0, D_MODEL]))
        traced = tf.function(fn, input_signature=[tf.TensorSpec([None, D_MODEL])])
        with pytest.raises(tf.errors.InvalidArgumentError, match="history_rows is empty"):
            traced(tf.zeros([0, D_MODEL]))


def test_error_rows_of_the_wrong_width(blocks):
    cache = mfalcon.history_cache(blocks, rows(10, 0))
    with pytest.raises(ValueError, match=r"target_rows must be \[n, 16\]"):
        mfalcon.score_targets(blocks, cache, rows(4, 1, width=12))
    with pytest.raises(ValueError, match=r"history_rows must be \[n, 16\]"):
        mfalcon.history_cache(blocks, rows(4, 1, width=17))
    with pytest.raises(ValueError, match=r"target_rows must be \[n, d_model\]"):
        mfalcon.score_targets(blocks, cache, tf.zeros([4]))
    traced = tf.function(lambda t: mfalcon.score_targets(blocks, cache, t),
                         input_signature=[tf.TensorSpec([None, None])])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"target_rows must be \[n, 16\]"):
        traced(rows(4, 1, width=12))


def test_error_blocks_that_let_targets_see_each_other(blocks):
    history = rows(5, 0)
    for bad in (HSTUBlock(HEADS, HEAD_DIM, MAX_LEN),  # target_group_size 0
                HSTUBlock(HEADS, HEAD_DIM, MAX_LEN, target_group_size=2)):
        with pytest.raises(ValueError, match="target_group_size=1"):
            mfalcon.history_cache([blocks[0], bad], history)
    with pytest.raises(ValueError, match="value_dim"):
        mfalcon.history_cache([HSTUBlock(HEADS, HEAD_DIM, MAX_LEN, value_dim=4,
                                         target_group_size=1)], history)
    with pytest.raises(ValueError, match="same"):
        mfalcon.history_cache([blocks[0], HSTUBlock(1, HEAD_DIM, MAX_LEN, target_group_size=1)],
                              history)
    cache = mfalcon.history_cache(blocks[:1], history)
    with pytest.raises(ValueError, match="the cache has 1 blocks"):
        mfalcon.score_targets(blocks, cache, rows(3, 1))
    with pytest.raises(ValueError, match="micro_batch"):
        mfalcon.score_targets(blocks[:1], cache, rows(3, 1), micro_batch=0)


def test_error_history_longer_than_max_seq_len():
    short = make_blocks(1, max_seq_len=16)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_seq_len"):
        mfalcon.history_cache(short, rows(17, 0))


def test_block_num_context_is_hstu_attentions(blocks):
    block = blocks[0]
    x = rows(12, 12)
    seq = tf.RaggedTensor.from_row_lengths(x, [12])
    out = block(seq, num_targets=[3], num_context=[4]).flat_values
    u, v, q, k = block.project(x)
    heads = lambda t: tf.reshape(t, [-1, HEADS, HEAD_DIM])  # noqa: E731
    attn = hstu_attention(heads(q), heads(k), heads(v), seq_offsets=[0, 12],
                          max_seq_len=MAX_LEN, alpha=block.alpha, num_context=[4],
                          num_target=[3], target_group_size=1)
    assert_close(out, block.finish(x, attn, u), tf.float32)
    plain = block(seq, num_targets=[3]).flat_values
    assert np.abs((out - plain)[:4].numpy()).max() > 1e-4  # context rows see further
    np.testing.assert_array_equal(out[4:].numpy(), plain[4:].numpy())


# ---- the target mask (g = 1) against its definition ----------------------------------------

def mask_from_definition(lq, lk, context, targets, group):
    """M(i, j) of one sequence, from the spec's rules (hstu_family.md §1, "Built-in causal
    mask"), written out element by element."""
    delta = lk - lq
    m = np.zeros((lq, lk))
    for i in range(lq):
        for j in range(lk):
            visible = j <= i + delta                                    # 1. causal
            if context > 0 and i < context and j < lk - targets:        # 2. context rows
                visible = True
            if group > 0 and targets > 0 and i >= lq - targets and j >= lk - targets:
                ii, jj = i - (lq - targets), j - (lk - targets)         # 3. target block
                visible = ii // group == jj // group and jj <= ii
            m[i, j] = visible
    return m


# Two sequences (history + targets; one longer than a 64-row tile), with and without context.
# The targets' q and k rows are 3x larger than the history's, so that target-target scores
# are large: a wrong target rule (targets seeing each other) is then far outside even the
# bfloat16 tolerance (each test also checks that it is).
SEQS = {"targets": dict(history=[9, 66], targets=[5, 6], context=[0, 0]),
        "context_targets": dict(history=[9, 66], targets=[5, 6], context=[3, 10])}
NQ, DIM, ALPHA, BOOST = 2, 8, 0.75, 3.0  # alpha: exact in the float32 attribute
GRAD_MAGNITUDE = 0.3  # the largest gradient entries (about 0.29)


class TestTargetMask:
    @staticmethod
    def problem(variant, dtype):
        p = SEQS[variant]
        lens = [h + t for h, t in zip(p["history"], p["targets"])]
        offsets = np.concatenate([[0], np.cumsum(lens)])
        total, smax = int(offsets[-1]), max(lens)
        boost = np.ones([total, 1, 1])
        for end, t in zip(offsets[1:], p["targets"]):
            boost[end - t:end] = BOOST
        q, k, v = (random_values([total, NQ, DIM], tf.float64, seed) for seed in (1, 2, 3))
        qkv = [tf.cast(x, dtype) for x in (q * boost, k * boost, v)]

        def masks(group):
            return [mask_from_definition(n, n, c, t, group)
                    for n, c, t in zip(lens, p["context"], p["targets"])]
        return qkv, offsets, smax, masks, p

    @staticmethod
    def fused(offsets, smax, p):
        def f(q, k, v):
            return hstu_attention(q, k, v, seq_offsets=tf.constant(offsets, tf.int64),
                                  max_seq_len=smax, alpha=ALPHA, num_target=p["targets"],
                                  num_context=p["context"], target_group_size=1)
        return f

    @staticmethod
    def scale(smax):
        return float(np.float32(1.0) / np.float32(smax))  # 1 / max_seq_len, in float

    @classmethod
    def numpy_formula(cls, q, k, v, offsets, smax, masks):
        """out = (silu(alpha q k^T) * c * M) v per sequence and head, float64 numpy."""
        q, k, v = (tf.cast(x, tf.float64).numpy() for x in (q, k, v))
        out = []
        for b, m in enumerate(masks):
            sl = slice(int(offsets[b]), int(offsets[b + 1]))
            z = ALPHA * np.einsum("ihd,jhd->hij", q[sl], k[sl])
            p = z / (1.0 + np.exp(-z)) * cls.scale(smax) * m
            out.append(np.einsum("hij,jhd->ihd", p, v[sl]))
        return np.concatenate(out)

    @classmethod
    def dense_tf(cls, offsets, smax, masks):
        """The same formula in TensorFlow ops (differentiable), sequence by sequence."""
        def f(q, k, v):
            out = []
            for b, m in enumerate(masks):
                sl = slice(int(offsets[b]), int(offsets[b + 1]))
                z = ALPHA * tf.einsum("ihd,jhd->hij", q[sl], k[sl])
                p = z * tf.sigmoid(z) * cls.scale(smax) * tf.constant(m, z.dtype)
                out.append(tf.einsum("hij,jhd->ihd", p, v[sl]))
            return tf.concat(out, 0)
        return f

    def test_mask_definition_g1(self):
        m = mask_from_definition(7, 7, 0, 3, 1)
        np.testing.assert_array_equal(m[:4], np.tril(np.ones((4, 7))))  # history: causal
        np.testing.assert_array_equal(m[4:, :4], np.ones((3, 4)))       # targets see history
        np.testing.assert_array_equal(m[4:, 4:], np.eye(3))             # and themselves only
        m = mask_from_definition(7, 7, 2, 3, 1)                         # context rows see
        np.testing.assert_array_equal(m[:2], np.ones((2, 7)) * (np.arange(7) < 4))  # history

    @pytest.mark.parametrize("variant", sorted(SEQS))
    def test_definition_equals_the_reference_visibility(self, variant):
        _, offsets, smax, masks, p = self.problem(variant, tf.float64)
        vis = ref.visibility(tf.constant(offsets), tf.constant(offsets), smax, smax,
                             num_context=tf.constant(p["context"]),
                             num_target=tf.constant(p["targets"]), target_group_size=1).numpy()
        for b, m in enumerate(masks(1)):
            n = m.shape[0]
            np.testing.assert_array_equal(vis[b, 0, :n, :n].astype(np.float64), m)

    @pytest.mark.parametrize("variant", sorted(SEQS))
    @pytest.mark.parametrize("dtype", FLOAT_DTYPES)
    def test_forward_matches_numpy_definition(self, dtype, variant):
        (q, k, v), offsets, smax, masks, p = self.problem(variant, dtype)
        expected = self.numpy_formula(q, k, v, offsets, smax, masks(1))
        out = self.fused(offsets, smax, p)(q, k, v)
        assert out.dtype == dtype
        kw = dict(magnitude=float(np.abs(expected).max()), reduction=smax)
        assert_close(out, expected, dtype, **kw)
        with pytest.raises(AssertionError):  # the tolerance tells the target rules apart
            assert_close(out, self.numpy_formula(q, k, v, offsets, smax, masks(0)), dtype, **kw)
        # The differentiable formula used for the gradients is the same function.
        assert_close(self.dense_tf(offsets, smax, masks(1))(*[tf.cast(x, tf.float64)
                                                              for x in (q, k, v)]),
                     expected, tf.float64)

    @pytest.mark.parametrize("variant", sorted(SEQS))
    @pytest.mark.parametrize("dtype", FLOAT_DTYPES)
    def test_gradients_match_float64_autodiff(self, dtype, variant):
        qkv, offsets, smax, masks, p = self.problem(variant, dtype)
        fused = self.fused(offsets, smax, p)
        kw = dict(magnitude=GRAD_MAGNITUDE, reduction=smax)
        assert_gradients_match_reference(fused, self.dense_tf(offsets, smax, masks(1)), qkv,
                                         [0, 1, 2], dtype, **kw)
        with pytest.raises(AssertionError):
            assert_gradients_match_reference(fused, self.dense_tf(offsets, smax, masks(0)),
                                             qkv, [0, 1, 2], dtype, **kw)
