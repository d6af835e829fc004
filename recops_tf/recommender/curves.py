"""``recops-tf train --out DIR``'s ``DIR/curves.png``: the training loss and the validation
metric by step, the test figures of sequential rules, the Markov chain and popularity as lines
beside the model's.

The loss is every step's, read back from the run's TensorBoard logs (``train/loss``; a resumed
run's logs overlap the killed run's, and the newer value of a step wins); without logs
(``--logdir none``) it is the loss of the step each validation followed, from the run's
validation history (``"train_loss"``). The validation metric is the history's. matplotlib is
optional (the ``chart`` extra): without it the picture is skipped with one line.
"""
import glob
import math
import os
import struct

import numpy as np

NAME = "curves.png"
LOSS_TAG = "train/loss"
_SIZE, _DPI = (11.0, 4.2), 100


def _records(path):
    """The records of a TFRecord file (TensorBoard's event files), read without TensorFlow's
    input pipeline; a record cut short (a killed writer) ends the file."""
    with open(path, "rb") as f:
        while True:
            head = f.read(12)  # length (uint64), its masked crc32 (uint32)
            if len(head) < 12:
                return
            (length,) = struct.unpack("<Q", head[:8])
            data = f.read(length)
            if len(data) < length or len(f.read(4)) < 4:  # the data's masked crc32
                return
            yield data


def _stamp(path):
    """The creation time in an event file's name (events.out.tfevents.TIME.HOST...)."""
    parts = os.path.basename(path).split(".")
    return int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else 0


def scalars_from_logs(logdir, tag=LOSS_TAG):
    """``{step: value}`` of the scalar `tag` in the TensorBoard event files of `logdir` (the
    newer file's value where files share a step); {} without any."""
    from tensorflow.core.util import event_pb2

    values = {}
    files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")),
                   key=lambda p: (_stamp(p), p))
    for path in files:
        for record in _records(path):
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.tag != tag:
                    continue
                if value.HasField("tensor"):
                    tensor = value.tensor
                    number = (tensor.float_val[0] if tensor.float_val else
                              np.frombuffer(tensor.tensor_content, np.float32)[0])
                else:
                    number = value.simple_value
                values[int(event.step)] = float(number)
    return values


def _smoothed(values, window):
    """The trailing mean of `window` values (fewer at the start)."""
    sums = np.cumsum(np.insert(np.asarray(values, np.float64), 0, 0.0))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def draw(metrics, losses=None):
    """The figure (a matplotlib Figure on the Agg canvas) of a run's `metrics` (what ``train
    --json`` writes: ``validation``, ``config``, ``test``, ``baselines``, ``best_step``), with
    the per-step `losses` ``{step: loss}`` when there are any."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    history = metrics.get("validation") or []
    config = metrics.get("config") or {}
    metric = config.get("validation_metric", "ndcg@10")
    fig = Figure(figsize=_SIZE, dpi=_DPI)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)

    if losses:
        steps = sorted(losses)
        values = [losses[s] for s in steps]
        window = max(1, len(steps) // 50)
        left.plot(steps, values, color="#1f6fb4", alpha=0.3 if window > 1 else 1.0,
                  linewidth=0.8, label="each step (TensorBoard train/loss)")
        if window > 1:
            left.plot(steps, _smoothed(values, window), color="#1f6fb4", linewidth=1.6,
                      label=f"mean of the last {window} steps")
    else:
        points = [(h["step"], h["train_loss"]) for h in history
                  if h.get("train_loss") is not None and math.isfinite(h["train_loss"])]
        if points:
            left.plot(*zip(*points), marker="o", markersize=3, color="#1f6fb4",
                      label="the step before each validation")
    left.set_xlabel("training step")
    left.set_ylabel(f"training loss ({config.get('loss', '?')})")
    left.set_title("training loss", fontsize=10)
    left.grid(alpha=0.3)
    if left.lines:
        left.legend(fontsize=8)

    points = [(h["step"], h[metric]) for h in history if metric in h]
    if points:
        right.plot(*zip(*points), marker="o", markersize=3, color="#1f6fb4",
                   label=f"model, validation {metric}")
    best = metrics.get("best_step")
    test = (metrics.get("test") or {}).get(metric)
    if test is not None and best is not None and best >= 0:
        prior = (metrics.get("transition_prior") or {}).get("value")
        right.plot([best], [test], marker="*", markersize=12, linestyle="none",
                   color="#d9822b", label=f"model, test {metric} (best step's weights"
                   + (f", transition prior {prior:g})" if prior else ")"))
        right.axvline(best, color="#d9822b", linestyle=":", linewidth=0.8)
    for name, label, style in (("sequential_rules", "sequential rules", "-."),
                               ("markov", "Markov chain", "--"),
                               ("popularity", "popularity", ":")):
        value = ((metrics.get("baselines") or {}).get(name) or {}).get(metric)
        if value is not None:
            right.axhline(value, color="#5a5a5a", linestyle=style, linewidth=1.2,
                          label=f"{label}, test {metric}")
    right.set_xlabel("training step")
    right.set_ylabel(metric.upper())
    protocol = "seen items excluded" if metrics.get("exclude_seen") else "seen items kept"
    right.set_title(f"{metric.upper()} ({protocol})", fontsize=10)
    right.grid(alpha=0.3)
    if right.lines:
        right.legend(fontsize=8)

    data = os.path.basename(str(metrics.get("data", ""))) or "data"
    fig.suptitle(f"recops-tf train, --preset {config.get('preset', '?')} on {data}: "
                 f"{metrics.get('steps', '?')} steps, best validation at step {best}",
                 fontsize=11)
    fig.tight_layout()
    return fig


def write(out, metrics, logdir=None, log=print):
    """Writes ``out/curves.png`` of a run's `metrics`, its per-step loss read from `logdir`
    (TensorBoard logs) when given; returns the path, or None, said in one line through `log`,
    when matplotlib is not installed or the picture failed (the run's results are saved by
    then: a picture does not fail it)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log(f"{NAME}: not written (matplotlib is not installed: pip install "
            f"'recops_tf[chart]')")
        return None
    path = os.path.join(out, NAME)
    try:
        losses = scalars_from_logs(logdir) if logdir and os.path.isdir(logdir) else {}
        # A fresh run into an old run's directory adds its logs to the old ones: its own
        # steps are the newer files' (above), and the old run's steps past its last are not.
        last = metrics.get("steps", math.inf)
        losses = {step: value for step, value in losses.items() if step <= last}
        draw(metrics, losses).savefig(path, dpi=_DPI, metadata={"Software": None})
    except Exception as e:  # noqa: BLE001  (a picture must not fail a finished run)
        log(f"{NAME}: not written ({type(e).__name__}: {e})")
        return None
    return path
