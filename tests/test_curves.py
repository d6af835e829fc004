"""`recops-tf train --out DIR` writes DIR/curves.png (a PNG matplotlib reads back: the loss
and the validation metric by step, the baselines as lines) and TensorBoard logs under DIR/logs
by default (`--logdir DIR2` elsewhere, `--logdir none` none: the loss then from the validation
history); a resumed run's logs carry on and its curves are drawn again; a fresh run into an old
run's directory draws its own steps; without matplotlib, or if drawing fails, the picture is
skipped in one line; a log cut short by a kill is read up to the cut."""
import json
import os
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf

from recops_tf import cli
from recops_tf.recommender import curves

pytest.importorskip("matplotlib")

TINY = ["--users", "60", "--items", "40", "--epochs", "2", "--batch-size", "16",
        "--d-model", "16", "--blocks", "1", "--head-dim", "8", "--max-seq-len", "16",
        "--negatives", "8", "--eval-every", "2", "--transition-prior", "0", "--no-progress"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _valid_png(path):
    import matplotlib.image

    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    pixels = matplotlib.image.imread(str(path))
    assert pixels.ndim == 3 and pixels.shape[0] >= 300 and pixels.shape[1] >= 600
    assert pixels.std() > 0  # something drawn


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("curves") / "run"
    assert cli.main(["train", *TINY, "--out", str(out)]) == 0
    return out


def test_train_out_writes_curves_and_logs(run, capsys):
    _valid_png(run / "curves.png")
    history = json.loads((run / "run.json").read_text())["metrics"]["validation"]
    assert [h["step"] for h in history] == [2, 4, 6, 8]
    assert all(np.isfinite(h["train_loss"]) for h in history)
    losses = curves.scalars_from_logs(str(run / "logs"))
    assert sorted(losses) == list(range(1, 9))  # every step's loss, in DIR/logs by default
    # The loss of the step each validation followed, as the history keeps it.
    assert [losses[h["step"]] for h in history] == pytest.approx(
        [h["train_loss"] for h in history], rel=1e-6)


def test_logdir_none_writes_no_logs_and_still_the_curves(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--max-steps", "4", "--out", str(out), "--logdir",
                     "none"]) == 0
    assert "curves: " in capsys.readouterr().out
    assert not (out / "logs").exists()
    _valid_png(out / "curves.png")


def test_a_resumed_run_carries_its_logs_on_and_redraws_its_curves(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", *TINY, "--max-steps", "4", "--checkpoint-every", "1", "--out", str(out)]
    assert cli.main(argv) == 0
    first = curves.scalars_from_logs(str(out / "logs"))
    # As if killed after its checkpoint of step 3: the newest checkpoint made step 3's.
    last = str(out / "checkpoints" / "last")
    tf.compat.v1.train.update_checkpoint_state(last, os.path.join(last, "ckpt-3"),
                                               [os.path.join(last, "ckpt-3")])
    os.remove(out / "curves.png")
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert "resumed from" in capsys.readouterr().out
    _valid_png(out / "curves.png")
    again = curves.scalars_from_logs(str(out / "logs"))
    assert len(os.listdir(out / "logs")) == 2 and sorted(again) == [1, 2, 3, 4]
    assert again == pytest.approx(first)  # step 4 ran again, the same loss


def test_without_matplotlib_the_curves_are_skipped_in_one_line(run, tmp_path, monkeypatch):
    metrics = json.loads((run / "run.json").read_text())["metrics"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    lines = []
    assert curves.write(str(tmp_path), metrics, str(run / "logs"), log=lines.append) is None
    assert len(lines) == 1 and "matplotlib is not installed" in lines[0]
    assert not os.listdir(tmp_path)


def test_a_fresh_run_into_an_old_runs_directory_draws_its_own_losses(run, tmp_path,
                                                                     monkeypatch):
    metrics = json.loads((run / "run.json").read_text())["metrics"]
    seen = {}

    def draw(metrics, losses):  # records the losses it is given, then fails
        seen.update(losses)
        raise RuntimeError("drawn")

    monkeypatch.setattr(curves, "draw", draw)
    lines = []
    shorter = dict(metrics, steps=5)  # a newer run of 5 steps beside the 8 of the logs
    assert curves.write(str(tmp_path), shorter, str(run / "logs"), log=lines.append) is None
    assert sorted(seen) == [1, 2, 3, 4, 5]
    assert lines == ["curves.png: not written (RuntimeError: drawn)"]  # the run goes on


def test_a_log_cut_short_is_read_to_the_cut(run, tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(run / "logs", logs)
    (name,) = os.listdir(logs)
    whole = curves.scalars_from_logs(str(logs))
    with open(logs / name, "r+b") as f:  # the last record's end lost
        f.truncate(os.path.getsize(logs / name) - 3)
    cut = curves.scalars_from_logs(str(logs))
    assert 0 < len(cut) <= len(whole) and all(whole[s] == cut[s] for s in cut)
    assert curves.scalars_from_logs(str(tmp_path / "nothing")) == {}
