"""The evaluation protocol: leave-one-out split, full-catalogue ranks with ties and excluded
items, HR / NDCG / MRR, and the popularity and Markov baselines."""
import numpy as np
import pytest

from recops_tf import recommender as rec
from recops_tf.recommender import evaluation


def _data(histories, num_items):
    items = [np.array(h, np.int64) for h in histories]
    stamps = [np.arange(len(h), dtype=np.int64) * 10 for h in histories]
    return rec.Dataset(items, stamps, num_items, "test",
                       item_names=np.arange(1, num_items + 1).astype(str))


def test_split_holds_out_validation_and_test_items():
    split = rec.Split.leave_one_out(_data([[1, 2, 3, 4], [5, 6, 7]], 7))
    train, train_t = split.train()
    assert [h.tolist() for h in train] == [[1, 2], [5]]
    assert [t.tolist() for t in train_t] == [[0, 10], [0]]
    assert [h.tolist() for h in split.history("valid")[0]] == [[1, 2], [5]]
    assert [h.tolist() for h in split.history("test")[0]] == [[1, 2, 3], [5, 6]]
    assert split.targets("valid")[0].tolist() == [3, 6]
    assert split.targets("test")[0].tolist() == [4, 7]
    assert split.targets("test")[1].tolist() == [30, 20]


def test_split_needs_three_interactions():
    with pytest.raises(ValueError, match="user 1 has 2"):
        rec.Split.leave_one_out(_data([[1, 2, 3], [1, 2]], 3))


def test_ranks_break_ties_by_item_id_and_exclude_seen_items():
    scores = np.array([[0.5, 0.9, 0.5, 0.1],   # target 3 ties with item 1: rank 2
                       [0.5, 0.9, 0.5, 0.1],   # target 1 ties with item 3: rank 1
                       [0.0, 0.0, 0.0, 0.0]])  # all tied: target 4 ranks last
    assert rec.ranks(scores, [3, 1, 4]).tolist() == [2, 1, 3]
    # Excluding item 2 (seen) lifts both; the target stays ranked even when "seen".
    exclude = [np.array([2]), np.array([2, 1]), np.array([1, 2, 3, 4])]
    assert rec.ranks(scores, [3, 1, 4], exclude).tolist() == [1, 0, 0]


def test_ranks_reject_targets_outside_the_catalogue():
    with pytest.raises(ValueError, match="item ids in 1..2"):
        rec.ranks(np.zeros((1, 2)), [3])


def test_metrics_of_known_ranks():
    m = rec.metrics([0, 9, 10, 60], ks=(10, 50))
    assert m["hr@10"] == pytest.approx(0.5)
    assert m["hr@50"] == pytest.approx(0.75)
    assert m["ndcg@10"] == pytest.approx((1.0 + 1 / np.log2(11)) / 4)
    assert m["ndcg@50"] == pytest.approx((1.0 + 1 / np.log2(11) + 1 / np.log2(12)) / 4)
    assert m["mrr"] == pytest.approx((1 + 1 / 10 + 1 / 11 + 1 / 61) / 4)


def test_markov_chain_counts_training_transitions_only():
    # 1 -> 2 twice and 1 -> 3 once in training; the held-out items (4, 5) never count.
    split = rec.Split.leave_one_out(_data([[1, 2, 1, 2, 4, 5], [1, 3, 5, 4]], 5))
    chain = rec.MarkovChain(split, 5)
    s = chain.scores([np.array([1])])[0]
    assert np.argmax(s) + 1 == 2 and s[1] > s[2] > s[0]
    assert s[3] < 1 and s[4] < 1  # 4 and 5 never followed 1 in training: popularity only
    assert evaluation.popularity_scores(split, 5).tolist() == [3, 2, 1, 0, 0]


def test_baselines_on_a_deterministic_chain():
    # Every user walks 1 -> 2 -> ... -> 6 from a different start: the Markov chain is exact.
    histories = [[(s + t) % 6 + 1 for t in range(6)] for s in range(6)] * 3
    split = rec.Split.leave_one_out(_data(histories, 6))
    b = rec.baselines(split, 6, "test")
    assert b["markov"]["hr@10"] == 1.0 and b["markov"]["mrr"] == 1.0
    assert b["popularity"]["mrr"] < 0.7
    excluded = rec.baselines(split, 6, "test", exclude_seen=True)
    assert excluded["markov"]["mrr"] == 1.0
    # With every other item seen, the target is the only candidate left.
    assert excluded["popularity"]["mrr"] == 1.0


def test_ranks_beside_the_scores_equal_numpy_ranks():
    """training.evaluate ranks on the model's side (ranker, by blocks of items);
    evaluation.ranks is the definition: the same ranks for both protocols. (The untrained
    fused model's item table is empty: its scores are all 0, every item tied with the
    target.) test_recommender_scoring has the rest."""
    import tensorflow as tf

    from recops_tf import recommender as rec
    from recops_tf.recommender import training

    data = rec.synthetic(num_users=40, num_items=25, seed=4)
    config = rec.Config.from_preset("hstu", d_model=8, num_blocks=1, head_dim=8,
                                    max_seq_len=12, seen_bias=True)
    model = training.build_model(config, data.num_items)
    split = rec.Split.leave_one_out(data)
    histories, stamps = split.history("test")
    targets, _ = split.targets("test")
    cut = lambda seqs: training._ragged([h[-12:] for h in seqs])
    scores = training.scorer(model)(cut(histories), cut(stamps)).numpy()
    for exclude in (False, True):
        for block in (None, 4):
            got = training.ranker(model, exclude, block)(cut(histories), cut(stamps),
                                                         training._ragged(histories),
                                                         tf.constant(targets)).numpy()
            want = rec.ranks(scores, targets, histories if exclude else None)
            np.testing.assert_array_equal(got, want)


def _random_split(rng, num_items, users):
    hist = [rng.integers(1, num_items + 1, int(rng.integers(3, 12))) for _ in range(users)]
    return rec.Split(hist, [np.arange(len(h)) for h in hist])


def test_the_baselines_sparse_ranks_are_the_dense_ranks():
    """evaluation._sparse_ranks (what `baselines` uses) against `ranks` on the dense scores,
    both protocols, ties included (few items: many equal scores)."""
    rng = np.random.default_rng(1)
    for trial in range(12):
        n = int(rng.integers(3, 30))
        split = _random_split(rng, n, int(rng.integers(5, 50)))
        pop = evaluation.popularity_scores(split, n, "test")
        models = [evaluation._Popularity(pop), rec.MarkovChain(split, n, "test"),
                  rec.MarkovChain(split, n),
                  evaluation.SequentialRules(split, n, "test", 3, 3, 0.5),
                  evaluation.SequentialRules(split, n, "valid", 5, 5, 0.7)]
        for model in models:
            dense = (model.scores if hasattr(model, "scores")
                     else (lambda h: np.tile(pop, (len(h), 1))))
            for which in ("valid", "test"):
                for exclude in (False, True):
                    np.testing.assert_array_equal(
                        evaluation._sparse_ranks(model, split, which, exclude, n),
                        evaluation._batched_ranks(dense, split, which, exclude, n),
                        err_msg=f"{trial} {type(model).__name__} {which} {exclude}")


def test_sequential_rules_score_by_the_rules_of_the_last_items():
    rng = np.random.default_rng(2)
    split = _random_split(rng, 9, 30)
    sr = evaluation.SequentialRules(split, 9, "test", window=2, depth=3, decay=0.5)
    fitted = split.history("test")[0]
    rule = np.zeros((10, 10))
    for h in fitted:  # b came 1 or 2 steps after a: 1 / gap
        for gap in (1, 2):
            for a, b in zip(h[:-gap], h[gap:]):
                rule[a, b] += 1.0 / gap
    for h in split.history("test")[0][:10]:
        want = sum(0.5 ** k * rule[h[-1 - k], 1:] for k in range(min(3, len(h))))
        got = sr.scores([h])[0]
        reached = want > 0
        np.testing.assert_allclose(got[reached], want[reached] + sr.tiebreak[reached])
        np.testing.assert_array_equal(got[~reached], sr.tiebreak[~reached])
        assert sr.tiebreak.max() < want[reached].min(initial=1.0)


def test_the_chain_a_user_deploys_knows_the_validation_transitions():
    # A's test transition 3 -> 4 is B's validation transition: only the chain fitted on every
    # event before the test item has seen it.
    split = rec.Split([np.array([1, 3, 4])] * 4 + [np.array([2, 3, 4, 1])] * 4,
                      [np.arange(3)] * 4 + [np.arange(4)] * 4)
    b = rec.baselines(split, 4, "test")
    # A: 4 first; B (after 4, never followed): popularity before the test item, 3 then 1.
    assert b["markov"]["mrr"] == 0.75
    assert b["markov_train"]["mrr"] < 0.75
    assert set(b) == {"popularity", "markov", "markov_train", "sequential_rules"}
    valid = rec.baselines(split, 4, "valid", strong=False)
    assert valid["markov"] == valid["markov_train"] and set(valid) == {
        "popularity", "markov", "markov_train"}


def test_the_rules_are_chosen_once_for_the_same_histories(monkeypatch):
    rng = np.random.default_rng(3)
    split = _random_split(rng, 12, 40)
    calls = []
    real = evaluation._sparse_ranks
    monkeypatch.setattr(evaluation, "_sparse_ranks",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    first = evaluation.sequential_rules_settings(split, 12)
    tuned = len(calls)
    assert tuned == len(evaluation.SR_GRID)
    again = rec.Split(split.items, split.timestamps)  # a split made again from the same data
    assert evaluation.sequential_rules_settings(again, 12) == first and len(calls) == tuned
    # Another grid (a capped window) is chosen anew, among its own settings.
    capped = evaluation.sequential_rules_settings(split, 12, max_window=1)
    assert capped[0] == 1 and len(calls) == tuned + sum(g[0] <= 1 for g in evaluation.SR_GRID)
