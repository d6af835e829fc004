#!/usr/bin/env python3
"""Recommendation quality as a user gets it: ``recops-tf train --data FILE`` (the defaults, or
the flags given after ``--``) on each data file and seed, one run after another, and a
markdown table of the test metrics (mean ± std over seeds) next to the baselines of the same
split. Runs already in ``--runs DIR`` (their JSON) are reused, so an interrupted table resumes.

    python tools/bench_quality.py --data ml-100k/u.data Beauty.txt --seeds 0 1 2
    python tools/bench_quality.py --data u.data --name sasrec -- --encoder sasrec

The data files are the user's (fetched for local evaluation, never committed). Each row says
the flags it ran with; a row without flags is the defaults. The table gives HR and NDCG at 10
with seen items kept and excluded, HR and NDCG at 5 and 20 (the SASRec family's cut-offs, seen
items kept), the ratio to the Markov chain, and the training time per epoch.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(data, seed, flags, path, fmt):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    argv = [sys.executable, "-m", "recops_tf", "train", "--data", data, "--seed", str(seed),
            "--no-progress", "--json", path, *flags]
    if fmt:
        argv += ["--format", fmt]
    print("running:", " ".join(argv[3:]), flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{proc.stderr[-3000:]}")
    with open(path) as f:
        return json.load(f)


def _protocol(result, exclude):
    """(model metrics, baselines) under seen items kept (exclude False) or excluded."""
    if result["exclude_seen"] == exclude:
        return result["test"], result["baselines"]
    return result["test_other_protocol"], result["baselines_other_protocol"]


def _cell(values, digits=4):
    if any(v is None for v in values):  # a run from before the metric was reported
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(rows):
    """Markdown rows: one per (data, name), then the Markov chain and popularity per data."""
    head = ("| data | method | HR@10 kept | NDCG@10 kept | HR@10 excl. | NDCG@10 excl. | "
            "HR@5 | NDCG@5 | HR@20 | NDCG@20 | x Markov HR@10 / NDCG@10 (kept; excl.) | "
            "s / epoch |")
    out = [head, "|" + "---|" * 12]
    for (data, name), results in rows.items():
        cells, ratios = [], []
        for exclude in (False, True):
            model = [_protocol(r, exclude)[0] for r in results]
            markov = [_protocol(r, exclude)[1]["markov"] for r in results]
            cells += [_cell([m["hr@10"] for m in model]), _cell([m["ndcg@10"] for m in model])]
            ratios.append(
                f"{statistics.mean(m['hr@10'] for m in model) / markov[0]['hr@10']:.2f}x / "
                f"{statistics.mean(m['ndcg@10'] for m in model) / markov[0]['ndcg@10']:.2f}x")
        kept = [_protocol(r, False)[0] for r in results]
        cells += [_cell([m.get(k) for m in kept]) for k in ("hr@5", "ndcg@5", "hr@20",
                                                              "ndcg@20")]
        per_epoch = [r["train_seconds"] / max(r["steps"], 1) * r["steps_per_epoch"]
                     for r in results if "steps_per_epoch" in r]
        seeds = f"{len(results)} seed{'s' if len(results) > 1 else ''}"
        out.append(f"| {data} | {name} ({seeds}) | " + " | ".join(cells) +
                   f" | {'; '.join(ratios)} | "
                   f"{f'{statistics.mean(per_epoch):.1f}' if per_epoch else 'n/a'} |")
    done = set()
    for (data, _), results in rows.items():
        if data in done:
            continue
        done.add(data)
        for base in ("markov", "popularity"):
            cells = []
            for exclude in (False, True):
                m = _protocol(results[0], exclude)[1][base]
                cells += [f"{m['hr@10']:.4f}", f"{m['ndcg@10']:.4f}"]
            m = _protocol(results[0], False)[1][base]
            cells += [f"{m[k]:.4f}" if k in m else "n/a" for k in ("hr@5", "ndcg@5", "hr@20",
                                                                   "ndcg@20")]
            out.append(f"| {data} | {base} | " + " | ".join(cells) + " | | |")
    return "\n".join(out)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="interaction files")
    parser.add_argument("--format", help="their format (default: detected)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--name", default="defaults", help="the row's name")
    parser.add_argument("--runs", default="quality-runs", help="the runs' JSON files here")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args(argv)
    os.makedirs(args.runs, exist_ok=True)
    rows = {}
    for data in args.data:
        label = os.path.basename(data)
        results = []
        for seed in args.seeds:
            tag = "_".join([label, args.name, f"s{seed}"]).replace("/", "_")
            results.append(run(data, seed, flags, os.path.join(args.runs, tag + ".json"),
                               args.format))
        name = args.name + (f" (`{' '.join(flags)}`)" if flags else "")
        rows[(label, name)] = results
    text = table(rows)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
