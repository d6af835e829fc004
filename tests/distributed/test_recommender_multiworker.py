"""`recops-tf train --workers N`: worker processes on TensorFlow's runtime train the one-worker
model (up to float order), checkpoint per worker, resume after a worker is killed, name a dead
or hung worker, and export the whole table."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from recops_tf import recommender as rec

_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
_ENV.pop("TF_CONFIG", None)
# The console script: its launcher imports no TensorFlow (no log lines of its own).
CLI = [os.path.join(os.path.dirname(sys.executable), "recops-tf")]
SMALL = ["--users", "120", "--items", "60", "--d-model", "16", "--blocks", "1", "--head-dim",
         "8", "--max-seq-len", "16", "--dropout", "0", "--min-steps", "0", "--no-progress",
         "--seed", "3", "--eval-every", "1000"]


def _train(*args, timeout=300):
    return subprocess.run([*CLI, "train", *SMALL, *args],
                          capture_output=True, text=True, env=_ENV, timeout=timeout)


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_two_workers_train_the_one_worker_model_and_export_it_whole(tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    done = _train("--max-steps", "30", "--json", str(one), "--out", str(tmp_path / "m1"))
    assert done.returncode == 0, done.stderr[-2000:]
    # --worker-timeout 2: the workers spend longer than that between two steps (the first
    # checkpoint, tracing the evaluation; over 10 s on a loaded machine) and answer each other
    # all along: not hung (a watchdog on progress alone ended this run)
    done = _train("--max-steps", "30", "--json", str(two), "--out", str(tmp_path / "m2"),
                  "--workers", "2", "--worker-timeout", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    # The same global batches, negatives and initial weights: the same run up to float order.
    np.testing.assert_allclose([a["first_loss"], a["last_loss"]],
                               [b["first_loss"], b["last_loss"]], rtol=1e-5)
    for key in ("hr@10", "ndcg@10", "mrr"):
        assert abs(a["test"][key] - b["test"][key]) < 0.02, key
    assert "markov" in done.stdout and done.stdout.count("test: last item") == 2
    # Per-worker checkpoints; one export with the whole (gathered) item table.
    assert sorted(os.listdir(tmp_path / "m2" / "checkpoints")) == ["worker-0", "worker-1",
                                                                  "workers.json"]
    history = [str(i) for i in (1, 5, 9, 12)]
    items1, scores1 = rec.recommend(str(tmp_path / "m1"), history, k=5)
    items2, scores2 = rec.recommend(str(tmp_path / "m2"), history, k=5)
    assert items1 == items2
    np.testing.assert_allclose(scores1, scores2, rtol=1e-3, atol=1e-3)


def test_a_killed_worker_stops_the_job_and_resume_continues_to_the_same_result(tmp_path):
    out = tmp_path / "run"
    args = ["--max-steps", "60", "--checkpoint-every", "5", "--workers", "2"]
    whole = _train(*args, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-2000:]
    proc = subprocess.Popen([*CLI, "train", *SMALL, *args, "--out",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_ENV)
    last = out / "checkpoints" / "worker-1" / "last"
    wanted = 2  # checkpoints to wait for (the two kept: the newest and the one before)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if last.exists() and sum(n.endswith(".index") for n in os.listdir(last)) >= wanted:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    victim = _children(proc.pid)[1]
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and time.monotonic() - killed < 90
    assert "worker 1 of 2 failed (killed by SIGKILL)" in err, err[-2000:]
    assert len(err.strip().splitlines()) == 1, err
    # Worker 1 killed between the two workers' saves of a step: worker 0 a step ahead. Made
    # so here, whatever the kill's timing, by dropping worker 1's newest checkpoint: the
    # resume must take the newest step both kept.
    kept = tf.train.get_checkpoint_state(str(last))
    paths = list(kept.all_model_checkpoint_paths)
    first = tf.train.get_checkpoint_state(str(out / "checkpoints" / "worker-0" / "last"))
    if len(paths) >= 2 and os.path.basename(first.model_checkpoint_path) == \
            os.path.basename(paths[-1]):
        tf.compat.v1.train.update_checkpoint_state(
            str(last), paths[-2], paths[:-1],
            all_model_checkpoint_timestamps=list(kept.all_model_checkpoint_timestamps)[:-1],
            last_preserved_timestamp=kept.last_preserved_timestamp)
    # Another number of workers is refused; as many resume.
    done = subprocess.run([*CLI, "train", "--resume", str(out),
                           "--workers", "1", "--no-progress"], capture_output=True, text=True,
                          env=_ENV, timeout=300)
    assert done.returncode == 2 and "resume with as many" in done.stderr, done.stderr[-2000:]
    done = subprocess.run([*CLI, "train", "--resume", str(out),
                           "--workers", "2", "--no-progress"], capture_output=True, text=True,
                          env=_ENV, timeout=300)
    assert done.returncode == 0 and "resumed from" in done.stdout, done.stderr[-2000:]
    resumed = json.loads((out / "info.json").read_text())["metrics"]
    straight = json.loads((tmp_path / "whole" / "info.json").read_text())["metrics"]
    assert resumed["steps"] == straight["steps"] == 60
    np.testing.assert_allclose(resumed["last_loss"], straight["last_loss"], rtol=1e-5)
    assert resumed["test"]["hr@10"] == pytest.approx(straight["test"]["hr@10"], abs=0.02)


def test_a_hung_worker_is_named(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([*CLI, "train", *SMALL, "--max-steps",
                             "100000", "--workers", "2", "--worker-timeout", "5",
                             "--checkpoint-every", "5", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_ENV)
    last = out / "checkpoints" / "worker-1" / "last"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None and not (
            last.exists() and any(n.endswith(".index") for n in os.listdir(last))):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    stuck = _children(proc.pid)[1]
    os.kill(stuck, signal.SIGSTOP)  # alive, but it never answers again
    began = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and time.monotonic() - began < 60
    # named by worker 0's watchdog (worker 1's server stopped answering its probes), however
    # loaded the machine: the probes' answers come from the workers' gRPC threads
    assert "worker 1 of 2 failed (hung: it stopped answering" in err, err[-2000:]
    assert len(err.strip().splitlines()) == 1, err
    with pytest.raises(ProcessLookupError):
        os.kill(stuck, 0)  # the launcher ended it too


@pytest.mark.parametrize("env,argv,words", [
    ({}, ["--workers", "0"], "--workers 0"),
    ({}, ["--workers", "2", "--worker-timeout", "0"], "--worker-timeout"),
    ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                               "task": {"type": "chief", "index": 0}})}, [], "TF_CONFIG"),
])
def test_bad_worker_flags_exit_2_with_one_line(env, argv, words):
    done = subprocess.run([*CLI, "train", *SMALL, *argv],
                          capture_output=True, text=True, env=dict(_ENV, **env), timeout=120)
    assert done.returncode == 2 and words in done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
