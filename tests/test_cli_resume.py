"""`recops-tf train --resume DIR` never drops a flag in silence: the output flags given beside
--resume apply to the resumed run (its --json is a fresh run's), a training flag given with
another value than the checkpoint's is refused in one line (exit 2), with the same value it is
accepted; run.json keeps the metrics of a fresh and of a resumed run."""
import json
import os
import shutil

import pytest
import tensorflow as tf

from recops_tf import cli

TINY = ["--users", "60", "--items", "40", "--epochs", "1", "--batch-size", "16",
        "--d-model", "16", "--blocks", "1", "--head-dim", "8", "--max-seq-len", "16",
        "--negatives", "8", "--no-progress", "--max-steps", "2", "--checkpoint-every", "1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 2-step run with checkpoints at steps 1 and 2, and its --json."""
    base = tmp_path_factory.mktemp("resume")
    out, metrics = base / "run", base / "fresh.json"
    assert cli.main(["train", *TINY, "--out", str(out), "--json", str(metrics)]) == 0
    assert {"ckpt-1.index", "ckpt-2.index"} <= set(os.listdir(out / "checkpoints" / "last"))
    return out, json.loads(metrics.read_text())


def _killed_after_step_1(run, tmp_path):
    """A copy of `run` as if killed after its checkpoint of step 1."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    last = str(copy / "checkpoints" / "last")
    tf.compat.v1.train.update_checkpoint_state(last, os.path.join(last, "ckpt-1"),
                                               [os.path.join(last, "ckpt-1")])
    return copy


def test_a_resumed_run_applies_its_output_flags_and_writes_a_fresh_runs_json(run, tmp_path,
                                                                              capsys):
    fresh_dir, fresh = run
    out = _killed_after_step_1(fresh_dir, tmp_path)
    config = json.loads((out / "run.json").read_text())["config"]
    metrics, logdir = tmp_path / "resumed.json", tmp_path / "tb"
    # Training flags with the checkpoint's values (given, abbreviated, fitted) are accepted.
    assert cli.main(["train", "--resume", str(out), "--json", str(metrics), "--logdir",
                     str(logdir), "--no-progress", "--users", "60", "--learn",
                     repr(config["learning_rate"]), "--out", str(out)]) == 0
    assert "resumed from" in capsys.readouterr().out
    resumed = json.loads(metrics.read_text())
    assert set(resumed) == set(fresh)
    assert resumed["steps"] == fresh["steps"] == 2
    for key in ("test", "validation", "last_loss", "config", "baselines"):
        assert resumed[key] == fresh[key], key
    tags = set()
    for name in os.listdir(logdir):
        for record in tf.data.TFRecordDataset(str(logdir / name)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            tags.update(v.tag for v in event.summary.value)
    assert "train/loss" in tags
    # run.json keeps the metrics, of the fresh run and of the resumed one, and the resume.
    assert json.loads((fresh_dir / "run.json").read_text())["metrics"]["test"] == fresh["test"]
    record = json.loads((out / "run.json").read_text())
    assert record["metrics"]["test"] == fresh["test"]
    assert record["argv"][:2] == TINY[:2] and "--json" in record["resumes"][0]


@pytest.mark.parametrize("argv,message", [
    (["--learning-rate", "0.5"], "--learning-rate 0.5 differs from the checkpoint's {lr}; "
     "resume with the checkpoint's flags or start a new run"),
    (["--lr-schedule", "{sched}"], "--lr-schedule {sched} differs from the checkpoint's {ours}"),
    (["--no-fused"], "--no-fused differs from the checkpoint's use_fused on"),
    (["--users", "61"], "--users 61 differs from the checkpoint's 60"),
    (["--data", "{data}"], "--data {data} differs from the checkpoint's (not given)"),
    (["--workers", "2"], "--workers 2 differs from the checkpoint's 1"),
    (["--out", "{other}"], "--out {other}: a resumed run writes to its own directory"),
], ids=["learning-rate", "lr-schedule", "no-fused", "users", "data", "workers", "out"])
def test_a_training_flag_that_differs_is_refused_in_one_line(run, tmp_path, capsys, argv,
                                                              message):
    out = run[0]
    config = json.loads((out / "run.json").read_text())["config"]
    data = tmp_path / "u.csv"
    data.write_text("user,item,timestamp\n1,2,3\n")
    names = dict(lr=config["learning_rate"], ours=config["lr_schedule"],
                 sched="cosine" if config["lr_schedule"] != "cosine" else "constant", data=data,
                 other=tmp_path / "other")
    before = (out / "run.json").read_text()
    metrics = tmp_path / "m.json"
    argv = [a.format(**names) for a in argv]
    assert cli.main(["train", "--resume", str(out), "--json", str(metrics), *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("recops-tf train: error: "), err
    assert message.format(**names) in err and "Traceback" not in err
    assert not metrics.exists() and (out / "run.json").read_text() == before


def test_the_output_flags_are_listed_once_and_in_the_help():
    parser = cli._parser()
    sub = next(a for a in parser._actions if hasattr(a, "choices") and a.choices)
    train = sub.choices["train"]
    dests = {a.dest: a for a in train._actions}
    assert set(cli.RESUME_OUTPUT_FLAGS) <= set(dests)
    text = " ".join(dests["resume"].help.split())
    for dest in set(cli.RESUME_OUTPUT_FLAGS) - {"verbose"}:
        assert f"--{dest.replace('_', '-')}" in text, dest


def test_a_resume_takes_the_runs_own_worker_count_and_refuses_another(tmp_path):
    """`--resume DIR` alone relaunches a `--workers 2` run's 2 workers; another N is refused
    before any worker starts (no TensorFlow, no training: the flags only)."""
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "workers.json").write_text('{"workers": 2}')
    (out / "run.json").write_text(json.dumps({"argv": [*TINY, "--workers", "2", "--out", "x"],
                                              "config": {"learning_rate": 0.001}}))

    def resumed(*argv):
        argv = ["--resume", str(out), *argv]
        return cli._resumed(cli._parser().parse_args(["train", *argv]), argv)

    assert resumed().workers == 2 and resumed("--workers", "2").workers == 2
    assert resumed("--worker-timeout", "5").worker_timeout == 5
    assert resumed().out == str(out) and resumed().max_steps == 2
    with pytest.raises(cli.UsageError, match="--workers 3 differs from the checkpoint's 2"):
        resumed("--workers", "3")
    with pytest.raises(cli.UsageError, match="--learning-rate 0.01 differs from the "
                       "checkpoint's 0.001"):
        resumed("--learning-rate", "1e-2")
