"""The data profile, the settings fitted to it (--preset auto), and the schedule counted in
steps: validation every N steps, patience in validations, no early stop before min_steps."""
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from recops_tf import recommender as rec
from recops_tf.recommender import profile as prof

_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def _dataset(histories):
    items = [np.array(h, np.int64) for h in histories]
    return rec.Dataset(items=items, timestamps=[np.arange(len(h), dtype=np.int64) for h in items],
                       num_items=int(max(max(h) for h in histories)), source="lines")


def test_profile_of_a_small_data_set_written_by_hand():
    # Training parts (all but the last two): [1, 2, 1], [2, 3], [1, 2, 3, 4]. Repeats, over the
    # whole histories: user 0 comes back to 1 and 2, user 2 to 1 and 2: 4 of 15.
    data = _dataset([[1, 2, 1, 2, 3], [2, 3, 4, 1], [1, 2, 3, 4, 1, 2]])
    found = prof.profile(data)
    assert (found.users, found.items, found.interactions) == (3, 4, 15)
    assert found.length["max"] == 4 and found.length["p50"] == 3
    assert found.repeat_rate == pytest.approx(4 / 15)
    # Validation targets 2, 4, 1 after last items 1, 3, 4: the chain saw 1->2 (twice), 3->4
    # and 4 never followed by anything: with 4 items every target is in the top 10.
    assert found.markov_hr10 == 1.0
    split = rec.Split.leave_one_out(data)
    assert found.markov_hr10 == rec.baselines(split, 4, "valid", False, ks=(10,))["markov"][
        "hr@10"]
    assert any("3 users, 4 items, 15 interactions" in line for line in found.lines())
    assert found.positions(200) == pytest.approx((2 + 1 + 3) / 3)
    assert "train_lengths" not in found.to_json() and found.to_json()["items"] == 4


def _profile(**changes):
    values = dict(users=10_000, items=5_000, interactions=500_000,
                  length=dict(p10=5, p50=20, p90=80, p99=301, max=900), repeat_rate=0.0,
                  markov_hr10=0.1, popularity_hr10=0.05,
                  train_lengths=np.array([1, 11, 21, 301]))  # 10, 20 and 200 positions
    values.update(changes)
    return prof.Profile(**values)


def test_fit_chooses_the_loss_by_the_logits_of_a_step():
    config = rec.Config.from_preset("auto")
    assert _profile().positions(200) == pytest.approx(230 / 3)  # a 1-item history reads none
    assert _profile().positions(15) == pytest.approx(40 / 3)
    # 128 histories a step of 230 / 3 positions each.
    items = int(prof.FULL_SOFTMAX_MAX_LOGITS / (128 * 230 / 3))
    small, reasons = prof.fit(_profile(items=items), config)
    large, _ = prof.fit(_profile(items=items + 1), config)
    assert small.loss == "full" and large.loss == "sampled"
    assert "9,813 positions a step" in reasons["loss"] and "<= 30 M" in reasons["loss"]
    # A shorter history given: fewer positions a step, the full softmax again.
    short, _ = prof.fit(_profile(items=items + 1), rec.Config.from_preset(
        "auto", max_seq_len=15), given={"max_seq_len"})
    assert short.loss == "full"


def test_fit_samples_negatives_per_position_on_long_histories():
    config = rec.Config.from_preset("auto")
    long = dict(p10=20, p50=prof.SPARSE_MEDIAN_HISTORY + 1, p90=90, p99=300, max=999)
    fitted, reasons = prof.fit(_profile(items=100, length=long), config)
    assert (fitted.loss, fitted.negatives_per) == ("sampled", "position")
    assert "long histories" in reasons["loss"] and "each position" in reasons["negatives_per"]
    # Short histories: the full softmax on a small catalogue, per sequence above the bound.
    small, reasons = prof.fit(_profile(items=100), config)
    assert small.loss == "full" and "negatives_per" not in reasons
    large, _ = prof.fit(_profile(items=10**6), config)
    assert (large.loss, large.negatives_per) == ("sampled", "sequence")
    # Each flag given keeps its value.
    given, _ = prof.fit(_profile(items=100, length=long), rec.Config.from_preset(
        "auto", loss="full"), given={"loss"})
    assert given.loss == "full"
    given, _ = prof.fit(_profile(items=100, length=long), rec.Config.from_preset(
        "auto", negatives_per="sequence"), given={"negatives_per"})
    assert (given.loss, given.negatives_per) == ("sampled", "sequence")


@pytest.mark.parametrize("p99,expected", [(301, 200), (9, 16), (3, 8), (40, 40), (41, 48)])
def test_fit_takes_the_history_from_the_length_distribution(p99, expected):
    fitted, _ = prof.fit(_profile(length=dict(p10=1, p50=2, p90=3, p99=p99, max=999)),
                         rec.Config.from_preset("auto"))
    assert fitted.max_seq_len == expected


def test_fit_takes_more_dropout_and_the_weight_average_on_short_sparse_histories():
    config = rec.Config.from_preset("auto")
    sparse, reasons = prof.fit(_profile(length=dict(p10=2, p50=prof.SPARSE_MEDIAN_HISTORY,
                                                    p90=30, p99=60, max=99)), config)
    dense, _ = prof.fit(_profile(length=dict(p10=20, p50=prof.SPARSE_MEDIAN_HISTORY + 1,
                                             p90=90, p99=300, max=999)), config)
    assert (sparse.dropout_rate, dense.dropout_rate) == (0.5, 0.2)
    assert (sparse.weight_average, dense.weight_average) == (0.8, 0.0)
    assert "median history has 20 items" in reasons["dropout_rate"]
    assert "average of the weights" in reasons["weight_average"]
    given, _ = prof.fit(_profile(), rec.Config.from_preset(
        "auto", dropout_rate=0.1, weight_average=0.5), given={"dropout_rate", "weight_average"})
    assert (given.dropout_rate, given.weight_average) == (0.1, 0.5)
    # The papers' presets keep the raw weights.
    for preset in ("hstu", "hstu-large", "sasrec"):
        assert rec.Config.from_preset(preset).weight_average == 0.0


def test_fit_refits_on_the_validation_items_on_short_histories():
    config = rec.Config.from_preset("auto")
    short, reasons = prof.fit(_profile(length=dict(p10=2, p50=5, p90=12, p99=30, max=60)),
                              config)
    long, _ = prof.fit(_profile(length=dict(p10=20, p50=prof.SPARSE_MEDIAN_HISTORY + 1,
                                            p90=90, p99=300, max=999)), config)
    assert (short.refit_epochs, long.refit_epochs) == (prof.SPARSE_REFIT_EPOCHS, 0)
    assert "one in 5" in reasons["refit_epochs"]
    given, _ = prof.fit(_profile(), rec.Config.from_preset("auto", refit_epochs=1),
                        given={"refit_epochs"})
    assert given.refit_epochs == 1
    for preset in ("hstu", "hstu-large", "sasrec"):
        assert rec.Config.from_preset(preset).refit_epochs == 0
    with pytest.raises(ValueError, match="refit_epochs must be >= 0"):
        rec.Config(refit_epochs=-1).check()


def test_fit_schedule_is_counted_in_steps():
    config = rec.Config.from_preset("auto")
    big, _ = prof.fit(_profile(users=100_000), config)
    assert big.batch_size == 128 and big.epochs == 0 and big.max_steps == prof.MAX_STEPS
    assert big.eval_every == 782  # an epoch: 100,000 / 128 steps
    assert big.min_steps == 7820  # 10 epochs
    small, _ = prof.fit(_profile(users=900), config)
    assert small.batch_size == 32  # 8 steps an epoch at 128, 15 at 64
    assert small.eval_every == prof.MIN_EVAL_EVERY and small.min_steps == prof.MIN_STEPS
    huge, _ = prof.fit(_profile(users=10_000_000), config)
    assert huge.eval_every == prof.MAX_EVAL_EVERY and huge.min_steps == prof.MAX_MIN_STEPS
    assert small.check() and big.check() and huge.check()


def test_fit_leaves_what_the_user_set_and_every_paper_preset_alone():
    config = rec.Config.from_preset("auto", loss="sampled", batch_size=7)
    fitted, reasons = prof.fit(_profile(users=900), config, given={"loss", "batch_size"})
    assert (fitted.loss, fitted.batch_size) == ("sampled", 7)
    assert "loss" not in reasons and "batch_size" not in reasons
    assert fitted.eval_every == 129  # an epoch of 900 users at the batch size given
    for preset in ("hstu", "hstu-large", "sasrec"):
        paper = rec.Config.from_preset(preset)
        assert prof.fit(_profile(), paper) == (paper, {})
    assert set(reasons) <= set(prof.FITTED)


def _tiny(**changes):
    values = dict(epochs=0, max_steps=24, batch_size=16, d_model=16, num_blocks=1, head_dim=8,
                  max_seq_len=16, num_negatives=8, learning_rate=3e-3)
    values.update(changes)
    return rec.Config.from_preset("auto", **values)


def test_validation_every_n_steps_and_patience_in_validations():
    data = rec.synthetic(num_users=64, num_items=30, seed=1)  # 4 steps an epoch
    result = rec.train(data, _tiny(eval_every=5, patience=0), progress=False)
    assert result.steps == 24
    # Every 5 steps, and once more at the last step.
    assert [h["step"] for h in result.validation] == [5, 10, 15, 20, 24]
    assert [h["epoch"] for h in result.validation] == [2, 3, 4, 5, 6]
    best = max(range(5), key=lambda i: result.validation[i]["ndcg@10"])
    assert result.best_step == result.validation[best]["step"]


def test_no_early_stop_before_min_steps():
    data = rec.synthetic(num_users=64, num_items=30, seed=1)
    # A learning rate this large diverges: patience 1 runs out at once ...
    hasty = rec.train(data, _tiny(eval_every=2, patience=1, learning_rate=0.5, max_steps=40),
                      progress=False)
    assert hasty.steps < 40
    # ... but not before min_steps.
    floor = rec.train(data, _tiny(eval_every=2, patience=1, learning_rate=0.5, max_steps=40,
                                  min_steps=30), progress=False)
    assert floor.steps >= 30
    scores = [h["ndcg@10"] for h in floor.validation]
    assert floor.validation[-1]["step"] == floor.steps
    assert max(scores) == next(h["ndcg@10"] for h in floor.validation
                               if h["step"] == floor.best_step)


def test_config_checks_the_schedule():
    with pytest.raises(ValueError, match="needs max_steps"):
        rec.Config.from_preset("auto", epochs=0, max_steps=0).check()
    with pytest.raises(ValueError, match="eval_every must be at least 0"):
        rec.Config.from_preset("auto", eval_every=-1).check()


def test_cli_prints_the_profile_and_saves_the_fitted_settings(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "recops_tf", "train", "--users", "60", "--items", "40",
         "--d-model", "16", "--blocks", "1", "--head-dim", "8", "--max-steps", "6",
         "--batch-size", "16", "--no-progress", "--out", str(out)],
        capture_output=True, text=True, env=_ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "data profile:" in proc.stdout and "repeat rate" in proc.stdout
    # the synthetic histories are long (21-60 items): the sampled softmax, per position
    assert "loss = sampled: the median history has" in proc.stdout
    assert "negatives_per = position: " in proc.stdout
    assert "batch_size =" not in proc.stdout  # given: not fitted
    run = json.loads((out / "run.json").read_text())
    assert run["profile"]["users"] == 60 and run["profile"]["items"] == 40
    assert run["fitted"]["loss"] == {"value": "sampled",
                                     "reason": run["fitted"]["loss"]["reason"]}
    assert run["config"]["loss"] == "sampled" and run["config"]["batch_size"] == 16
    assert run["config"]["negatives_per"] == "position"
    assert run["config"]["max_steps"] == 6
    assert set(run["fitted"]) <= {f.name for f in dataclasses.fields(rec.Config)}
    # A paper preset is its recipe: nothing fitted.
    paper = subprocess.run(
        [sys.executable, "-m", "recops_tf", "train", "--preset", "hstu", "--users", "60",
         "--items", "40", "--d-model", "16", "--blocks", "1", "--head-dim", "8",
         "--max-steps", "2", "--no-progress"],
        capture_output=True, text=True, env=_ENV, timeout=600)
    assert paper.returncode == 0, paper.stderr[-2000:]
    assert "data profile:" not in paper.stdout and "sampled softmax" in paper.stdout


def test_on_validation_stops_a_run_and_keeps_the_best():
    data = rec.synthetic(num_users=64, num_items=30, seed=1)
    seen = []

    def stop_at_third(step, value):
        seen.append((step, value))
        return len(seen) == 3

    result = rec.train(data, _tiny(eval_every=4, patience=0, max_steps=40), progress=False,
                       on_validation=stop_at_third)
    assert [s for s, _ in seen] == [4, 8, 12] and result.steps == 12
    assert [h["step"] for h in result.validation] == [4, 8, 12]
    assert result.best_step == max(seen, key=lambda sv: sv[1])[0]

