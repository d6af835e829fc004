"""Multi-worker training throughput of `recops-tf train --workers N` on this machine.

For N = 1, 2, 4 (one intra-op and one inter-op thread per worker) it trains the built-in
synthetic set for a fixed number of steps (no validation until the end) and reports:

* steps/s of the whole job (same global batch for every N);
* the bytes one worker sends per step, from the step's shapes: the item-table lookups (keys
  out, rows back), their gradients to the owners, the count matrices, and the ring all-reduce
  of the dense gradients;
* the share of a step in communication, estimated as ``1 - t_local / t_step``: ``t_local`` is
  a one-worker step on the same per-worker rows (batch / N), ``t_step`` the N-worker step;
* on paper, the same bytes for 8 and 64 machines against a 25 Gb/s network.

    python tools/bench_multiworker.py [--workers 1 2 4] [--steps 60] [--json out.json]

The workers share this machine's cores (2 here): beyond 2 workers they compete for them, so
steps/s falls for reasons a cluster does not have; the byte counts do not depend on that.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ARGS = ["--users", "3000", "--items", "1000", "--dropout", "0", "--min-steps", "0",
        "--eval-every", "100000", "--patience", "0", "--no-progress", "--seed", "0",
        "--loss", "sampled", "--negatives", "128"]


def run(workers, steps, batch, extra=()):
    out = tempfile.mkdtemp(prefix="bench_mw_")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1",
               TF_NUM_INTEROP_THREADS="1")
    env.pop("TF_CONFIG", None)
    cli = os.path.join(os.path.dirname(sys.executable), "recops-tf")
    done = subprocess.run([cli, "train", *ARGS, "--max-steps", str(steps), "--batch-size",
                           str(batch), "--workers", str(workers), "--json",
                           os.path.join(out, "m.json"), *extra],
                          capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    with open(os.path.join(out, "m.json")) as f:
        return json.load(f)


def step_bytes(workers, batch, length, num_items, d_model, negatives, dense_params):
    """Bytes one worker sends per step (see the module docstring). Keys of a worker's lookups:
    its rows' items and targets and the batch's negatives (shared by the global batch),
    deduplicated; a share (R - 1) / R of them is owned elsewhere."""
    if workers == 1:
        return {"lookups": 0, "gradients": 0, "counts": 0, "all_reduce": 0, "total": 0}
    r = workers
    rows = batch / r
    keys = min(num_items, rows * (length + 1) + rows * negatives)  # upper bound, deduplicated
    remote = keys * (r - 1) / r
    lookups = remote * 8 + remote * d_model * 4  # keys out; rows come back (counted by owner)
    gradients = remote * d_model * 4
    counts = 2 * r * r * 4 * 2  # a count matrix per all-to-all (keys and rows), fwd and bwd
    all_reduce = 2 * (r - 1) / r * dense_params * 4
    total = lookups + gradients + counts + all_reduce
    return {"lookups": lookups, "gradients": gradients, "counts": counts,
            "all_reduce": all_reduce, "total": total}


def dense_params(cfg):
    """Trainable values outside the item tables (what the all-reduce moves)."""
    import recops_tf  # noqa: F401
    from recops_tf.recommender import Config
    from recops_tf.recommender.training import _ragged, build_model

    model = build_model(Config(**cfg), 1000)
    one = _ragged([np.array([1], np.int64)])
    model({"items": one, "timestamps": one})
    return int(sum(np.prod(v.shape) for v in model.trainable_variables
                   if "gradient_anchor" not in v.path))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows, report = [], {}
    for n in args.workers:
        job = run(n, args.steps, args.batch_size)
        per_step = lambda m: (m["train_seconds"] - m["first_step_seconds"]) / (  # noqa: E731
            m["steps"] - 1)  # the first step traces the function: left out
        t_step = per_step(job)
        local = run(1, args.steps, max(1, args.batch_size // n)) if n > 1 else job
        t_local = per_step(local)
        cfg = job["config"]
        dense = dense_params(cfg)
        sent = step_bytes(n, args.batch_size, cfg["max_seq_len"], 1000, cfg["d_model"],
                          cfg["num_negatives"], dense)
        share = max(0.0, 1.0 - t_local / t_step) if n > 1 else 0.0
        report[n] = dict(steps_per_second=1 / t_step, step_ms=1e3 * t_step,
                         local_step_ms=1e3 * t_local, communication_share=share,
                         bytes_per_step=sent, test=job["test"])
        rows.append((n, 1 / t_step, 1e3 * t_step, 1e3 * t_local, share, sent["total"],
                     job["test"]["hr@10"]))
    print(f"recops-tf train --workers N, synthetic 3000 users x 1000 items, batch "
          f"{args.batch_size}, {args.steps} steps, 1 thread a worker")
    print("| workers | steps/s | ms a step | ms a step of batch/N alone | communication "
          "share (est.) | bytes sent a worker a step | test HR@10 |")
    print("|---|---|---|---|---|---|---|")
    for n, sps, ms, local, share, sent, hr in rows:
        print(f"| {n} | {sps:.2f} | {ms:.1f} | {local:.1f} | {share:.0%} | {sent / 1e6:.2f} MB "
              f"| {hr:.4f} |")
    cfg_d, dense = cfg["d_model"], dense_params(cfg)
    print("\nOn paper, 25 Gb/s network, the same per-worker batch of "
          f"{args.batch_size // 2} rows, a 1 M-item catalogue:")
    print("| machines | bytes sent a worker a step | network time a step |")
    print("|---|---|---|")
    for machines in (8, 64):
        sent = step_bytes(machines, args.batch_size // 2 * machines, 200, 1_000_000, cfg_d,
                          128, dense)["total"]
        print(f"| {machines} | {sent / 1e6:.2f} MB | {sent * 8 / 25e9 * 1e3:.2f} ms |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(k): v for k, v in report.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    sys.exit(main())
