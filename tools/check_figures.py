#!/usr/bin/env python3
"""Reruns the short figures the README and docs state and fails when one leaves its documented
spread: run it whenever the recommender, the ops it uses or the defaults change.

    python tools/check_figures.py --ml-100k ~/ml-100k        # every figure (about 30 minutes)
    python tools/check_figures.py --ml-100k ~/ml-100k --only ranking

Each figure is a `recops-tf` command run as a user runs it (its `--json` record read back), a
value from that record, the documented value and the spread the docs give for it (over seeds,
or a rerun's), and the doc that states it. A figure may also be a comparison the docs claim
(the ranker ahead of its baselines). Prints one line per check; exits 1 if any check fails, 2
on a usage error (a missing data folder). Data is read from your own copy (never committed).
"""
import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time


@dataclasses.dataclass
class Figure:
    name: str
    argv: list  # `recops-tf` arguments; "{ml100k}" is the MovieLens-100K folder
    source: str  # the doc that states the figures
    # (path in the --json record, documented value, spread): passes within value +- spread
    values: list = dataclasses.field(default_factory=list)
    # (path, path): the first above the second, as the doc claims
    above: list = dataclasses.field(default_factory=list)


FIGURES = [
    Figure(
        "retrieval",
        ["train", "--data", "{ml100k}/u.data", "--seed", "0"],
        "README.md Results and docs/quality.md: MovieLens-100K seed 0 with the defaults "
        "(0.2206 / 0.1213); spread: the seeds 0-2 range of the same encoder recipe "
        "(HR@10 0.2068-0.2163, NDCG@10 0.1088-0.1167)",
        values=[("test.hr@10", 0.2206, 0.006), ("test.ndcg@10", 0.1213, 0.004)],
        above=[("test.hr@10", "baselines.sequential_rules.hr@10"),
               ("test.ndcg@10", "baselines.markov.ndcg@10")]),
    Figure(
        "ranking",
        ["train", "--task", "ranking", "--data", "{ml100k}/u.data", "--seed", "0"],
        "docs/ranking.md: the HSTU ranker's like AUC over seeds 0-2, 0.7769 +- 0.0035 (spread "
        "3 standard deviations); ahead of the DLRM-style and two-tower models in AUC and NE",
        values=[("models.hstu.test.like.auc", 0.7769, 3 * 0.0035)],
        above=[("models.hstu.test.like.auc", "models.dlrm.test.like.auc"),
               ("models.hstu.test.like.auc", "models.two-tower.test.like.auc"),
               ("models.dlrm.test.like.ne", "models.hstu.test.like.ne"),
               ("models.two-tower.test.like.ne", "models.hstu.test.like.ne")]),
]


def lookup(record, path):
    """The value at a dotted `path` of a --json record (keys may hold '-', not '.')."""
    node = record
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            raise KeyError(f"{path}: no {key!r} in the record")
        node = node[key]
    return float(node)


def check(figure, record):
    """[(ok, text)] for every check of `figure` on its --json `record`."""
    out = []
    for path, value, spread in figure.values:
        got = lookup(record, path)
        ok = abs(got - value) <= spread + 1e-12
        out.append((ok, f"{path} {got:.4f}, documented {value:.4f} +- {spread:.4f}"))
    for high, low in figure.above:
        a, b = lookup(record, high), lookup(record, low)
        out.append((a > b, f"{high} {a:.4f} above {low} {b:.4f}"))
    return out


def run(figure, ml100k, workdir):
    """Runs `figure`'s command; its --json record."""
    out = os.path.join(workdir, figure.name + ".json")
    argv = [a.replace("{ml100k}", ml100k) for a in figure.argv]
    command = [sys.executable, "-m", "recops_tf"] + argv + ["--json", out, "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: "
                           f"{done.stderr.strip().splitlines()[-1:]}")
    with open(out) as f:
        return json.load(f)


def main(argv=None, runner=run):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ml-100k", required=True, metavar="DIR",
                        help="MovieLens-100K's folder (u.data, u.user)")
    parser.add_argument("--only", action="append", choices=[f.name for f in FIGURES],
                        help="these figures only (repeatable)")
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.ml_100k, "u.data")):
        parser.error(f"--ml-100k {args.ml_100k}: no u.data there")
    failed = 0
    with tempfile.TemporaryDirectory() as workdir:
        for figure in FIGURES:
            if args.only and figure.name not in args.only:
                continue
            began = time.perf_counter()
            try:
                results = check(figure, runner(figure, args.ml_100k, workdir))
            except (RuntimeError, KeyError) as error:
                results = [(False, str(error))]
            print(f"{figure.name} ({time.perf_counter() - began:.0f} s): {figure.source}")
            for ok, text in results:
                print(f"  {'ok  ' if ok else 'FAIL'} {text}")
                failed += not ok
    print(f"{failed} check(s) failed" if failed else "every figure within its spread")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
