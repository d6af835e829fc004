"""recops-tf tune: the search's bad inputs, a search killed and resumed, best.json read back
by recops-tf train --config (a flag beside it wins), and the search space's rules."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from recops_tf import cli
from recops_tf import recommender as rec
from recops_tf.recommender import tuning

_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
# Settings fixed by flags so that a trial is a few seconds: the search varies the rest.
_SMALL = ["--d-model", "16", "--blocks", "1", "--head-dim", "16", "--max-steps", "12",
          "--eval-every", "4", "--min-steps", "0"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    """A small interaction file in SASRec's `user item` format (synthetic histories)."""
    data = rec.synthetic(num_users=48, num_items=30, seed=3)
    path = tmp_path_factory.mktemp("tune") / "interactions.txt"
    with open(path, "w") as f:
        for user, history in enumerate(data.items):
            f.writelines(f"{user + 1} {item}\n" for item in history)
    return str(path)


def _cli(*argv, timeout=900):
    return subprocess.run([sys.executable, "-m", "recops_tf", *argv], capture_output=True,
                          text=True, env=_ENV, timeout=timeout)


def _one_line_error(capsys, argv, message):
    """`recops-tf ARGV` (in this process) exits 2 with one line on stderr saying `message`."""
    capsys.readouterr()
    assert cli.main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 1 and message in errors[0], errors


@pytest.mark.parametrize("argv,message", [
    ([], "--data is required"),
    (["--data", "{missing}"], "no such file"),
    (["--data", "{data}", "--trials", "0"], "--trials must be at least 1"),
    (["--data", "{data}", "--budget-minutes", "-1"], "--budget-minutes must be positive"),
    (["--data", "{data}", "--budget-minutes", "0.001"], "is below one trial"),
])
def test_bad_inputs_get_one_line_and_exit_2(data_file, tmp_path, capsys, argv, message):
    argv = [a.format(data=data_file, missing=str(tmp_path / "nope.txt")) for a in argv]
    _one_line_error(capsys, ["tune", "--out", str(tmp_path / "search"), *_SMALL, *argv],
                    message)


def test_a_killed_search_resumes_and_train_reads_its_best_config(data_file, tmp_path):
    out = str(tmp_path / "search")
    argv = [sys.executable, "-m", "recops_tf", "tune", "--data", data_file, "--out", out,
            "--trials", "3", *_SMALL]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_ENV)
    lines, deadline = [], time.time() + 600
    for line in proc.stdout:  # killed once the first trial (the defaults) is complete
        lines.append(line)
        if line.startswith("trial 0 (the defaults) [1/3]"):
            proc.send_signal(signal.SIGKILL)
            break
        assert time.time() < deadline, "".join(lines)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(lines) + proc.stderr.read()[-2000:]
    assert not os.path.exists(os.path.join(out, "best.json"))

    again = _cli("tune", "--data", data_file, "--out", out, "--trials", "3", *_SMALL)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming" in again.stdout and "1 of 3 trials complete" in again.stdout
    assert "trial 0 (the defaults)" not in again.stdout  # not run twice
    records = json.loads(open(os.path.join(out, "trials.json")).read())
    assert len(records) == 3 and sum(r["defaults"] for r in records) == 1
    defaults = next(r for r in records if r["defaults"])
    assert defaults["trial"] == 0 and defaults["learning_rate"] == 1e-3
    best = json.loads(open(os.path.join(out, "best.json")).read())
    assert best["valid ndcg@10"] == max(r["valid ndcg@10"] for r in records
                                        if not r["pruned"])
    assert not defaults["pruned"]  # the defaults are the pruner's reference, never pruned
    assert best["valid ndcg@10"] >= defaults["valid ndcg@10"]
    assert "results (best first):" in again.stdout

    run = tmp_path / "run"
    trained = _cli("train", "--data", data_file, "--config", os.path.join(out, "best.json"),
                   "--learning-rate", "0.002", "--max-steps", "4", "--no-progress", "--out",
                   str(run))
    assert trained.returncode == 0, trained.stderr[-2000:]
    config = json.loads((run / "run.json").read_text())["config"]
    for field, value in best["config"].items():
        if field not in ("learning_rate", "max_steps"):
            assert config[field] == value, field
    assert config["learning_rate"] == 0.002 and config["max_steps"] == 4
    assert "nothing fitted" in trained.stdout  # the file set them all


@pytest.mark.parametrize("text,message", [
    ("{nope", "not JSON"),
    ('{"config": {"warp_drive": 9}}', "unknown settings ['warp_drive']"),
    ("[1, 2]", "expected a JSON object"),
    ('{"dropout_rate": "high"}', "dropout_rate must be a number, got 'high'"),
    ('{"num_blocks": 2.5}', "num_blocks must be a whole number, got 2.5"),
    ('{"l2_norm": 1}', "l2_norm must be true or false, got 1"),
    ('{"transition_prior": "often"}', "transition_prior must be a number"),
    ('{"transition_prior": -3}', "transition_prior must be >= 0 or 'auto', got -3"),
])
def test_train_config_file_errors(data_file, tmp_path, capsys, text, message):
    path = tmp_path / "best.json"
    path.write_text(text)
    _one_line_error(capsys, ["train", "--data", data_file, "--config", str(path),
                             "--no-progress"], message)
    _one_line_error(capsys, ["train", "--data", data_file, "--config", str(tmp_path / "none"),
                             "--no-progress"], "No such file")


def test_search_space_rules():
    assert "learning_rate" not in tuning.searched({"learning_rate"})
    assert set(tuning.searched()) == set(tuning.SPACE)
    base = rec.Config.from_preset("auto", batch_size=64)
    assert tuning.defaults_of(base, tuning.searched())["batch_size"] == 64
    with pytest.raises(tuning.TuneError, match="outside the search space"):
        tuning.defaults_of(rec.Config.from_preset("auto", batch_size=7), ["batch_size"])
    import optuna

    params = tuning.defaults_of(base, tuning.searched())
    # The defaults' parameters give the defaults back.
    assert tuning.suggest(optuna.trial.FixedTrial(params), base, tuning.searched()) == base
