#!/usr/bin/env python3
"""Renders the docs' pictures from their committed results: every ``docs/results/*.json`` to
PNGs under ``docs/img/``, one command, the same bytes on a rerun (fixed size and dpi, no
software version or date in the file).

    python tools/plots.py                         # docs/results/*.json -> docs/img/
    python tools/plots.py --out-dir /tmp/img      # elsewhere
    python tools/plots.py docs/results/serving.json

A results file says its ``"kind"`` (or is recognised by its shape) and where its figures come
from (``"source"``: the doc section and the command that measured them):

- ``quality``: per data set, the test HR@10 / NDCG@10 of the defaults next to the baselines
  and published results (docs/quality.md's tables) -> ``quality.png``.
- ``benchmarks``: rows of ``recops-tf bench --json`` (stem, case, mode, speedup; a ``short``
  label optional) drawn by ``recops_tf.bench.speedup_chart``, the chart of ``recops-tf bench
  --chart``, with the JSON's CPU added to its title -> ``speedups.png`` (the file is
  docs/results/speedups.json: .gitignore keeps ``bench*.json`` out of the repository).
- ``serving``: ``tools/bench_serve.py --json``'s ``predict`` rows (p50 / p99 latency and
  throughput by concurrency, REST and gRPC, batching on and off, the in-process floor) ->
  ``NAME.png``; its ``cache`` rows, when present (one new event on H cached events against the
  recompute) -> ``NAME_cache.png``.
- ``time_to_quality``: ``tools/bench_time_to_quality.py``'s ``DIR/results.json`` records
  (wall time to the best validation and the whole run per data set and build), bare as the
  tool writes them or under ``"records"`` beside a ``"source"`` -> ``NAME.png``.

A file that is not JSON, or lacks what its kind needs, stops the command with a message
naming the file and what is missing (exit status 1); nothing is written for it.
"""
import argparse
import contextlib
import glob
import json
import io
import math
import os
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # recops_tf.bench loads TensorFlow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")
IMG = os.path.join(ROOT, "docs", "img")
DPI = 100
# No "Software" (matplotlib's version) in the PNG: a rerun with another matplotlib version
# changes the file only if its drawing changed.
METADATA = {"Software": None}
COLORS_PNG = 128
COLORS = {"defaults": "#1f6fb4", "preset": "#8fb3d9", "other": "#9a9a9a",
          "published": "#d9822b", "baseline": "#5a5a5a"}


class BadResults(Exception):
    """A results file that cannot be drawn: the message says why."""


def _need(mapping, key, where):
    if not isinstance(mapping, dict) or key not in mapping:
        raise BadResults(f"{where}: missing {key!r}")
    return mapping[key]


def _number(value, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value):
        raise BadResults(f"{where}: expected a number, got {value!r}")
    return float(value)


def _figure(width, height):
    """A matplotlib Figure drawn by Agg, outside pyplot (no global state, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _png(fig, path, savefig=None):
    """Writes `fig` to `path` as a PNG of at most `COLORS_PNG` colours (Agg's antialiasing
    makes thousands, three times the bytes, for no visible difference), no metadata."""
    from PIL import Image  # matplotlib's own dependency

    buffer = io.BytesIO()
    (savefig or fig.savefig)(buffer, format="png", dpi=DPI, metadata=METADATA)
    image = Image.open(buffer).convert("RGB").quantize(
        colors=COLORS_PNG, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    image.save(path, format="png", optimize=True)
    return path


def _log_axis(axis):
    """A log axis labelled in plain numbers at 1, 2 and 5 of each decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
    axis.set_minor_formatter(NullFormatter())


def _machine(results):
    machine = results.get("machine") or {}
    cpu = machine.get("cpu")
    cpus = machine.get("cpus") or (results.get("config") or {}).get("cpus")
    text = ", ".join(x for x in (cpu, f"{cpus} cores" if cpus else None) if x)
    return text or "CPU not recorded"


def kind_of(results):
    """The results' kind: their "kind", else recognised by their keys."""
    if isinstance(results, list):
        if results and all(isinstance(r, dict) and "to_best_seconds" in r for r in results):
            return "time_to_quality"
        raise BadResults("a list, but not of bench_time_to_quality.py records (each with "
                         "'to_best_seconds')")
    if not isinstance(results, dict):
        raise BadResults(f"expected a JSON object or list, got {type(results).__name__}")
    if "kind" in results:
        return results["kind"]
    for kind, key in (("benchmarks", "rows"), ("serving", "predict"), ("quality", "datasets"),
                      ("time_to_quality", "records")):
        if key in results:
            return kind
    raise BadResults("no 'kind', and none of the keys 'rows' (benchmarks), 'predict' "
                     "(serving), 'datasets' (quality), 'records' (time_to_quality)")


# -- quality ------------------------------------------------------------------------------------
def plot_quality(results, stem, out_dir):
    datasets = _need(results, "datasets", "quality")
    if not isinstance(datasets, list) or not datasets:
        raise BadResults("quality: 'datasets' must be a non-empty list")
    metrics = results.get("metrics", ["hr@10", "ndcg@10"])
    cols = min(3, len(datasets))
    rows_n = math.ceil(len(datasets) / cols)
    fig = _figure(5.2 * cols, 0.5 + 3.0 * rows_n)
    axes = fig.subplots(rows_n, cols, squeeze=False).ravel()
    for ax, data in zip(axes, datasets):
        name = _need(data, "name", "quality dataset")
        rows = _need(data, "rows", f"quality {name!r}")
        if not isinstance(rows, list) or not rows:
            raise BadResults(f"quality {name!r}: 'rows' must be a non-empty list")
        height = 0.8 / len(metrics)
        for j, metric in enumerate(metrics):
            for i, row in enumerate(rows):
                where = f"quality {name!r} row {i}"
                value = _number(_need(row, metric, where), where)
                std = row.get(f"{metric}_std")
                ax.barh(i + (j - (len(metrics) - 1) / 2) * height, value, height,
                        color=COLORS.get(row.get("kind"), COLORS["other"]),
                        alpha=1.0 if j == 0 else 0.55, hatch=None if j == 0 else "//",
                        edgecolor="white", linewidth=0.5,
                        xerr=_number(std, where) if std is not None else None,
                        error_kw={"elinewidth": 0.8, "capsize": 2})
                ax.text(value + (float(std) if std is not None else 0.0),
                        i + (j - (len(metrics) - 1) / 2) * height, f" {value:.4f}",
                        va="center", fontsize=6.5)
        ax.set_yticks(range(len(rows)),
                      [str(r.get("label") or r.get("method", "?")) for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1.25 * max(float(r[m]) + float(r.get(f"{m}_std") or 0.0)
                                  for r in rows for m in metrics))
        ax.set_title(f"{name}\n({data.get('protocol', 'seen items kept')})", fontsize=9)
        ax.set_xlabel(" / ".join(m.upper() for m in metrics) + " on the test split",
                      fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
    for ax in axes[len(datasets):]:
        ax.set_visible(False)
    from matplotlib.patches import Patch

    legend = [Patch(color=COLORS["other"], label=f"{metrics[0].upper()} (solid)")]
    if len(metrics) > 1:
        legend.append(Patch(facecolor=COLORS["other"], alpha=0.55, hatch="//",
                            edgecolor="white", label=f"{metrics[1].upper()} (hatched)"))
    legend += [Patch(color=COLORS[k], label=label) for k, label in (
        ("defaults", "recops-tf train defaults"), ("preset", "a --preset"),
        ("published", "published"), ("baseline", "baseline (same split)"),
        ("other", "other setting"))]
    fig.legend(handles=legend, loc="lower center", ncol=len(legend), fontsize=8,
               frameon=False)
    fig.suptitle(results.get("title", "Test quality per data set"), fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return [_png(fig, os.path.join(out_dir, f"{stem}.png"))]


# -- benchmarks ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _saved_as_ours(title_suffix):
    """``Figure.savefig`` as ``recops_tf.bench.speedup_chart`` calls it, with `title_suffix`
    added to the title, this file's dpi and no software version in the PNG (that function
    names no CPU and writes matplotlib's version)."""
    from matplotlib.figure import Figure

    original = Figure.savefig

    def savefig(fig, path, **kwargs):
        for ax in fig.axes:
            ax.set_title(f"{ax.get_title()}\n{title_suffix}", fontsize=10)
        fig.tight_layout()
        return _png(fig, path, lambda *a, **k: original(fig, *a, **k))

    Figure.savefig = savefig
    try:
        yield
    finally:
        Figure.savefig = original


def plot_benchmarks(results, stem, out_dir):
    rows = _need(results, "rows", "benchmarks")
    if not isinstance(rows, list) or not rows:
        raise BadResults("benchmarks: 'rows' must be a non-empty list")
    chart_rows = []
    for i, row in enumerate(rows):
        where = f"benchmarks row {i}"
        for key in ("stem", "case", "mode"):
            _need(row, key, where)
        speedup = _number(_need(row, "speedup", where), where)
        if speedup <= 0:
            raise BadResults(f"{where}: speedup {speedup} must be positive")
        chart_rows.append(dict(row, case=row.get("short") or row["case"], speedup=speedup))
    from recops_tf import bench

    path = os.path.join(out_dir, f"{stem}.png")
    suffix = (f"{_machine(results)}, {results.get('dtype', 'float32')}; "
              "forward (fwd), forward+backward (fwd+bwd), optimizer/table steps (step)")
    with _saved_as_ours(suffix):
        if not bench.speedup_chart({"rows": chart_rows}, path):
            raise BadResults("benchmarks: matplotlib is not installed")
    return [path]


# -- serving ------------------------------------------------------------------------------------
_SERIES = (("rest", "on", "REST, batching on", "#1f6fb4", "-"),
           ("rest", "off", "REST, batching off", "#1f6fb4", "--"),
           ("grpc", "on", "gRPC, batching on", "#d9822b", "-"),
           ("grpc", "off", "gRPC, batching off", "#d9822b", "--"))


def plot_serving(results, stem, out_dir):
    predict = _need(results, "predict", "serving")
    if not isinstance(predict, list) or not predict:
        raise BadResults("serving: 'predict' must be a non-empty list")
    config = results.get("config") or {}
    for i, row in enumerate(predict):
        for key in ("api", "batching", "concurrency", "p50_ms"):
            _need(row, key, f"serving predict row {i}")
    for i, row in enumerate(results.get("cache") or []):  # checked before anything is drawn
        for key in ("history", "cached_p50_ms", "recompute_p50_ms"):
            _need(row, key, f"serving cache row {i}")
    fig = _figure(14, 4.6)
    axes = fig.subplots(1, 3)
    panels = (("p50_ms", "p50 latency (ms)"), ("p99_ms", "p99 latency (ms)"),
              ("throughput_rps", "throughput (requests/s)"))
    levels = sorted({int(r["concurrency"]) for r in predict if r["batching"] in ("on", "off")})
    for ax, (key, label) in zip(axes, panels):
        for api, batching, name, color, style in _SERIES:
            points = sorted((int(r["concurrency"]), _number(r[key], f"serving {api} {key}"))
                            for r in predict if r["api"] == api and r["batching"] == batching
                            and r.get(key) is not None)
            if points:
                ax.plot(*zip(*points), style, marker="o", markersize=4, color=color,
                        label=name)
        floor = results.get("floor") or {}
        if key != "throughput_rps" and floor.get(key) is not None:
            ax.axhline(_number(floor[key], f"serving floor {key}"), color="#5a5a5a",
                       linestyle=":", linewidth=1,
                       label="in-process serving_default (the floor)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _log_axis(ax.yaxis)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent clients (closed loop)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7.5)
    items = config.get("num_items")
    title = results.get("title") or ("recops-tf serve, :predict by concurrency" + (
        f" ({items:,} items)" if items else ""))
    fig.suptitle(f"{title}\n{_machine(results)}; server and clients on the same cores",
                 fontsize=10.5)
    fig.tight_layout()
    written = [_png(fig, os.path.join(out_dir, f"{stem}.png"))]
    if results.get("cache"):
        written.append(_plot_cache(results, stem, out_dir))
    return written


def _plot_cache(results, stem, out_dir):
    cache = results["cache"]
    fig = _figure(11, 4.4)
    left, right = fig.subplots(1, 2)
    h = [int(r["history"]) for r in cache]
    for ax, lines, title in (
            (left, (("cached_p50_ms", "REST :recommend, cached", "-"),
                    ("recompute_p50_ms", "REST :recommend, recompute (--cache-mb 0)", "--")),
             "over REST (the server)"),
            (right, (("extend_p50_ms", "extend_in_place (the cached path)", "-"),
                     ("user_state_p50_ms", "user_state (the full recompute)", "--"),
                     ("top_k_p50_ms", "top_k (both paths)", ":")),
             "in process (the SavedModel's functions)")):
        for key, label, style in lines:
            values = [r.get(key) for r in cache]
            if all(v is not None for v in values):
                ax.plot(h, [_number(v, f"serving cache {key}") for v in values], style,
                        marker="o", markersize=4, label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _log_axis(ax.yaxis)
        ax.set_xticks(h, [f"{x:,}" for x in h])
        ax.set_xlabel("events already in the user's history (H)")
        ax.set_ylabel("p50 latency of one new event (ms)")
        ax.set_title(title, fontsize=9.5)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7.5)
    fig.suptitle(f"recops-tf serve: one new event after H events, the users' cache against "
                 f"the recompute\n{_machine(results)}", fontsize=10.5)
    fig.tight_layout()
    return _png(fig, os.path.join(out_dir, f"{stem}_cache.png"))


# -- time to quality ----------------------------------------------------------------------------
def plot_time_to_quality(results, stem, out_dir):
    if isinstance(results, list):  # the tool's results.json as it writes it
        results = {"records": results}
    records = _need(results, "records", "time_to_quality")
    if not isinstance(records, list) or not records:
        raise BadResults("time_to_quality: 'records' must be a non-empty list")
    for i, r in enumerate(records):
        for key in ("data", "build", "to_best_seconds", "wall_seconds"):
            _need(r, key, f"time_to_quality record {i}")
    data = list(dict.fromkeys(r["data"] for r in records))
    builds = list(dict.fromkeys(r["build"] for r in records))  # the first: the reference
    found = {(r["data"], r["build"]): r for r in records}
    labels, notes = results.get("labels") or {}, results.get("notes") or {}
    fig = _figure(10, 5)
    ax = fig.subplots()
    width = 0.8 / len(builds)
    palette = ("#9a9a9a", "#1f6fb4", "#d9822b", "#2a9a5a")
    top = 0.0
    for j, build in enumerate(builds):
        for i, name in enumerate(data):
            r = found.get((name, build))
            if r is None:
                continue
            x = i + (j - (len(builds) - 1) / 2) * width
            where = f"time_to_quality {name} {build}"
            best = _number(r["to_best_seconds"], where)
            whole = _number(r["wall_seconds"], where)
            top = max(top, whole)
            color = palette[j % len(palette)]
            ax.bar(x, whole, width * 0.9, color=color, alpha=0.3,
                   label="whole run" if (i, j) == (0, len(builds) - 1) else None)
            ax.bar(x, best, width * 0.9, color=color,
                   label=f"{build} ({r.get('commit') or '?'}): to the best validation"
                   if i == 0 else None)
            text = f"{best:,.0f} s"
            ref = found.get((name, builds[0]))
            if j > 0 and ref is not None:
                text += f"\n{_number(ref['to_best_seconds'], where) / best:.2f}x"
            ax.text(x, best, text, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(data)), [
        labels.get(d, d) + ("\n" + textwrap.fill(f"({notes[d]})", 44) if d in notes else "")
        for d in data], fontsize=8)
    ax.set_ylabel("wall time from the process's start (s)")
    ax.set_ylim(0, top * 1.1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    metric = next((r.get("validation_metric") for r in records if r.get("validation_metric")),
                  "ndcg@10")
    title = results.get("title", f"Time to the best validation {metric.upper()}")
    seeds = sorted({r.get("seed") for r in records if r.get("seed") is not None})
    fig.suptitle(f"{title}\n{_machine(results)}; seed {', '.join(map(str, seeds))}; "
                 f"x {builds[0]}: {builds[0]}'s time to best over the build's", fontsize=10)
    fig.tight_layout()
    return [_png(fig, os.path.join(out_dir, f"{stem}.png"))]


PLOTS = {"quality": plot_quality, "benchmarks": plot_benchmarks, "serving": plot_serving,
         "time_to_quality": plot_time_to_quality}


def render(path, out_dir):
    """Draws the results file `path` into `out_dir`; returns the PNGs written. BadResults
    names the file and what is wrong with it."""
    try:
        with open(path) as f:
            results = json.load(f)
    except json.JSONDecodeError as e:
        raise BadResults(f"{path}: not valid JSON ({e})") from None
    stem = os.path.splitext(os.path.basename(path))[0]
    try:
        kind = kind_of(results)
        if kind not in PLOTS:
            raise BadResults(f"unknown kind {kind!r} (one of {', '.join(PLOTS)})")
        return PLOTS[kind](results, stem, out_dir)
    except BadResults as e:
        raise BadResults(f"{path}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:  # a shape the checks above did not name
        raise BadResults(f"{path}: unexpected content ({type(e).__name__}: {e})") from None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help="results files (default: every "
                        "docs/results/*.json)")
    parser.add_argument("--out-dir", default=IMG, help="where the PNGs go (default: docs/img)")
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        parser.error("needs matplotlib: pip install 'recops_tf[chart]'")
    files = args.files or sorted(glob.glob(os.path.join(RESULTS, "*.json")))
    if not files:
        parser.error(f"no results files in {RESULTS}")
    os.makedirs(args.out_dir, exist_ok=True)
    try:
        for path in files:
            for png in render(path, args.out_dir):
                print(f"{os.path.relpath(path)} -> {os.path.relpath(png)} "
                      f"({os.path.getsize(png) / 1024:.0f} KB)")
    except (BadResults, OSError) as e:
        print(f"plots.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
