#!/usr/bin/env python3
"""Case 9 of issue 54: does one client of large requests slow everyone else down?

It builds a tiny export itself (an HSTU recommender of 30 items, ``max_seq_len`` 24, random
weights, as tests/serving's), starts ``recops-tf serve`` on it as a separate process (127.0.0.1,
any free ports, the default flags plus ``--server-flags``), then, in one run so the ratios share
the machine's state:

1. **alone**: 8 small clients (threads, each its own keep-alive HTTP connection) loop REST
   ``:predict`` of one 10-event history for ``--seconds``;
2. **beside a large client**: the same 8, while one more client loops a valid 3 MB ``:predict``
   (1 row x 300,000 items and their timestamps, the issue's request) on its own connection.

It prints, for the small clients, p50 / p99 latency and throughput of each phase and the ratios
(beside / alone), and the large client's count and p50. The issue's acceptance: p50 within 3x
and p99 within 5x. Every answer must be a 200 (any other counts as an error and is printed).

    python tools/bench_serving_fairness.py [--seconds 15] [--small-clients 8]
                                           [--large-items 300000] [--server-flags "..."]

On a shared machine absolute figures are noisy; compare the ratios of one run. Run it at low
priority beside other jobs (``chrt -i 0 nice -n 19 python tools/bench_serving_fairness.py``).
"""
import argparse
import http.client
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

PATH = "/v1/models/default:predict"
NUM_ITEMS, WINDOW = 30, 24


def build_export(base):
    """A tiny recommender, exported as `base`/1 (as tests/serving/test_server.py's)."""
    import tensorflow as tf

    from recops_tf import recommender as rec
    from recops_tf.recommender.exporting import export

    model = rec.GenerativeRecommender(NUM_ITEMS, d_model=16, num_blocks=2, num_heads=2,
                                      head_dim=8, max_seq_len=WINDOW, seen_bias=True, seed=0)
    one = tf.RaggedTensor.from_row_lengths(tf.constant([1], tf.int64), [1])
    model({"items": one, "timestamps": one})
    names = [f"i{i}" for i in range(1, NUM_ITEMS + 1)]
    export(model, rec.Dataset([], [], NUM_ITEMS, "bench", item_names=names),
           os.path.join(base, "1"))


def start_server(base, flags, log):
    command = [sys.executable, "-m", "recops_tf", "serve", "--model", base, "--rest-port", "0",
               "--grpc-port", "-1"] + flags
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    line = process.stdout.readline()
    if "REST on" not in line:
        process.kill()
        raise SystemExit(f"the server did not start: {line!r} (its log: {log.name})")
    port = int(line.split("REST on 127.0.0.1:")[1].split(",")[0])
    return process, port


def wait_ready(port, seconds=120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("the server never became ready")


class Client(threading.Thread):
    """Loops `body` on one keep-alive connection until `stop`; latencies in seconds."""

    def __init__(self, port, body, stop, record):
        super().__init__(daemon=True)
        self.port, self.body, self.stop, self.record = port, body, stop, record
        self.latencies, self.errors = [], []

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {"Content-Type": "application/json"}
        while not self.stop.is_set():
            began = time.perf_counter()
            try:
                conn.request("POST", PATH, self.body, headers)
                answer = conn.getresponse()
                raw = answer.read()
            except (OSError, http.client.HTTPException) as e:
                self.errors.append(repr(e))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                continue
            took = time.perf_counter() - began
            if answer.status != 200:
                self.errors.append(f"{answer.status} {raw[:200]!r}")
            elif self.record.is_set():
                self.latencies.append(took)
        conn.close()


def small_body(rng):
    items = rng.integers(1, NUM_ITEMS + 1, 10).tolist()
    return json.dumps({"instances": [{"items": items,
                                      "timestamps": list(range(1, 11))}]}).encode()


def large_body(n, rng):
    items = rng.integers(1, NUM_ITEMS + 1, n).tolist()
    stamps = list(range(1_000_000, 1_000_000 + n))
    return json.dumps({"instances": [{"items": items, "timestamps": stamps}]},
                      separators=(",", ":")).encode()


def phase(port, small, seconds, large=None, warmup=1.0):
    """Runs the small clients (and the large one) for `seconds` after `warmup`."""
    stop, record = threading.Event(), threading.Event()
    clients = [Client(port, body, stop, record) for body in small]
    big = Client(port, large, stop, record) if large is not None else None
    for c in clients + ([big] if big else []):
        c.start()
    time.sleep(warmup)
    record.set()
    began = time.perf_counter()
    time.sleep(seconds)
    record.clear()
    wall = time.perf_counter() - began
    stop.set()
    for c in clients + ([big] if big else []):
        c.join(timeout=150)
    lat = np.concatenate([c.latencies for c in clients]) if clients else np.zeros(0)
    errors = [e for c in clients + ([big] if big else []) for e in c.errors]
    out = {"requests": len(lat), "rps": len(lat) / wall,
           "p50_ms": float(np.percentile(lat, 50) * 1e3) if len(lat) else float("nan"),
           "p99_ms": float(np.percentile(lat, 99) * 1e3) if len(lat) else float("nan"),
           "errors": errors[:5], "error_count": len(errors)}
    if big is not None:
        out["large_requests"] = len(big.latencies)
        out["large_p50_ms"] = (float(np.percentile(big.latencies, 50) * 1e3)
                               if big.latencies else float("nan"))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="each phase (default 15)")
    parser.add_argument("--small-clients", type=int, default=8)
    parser.add_argument("--large-items", type=int, default=300_000,
                        help="items (and timestamps) of the large request's one row")
    parser.add_argument("--server-flags", default="", help="more flags of recops-tf serve")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    small = [small_body(rng) for _ in range(args.small_clients)]
    large = large_body(args.large_items, rng)
    with tempfile.TemporaryDirectory() as tmp:
        build_export(os.path.join(tmp, "m"))
        log = open(os.path.join(tmp, "server.log"), "w")
        process, port = start_server(os.path.join(tmp, "m"), shlex.split(args.server_flags), log)
        try:
            wait_ready(port)
            alone = phase(port, small, args.seconds)
            beside = phase(port, small, args.seconds, large=large)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()
    ratios = {"p50": beside["p50_ms"] / alone["p50_ms"], "p99": beside["p99_ms"] / alone["p99_ms"],
              "throughput": alone["rps"] / beside["rps"]}
    print(f"large request: 1 row x {args.large_items:,} items, {len(large) / 1e6:.2f} MB; "
          f"{args.small_clients} small clients of 10 items")
    for name, p in (("alone", alone), ("beside the large client", beside)):
        extra = (f"; large: {p['large_requests']} requests, p50 {p['large_p50_ms']:.0f} ms"
                 if "large_requests" in p else "")
        print(f"  {name:<24} p50 {p['p50_ms']:7.2f} ms  p99 {p['p99_ms']:7.2f} ms  "
              f"{p['rps']:7.1f} req/s  errors {p['error_count']}{extra}")
        for e in p["errors"]:
            print(f"    error: {e}")
    print(f"  ratios (beside / alone): p50 {ratios['p50']:.2f}x (acceptance <= 3x), "
          f"p99 {ratios['p99']:.2f}x (<= 5x), throughput {ratios['throughput']:.2f}x less")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"alone": alone, "beside": beside, "ratios": ratios}, f, indent=1)


if __name__ == "__main__":
    main()
