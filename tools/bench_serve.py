#!/usr/bin/env python3
"""Load generator and benchmark of ``recops-tf serve`` (``recops_tf.serving``), bounded in
requests and time, on 127.0.0.1 only. No data files: it builds and exports its own model.

What it measures, in one run (so ratios share the machine's state):

* **Predict** (TF Serving's ``serving_default`` signature, one user of a 10-event history per
  request): closed-loop clients at each ``--concurrency`` (threads; each its own keep-alive
  ``http.client.HTTPConnection`` for REST ``:predict`` in the row form, or its own gRPC channel
  for ``PredictionService/Predict`` with ``[1, 10]`` int64 TensorProtos), against a server with
  dynamic batching and one without (``--no-batching``). Per (API, batching, concurrency): p50 /
  p99 latency, throughput, errors (a non-200 answer, a failed call, or an answer that differs
  from the SavedModel's own for that request: every answer is checked), and the mean rows of the
  server's model calls (its ``recops_serving_batch_size`` histogram, read from
  ``/monitoring/prometheus/metrics`` before and after the level). A level ends after
  ``--requests`` x (1 + log4(concurrency)) requests or ``--seconds``, whichever comes first.
  Beside them, the in-process floor: the loaded SavedModel's ``serving_default`` called directly
  in this process at concurrency 1.
* **The users' cache** (``POST /v1/models/default:recommend``): a user's history of H events
  (``--histories``, default H = 50, 200, 1000, 2000, 4000) is sent once, then one new event per
  request (``--cache-reps``, fewer where H + reps would pass ``max_seq_len``); only those
  one-event requests are timed, on the server with its key/value cache (the default
  ``--cache-mb``) and on a server with ``--cache-mb 0`` (every request re-encodes the whole
  history the server keeps), in runs of 5 requests to one server then the same 5 to the
  other. Their answers must be equal (same items, scores within 1e-4 relative), and equal to
  the SavedModel's ``recommend`` signature on the whole history (whose in-process time is
  reported too). Beside them, the REST round trip of a ``GET`` status on the same
  connection: no cached answer comes faster than it plus the cached path's two model calls
  (``extend``, ``top_k``), so the recompute's p50 over that sum bounds the REST ratio.
  Then, in this process, the loaded SavedModel's functions called as the server calls them
  (``serving.models.Call``): ``extend_in_place`` of one new event against the H cache rows a
  prior ``extend`` of the H events returned (the cached path), ``user_state`` of the H + 1
  events (the full recompute), ``top_k`` (both paths' scoring), p50 of each, and
  ``user_state / extend``; ``extend``'s state must equal ``user_state``'s.

The servers are separate processes (``recops-tf serve --rest-port 0 --grpc-port 0 ...``, from
this interpreter's ``bin/``; their ports read from the line they print when ready; stopped with
SIGTERM, which drains them), so they do not share this process's GIL. They do share the
machine's cores with the clients (the clients' JSON / protobuf encoding and decoding and answer
checks run in this process's threads, and their time is in the latencies): on a 2-core machine,
server and clients compete for the same 2 cores, and any other job running on it counts too.

    python tools/bench_serve.py [--quick] [--concurrency 1 4 16 64] [--requests 200]
                                [--seconds 20] [--cache-reps 50] [--histories 50 ... 4000]
                                [--json FILE]

The model: HSTU (d_model 50, 2 blocks, 1 head, head_dim 50, seen-item bias), ``--num-items``
(3,000) items, ``max_seq_len`` 4096 (for the long histories of the cache sweep; the :predict
requests' cost does not depend on it: their 10-event histories are ragged, and the
``serving_default`` p50 at 1, 16 and 32 rows measured the same, within 3 %, with
``max_seq_len`` 1024 and 4096), random weights (its relative-attention and seen-item biases
too, so that the cache's answers are checked against the recompute with them at work).
"""
import argparse
import http.client
import itertools
import json
import math
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from recops_tf.recommender.data import Dataset  # noqa: E402
from recops_tf.recommender.exporting import export  # noqa: E402
from recops_tf.recommender.model import GenerativeRecommender  # noqa: E402
from recops_tf.serving import _apis  # noqa: E402
from recops_tf.serving.models import Call  # noqa: E402

MAX_SEQ_LEN = 4096
HISTORY = 10  # events of a :predict request's user
USERS = 64  # distinct :predict requests, cycled
CACHE_HISTORIES = (50, 200, 1000, 2000, 4000)
RTOL = 1e-4
# extend's and user_state's states: l2-normalised vectors, computed in different orders (an
# element near 0 makes an element-wise relative difference meaningless); float32's tolerance
# of the tests' table for a reduction over 1,000s of terms.
STATE_ATOL = 1e-5
READY_SECONDS = 120.0  # a server's start, at most
STOP_SECONDS = 30.0  # a server's drain after SIGTERM, at most (then it is killed)
TARGET_H = 1000  # the history of target (c)
RUN = 5  # calls in a row of each function in process (bench_functions)


# -- the model ---------------------------------------------------------------------------------
def build_and_export(base, num_items, seed=0, successors=0):
    """An HSTU recommender (random weights) exported as ``base/1``; its SavedModel's path.
    ``successors`` > 0: with a transition prior of weight 1 (as ``train``'s defaults export
    one), that many random successors of each item, seen 1-4 times each."""
    rng = np.random.default_rng(seed)
    first = np.repeat(np.arange(1, num_items + 1, dtype=np.int64), successors)
    keys, at = np.unique(first * (num_items + 1) + rng.integers(1, num_items + 1, first.size),
                         return_index=True)
    counts = rng.integers(1, 5, first.size)[at]
    model = GenerativeRecommender(num_items, encoder="hstu", d_model=50, num_blocks=2,
                                  num_heads=1, head_dim=50, max_seq_len=MAX_SEQ_LEN,
                                  seen_bias=True, seed=seed, transition_pairs=keys.size)
    one = tf.RaggedTensor.from_row_lengths(tf.constant([1], tf.int64), [1])
    model({"items": one, "timestamps": one})
    if keys.size:  # random transitions, as evaluation.transitions gives them
        model.set_transitions((np.searchsorted(keys // (num_items + 1),
                                               np.arange(num_items + 2)),
                               keys % (num_items + 1), counts))
        model.transition_weight.assign(1.0)
    for w in model.weights:  # the biases start at 0: give them values, so they count
        if "bias" in w.path and w.dtype == "float32":
            w.assign(rng.normal(0, 0.3, w.shape).astype("float32"))
    dataset = Dataset([], [], num_items, "bench",
                      item_names=[str(i) for i in range(1, num_items + 1)])
    return export(model, dataset, os.path.join(base, "1"))


# -- servers -----------------------------------------------------------------------------------
_READY = re.compile(r"^serving model .*; REST on \S+:(\d+), gRPC on \S+:(\d+)\s*$")


class Server:
    """``recops-tf serve`` of `base` in a subprocess (`flags` added to its command line); its
    ports once ``ready()``, ``batch_stats()`` from its metrics, ``close()`` (SIGTERM)."""

    def __init__(self, name, base, flags, log_dir):
        self.name = name
        self.command = [os.path.join(os.path.dirname(sys.executable), "recops-tf"), "serve",
                        "--model", base, "--rest-port", "0", "--grpc-port", "0", *flags]
        self.log_path = os.path.join(log_dir, f"server-{name}.stderr")
        self.log = open(self.log_path, "w")
        self.lines = queue.Queue()
        self.rest_port = self.grpc_port = None
        self.exit_code = None
        self.began = time.perf_counter()
        self.ready_s = None
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True,
                                        env=env)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:  # every line, to EOF: the pipe never fills
            self.lines.put(line)
        self.lines.put(None)

    def ready(self, timeout=READY_SECONDS):
        """Waits for the line the server prints when it listens; its ports."""
        deadline = self.began + timeout
        while True:
            left = deadline - time.perf_counter()
            try:
                line = self.lines.get(timeout=max(left, 0.0))
            except queue.Empty:
                raise RuntimeError(f"server {self.name}: not ready after {timeout:.0f} s "
                                   f"({' '.join(self.command)}){self._tail()}") from None
            if line is None:
                code = self.process.wait()
                raise RuntimeError(f"server {self.name} exited ({code}) before it was ready "
                                   f"({' '.join(self.command)}){self._tail()}")
            match = _READY.match(line)
            if match:
                self.rest_port, self.grpc_port = int(match.group(1)), int(match.group(2))
                self.ready_s = time.perf_counter() - self.began
                return self
            print(f"[server {self.name}] {line.rstrip()}", file=sys.stderr, flush=True)

    def _tail(self, lines=15):
        if not self.log.closed:
            self.log.flush()
        try:
            with open(self.log_path, errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
        except OSError:
            return ""
        return ("; its stderr ends:\n  " + "\n  ".join(tail)) if tail else ""

    def cpu_seconds(self):
        """The server process's CPU time so far (all its threads: the sum of their
        ``/proc/PID/task/TID/schedstat`` run times, in ns), or None (not Linux). Threads
        that ended are not counted (the server's pools keep theirs)."""
        total, tasks = 0, f"/proc/{self.process.pid}/task"
        try:
            tids = os.listdir(tasks)
        except OSError:
            return None
        for tid in tids:
            try:
                with open(f"{tasks}/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, IndexError, ValueError):
                pass  # a thread that ended meanwhile
        return total / 1e9

    def batch_stats(self):
        """(model calls, rows) so far, from the server's batch-size histogram."""
        conn = http.client.HTTPConnection("127.0.0.1", self.rest_port, timeout=30)
        try:
            conn.request("GET", "/monitoring/prometheus/metrics")
            response = conn.getresponse()
            text = response.read().decode()
        finally:
            conn.close()
        if response.status != 200:
            raise RuntimeError(f"server {self.name}: metrics answered HTTP {response.status}")
        values = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in ("recops_serving_batch_size_count",
                                                "recops_serving_batch_size_sum"):
                values[parts[0]] = float(parts[1])
        return (values.get("recops_serving_batch_size_count", 0.0),
                values.get("recops_serving_batch_size_sum", 0.0))

    def close(self):
        """SIGTERM (the server drains and exits), killed after ``STOP_SECONDS``; its exit
        code, and a note if it was not 0 or its stderr has a traceback."""
        note = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                note = f"server {self.name}: still running {STOP_SECONDS:.0f} s after SIGTERM: " \
                       "killed"
        self.exit_code = self.process.returncode
        self.reader.join(5)
        self.log.close()
        with open(self.log_path, errors="replace") as f:
            stderr = f.read()
        if note is None and (self.exit_code != 0 or "Traceback" in stderr):
            note = f"server {self.name}: exit code {self.exit_code}{self._tail()}"
        return note

    def info(self):
        return {"command": self.command, "rest_port": self.rest_port,
                "grpc_port": self.grpc_port, "ready_s": self.ready_s,
                "exit_code": self.exit_code}


# -- clients -----------------------------------------------------------------------------------
def _same(items, scores, want_items, want_scores):
    """None if the answer equals the expected one (scores within RTOL), else why not."""
    items, scores = np.asarray(items), np.asarray(scores, np.float64)
    if items.shape != want_items.shape or not np.array_equal(items, want_items):
        return "wrong answer: items differ from the SavedModel's"
    rel = _rel_diff(scores, want_scores)
    if rel > RTOL:
        return f"wrong answer: scores differ by {rel:.2e} (relative)"
    return None


def _rel_diff(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not a.size:
        return 0.0
    return float(np.max(np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-6)))


def rest_client(port, bodies, expected):
    """A factory of REST ``:predict`` callers (one keep-alive connection each)."""
    def make():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

        def call(i):
            began = time.perf_counter()
            try:
                conn.request("POST", "/v1/models/default:predict", bodies[i % len(bodies)],
                             {"Content-Type": "application/json"})
                response = conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as e:
                conn.close()  # the next request reconnects
                return f"{type(e).__name__}: {e}"
            if response.status != 200:
                return f"HTTP {response.status}: {raw[:300].decode(errors='replace')}"
            answer = json.loads(raw)["predictions"][0]
            took = time.perf_counter() - began  # the answer in hand; the check is the bench's
            return _same(answer["items"], answer["scores"], *expected[i % len(expected)]), took

        return call, conn.close
    return make


def grpc_client(port, requests, expected):
    """A factory of gRPC ``Predict`` callers (one channel, with its own connection, each)."""
    def make():
        channel = grpc.insecure_channel(f"127.0.0.1:{port}",
                                        options=[("grpc.use_local_subchannel_pool", 1)])
        stub = _apis.stubs(channel)

        def call(i):
            began = time.perf_counter()
            try:
                answer = stub.Predict(requests[i % len(requests)], timeout=60)
            except grpc.RpcError as e:
                return f"gRPC {e.code().name}: {e.details()}"
            items = tf.make_ndarray(answer.outputs["items"])[0]
            scores = tf.make_ndarray(answer.outputs["scores"])[0]
            took = time.perf_counter() - began  # the answer in hand; the check is the bench's
            return _same(items, scores, *expected[i % len(expected)]), took

        return call, channel.close
    return make


def status_client(api, port):
    """A factory of model-status callers (REST ``GET /v1/models/default``, gRPC
    ``GetModelStatus``): the server's request path without a model call, the ceiling of any
    request's throughput on this stack."""
    def make():
        if api == "rest":
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

            def call(i):
                try:
                    conn.request("GET", "/v1/models/default")
                    response = conn.getresponse()
                    raw = response.read()
                except (OSError, http.client.HTTPException) as e:
                    conn.close()
                    return f"{type(e).__name__}: {e}"
                return None if response.status == 200 else f"HTTP {response.status}: {raw!r}"

            return call, conn.close
        channel = grpc.insecure_channel(f"127.0.0.1:{port}",
                                        options=[("grpc.use_local_subchannel_pool", 1)])
        stub, request = _apis.stubs(channel), _apis.GetModelStatusRequest()
        request.model_spec.name = "default"

        def call(i):
            try:
                stub.GetModelStatus(request, timeout=60)
            except grpc.RpcError as e:
                return f"gRPC {e.code().name}: {e.details()}"
            return None

        return call, channel.close
    return make


def run_level(make_client, concurrency, total, seconds, warmup=2, probe=None, marks=None):
    """Closed loop: `concurrency` threads, each with its client, send requests until `total`
    were sent or `seconds` passed (after `warmup` untimed requests each). Returns the
    latencies (s) of the answers that were right, the errors, and the wall time. A client's
    call returns its error (None: right), or ``(error, latency)`` when it times its request up
    to the answer in hand itself, leaving out its check of the answer. With
    `probe`, ``marks["start"]`` and ``marks["end"]`` are its values as the timed requests
    begin and after they end."""
    counter = itertools.count()
    latencies = [[] for _ in range(concurrency)]
    errors, lock = [], threading.Lock()
    barrier = threading.Barrier(concurrency + 1)
    go = threading.Event()  # set once the probe is read and the clock started
    deadline = [math.inf]

    def worker(w):
        call = close = None
        try:
            call, close = make_client()
            for j in range(warmup):
                call(w * warmup + j)
        except Exception as e:  # noqa: BLE001
            with lock:
                errors.append(f"client setup: {type(e).__name__}: {e}")
            call = None
        finally:
            barrier.wait()
        go.wait()
        try:
            while call is not None:
                i = next(counter)
                if i >= total or time.perf_counter() > deadline[0]:
                    break
                began = time.perf_counter()
                try:
                    error = call(i)
                except Exception as e:  # noqa: BLE001  (a malformed answer, ...)
                    error = f"{type(e).__name__}: {e}"
                took = time.perf_counter() - began
                if isinstance(error, tuple):
                    error, took = error
                if error is None:
                    latencies[w].append(took)
                else:
                    with lock:
                        errors.append(error)
        finally:
            if close is not None:
                close()

    threads = [threading.Thread(target=worker, args=(w,), daemon=True)
               for w in range(concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    if probe is not None:  # the warm-ups are done: only the timed requests from here
        marks["start"] = probe()
    start = time.perf_counter()
    deadline[0] = start + seconds
    go.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if probe is not None:
        marks["end"] = probe()
    return np.concatenate([np.asarray(x) for x in latencies] + [np.zeros(0)]), errors, wall


def summary(latencies, errors, wall):
    ok = len(latencies)
    return {"requests": ok + len(errors), "ok": ok, "errors": len(errors),
            "p50_ms": float(np.percentile(latencies, 50) * 1e3) if ok else None,
            "p99_ms": float(np.percentile(latencies, 99) * 1e3) if ok else None,
            "throughput_rps": ok / wall if wall > 0 else None, "wall_s": wall,
            "error_samples": sorted(set(errors))[:5]}


def _own_cpu():
    return time.process_time()  # this process's CPU time, all its threads


def _cpu(marks, requests, wall):
    """CPU ms per request of the server and of this process (the clients) over a level's
    timed requests, and the cores both kept busy."""
    (server0, client0), (server1, client1) = marks["start"], marks["end"]
    server = None if server0 is None or server1 is None else server1 - server0
    client = client1 - client0
    return {"server_cpu_ms_per_req": server * 1e3 / requests if server is not None and
            requests else None,
            "client_cpu_ms_per_req": client * 1e3 / requests if requests else None,
            "cores_busy": (client + (server or 0.0)) / wall if wall > 0 else None}


def level_requests(requests, concurrency):
    """`requests` at concurrency 1, growing by `requests` for each factor 4 of concurrency."""
    return max(1, round(requests * (1 + math.log(concurrency, 4))))


# -- the predict benchmark ---------------------------------------------------------------------
def predict_inputs(num_items, seed=1):
    rng = np.random.default_rng(seed)
    items = rng.integers(1, num_items + 1, [USERS, HISTORY]).astype(np.int64)
    stamps = (1_600_000_000 + np.cumsum(rng.integers(1, 5000, [USERS, HISTORY]), 1)).astype(
        np.int64)
    return items, stamps


def bench_floor(module, items, stamps, total, seconds):
    """The SavedModel's serving_default called directly, one user a call, concurrency 1: as a
    user calls it (``fn(items=..., timestamps=...)``, the floor of target (a)), and, calls
    interleaved, as the server calls it (``serving.models.Call``), under ``server_call``."""
    plain = module.signatures["serving_default"]
    fast = Call(plain)
    for i in range(3):
        plain(items=tf.constant(items[i:i + 1]), timestamps=tf.constant(stamps[i:i + 1]))
        fast(items=tf.constant(items[i:i + 1]), timestamps=tf.constant(stamps[i:i + 1]))
    latencies = {"plain": [], "server_call": []}
    start = time.perf_counter()
    for i in range(total):
        if time.perf_counter() - start > seconds:
            break
        row = i % len(items)
        for name, fn in (("plain", plain), ("server_call", fast)):
            began = time.perf_counter()
            out = fn(items=tf.constant(items[row:row + 1]),
                     timestamps=tf.constant(stamps[row:row + 1]))
            out["items"].numpy(), out["scores"].numpy()
            latencies[name].append(time.perf_counter() - began)
    result = summary(np.asarray(latencies["plain"]), [], sum(latencies["plain"]))
    result["server_call"] = summary(np.asarray(latencies["server_call"]), [],
                                    sum(latencies["server_call"]))
    return result


SWEEP_BATCHES = (1, 2, 4, 8, 16, 32)


def bench_batch_sweep(module, items, stamps, seconds=1.0):
    """serving_default in process at each batch size of `SWEEP_BATCHES` (rows of `items`
    repeated): p50 wall ms a call and CPU ms a row (this process's CPU time, both TF thread
    pools included): what batching can save in the model call itself."""
    plain = Call(module.signatures["serving_default"])
    out = []
    for batch in SWEEP_BATCHES:
        it = tf.constant(np.resize(items, (batch, items.shape[1])))
        ts = tf.constant(np.resize(stamps, (batch, items.shape[1])))
        for _ in range(5):
            plain(items=it, timestamps=ts)
        walls, cpu0, start = [], _own_cpu(), time.perf_counter()
        while time.perf_counter() - start < seconds or len(walls) < 20:
            began = time.perf_counter()
            plain(items=it, timestamps=ts)["scores"].numpy()
            walls.append(time.perf_counter() - began)
        cpu = _own_cpu() - cpu0
        out.append({"batch": batch, "calls": len(walls), "p50_ms": _p50_ms(walls),
                    "cpu_ms_per_row": 1e3 * cpu / len(walls) / batch})
    return out


def bench_predict(servers, module, num_items, args):
    items, stamps = predict_inputs(num_items)
    want = module.signatures["serving_default"](items=tf.constant(items),
                                                timestamps=tf.constant(stamps))
    expected = [(want["items"].numpy()[r], want["scores"].numpy()[r].astype(np.float64))
                for r in range(USERS)]
    bodies = [json.dumps({"instances": [{"items": items[r].tolist(),
                                         "timestamps": stamps[r].tolist()}]}).encode()
              for r in range(USERS)]
    protos = []
    for r in range(USERS):
        request = _apis.PredictRequest()
        request.model_spec.name = "default"
        request.model_spec.signature_name = "serving_default"
        request.inputs["items"].CopyFrom(tf.make_tensor_proto(items[r:r + 1]))
        request.inputs["timestamps"].CopyFrom(tf.make_tensor_proto(stamps[r:r + 1]))
        protos.append(request)
    floor = bench_floor(module, items, stamps, args.requests, args.seconds)
    print(f"floor: p50 {floor['p50_ms']:.2f} ms", file=sys.stderr, flush=True)
    floor["batch_sweep"] = bench_batch_sweep(module, items, stamps)
    rows = []
    for n, concurrency in enumerate(args.concurrency):
        total = level_requests(args.requests, concurrency)
        for api in ("rest", "grpc"):
            order = ("on", "off") if n % 2 == 0 else ("off", "on")  # drift hits both alike
            for batching in order:
                server = servers[batching]
                make = (rest_client(server.rest_port, bodies, expected) if api == "rest" else
                        grpc_client(server.grpc_port, protos, expected))
                calls0, rows0 = server.batch_stats()
                marks = {}
                result = summary(*run_level(make, concurrency, total, args.seconds,
                                            probe=lambda: (server.cpu_seconds(), _own_cpu()),
                                            marks=marks))
                calls1, rows1 = server.batch_stats()
                result.update(api=api, batching=batching, concurrency=concurrency,
                              mean_batch=(rows1 - rows0) / (calls1 - calls0)
                              if calls1 > calls0 else None,
                              **_cpu(marks, result["requests"], result["wall_s"]))
                rows.append(result)
                print(f"{api} batching {batching} x{concurrency}: {result['ok']} ok, "
                      f"{result['errors']} errors, p50 {_ms(result['p50_ms'])} ms, "
                      f"{_num(result['throughput_rps'], 0)} req/s", file=sys.stderr, flush=True)
    for api in ("rest", "grpc"):  # the stack's ceiling: status requests, no model call
        server = servers["on"]
        concurrency = 16 if 16 in args.concurrency else max(args.concurrency)
        port = server.rest_port if api == "rest" else server.grpc_port
        marks = {}
        result = summary(*run_level(status_client(api, port), concurrency,
                                    level_requests(args.requests, concurrency), args.seconds,
                                    probe=lambda: (server.cpu_seconds(), _own_cpu()),
                                    marks=marks))
        result.update(api=f"{api} status (no model call)", batching="-",
                      concurrency=concurrency, mean_batch=None,
                      **_cpu(marks, result["requests"], result["wall_s"]))
        rows.append(result)
        print(f"{api} status x{concurrency}: {result['ok']} ok, {result['errors']} errors, "
              f"{_num(result['throughput_rps'], 0)} req/s", file=sys.stderr, flush=True)
    return floor, rows


# -- the users' cache benchmark ----------------------------------------------------------------
def _post(conn, path, body):
    began = time.perf_counter()
    conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    response = conn.getresponse()
    raw = response.read()
    took = time.perf_counter() - began
    answer = json.loads(raw)
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status} from :recommend: {answer}")
    return took, answer


def _p50_ms(times):
    return float(np.median(times) * 1e3)


def bench_functions(module, width, items, stamps, h, reps):
    """In this process, the SavedModel's functions of the two paths for one new event (the
    last of `items`) after `h` events: ``extend`` against the cache rows of the `h` events (as
    a prior ``extend`` returned them), ``user_state`` of all h + 1 events, ``top_k`` of the
    state. Each is timed in runs of `RUN` calls in a row (a server of cached users calls
    ``extend`` after ``extend``), the three functions' runs alternating, about `reps` calls
    each; ``extend`` also called alone between the others' calls (``extend_cold``: its caches
    and the pool's threads cold after a multi-threaded recompute). Their p50 (ms), and the
    largest relative difference of the two states."""
    # as the server calls them: concrete functions (no restored-function argument matching)
    fns = {name: Call(getattr(module, name).get_concrete_function())
           for name in ("extend", "extend_in_place", "user_state", "top_k")}
    first = fns["extend"](tf.constant(items[:h]), tf.constant(stamps[:h]),
                          tf.zeros([0, width], tf.float32), tf.constant([], tf.int64))
    past, past_ts = first["rows"], tf.constant(stamps[:h])
    new_items, new_stamps = tf.constant(items[h:h + 1]), tf.constant(stamps[h:h + 1])
    all_items, all_stamps = tf.constant(items[:h + 1]), tf.constant(stamps[:h + 1])
    k, exclude = tf.constant(10, tf.int32), tf.constant(False)

    def extend():
        return fns["extend_in_place"](new_items, new_stamps, past, past_ts)["state"].numpy()

    def user_state():
        return fns["user_state"](all_items, all_stamps)["state"].numpy()

    def top_k(state):
        out = fns["top_k"](tf.constant(state), all_items, k, exclude)
        return out["items"].numpy(), out["scores"].numpy()

    cached, full = extend(), user_state()
    top_k(cached)
    times = {"extend": [], "user_state": [], "top_k": [], "extend_cold": []}
    for _ in range(max(2, math.ceil(reps / RUN))):
        for name, fn in (("extend", extend), ("user_state", user_state),
                         ("top_k", lambda: top_k(cached))):
            for _ in range(RUN):
                began = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - began)
        for _ in range(RUN):  # alone between the others
            user_state()
            began = time.perf_counter()
            extend()
            times["extend_cold"].append(time.perf_counter() - began)
    p50 = {f"{name}_p50_ms": _p50_ms(t) for name, t in times.items()}
    return dict(p50, state_rel_diff=_rel_diff(cached, full),
                state_abs_diff=float(np.max(np.abs(np.asarray(cached, np.float64) - full))))


def bench_cache(servers, module, width, num_items, histories, reps_max, seed=2):
    """One-new-event :recommend requests after a history of H, with and without the cache,
    then the in-process functions of both paths at that H."""
    path = "/v1/models/default:recommend"
    rng = np.random.default_rng(seed)
    conns = {name: http.client.HTTPConnection("127.0.0.1", s.rest_port, timeout=300)
             for name, s in servers.items()}
    rows, problems = [], []
    try:
        # warm-up: a short user on each server (the functions' first calls are not timed)
        for name, conn in conns.items():
            _post(conn, path, {"user_id": "warm-up", "items": [1, 2, 3],
                               "timestamps": [1, 2, 3], "k": 10})
            for t in range(4, 7):
                _post(conn, path, {"user_id": "warm-up", "items": [t], "timestamps": [t],
                                   "k": 10})
        # The REST round trip with no model call (GET status, same connection): no cached
        # request can answer faster, so recompute / this bounds the REST ratio.
        status_times = []
        for _ in range(max(20, reps_max)):
            began = time.perf_counter()
            conns["cached"].request("GET", "/v1/models/default")
            conns["cached"].getresponse().read()
            status_times.append(time.perf_counter() - began)
        round_trip = _p50_ms(status_times)
        for h in histories:
            reps = min(reps_max, MAX_SEQ_LEN - h)
            items = rng.integers(1, num_items + 1, h + reps).astype(np.int64)
            stamps = (1_600_000_000 + np.cumsum(rng.integers(1, 5000, h + reps))).astype(
                np.int64)
            user = f"bench-{h}"
            first, times, answers = {}, {n: [] for n in conns}, {n: [] for n in conns}
            for name, conn in conns.items():
                first[name], answer = _post(conn, path, {
                    "user_id": user, "items": items[:h].tolist(),
                    "timestamps": stamps[:h].tolist(), "k": 10})
                answers[name].append(answer)
            floor = []
            # Runs of RUN events to one server, then the same to the other (the order of the
            # servers alternating): a server's requests follow each other, as a server's
            # users' do, rather than each following the other server's (whose threads, after
            # a multi-threaded recompute, still spin on the same 2 cores).
            for first_step in range(0, reps, RUN):
                steps = range(first_step, min(reps, first_step + RUN))
                order = list(conns) if first_step // RUN % 2 == 0 else list(conns)[::-1]
                for name in order:
                    for r in steps:
                        body = {"user_id": user, "items": [int(items[h + r])],
                                "timestamps": [int(stamps[h + r])], "k": 10}
                        took, answer = _post(conns[name], path, body)
                        times[name].append(took)
                        answers[name].append(answer)
                for r in steps:
                    at = h + r
                    began = time.perf_counter()
                    ref = module.recommend(tf.constant(items[:at + 1]),
                                           tf.constant(stamps[:at + 1]), tf.constant(10, tf.int32))
                    ref_items, ref_scores = ref["items"].numpy(), ref["scores"].numpy()
                    floor.append(time.perf_counter() - began)
                    answers.setdefault("reference", []).append(
                        {"items": [str(i) for i in ref_items], "scores": ref_scores.tolist()})
            equal, vs_reference, max_rel = True, True, 0.0
            for step, (a, b) in enumerate(zip(answers["cached"], answers["recompute"])):
                rel = _rel_diff(a["scores"], b["scores"])
                max_rel = max(max_rel, rel)
                if a["items"] != b["items"] or rel > RTOL:
                    equal = False
                    problems.append(f"H={h} step {step}: cached {a['items']} {a['scores'][:3]}"
                                    f" vs recompute {b['items']} {b['scores'][:3]}")
                want_len = h + step
                for name, ans in (("cached", a), ("recompute", b)):
                    if ans["history_length"] != want_len:
                        problems.append(f"H={h} step {step}: {name} history_length "
                                        f"{ans['history_length']}, expected {want_len}")
                if step and a["cache"] != "hit":
                    problems.append(f"H={h} step {step}: cached server answered cache="
                                    f"{a['cache']!r}, expected 'hit'")
                if b["cache"] != "off":
                    problems.append(f"H={h} step {step}: recompute server answered cache="
                                    f"{b['cache']!r}, expected 'off'")
            for step, ref in enumerate(answers["reference"], start=1):
                got = answers["cached"][step]
                if got["items"] != ref["items"] or _rel_diff(got["scores"], ref["scores"]) > RTOL:
                    vs_reference = False
                    problems.append(f"H={h} step {step}: cached {got['items']} differs from the "
                                    f"SavedModel's recommend {ref['items']}")
            p50 = {n: _p50_ms(times[n]) for n in conns}
            p99 = {n: float(np.percentile(times[n], 99) * 1e3) for n in conns}
            row = {"history": h, "reps": reps, "cached_p50_ms": p50["cached"],
                   "cached_p99_ms": p99["cached"], "recompute_p50_ms": p50["recompute"],
                   "recompute_p99_ms": p99["recompute"],
                   "ratio": p50["recompute"] / p50["cached"],
                   "first_cached_ms": first["cached"] * 1e3,
                   "first_recompute_ms": first["recompute"] * 1e3,
                   "floor_full_p50_ms": _p50_ms(floor),
                   "equal": equal, "equal_to_savedmodel": vs_reference,
                   "rest_round_trip_p50_ms": round_trip,
                   "max_rel_diff": max_rel}
            fns = bench_functions(module, width, items, stamps, h, reps)
            if fns["state_abs_diff"] > STATE_ATOL:  # a unit vector (l2-normalised state)
                problems.append(f"H={h}: extend's state differs from user_state's by "
                                f"{fns['state_abs_diff']:.2e} (absolute)")
            row.update(fns, fn_ratio=fns["user_state_p50_ms"] / fns["extend_p50_ms"])
            rows.append(row)
            print(f"cache H={h}: REST cached {p50['cached']:.2f} ms, recompute "
                  f"{p50['recompute']:.2f} ms, equal {equal}; in-process extend "
                  f"{fns['extend_p50_ms']:.2f} ms, user_state {fns['user_state_p50_ms']:.2f} "
                  f"ms, top_k {fns['top_k_p50_ms']:.2f} ms", file=sys.stderr, flush=True)
    finally:
        for conn in conns.values():
            conn.close()
    return rows, problems


# -- output ------------------------------------------------------------------------------------
def _ms(v):
    return "-" if v is None else f"{v:.2f}"


def _num(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def tables(result):
    out = []
    floor = result["floor"]
    out += ["### :predict (serving_default, one user of 10 events per request)", "",
            "| API | batching | concurrency | requests | errors | p50 ms | p99 ms | req/s | "
            "mean batch | server CPU ms/req | client CPU ms/req | cores busy |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| in-process SavedModel | - | 1 | {floor['requests']} | 0 | "
            f"{_ms(floor['p50_ms'])} | {_ms(floor['p99_ms'])} | "
            f"{_num(floor['throughput_rps'], 0)} | 1 | - | - | - |"]
    if floor.get("server_call"):
        fast = floor["server_call"]
        out.append(f"| in-process, called as the server calls it | - | 1 | {fast['requests']} | "
                   f"0 | {_ms(fast['p50_ms'])} | {_ms(fast['p99_ms'])} | "
                   f"{_num(fast['throughput_rps'], 0)} | 1 | - | - | - |")
    for r in result["predict"]:
        out.append(f"| {r['api']} | {r['batching']} | {r['concurrency']} | {r['requests']} | "
                   f"{r['errors']} | {_ms(r['p50_ms'])} | {_ms(r['p99_ms'])} | "
                   f"{_num(r['throughput_rps'], 0)} | {_num(r['mean_batch'])} | "
                   f"{_ms(r['server_cpu_ms_per_req'])} | {_ms(r['client_cpu_ms_per_req'])} | "
                   f"{_num(r['cores_busy'], 2)} |")
    if floor.get("batch_sweep"):
        sweep = floor["batch_sweep"]
        out += ["", "### serving_default in process by batch size (what batching can save in "
                "the model call)", "",
                "| rows a call | " + " | ".join(str(r["batch"]) for r in sweep) + " |",
                "|---|" + "---:|" * len(sweep),
                "| p50 ms a call | " + " | ".join(_ms(r["p50_ms"]) for r in sweep) + " |",
                "| CPU ms a row | " + " | ".join(f"{r['cpu_ms_per_row']:.3f}" for r in sweep)
                + " |"]
    out += ["", "### Dynamic batching: throughput on / off", "",
            "| API | concurrency | req/s on | req/s off | on / off | p50 on | p50 off |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    cells = {(r["api"], r["batching"], r["concurrency"]): r for r in result["predict"]}
    for api in ("rest", "grpc"):
        for c in result["config"]["concurrency"]:
            on, off = cells.get((api, "on", c)), cells.get((api, "off", c))
            if not on or not off:
                continue
            ratio = (on["throughput_rps"] / off["throughput_rps"]
                     if on["throughput_rps"] and off["throughput_rps"] else None)
            out.append(f"| {api} | {c} | {_num(on['throughput_rps'], 0)} | "
                       f"{_num(off['throughput_rps'], 0)} | {_num(ratio, 2)} | "
                       f"{_ms(on['p50_ms'])} | {_ms(off['p50_ms'])} |")
    errors = [(r, e) for r in result["predict"] for e in r["error_samples"]]
    if errors:
        out += ["", "Errors (samples):"]
        out += [f"- {r['api']} batching {r['batching']} x{r['concurrency']}: {e}"
                for r, e in errors]
    out += ["", "### :recommend, one new event after a history of H "
            "(REST; user cache vs. full recompute, --cache-mb 0)", "",
            "| H | reps | cached p50 ms | cached p99 | recompute p50 ms | recompute p99 | "
            "recompute / cached | in-process recommend p50 | first request cached / "
            "recompute ms | equal |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["cache"]:
        out.append(f"| {r['history']} | {r['reps']} | {_ms(r['cached_p50_ms'])} | "
                   f"{_ms(r['cached_p99_ms'])} | {_ms(r['recompute_p50_ms'])} | "
                   f"{_ms(r['recompute_p99_ms'])} | {r['ratio']:.2f} | "
                   f"{_ms(r['floor_full_p50_ms'])} | {r['first_cached_ms']:.1f} / "
                   f"{r['first_recompute_ms']:.1f} | "
                   f"{'yes' if r['equal'] else 'NO'} (max rel {r['max_rel_diff']:.1e}) |")
    out += ["", "### The same, in process: the SavedModel's functions (p50 ms)", "",
            "| H | extend (1 event, H cached rows) | user_state (H+1 events) | top_k | "
            "user_state / extend | (user_state + top_k) / (extend + top_k) | "
            "extend alone after a user_state | "
            "REST cached - (extend + top_k) | REST recompute - (user_state + top_k) | "
            "state max abs diff |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["cache"]:
        ext, full, top = r["extend_p50_ms"], r["user_state_p50_ms"], r["top_k_p50_ms"]
        out.append(f"| {r['history']} | {ext:.2f} | {full:.2f} | {top:.2f} | "
                   f"{r['fn_ratio']:.2f} | {(full + top) / (ext + top):.2f} | "
                   f"{_ms(r.get('extend_cold_p50_ms'))} | "
                   f"{r['cached_p50_ms'] - ext - top:.2f} | "
                   f"{r['recompute_p50_ms'] - full - top:.2f} | "
                   f"{r.get('state_abs_diff', r['state_rel_diff']):.1e} |")
    out += ["", "Cached and recompute answers equal (same items, scores within "
            f"{RTOL:g} relative): {'yes' if result['cache_answers_equal'] else 'NO'}; "
            "equal to the SavedModel's recommend: "
            f"{'yes' if result['cache_equal_to_savedmodel'] else 'NO'}"]
    out += [f"- {p}" for p in result["cache_problems"][:10]]
    if result["targets"]:
        out += ["", "### Targets", "", "| target | measured | bound | holds |",
                "|---|---|---|---|"]
        out += [f"| {t['target']} | {t['measured']} | {t['bound']} | "
                f"{'yes' if t['holds'] else 'NO'} |" for t in result["targets"]]
    if result["server_notes"]:
        out += ["", "Servers:"] + [f"- {n}" for n in result["server_notes"]]
    return "\n".join(out)


def _bound(target, top, bottom, unit, need, what):
    """A row of the targets table: the best ratio this stack allows, ``top / bottom``."""
    digits = 2 if unit else 0
    most = top / bottom
    return {"target": target,
            "measured": f"{most:.2f} ({top:.{digits}f} / {bottom:.{digits}f}{unit})",
            "bound": f">= {need}, else no {what} reaches {need}x on this stack",
            "holds": most >= need}


def _cpu_bounds(result, on, off, ceiling):
    """Rows of target (b)'s CPU bound: the req/s of the machine's cores if a batched request
    cost no more CPU than the status request's in the server, the model call's CPU a row at a
    batch of B rows (in process, interpolated in the batch sweep) and the client's CPU a
    request, against the measured req/s without batching; B the measured mean batch, and 16
    (every client in every batch)."""
    sweep = result["floor"].get("batch_sweep")
    parts = (ceiling or {}).get("server_cpu_ms_per_req"), on.get("client_cpu_ms_per_req")
    if not sweep or None in parts or not on.get("mean_batch"):
        return []
    cores = result["config"]["cpus"]
    rows = []
    for batch, what in ((on["mean_batch"], "the measured mean batch"),
                        (16.0, "every client in every batch")):
        per_row = float(np.interp(np.log(batch), np.log([r["batch"] for r in sweep]),
                                  [r["cpu_ms_per_row"] for r in sweep]))
        cost = parts[0] + per_row + parts[1]
        rows.append(_bound(f"(b) bound: {cores} cores / (status request's server CPU "
                           f"{parts[0]:.2f} + the model's CPU a row at {batch:.1f} rows "
                           f"({what}) {per_row:.3f} + client CPU {parts[1]:.2f} ms) / rest "
                           "req/s batching off", 1e3 * cores / cost, off["throughput_rps"], "",
                           3, "batching"))
    return rows


def targets(result):
    """(a) concurrency 1: REST p50 <= 1.5 x in-process p50 + 0.5 ms, batching on and off;
    (b) concurrency 16: no errors, REST throughput with batching >= 3x without (gRPC's ratio
    beside it); (c) one new event after TARGET_H events: cached >= 10x faster than the full
    recompute over REST and in process (user_state / extend)."""
    out = []
    cells = {(r["api"], r["batching"], r["concurrency"]): r for r in result["predict"]}
    floor = result["floor"]["p50_ms"]
    for batching in ("on", "off"):
        r = cells.get(("rest", batching, 1))
        if r and r["p50_ms"] is not None and floor is not None:
            bound = 1.5 * floor + 0.5
            out.append({"target": f"(a) REST p50 at concurrency 1, batching {batching}",
                        "measured": f"{r['p50_ms']:.2f} ms", "bound": f"<= {bound:.2f} ms "
                        f"(1.5 x {floor:.2f} + 0.5)", "holds": r["p50_ms"] <= bound})
    at16 = [r for r in result["predict"] if r["concurrency"] == 16]
    if at16:
        errors = sum(r["errors"] for r in at16)
        out.append({"target": "(b) errors at concurrency 16 (REST, gRPC; on, off)",
                    "measured": str(errors), "bound": "0", "holds": errors == 0})
        for api in ("rest", "grpc"):
            on, off = cells.get((api, "on", 16)), cells.get((api, "off", 16))
            if on and off and on["throughput_rps"] and off["throughput_rps"]:
                ratio = on["throughput_rps"] / off["throughput_rps"]
                out.append({"target": f"(b) {api} req/s at concurrency 16, batching on / off",
                            "measured": f"{ratio:.2f} ({on['throughput_rps']:.0f} / "
                            f"{off['throughput_rps']:.0f})", "bound": ">= 3" if api == "rest"
                            else ">= 3 (not a target for gRPC)", "holds": ratio >= 3})
                ceiling = cells.get((f"{api} status (no model call)", "-", 16))
                if ceiling and ceiling["throughput_rps"]:
                    out.append(_bound(f"(b) bound: {api} status req/s (no model call) / "
                                      "predict req/s batching off, concurrency 16",
                                      ceiling["throughput_rps"], off["throughput_rps"], "", 3,
                                      "batching"))
                if api == "rest":
                    out += _cpu_bounds(result, on, off, ceiling)
    row = next((r for r in result["cache"] if r["history"] == TARGET_H), None)
    if row:
        out.append({"target": f"(c) H={TARGET_H}, REST recompute / cached p50",
                    "measured": f"{row['ratio']:.2f} ({row['recompute_p50_ms']:.2f} / "
                    f"{row['cached_p50_ms']:.2f} ms)", "bound": ">= 10",
                    "holds": row["ratio"] >= 10})
        if row.get("rest_round_trip_p50_ms"):
            least = row["rest_round_trip_p50_ms"] + row["extend_p50_ms"] + row["top_k_p50_ms"]
            out.append(_bound(f"(c) bound: H={TARGET_H} REST recompute / (REST round trip with "
                              "no model call + the cached path's extend + top_k in process)",
                              row["recompute_p50_ms"], least, " ms", 10, "cache over REST"))
        out.append({"target": f"(c) H={TARGET_H}, in process user_state / extend p50",
                    "measured": f"{row['fn_ratio']:.2f} ({row['user_state_p50_ms']:.2f} / "
                    f"{row['extend_p50_ms']:.2f} ms)", "bound": ">= 10",
                    "holds": row["fn_ratio"] >= 10})
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small request counts and time caps (a smoke run)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=None,
                        help="client threads per level (default 1 4 16 64; quick: 1 4 16)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests at concurrency 1 (default 200, quick 20); a level of "
                        "concurrency c sends requests x (1 + log4 c)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="time cap of a level (default 20, quick 3)")
    parser.add_argument("--cache-reps", type=int, default=None,
                        help="one-event requests per history (default 50, quick 6; at most "
                        f"{MAX_SEQ_LEN} - H)")
    parser.add_argument("--histories", type=int, nargs="+", default=list(CACHE_HISTORIES),
                        help="the cache sweep's history lengths H (default "
                        f"{' '.join(map(str, CACHE_HISTORIES))}; each < {MAX_SEQ_LEN})")
    parser.add_argument("--num-items", type=int, default=3000)
    parser.add_argument("--successors", type=int, default=10,
                        help="the model's transition prior: random successors of each item "
                        "(train's defaults export a prior; Amazon Toys has about 12 distinct "
                        "successors an item), 0: none (default 10)")
    parser.add_argument("--batching-flags", default="",
                        help="extra flags of the batching server, e.g. '--num-batch-threads 2 "
                        "--batch-timeout-micros 2000' (default: recops-tf serve's defaults)")
    parser.add_argument("--server-flags", default="",
                        help="extra flags of every server (batching, not, recompute), e.g. "
                        "'--tensorflow-intra-op-parallelism 2' (default: recops-tf serve's "
                        "defaults)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = parser.parse_args(argv)
    args.concurrency = args.concurrency or ([1, 4, 16] if args.quick else [1, 4, 16, 64])
    args.requests = args.requests or (20 if args.quick else 200)
    args.seconds = args.seconds or (3.0 if args.quick else 20.0)
    args.cache_reps = args.cache_reps or (6 if args.quick else 50)
    if min(args.concurrency) < 1 or args.requests < 1 or args.seconds <= 0 or \
            args.cache_reps < 1:
        parser.error("--concurrency, --requests, --seconds and --cache-reps must be positive")
    if args.successors < 0:
        parser.error("--successors must be at least 0")
    if not all(1 <= h < MAX_SEQ_LEN for h in args.histories):
        parser.error(f"--histories: each in 1..{MAX_SEQ_LEN - 1}")
    command = os.path.join(os.path.dirname(sys.executable), "recops-tf")
    if not os.access(command, os.X_OK):
        parser.error(f"{command}: not found (install recops_tf[serve] in this environment)")

    began, load_before = time.time(), os.getloadavg()
    tmp = tempfile.mkdtemp(prefix="bench_serve_")
    servers, notes = {}, []
    try:
        path = build_and_export(tmp, args.num_items, successors=args.successors)
        with open(os.path.join(os.path.dirname(path), "info.json")) as f:
            width = json.load(f)["cache_width"]
        print(f"exported {path} in {time.time() - began:.1f} s", file=sys.stderr, flush=True)
        # all three start at once (each loads TensorFlow and the model), then wait for each
        for name, flags in (("on", shlex.split(args.batching_flags)), ("off", ["--no-batching"]),
                            ("recompute", ["--cache-mb", "0"])):
            servers[name] = Server(name, tmp, shlex.split(args.server_flags) + flags, tmp)
        for server in servers.values():
            server.ready()
            print(f"server {server.name}: ready in {server.ready_s:.1f} s (REST "
                  f"{server.rest_port}, gRPC {server.grpc_port})", file=sys.stderr, flush=True)
        module = tf.saved_model.load(path)
        floor, predict = bench_predict({"on": servers["on"], "off": servers["off"]}, module,
                                       args.num_items, args)
        cache, problems = bench_cache({"cached": servers["on"],
                                       "recompute": servers["recompute"]},
                                      module, width, args.num_items, args.histories,
                                      args.cache_reps)
    finally:
        for server in servers.values():
            note = server.close()
            if note:
                notes.append(note)
                print(note, file=sys.stderr, flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "config": {"concurrency": args.concurrency, "requests": args.requests,
                   "seconds": args.seconds, "cache_reps": args.cache_reps,
                   "histories": args.histories, "num_items": args.num_items,
                   "successors": args.successors, "batching_flags": args.batching_flags,
                   "server_flags": args.server_flags,
                   "max_seq_len": MAX_SEQ_LEN, "history": HISTORY, "quick": args.quick,
                   "cpus": os.cpu_count(), "load_average_before": load_before,
                   "load_average_after": os.getloadavg(),
                   "tensorflow": tf.__version__, "grpc": grpc.__version__,
                   "apis": _apis.SOURCE},
        "servers": {name: server.info() for name, server in servers.items()},
        "floor": floor, "predict": predict, "cache": cache,
        "cache_answers_equal": all(r["equal"] for r in cache),
        "cache_equal_to_savedmodel": all(r["equal_to_savedmodel"] for r in cache),
        "cache_problems": problems, "server_notes": notes}
    result["targets"] = targets(result)
    result["seconds"] = time.time() - began
    print(tables(result))
    load = result["config"]
    print(f"\n({result['seconds']:.0f} s in all; {load['cpus']} CPUs; load average (1, 5, 15 "
          f"min) before {' '.join(f'{x:.2f}' for x in load['load_average_before'])}, after "
          f"{' '.join(f'{x:.2f}' for x in load['load_average_after'])})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if not problems and not notes and not any(r["errors"] for r in predict) else 1


if __name__ == "__main__":
    sys.exit(main())
