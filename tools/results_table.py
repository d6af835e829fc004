#!/usr/bin/env python3
"""Averages `recops-tf train --json` result files over seeds into a markdown table: per
method (the run's preset, and the Markov and popularity baselines computed in the same runs)
the mean and spread of HR / NDCG @10/50/200 and MRR, epochs and train time, under both
evaluation protocols (seen items kept / excluded).

    python tools/results_table.py runs/hstu_s*.json runs/sasrec_s*.json [--out table.md]

Files of one preset are grouped; baselines are taken from the first preset's runs (every run
computes them on the same split).
"""
import argparse
import collections
import json

import numpy as np

COLUMNS = ("hr@10", "ndcg@10", "hr@50", "ndcg@50", "hr@200", "ndcg@200", "mrr")


def load(paths):
    runs = collections.defaultdict(list)
    for path in paths:
        with open(path) as f:
            result = json.load(f)
        name = result["config"]["preset"] + ("" if result["config"]["use_fused"]
                                             else " --no-fused")
        runs[name].append(result)
    return runs


def protocol_metrics(result, exclude_seen):
    """(model, baselines) metrics of one result under the asked protocol."""
    if result["exclude_seen"] == exclude_seen:
        return result["test"], result["baselines"]
    return result["test_other_protocol"], result["baselines_other_protocol"]


def cell(values, spread=True, digits=4):
    values = np.asarray(values, np.float64)
    if len(values) == 1 or not spread:
        return f"{values.mean():.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=0):.{digits}f}"


def table(runs, exclude_seen):
    head = ("| method | seeds | " + " | ".join(c.upper() for c in COLUMNS) +
            " | epochs | train s |")
    lines = [head, "|" + "---|" * (len(COLUMNS) + 4)]
    first = next(iter(runs.values()))
    for name, results in runs.items():
        ms = [protocol_metrics(r, exclude_seen)[0] for r in results]
        lines.append(f"| {name} | {len(results)} | " +
                     " | ".join(cell([m[c] for m in ms]) for c in COLUMNS) +
                     f" | {cell([r['epochs'] for r in results], False, 0)} | "
                     f"{cell([r['train_seconds'] for r in results], False, 0)} |")
    for base in ("markov", "popularity"):
        ms = [protocol_metrics(r, exclude_seen)[1][base] for r in first]
        lines.append(f"| {base} | (deterministic) | " +
                     " | ".join(cell([m[c] for m in ms], False) for c in COLUMNS) +
                     " | - | - |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    runs = load(args.results)
    text = []
    for exclude in (False, True):
        text.append(f"Seen items {'excluded' if exclude else 'kept'} "
                    f"({'--exclude-seen' if exclude else 'default'}); mean ± std over seeds:\n")
        text.append(table(runs, exclude) + "\n")
    out = "\n".join(text)
    print(out)
    if args.out:
        with open(args.out, "w") as f:
            f.write(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
