"""Full-catalogue scoring by item blocks (``recops_tf.recommender.scoring``): the ranks equal
``evaluation.ranks`` and the top-k ``tf.math.top_k`` on integer-valued scores (ties
everywhere), with exclusions, sparse extras, blocks that do not divide the catalogue, a
catalogue narrower than a block and no rows; the NaN-safe path, the targets' re-reading; and
``training.evaluate`` equal to the whole-matrix ranker it replaced, on a model with the
seen-item bias, the transition prior and tied items."""
import numpy as np
import pytest
import tensorflow as tf

from recops_tf import recommender as rec
from recops_tf.recommender import evaluation, scoring, training
from recops_tf.recommender.model import last_states

BLOCKS = (1, 2, 3, 7, 16, 64, None)


def _case(rng, rows, num_items, d=3, stages=2, excluded=4):
    """Integer states and items in -2..2 (integer scores: ties everywhere), `stages` stages of
    distinct (row, item) pairs with integer values, per row up to `excluded` excluded items
    (duplicates and the target itself among them), and the reference ``[rows, N]`` scores."""
    states = rng.integers(-2, 3, (rows, d)).astype(np.float32)
    matrix = rng.integers(-2, 3, (num_items, d)).astype(np.float32)
    targets = rng.integers(1, num_items + 1, rows)
    scores = states @ matrix.T
    extras = []
    for _ in range(stages):
        pairs = sorted({(int(r), int(i)) for r, i in zip(rng.integers(0, max(rows, 1), 8),
                                                         rng.integers(1, num_items + 1, 8))})
        pairs = pairs if rows else []
        r = np.array([p[0] for p in pairs], np.int64)
        i = np.array([p[1] for p in pairs], np.int64)
        v = rng.integers(-2, 3, len(pairs)).astype(np.float32)
        scores[r, i - 1] += v
        extras.append((r, i, v))
    exclude = [rng.integers(1, num_items + 1, rng.integers(0, excluded + 1))
               for _ in range(rows)]
    for row in range(0, rows, 3):
        exclude[row] = np.append(exclude[row], [targets[row], exclude[row][:1]][0])
    return states, matrix, targets, extras, exclude, scores


def _ragged(rows):
    return tf.RaggedTensor.from_row_lengths(
        tf.constant(np.concatenate([np.asarray(r, np.int64) for r in rows] or
                                   [np.zeros(0, np.int64)])),
        tf.constant([len(r) for r in rows], tf.int64))


@pytest.fixture(params=["fast", "plain"])
def path(request, monkeypatch):
    """Both counting paths: the one-comparison path of finite scores and the NaN-safe one."""
    if request.param == "plain":
        monkeypatch.setattr(scoring, "_nan_free", lambda *args: tf.constant(False))
    return request.param


@pytest.mark.parametrize("block", BLOCKS)
def test_blocked_ranks_equal_evaluation_ranks(block, path):
    rng = np.random.default_rng(0 if block is None else block)
    for trial in range(12):
        rows, num_items = int(rng.integers(1, 9)), int(rng.integers(1, 40))
        states, matrix, targets, extras, exclude, scores = _case(rng, rows, num_items,
                                                                  stages=trial % 3)
        for excluded in (None, exclude):
            want = evaluation.ranks(scores, targets, excluded)
            got = scoring.blocked_ranks(
                states, matrix, targets, extras=extras, block=block,
                exclude=None if excluded is None else _ragged(excluded))
            np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{trial} {excluded}")


def test_blocked_ranks_in_a_function_with_a_temperature_and_pairs_to_exclude(path):
    rng = np.random.default_rng(5)
    states, matrix, targets, extras, exclude, scores = _case(rng, 9, 37)
    rows = np.repeat(np.arange(9), [len(e) for e in exclude])
    pairs = (rows, np.concatenate(exclude))
    # A power-of-two temperature keeps the scores integer: states / 0.5 == 2 x states.
    want = evaluation.ranks(2 * (states @ matrix.T) + (scores - states @ matrix.T), targets,
                            exclude)
    fn = tf.function(lambda s, m, t: scoring.blocked_ranks(
        s, m, t, temperature=0.5, extras=[(r, i, v) for r, i, v in extras], exclude=pairs,
        block=tf.constant(5)))
    np.testing.assert_array_equal(fn(states, matrix, targets).numpy(), want)


def test_no_rows_and_a_catalogue_narrower_than_a_block(path):
    got = scoring.blocked_ranks(np.zeros((0, 4), np.float32), np.ones((3, 4), np.float32),
                                np.zeros(0, np.int64), exclude=_ragged([]), block=8)
    assert got.shape == (0,) and got.dtype == tf.int64
    got = scoring.blocked_ranks(np.ones((2, 1), np.float32), np.ones((1, 1), np.float32),
                                [1, 1], block=8)
    np.testing.assert_array_equal(got.numpy(), [0, 0])


def test_nan_and_inf_scores_rank_as_evaluation_ranks():
    """NaN and inf scores (non-finite states or items, or a product past the float range):
    the plain path, whose NaN ranks nothing ahead, as the numpy definition's comparisons."""
    rng = np.random.default_rng(2)
    states, matrix, targets, _, exclude, _ = _case(rng, 8, 30, stages=0)
    states[1] = np.nan  # every score of row 1 NaN, its target's too: rank 0
    states[2, 0] = np.inf
    matrix[4] = [np.inf, 1, 0]
    matrix[7] = [-np.inf, 0, 0]
    huge = np.where(rng.integers(0, 2, (8, 3)) > 0, 2.0 ** 60, -2.0 ** 60).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for s in (states, huge):  # 2^60 x 2 x 3 > 1e36: the plain path; exact, finite scores
            scores = s.astype(np.float64) @ matrix.T.astype(np.float64)
            for excluded in (None, exclude):
                want = evaluation.ranks(scores.astype(np.float32), targets, excluded)
                for block in (1, 4, None):
                    got = scoring.blocked_ranks(s, matrix, targets, block=block,
                                                exclude=None if excluded is None
                                                else _ragged(excluded))
                    np.testing.assert_array_equal(got.numpy(), want)


def test_targets_scores_read_again_from_the_blocks(monkeypatch, path):
    """Where the targets' first scores (their [rows, rows] product) differ from the blocks'
    (another GEMM path), the counts are taken again with the blocks' values."""
    first = scoring._target_scores
    monkeypatch.setattr(scoring, "_target_scores", lambda *args: first(*args) + 0.5)
    rng = np.random.default_rng(3)
    states, matrix, targets, extras, exclude, scores = _case(rng, 7, 23)
    got = scoring.blocked_ranks(states, matrix, targets, extras=extras, exclude=_ragged(exclude),
                                block=4)
    np.testing.assert_array_equal(got.numpy(), evaluation.ranks(scores, targets, exclude))


def test_blocked_ranks_refuse_targets_outside_the_catalogue():
    for bad in ([0], [4]):
        with pytest.raises(tf.errors.InvalidArgumentError, match="targets"):
            scoring.blocked_ranks(np.ones((1, 2), np.float32), np.ones((3, 2), np.float32),
                                  bad)


def test_default_block_bounds_the_step():
    assert int(scoring.default_block(256)) == scoring.BLOCK_ELEMENTS // 256
    assert int(scoring.default_block(0)) == scoring.MAX_BLOCK
    assert int(scoring.default_block(1 << 20)) == scoring.MIN_BLOCK


@pytest.mark.parametrize("block", (1, 2, 5, 64, 1000))
def test_blocked_top_k_equals_tf_top_k_ties_included(block):
    rng = np.random.default_rng(block)
    for trial in range(10):
        rows, num_items = int(rng.integers(0, 6)), int(rng.integers(1, 50))
        states, matrix, _, extras, exclude, scores = _case(rng, rows, num_items,
                                                           stages=trial % 2)
        num = int(rng.integers(1, num_items + 1)) if trial % 3 == 0 else num_items
        excluded = trial % 4 != 0
        if excluded:
            for row, items in enumerate(exclude):
                scores[row, items - 1] = -np.inf
        scores[:, num:] = -np.inf  # rows past num_items: padding
        for k in sorted({1, 3, 7, num}):
            want = tf.math.top_k(scores, min(k, num))
            values, items = scoring.blocked_top_k(
                states, matrix, k, extras=extras, exclude=_ragged(exclude) if excluded else None,
                block=block, num_items=num)
            np.testing.assert_array_equal(items.numpy(), want.indices.numpy() + 1)
            np.testing.assert_array_equal(values.numpy(), want.values.numpy())


def test_blocked_top_k_by_block_maxima_in_wide_blocks():
    """Blocks of 32,768 items or more (whole TOP_K_BLOCKs) take the blocks' own top-k by
    maxima (``exporting.top_k_by_blocks``); few distinct scores: ties across the blocks."""
    rng = np.random.default_rng(7)
    num_items = 2 * scoring.BLOCKED_TOP_K_FROM + 3 * scoring.TOP_K_BLOCK
    states = rng.integers(-1, 2, (3, 2)).astype(np.float32)
    matrix = rng.integers(-1, 2, (num_items, 2)).astype(np.float32)
    scores = states @ matrix.T
    for k in (1, 100, 300):
        want = tf.math.top_k(scores, k)
        values, items = scoring.blocked_top_k(states, matrix, tf.constant(k),
                                              block=scoring.BLOCKED_TOP_K_FROM)
        np.testing.assert_array_equal(items.numpy(), want.indices.numpy() + 1)
        np.testing.assert_array_equal(values.numpy(), want.values.numpy())
    with pytest.raises(ValueError, match="static"):
        scoring.blocked_top_k(states, matrix, 1, block=tf.constant(4))


# -- the model's ranks: evaluate as before --------------------------------------------------
def _old_ranker(model, exclude_seen):
    """The ranker `training.ranker` was before the blocks: the ``[B, num_items]`` scores of
    ``model.scores``, the targets' ranks counted over the whole matrix."""
    @tf.function(input_signature=[training._SPEC] * 3 + [tf.TensorSpec([None], tf.int64)])
    def rank(items, timestamps, seen, targets):
        s = model.scores(last_states(model, items, timestamps), seen=items)
        rows = tf.range(tf.shape(s, out_type=tf.int64)[0])
        at = tf.stack([rows, targets - 1], 1)
        target = tf.gather_nd(s, at)
        if exclude_seen:
            gone = tf.stack([seen.value_rowids(), seen.flat_values - 1], 1)
            s = tf.tensor_scatter_nd_update(
                s, gone, tf.fill(tf.shape(gone)[:1], tf.constant(-np.inf, s.dtype)))
            s = tf.tensor_scatter_nd_update(s, at, target)
        ids = tf.range(1, tf.shape(s, out_type=tf.int64)[1] + 1)
        higher = tf.reduce_sum(tf.cast(s > target[:, None], tf.int64), 1)
        tied = tf.reduce_sum(tf.cast((s == target[:, None]) & (ids[None, :] < targets[:, None]),
                                     tf.int64), 1)
        return higher + tied
    return rank


@pytest.fixture(scope="module")
def tied_model():
    """A model with the seen-item bias and the transition prior (both non-zero), its three
    rarest items sharing one embedding (their scores tie where neither the bias nor the
    prior tells them apart), its leave-one-out split and the three items."""
    data = rec.synthetic(num_users=70, num_items=60, seed=4)
    split = rec.Split.leave_one_out(data)
    counted = evaluation.transitions(split.train()[0], data.num_items)
    config = rec.Config.from_preset("hstu", d_model=8, num_blocks=1, head_dim=8,
                                    max_seq_len=12, seen_bias=True, use_fused=False)
    model = training.build_model(config, data.num_items, transition_pairs=len(counted[1]))
    one = tf.RaggedTensor.from_row_lengths(tf.constant([1], tf.int64), tf.constant([1], tf.int64))
    model({"items": one, "timestamps": one}, training=False)
    model.set_transitions(counted)
    model.transition_weight.assign(0.7)
    model.seen_logit.assign(0.3)
    rare = np.argsort(np.bincount(np.concatenate(data.items), minlength=61)[1:])[:3] + 1
    table = model.item_embedding.embeddings
    for item in rare[1:]:
        table[item].assign(table[rare[0]])
    return model, split, rare


@pytest.mark.parametrize("exclude_seen", [False, True])
def test_ranker_equals_ranks_of_the_model_scores(tied_model, exclude_seen):
    model, split, rare = tied_model
    histories, stamps = split.history("test")
    targets, _ = split.targets("test")
    targets[:10] = list(rare) * 3 + [rare[1]]  # tied targets
    cut = lambda seqs: training._ragged([h[-12:] for h in seqs])  # noqa: E731
    scores = training.scorer(model)(cut(histories), cut(stamps)).numpy()
    tied = scores[:, rare - 1] == scores[:, rare[:1] - 1]
    assert tied.all(1).sum() > 10
    want = evaluation.ranks(scores, targets, histories if exclude_seen else None)
    for block in (None, 4):
        got = training.ranker(model, exclude_seen, block)(
            cut(histories), cut(stamps), training._ragged(histories), tf.constant(targets))
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("exclude_seen", [False, True])
def test_evaluate_equals_the_whole_matrix_ranker(tied_model, exclude_seen):
    model, split, _ = tied_model
    histories, stamps = split.history("valid")
    targets, _ = split.targets("valid")
    rank = _old_ranker(model, exclude_seen)
    cut = lambda seqs: training._ragged([h[-12:] for h in seqs])  # noqa: E731
    old = np.concatenate([
        rank(cut(histories[f:f + 32]), cut(stamps[f:f + 32]),
             training._ragged(histories[f:f + 32]), tf.constant(targets[f:f + 32])).numpy()
        for f in range(0, len(targets), 32)])
    want = evaluation.metrics(old)
    for block in (None, 7):
        assert training.evaluate(model, split, "valid", exclude_seen, batch_size=32,
                                 block=block) == want


def test_evaluate_batches_are_kept_per_protocol_and_batch(tied_model):
    """evaluate builds its ragged batches once per (which, length, users, batch) and keeps
    them on the split: the figures do not depend on the batch size nor on what was
    evaluated before, and a second validation reuses the batches."""
    model, split, _ = tied_model
    fresh = evaluation.Split(split.items, split.timestamps)
    assert training.eval_batch_size(model.max_seq_len) >= training.MIN_EVAL_BATCH
    whole = training.evaluate(model, fresh, "valid")  # one batch: the default size
    kept = fresh.__dict__["_recops_eval_batches"]
    (key, batches), = kept.items()
    assert len(batches) == 1 and key[0] == "valid"
    again = training.evaluate(model, fresh, "valid")
    assert again == whole and fresh.__dict__["_recops_eval_batches"][key] is batches
    test = training.evaluate(model, fresh, "test", batch_size=9)
    assert test != whole  # another target: another batch set
    assert [k[0] for k in fresh.__dict__["_recops_eval_batches"]] == ["test"]
    assert training.evaluate(model, fresh, "valid", batch_size=9) == whole
    assert training.eval_batch_size(200) == training.EVAL_POSITIONS // 200
    assert training.eval_batch_size(1) == training.MAX_EVAL_BATCH
    assert training.eval_batch_size(10**6) == training.MIN_EVAL_BATCH
