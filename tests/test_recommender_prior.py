"""The transition prior: sequential rules' evidence (a first-order Markov chain at depth and
window 1) added to the encoder's scores at inference, its weight chosen on the validation split
(``Config.transition_prior``): the counts, the scores it changes (and those it does not), the
trainer's choice and the events each split's counts know, the export and the .keras file that
keep it, and the CLI's flag."""
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from recops_tf import cli
from recops_tf import recommender as rec
from recops_tf.recommender import evaluation
from recops_tf.recommender import training as training_module

HISTORIES = [np.array([1, 2, 3]), np.array([1, 2]), np.array([2, 1])]


def _model(**kwargs):
    values = dict(d_model=8, num_blocks=1, head_dim=4, max_seq_len=8, transition_pairs=3)
    values.update(kwargs)
    model = rec.GenerativeRecommender(4, **values)
    one = tf.RaggedTensor.from_row_lengths(tf.constant([1], tf.int64), tf.constant([1], tf.int64))
    model({"items": one, "timestamps": one}, training=False)
    return model


def _ragged(rows):
    return tf.RaggedTensor.from_row_lengths(
        tf.constant(np.concatenate(rows or [[]]).astype(np.int64)),
        tf.constant([len(r) for r in rows], tf.int64))


def test_transitions_are_counted_by_the_preceding_item():
    starts, items, counts = evaluation.transitions(HISTORIES, 4)
    # (1, 2) twice, (2, 3), (2, 1): item 1's pairs are [0, 1), item 2's [1, 3), none after.
    np.testing.assert_array_equal(starts, [0, 0, 1, 3, 3, 3])
    np.testing.assert_array_equal(items, [2, 1, 3])
    np.testing.assert_array_equal(counts, [2, 1, 1])
    with pytest.raises(ValueError, match="1..4"):
        evaluation.transitions([np.array([1, 5])], 4)
    with pytest.raises(ValueError, match="built for 2"):
        _model(transition_pairs=2).set_transitions(evaluation.transitions(HISTORIES, 4))
    model = _model()
    model.set_transitions(evaluation.transitions(HISTORIES, 4))
    np.testing.assert_allclose(model.transition_values.numpy(), np.log1p([2, 1, 1]))
    with pytest.raises(ValueError, match="transition_pairs"):
        _model(transition_pairs=-1)


def test_the_prior_is_added_after_the_last_item_at_inference_only():
    model = _model()
    model.set_transitions(evaluation.transitions(HISTORIES, 4))
    model.transition_weight.assign(2.0)
    states = tf.random.stateless_normal([3, 8], seed=[1, 2])
    seen = _ragged([np.array([3, 1]), np.array([4, 2]), np.array([], np.int64)])
    got = (model.scores(states, seen=seen) - model.scores(states)).numpy()
    expected = np.zeros((3, 4))
    expected[0, 1] = 2 * np.log(3)  # after item 1: item 2, twice
    expected[1, [0, 2]] = 2 * np.log(2)  # after item 2: items 1 and 3, once each
    np.testing.assert_allclose(got, expected, atol=1e-5)  # an empty history: nothing
    np.testing.assert_array_equal(model.scores(states, seen=seen, training=True).numpy(),
                                  model.scores(states).numpy())
    model.transition_weight.assign(0.0)
    np.testing.assert_array_equal(model.scores(states, seen=seen).numpy(),
                                  model.scores(states).numpy())


def test_deeper_rules_add_the_earlier_items_evidence_decayed():
    model = _model(transition_pairs=6, transition_depth=2, transition_decay=0.5)
    counted = evaluation.transitions(HISTORIES, 4, window=2)
    # within 2 steps, 1 / gap each: (1,2) 2, (1,3) 0.5, (2,1) 1, (2,3) 1; one pair short of
    # the 6 built for: the shape is checked
    with pytest.raises(ValueError, match="built for 6"):
        model.set_transitions(counted)
    model = _model(transition_pairs=4, transition_depth=2, transition_decay=0.5)
    model.set_transitions(counted)
    model.transition_weight.assign(2.0)
    states = tf.random.stateless_normal([2, 8], seed=[3, 4])
    seen = _ragged([np.array([2, 1]), np.array([1])])
    got = (model.scores(states, seen=seen) - model.scores(states)).numpy()
    expected = np.zeros((2, 4))
    expected[0, 1] += 2 * np.log1p(2.0)  # after 1 (the last): 2, 3
    expected[0, 2] += 2 * np.log1p(0.5) + 2 * 0.5 * np.log1p(1.0)  # and after 2 (decayed)
    expected[0, 0] += 2 * 0.5 * np.log1p(1.0)
    expected[1, 1] += 2 * np.log1p(2.0)  # one item: its rules only
    expected[1, 2] += 2 * np.log1p(0.5)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    with pytest.raises(ValueError, match="transition_depth"):
        _model(transition_depth=0)


def test_a_tables_shape_keeps_while_its_counts_change():
    every = evaluation.transitions(HISTORIES, 4)
    part = evaluation.transitions(HISTORIES[:1], 4)  # (1, 2), (2, 3) once each
    starts, items, counts = evaluation.recount(every, part, 4)
    np.testing.assert_array_equal(starts, every[0])
    np.testing.assert_array_equal(items, every[1])
    np.testing.assert_array_equal(counts, [1, 0, 1])
    with pytest.raises(ValueError, match="structure lacks"):
        evaluation.recount(part, every, 4)


def _cycle_data(users=60, items=30, length=12, seed=0):
    """Histories that walk a fixed cycle of the catalogue from a random start: the next item
    is the last one's successor, which a Markov chain learns from few examples."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(items) + 1
    histories = []
    for _ in range(users):
        start = rng.integers(items)
        histories.append(order[(start + np.arange(length)) % items].astype(np.int64))
    return rec.Dataset(items=histories, timestamps=[np.arange(length, dtype=np.int64)] * users,
                       num_items=items, source="cycle",
                       item_names=np.arange(1, items + 1))


def _config(**overrides):
    values = dict(epochs=0, max_steps=4, eval_every=2, batch_size=16, d_model=16, num_blocks=1,
                  head_dim=8, max_seq_len=16, num_negatives=8)
    values.update(overrides)
    return rec.Config.from_preset(values.pop("preset", "auto"), **values)


def test_the_trainer_chooses_the_weight_on_validation():
    data = _cycle_data()
    result = rec.train(data, _config(), progress=False)
    prior, model = result.transition_prior, result.model
    grid = training_module.TRANSITION_PRIOR_GRID
    tried = [float(w) for w in prior["validation"]]
    assert tried[:len(grid)] == list(grid)
    chosen = max(tried, key=lambda w: (prior["validation"][str(w)], -w))
    assert prior["value"] == chosen == float(model.transition_weight.numpy())
    # After 4 steps the encoder knows little; the chain knows the cycle: the prior wins on
    # validation, and the test metrics are those of the weight chosen.
    assert chosen > 0 and prior["validation"][str(chosen)] > prior["validation"]["0.0"]
    split = evaluation.Split.leave_one_out(data)
    # The returned model counts every event of the data; the test counted those before the
    # test item, the validation the training parts.
    window = prior["rules"]["window"]
    every = evaluation.transitions(data.items, data.num_items, window)
    np.testing.assert_allclose(model.transition_values.numpy(), np.log1p(every[2]), rtol=1e-6)
    assert (model.transition_depth, model.transition_decay) == (prior["rules"]["depth"],
                                                                prior["rules"]["decay"])
    known = lambda which: evaluation.recount(  # noqa: E731
        every, evaluation.transitions(split.history(which)[0], data.num_items, window),
        data.num_items)
    assert not np.array_equal(known("test")[2], every[2])
    model.set_transitions(known("test"))
    assert training_module.evaluate(model, split, "test") == result.test
    assert result.test["ndcg@10"] > prior["test_without"]["ndcg@10"]
    model.set_transitions(known("valid"))
    assert training_module.evaluate(model, split, "valid")[
        result.config.validation_metric] == prior["validation"][str(chosen)]
    model.transition_weight.assign(0.0)
    assert training_module.evaluate(model, split, "test") == prior["test_without"]


@pytest.mark.parametrize("peak, chosen, extra", [
    (4.0, 4.0, []),  # inside the grid: the grid only
    (32.0, 32.0, [64.0]),  # the grid's last is the best: one doubling shows it stays so
    (256.0, 256.0, [64.0, 128.0, 256.0, 512.0]),
    (1e9, 1024.0, [64.0, 128.0, 256.0, 512.0, 1024.0]),  # up to TRANSITION_PRIOR_MAX
])
def test_the_grid_extends_while_its_last_weight_is_the_best(monkeypatch, peak, chosen, extra):
    """AUTO doubles the grid's last weight while it has the best validation metric (a tie keeps
    the smaller weight): a metric that rises with the weight up to `peak`, level past it."""
    model = _model()
    seen = []

    def evaluate(model, split, which, exclude_seen, group=None):
        weight = float(model.transition_weight.numpy())
        seen.append(weight)
        return {"ndcg@10": min(weight, peak)}

    monkeypatch.setattr(training_module, "evaluate", evaluate)
    config = rec.Config(transition_prior=training_module.AUTO)
    prior = training_module.choose_transition_prior(model, None, config)
    assert seen == list(training_module.TRANSITION_PRIOR_GRID) + extra
    assert [float(w) for w in prior["validation"]] == seen
    assert prior["value"] == chosen == float(model.transition_weight.numpy())


def test_a_given_weight_is_kept_and_the_presets_have_no_prior():
    data = _cycle_data(users=30)
    fixed = rec.train(data, _config(transition_prior=1.5), progress=False)
    assert fixed.transition_prior["value"] == 1.5 and fixed.transition_prior["validation"] == {}
    assert float(fixed.model.transition_weight.numpy()) == 1.5
    for preset in ("hstu", "sasrec"):
        result = rec.train(data, _config(preset=preset), progress=False)
        assert result.transition_prior == {} and result.model.transition_pairs == 0
    with pytest.raises(ValueError, match="transition_prior"):
        _config(transition_prior=-0.5).check()


def test_the_export_and_the_keras_file_keep_the_prior(tmp_path, monkeypatch):
    data = _cycle_data(users=30)
    monkeypatch.setattr(evaluation, "SR_GRID", ((3, 2, 0.5),))  # rules two items deep
    model = rec.train(data, _config(transition_prior=1.5), progress=False).model
    assert (model.transition_depth, model.transition_decay) == (2, 0.5)
    out = tmp_path / "export"
    module = tf.saved_model.load(rec.export(model, data, str(out)))
    history = tf.constant(data.items[0][:6])
    times = tf.constant(data.timestamps[0][:6])
    state = module.user_state(history, times)["state"]
    expected = model.scores(state[None], seen=_ragged([data.items[0][:6]])).numpy()[0]
    plain = model.scores(state[None]).numpy()[0]
    assert np.abs(expected - plain).max() > 1.0  # the prior moves the successor's score
    best = np.argsort(-expected, kind="stable")[:5] + 1
    for got in (module.recommend(history, times, tf.constant(5)),
                module.top_k(state, history, tf.constant(5), tf.constant(False))):
        np.testing.assert_array_equal(got["items"].numpy(), best)
        np.testing.assert_allclose(got["scores"].numpy(), expected[best - 1], rtol=1e-5,
                                   atol=1e-5)
    served = module.signatures["serving_default"](items=history[None], timestamps=times[None])
    np.testing.assert_array_equal(served["items"].numpy()[0, :5], best)
    candidates = tf.constant([1, 7, 30, int(best[0])], tf.int64)
    np.testing.assert_allclose(module.score_items(state, history, candidates)["scores"].numpy(),
                               expected[candidates.numpy() - 1], rtol=1e-5, atol=1e-5)
    loaded = keras.saving.load_model(str(out / "model.keras"))
    assert loaded.transition_pairs == model.transition_pairs
    assert (loaded.transition_depth, loaded.transition_decay) == (2, 0.5)
    assert float(loaded.transition_weight.numpy()) == 1.5
    for name in ("transition_starts", "transition_items", "transition_values"):
        np.testing.assert_array_equal(getattr(loaded, name).numpy(),
                                      getattr(model, name).numpy())


def test_the_cli_flag(tmp_path, capsys):
    for bad in ("-1", "often"):
        with pytest.raises(SystemExit) as stop:
            cli.main(["train", "--transition-prior", bad, "--max-steps", "1"])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--transition-prior" in err
    out = tmp_path / "run.json"
    args = ["train", "--users", "40", "--items", "30", "--max-steps", "2", "--batch-size", "16",
            "--d-model", "16", "--blocks", "1", "--head-dim", "8", "--max-seq-len", "16",
            "--no-progress", "--json", str(out)]
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert "a transition prior (its weight chosen on validation" in text
    assert "transition prior: weight" in text and "the best validation ndcg@10 of 0: " in text
    record = json.loads(out.read_text())
    assert record["config"]["transition_prior"] == training_module.AUTO
    assert len(record["transition_prior"]["validation"]) >= len(
        training_module.TRANSITION_PRIOR_GRID)
    assert cli.main(args + ["--transition-prior", "0"]) == 0
    assert "transition prior" not in capsys.readouterr().out
    assert json.loads(out.read_text())["transition_prior"] == {}


def test_a_config_file_may_say_auto(tmp_path):
    from recops_tf.recommender import tuning

    path = tmp_path / "best.json"
    path.write_text('{"transition_prior": "auto", "weight_average": 0}')
    assert tuning.read_config(str(path)) == {"transition_prior": training_module.AUTO,
                                             "weight_average": 0}
