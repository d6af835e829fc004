#!/usr/bin/env python3
"""Time to quality: the defaults' wall time to their best validation NDCG@10 (and the test
figures), one build against another, same data, same seeds, one run each.

    python tools/bench_time_to_quality.py \\
        --data ml-100k=/data/u.data Beauty=/data/Beauty.pairs:sasrec Toys=/data/Toys.pairs:sasrec \\
        --seeds 0 --builds base=/work/base,new=/work/main --out ttq

For each (data set, seed, build), one after another, the build's own ``python -m recops_tf
train --data PATH [--format F] --seed S --out DIR --json FILE --no-progress`` runs in a
process of its own, with the build's checkout first on PYTHONPATH and as its working
directory, so its package and its op library load (checked first with ``python -m recops_tf
info``). Nothing else is passed (``--no-progress`` only prints a line per validation instead
of a progress bar): the defaults, as ``recops-tf train --data FILE`` runs them. Every line the
run prints is timestamped on arrival (``DIR/logs/``); the time to the best validation is the
arrival of the line of the best step's validation (``step N: valid ndcg@10 ...``), counted
from the start of the process, so it includes the start-up, the data loading and profiling,
the training steps, the validations and the checkpoints before it. The step, the steps run,
the training seconds and the test figures come from the run's ``--json``.

Each finished run is appended to ``DIR/results.json``; run again, the tool skips the (data,
seed, build, extra arguments) already there, so a killed benchmark resumes where it stopped
(an unfinished run starts again). The markdown table goes to stdout and ``DIR/table.md``;
the ratio is the first build's time over each other build's (above 1: the other is faster).
Progress goes to stderr.

``--extra-args "..."`` adds flags to every run of every build (a smoke test with short runs:
``--extra-args "--max-steps 60 --min-steps 0"``); the table's header says so, and such runs
are kept apart from the defaults' in the results.

The data files are the user's (fetched for local evaluation, never committed).
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

FORMATS = ("ml-100k", "ml-1m", "ml-csv", "sasrec", "csv")  # recommender/data.py's
METRIC = "ndcg@10"  # the defaults' validation metric
VALIDATION_LINE = re.compile(r"^step (\d+): valid (\S+) (\S+) \(best")


def parse_data(values):
    """NAME=PATH[:FORMAT] -> [(name, absolute path, format or None)]."""
    out = []
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"--data {value!r}: expected NAME=PATH[:FORMAT]")
        path, fmt = rest, None
        head, colon, tail = rest.rpartition(":")
        if colon and tail in FORMATS:
            path, fmt = head, tail
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            raise SystemExit(f"--data {name}: {path}: no such file")
        if re.search(r"[^\w.+-]", name):
            raise SystemExit(f"--data {value!r}: the name may hold letters, digits, . + - _")
        out.append((name, path, fmt))
    if len({n for n, _, _ in out}) != len(out):
        raise SystemExit("--data: two data sets have the same name")
    return out


def parse_builds(value):
    """NAME=CHECKOUT,NAME=CHECKOUT -> [(name, absolute checkout)], in order."""
    out = []
    for part in value.split(","):
        name, sep, path = part.strip().partition("=")
        if not sep or not name or not path or re.search(r"[^\w.+-]", name):
            raise SystemExit(f"--builds {value!r}: expected NAME=CHECKOUT,NAME=CHECKOUT")
        path = os.path.abspath(path)
        if not os.path.isfile(os.path.join(path, "recops_tf", "__init__.py")):
            raise SystemExit(f"--builds {name}: {path} is not a recops_tf checkout "
                             "(no recops_tf/__init__.py)")
        out.append((name, path))
    if len({n for n, _ in out}) != len(out):
        raise SystemExit("--builds: two builds have the same name")
    return out


def build_env(checkout):
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join([checkout] + [p for p in env.get("PYTHONPATH", "")
                                                      .split(os.pathsep) if p])
    return env


def commit_of(checkout):
    """The checkout's commit, ``+dirty`` when tracked files differ from it; None outside git."""
    try:
        head = subprocess.run(["git", "-C", checkout, "rev-parse", "--short=10", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", checkout, "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def check_build(name, checkout):
    """Checks that the checkout's own package loads there; returns ``info``'s first line."""
    proc = subprocess.run([sys.executable, "-m", "recops_tf", "info"], cwd=checkout,
                          env=build_env(checkout), capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise SystemExit(f"build {name}: `python -m recops_tf info` failed in {checkout}:\n"
                         f"{tail}")
    found = re.search(r"\((.*)\)\s*$", lines[0])
    package = os.path.realpath(os.path.join(checkout, "recops_tf"))
    if not found or os.path.realpath(found.group(1)) != package:
        raise SystemExit(f"build {name}: `python -m recops_tf info` in {checkout} loaded "
                         f"{lines[0]!r}, not {package}")
    return lines[0]


def log(line):
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def run_one(name, path, fmt, seed, build, checkout, extra, out_dir):
    """Runs the build's ``train`` once; returns its record (None: the run failed)."""
    tag = f"{name}_s{seed}_{build}"
    run_dir = os.path.join(out_dir, "runs", tag)
    json_path = os.path.join(out_dir, "runs", tag + ".json")
    log_path = os.path.join(out_dir, "logs", tag + ".log")
    for stale in (run_dir, json_path):  # an unfinished run of before starts again
        if os.path.isdir(stale):
            shutil.rmtree(stale)
        elif os.path.exists(stale):
            os.remove(stale)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    os.makedirs(os.path.dirname(json_path), exist_ok=True)
    argv = ["train", "--data", path, *(["--format", fmt] if fmt else []), "--seed", str(seed),
            "--out", run_dir, "--json", json_path, "--no-progress", *extra]
    validations = {}  # step -> seconds from the start at its line
    marks = {}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "recops_tf", *argv], cwd=checkout,
                            env=build_env(checkout), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1)
    try:
        with open(log_path, "w") as logf:
            logf.write(f"# {checkout}$ python -m recops_tf {shlex.join(argv)}\n")
            for line in proc.stdout:
                at = time.monotonic() - start
                logf.write(f"{at:10.3f} {line}")
                logf.flush()
                text = line.rstrip("\n")
                found = VALIDATION_LINE.match(text)
                if found:
                    validations[int(found.group(1))] = at
                    log(f"  {tag} {at:.0f} s: {text}")
                elif text.startswith("optimizer:"):  # printed as training is about to start
                    marks["train_start"] = at
                elif text.startswith("trained "):
                    marks["train_end"] = at
                elif text.startswith("early stop"):
                    log(f"  {tag} {at:.0f} s: {text}")
            code = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: the run goes with the tool
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    wall = time.monotonic() - start
    if code != 0 or not os.path.exists(json_path):
        with open(log_path) as f:
            tail = "".join(f.readlines()[-15:])
        log(f"{tag}: failed (exit {code}); the log: {log_path}\n{tail}")
        return None
    with open(json_path) as f:
        result = json.load(f)
    best_step = int(result["best_step"])
    metric = result.get("config", {}).get("validation_metric", METRIC)
    best = [v for v in result.get("validation", []) if v.get("step") == best_step]
    if best_step not in validations:
        log(f"{tag}: no validation line of the best step {best_step} in {log_path}")
        return None
    kept = result["exclude_seen"] is False
    test_kept = result["test"] if kept else result["test_other_protocol"]
    test_excl = result["test_other_protocol"] if kept else result["test"]
    return {
        "data": name, "path": path, "format": fmt, "seed": seed, "build": build,
        "checkout": checkout, "commit": commit_of(checkout), "extra_args": shlex.join(extra),
        "argv": ["python", "-m", "recops_tf", *argv],
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "wall_seconds": round(wall, 3),
        "to_best_seconds": round(validations[best_step], 3),
        # the lines before and after training (None: not printed)
        "train_start_seconds": _round(marks.get("train_start")),
        "train_end_seconds": _round(marks.get("train_end")),
        "train_seconds": result["train_seconds"],  # the steps alone (no validation)
        "steps": result["steps"], "steps_per_epoch": result.get("steps_per_epoch"),
        "best_step": best_step, "validations": len(validations),
        "validation_metric": metric,
        "best_validation": best[0].get(metric) if best else None,
        "test_hr@10": test_kept["hr@10"], "test_ndcg@10": test_kept["ndcg@10"],
        "test_hr@10_excluded": test_excl["hr@10"], "test_ndcg@10_excluded": test_excl["ndcg@10"],
        "transition_prior": (result.get("transition_prior") or {}).get("value"),
        "log": log_path,
    }


def _round(value):
    return None if value is None else round(value, 3)


def load_results(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        try:
            records = json.load(f)
        except json.JSONDecodeError as e:
            raise SystemExit(f"{path}: not a results file of this tool ({e})") from None
    if not isinstance(records, list):
        raise SystemExit(f"{path}: not a results file of this tool (not a list)")
    return records


def save_results(path, records):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(records, f, indent=1)
    os.replace(tmp, path)


def key(record):
    return record["data"], record["seed"], record["build"], record["extra_args"]


def _f(value, digits=4):
    return "n/a" if value is None else f"{value:.{digits}f}"


def table(records, data, seeds, builds, extra):
    """The markdown table of the runs of `data` x `seeds` x `builds` found in `records`."""
    found = {key(r): r for r in records}
    ref = builds[0][0]
    commits = {}
    for r in records:
        if r["extra_args"] == extra:
            commits.setdefault(r["build"], set()).add(r["commit"] or "?")
    header = ", ".join(f"{b} = {path} ({', '.join(sorted(commits.get(b, {'no run yet'})))})"
                       for b, path in builds)
    flags = f"`--extra-args {extra}` (not the defaults)" if extra else "the defaults"
    out = [f"Time to quality, {flags}; builds: {header}. Time to best: from the start of "
           f"`python -m recops_tf train` to the line of the best validation {METRIC}; "
           f"x {ref}: {ref}'s time to best over the build's.", "",
           f"| data | seed | build | steps | best step | best valid {METRIC} | time to best (s) "
           f"| whole run (s) | ms / step | test HR@10 | test NDCG@10 | x {ref} (time to best) "
           "| x " + ref + " (ms / step) |",
           "|" + "---|" * 13]
    ratios = {}
    for name, _, _ in data:
        for seed in seeds:
            base = found.get((name, seed, ref, extra))
            for build, _ in builds:
                r = found.get((name, seed, build, extra))
                if r is None:
                    out.append(f"| {name} | {seed} | {build} | not run |" + " |" * 9)
                    continue
                per_step = 1000 * r["train_seconds"] / max(r["steps"], 1)
                speed = time_ratio = ""
                if build != ref and base is not None:
                    t = base["to_best_seconds"] / max(r["to_best_seconds"], 1e-9)
                    s = (base["train_seconds"] / max(base["steps"], 1)) / max(
                        r["train_seconds"] / max(r["steps"], 1), 1e-12)
                    ratios.setdefault(build, []).append((t, s))
                    time_ratio, speed = f"{t:.2f}x", f"{s:.2f}x"
                out.append(
                    f"| {name} | {seed} | {build} | {r['steps']:,} | {r['best_step']:,} | "
                    f"{_f(r['best_validation'])} | {r['to_best_seconds']:.0f} | "
                    f"{r['wall_seconds']:.0f} | {per_step:.1f} | {_f(r['test_hr@10'])} | "
                    f"{_f(r['test_ndcg@10'])} | {time_ratio} | {speed} |")
    for build, pairs in ratios.items():
        if len(pairs) > 1:
            out.append("")
            out.append(f"{build}: geometric mean over {len(pairs)} runs, x {ref} time to best "
                       f"{statistics.geometric_mean(t for t, _ in pairs):.2f}x, ms / step "
                       f"{statistics.geometric_mean(s for _, s in pairs):.2f}x")
    return "\n".join(out) + "\n"


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", required=True, metavar="NAME=PATH[:FORMAT]",
                        help=f"data sets; FORMAT one of {', '.join(FORMATS)} (default: "
                             "detected by train)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--builds", required=True, metavar="NAME=CHECKOUT,...",
                        help="checkouts with their op library built in place; the first is "
                             "the reference of the ratios")
    parser.add_argument("--out", required=True, help="results.json, table.md, logs/, runs/")
    parser.add_argument("--extra-args", default="",
                        help="flags added to every run (a smoke test; not the defaults); "
                             "write --extra-args=\"--flag value\"")
    parser.add_argument("--table-only", action="store_true",
                        help="print the table of the runs already made; run nothing")
    args = parser.parse_args(argv)
    data, builds = parse_data(args.data), parse_builds(args.builds)
    extra = shlex.split(args.extra_args)
    extra_text = shlex.join(extra)
    os.makedirs(args.out, exist_ok=True)
    out_dir = os.path.abspath(args.out)
    results_path = os.path.join(out_dir, "results.json")
    records = load_results(results_path)
    done = {key(r) for r in records}
    todo = [(d, s, b) for d in data for s in args.seeds for b in builds
            if (d[0], s, b[0], extra_text) not in done]
    if todo and not args.table_only:
        # SIGTERM as Ctrl-C: the run under way is ended with the tool (and run again later).
        signal.signal(signal.SIGTERM, _interrupt)
        log(f"{len(todo)} runs to make, {len(done)} in {results_path} already")
        for build, checkout in builds:
            if any(b[0] == build for _, _, b in todo):
                log(f"build {build}: {check_build(build, checkout)}, "
                    f"commit {commit_of(checkout)}")
        try:
            for number, ((name, path, fmt), seed, (build, checkout)) in enumerate(todo, 1):
                log(f"[{number}/{len(todo)}] {name} seed {seed} build {build}: running")
                record = run_one(name, path, fmt, seed, build, checkout, extra, out_dir)
                if record is None:
                    return 1
                records = load_results(results_path) + [record]
                save_results(results_path, records)
                log(f"[{number}/{len(todo)}] {name} seed {seed} build {build}: best "
                    f"{record['validation_metric']} {_f(record['best_validation'])} at step "
                    f"{record['best_step']} after {record['to_best_seconds']:.0f} s, "
                    f"{record['steps']} steps in {record['wall_seconds']:.0f} s; test HR@10 "
                    f"{_f(record['test_hr@10'])}, NDCG@10 {_f(record['test_ndcg@10'])}")
        except KeyboardInterrupt:
            log("interrupted: the finished runs are in the results; run again to resume")
            return 130
    text = table(records, data, args.seeds, builds, extra_text)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
