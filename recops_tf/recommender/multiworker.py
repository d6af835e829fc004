"""``recops-tf train --workers N``: the recommender trained by several worker processes on
TensorFlow's own distributed runtime (its gRPC servers and collective ops), through the
project's ``recops_tf.distributed.Group`` rather than ``tf.distribute.MultiWorkerMirroredStrategy``:
the item tables are model-parallel ``ShardedEmbedding``s (key k on rank k mod N, its optimizer
slots beside it, updated by the fused LazyAdam on the owner), which a mirrored strategy would
replicate; the dense weights are data-parallel (gradients summed with the group's all-reduce).

* One machine: ``--workers N`` starts N local worker processes (``launch``) on free ports of
  127.0.0.1 and watches them: a worker that exits with an error, or is killed, stops the job
  (the others are ended) with its name in the error; one that hangs makes the others' next
  collective fail after the group's timeout.
* A cluster: every machine runs the same ``recops-tf train ...`` with ``TF_CONFIG`` naming
  the cluster's workers and its own index (``tf.distribute``'s convention); each process is
  then one worker (``cluster_group``).

Rank 0, the chief, prints the report, writes ``--json`` and the export (the whole item table,
gathered from the shards by ``unsharded``); every worker checkpoints its shard at the same steps
under ``OUT/checkpoints/worker-<rank>``.
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np

WORKER_ENV = "RECOPS_WORKER"  # set by `launch` in the workers it starts


class _Watchdog:
    """Ends this worker (exit status 1, one line naming the group failure) when it makes no
    progress (`beat`) for `timeout` seconds, `startup` before the first beat. The group's
    collectives have no timeout of their own: TensorFlow keeps a sleeping thread per
    collective for its timeout, thousands at a training step's rate."""

    def __init__(self, rank, timeout, startup):
        self.rank, self.timeout, self.allowance = rank, timeout, startup
        self.last, self.stopped = time.monotonic(), False
        threading.Thread(target=self._watch, daemon=True, name="recops-watchdog").start()

    def beat(self):
        self.last, self.allowance = time.monotonic(), self.timeout

    def _watch(self):
        while not self.stopped:
            time.sleep(min(1.0, self.timeout / 4))
            idle = time.monotonic() - self.last
            if idle > self.allowance and not self.stopped:
                sys.stderr.write(f"recops-tf train: error: worker {self.rank}: the group failed "
                                 f"(no progress for {idle:.0f} s: a worker stopped answering)\n")
                sys.stderr.flush()
                os._exit(1)


_WATCHDOG = []


def beat():
    """Marks progress of this worker (a training step, an evaluation batch)."""
    if _WATCHDOG:
        _WATCHDOG[0].beat()


def stop_watchdog():
    """After the last collective (the chief then exports alone)."""
    if _WATCHDOG:
        _WATCHDOG[0].stopped = True


def cluster_group(timeout=60.0):
    """This process's ``Group`` when ``TF_CONFIG`` names a cluster of several workers, else
    None. Joins the cluster (TensorFlow's gRPC server of this worker starts here), and starts
    the watchdog that ends the worker after `timeout` seconds without progress (10 minutes
    before training starts: reading and profiling the data)."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    workers = config.get("cluster", {}).get("worker") or []
    if len(workers) < 2:
        return None
    task = config.get("task", {})
    if task.get("type", "worker") != "worker" or "index" not in task:
        raise ValueError("TF_CONFIG: task must be {'type': 'worker', 'index': i}")
    from recops_tf import distributed

    group = distributed.connect(workers, int(task["index"]), timeout=None)
    _WATCHDOG[:] = [_Watchdog(group.rank, float(timeout), max(600.0, float(timeout)))]
    return group


def unsharded(model, config, num_items, group):
    """A one-process model equal to the sharded `model` (every rank calls it: the tables'
    shards are gathered to every rank)."""
    import tensorflow as tf

    from recops_tf.recommender.training import _ragged, build_model

    whole = build_model(config, num_items, transition_pairs=model.transition_pairs)
    one = _ragged([np.array([1], np.int64)])
    whole({"items": one, "timestamps": one}, training=False)
    whole.item_matrix(training=False)
    for mine, theirs in zip(model.variables, whole.variables):
        theirs.assign(mine)
    for shard, table in zip(model.tables(), whole.tables()):
        keys, rows = shard.export()
        count = group.gather(tf.shape(keys, out_type=tf.int64)[:1]).numpy()
        most = int(count.max())
        pad = lambda x: tf.pad(x, [[0, most - tf.shape(x)[0]]] + [[0, 0]] * (  # noqa: E731
            x.shape.rank - 1))
        all_keys = group.gather(pad(keys)).numpy().reshape(group.world_size, most)
        all_rows = group.gather(pad(rows)).numpy().reshape(group.world_size, most, -1)
        keep = np.arange(most)[None, :] < count[:, None]
        table.assign(tf.constant(all_keys[keep]), tf.constant(all_rows[keep]))
    return whole


def free_ports(count):
    """`count` free TCP ports of 127.0.0.1 (bound then released)."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def launch(argv, workers, log_dir=None, poll=0.2, settle=15.0):
    """Runs ``recops-tf train ARGV`` as `workers` local processes; returns the exit status.

    The chief's report is this process's output; the workers' logs (the chief's stderr, the
    others' output) go to ``log_dir/worker-<i>.log`` (a temporary directory when None). When
    a worker is killed or fails, the others are ended and the error names it: the worker
    killed, else the one that failed for a reason of its own, else the one still running when
    the others' collectives timed out waiting (hung). All exit 0: 0."""
    import tempfile

    log_dir = log_dir or tempfile.mkdtemp(prefix="recops_workers_")
    os.makedirs(log_dir, exist_ok=True)
    hosts = [f"127.0.0.1:{p}" for p in free_ports(workers)]
    procs, logs = [], []
    for i in range(workers):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": {"worker": hosts},
                                                     "task": {"type": "worker", "index": i}}),
                   **{WORKER_ENV: "1"})
        path = os.path.join(log_dir, f"worker-{i}.log")
        logs.append(path)
        out = open(path, "w")  # the chief's stdout stays this process's (the report)
        procs.append(subprocess.Popen([sys.executable, "-m", "recops_tf", "train", *argv],
                                      env=env, stdout=None if i == 0 else out, stderr=out))
    previous = {sig: signal.signal(sig, lambda *_: _end(procs)) for sig in (signal.SIGTERM,)}
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                return 0
            if any(c not in (None, 0) for c in codes):
                break
            time.sleep(poll)
        # A failure. A worker whose group failed (a peer died or stopped answering) is a
        # victim: give the others a moment to fail too, then name the cause.
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) and not _victim(logs[i]) for i, c in enumerate(codes)):
                break
            time.sleep(poll)
        codes = [p.poll() for p in procs]
        _end(procs)
        culprits = [i for i, c in enumerate(codes) if c not in (None, 0) and
                    not _victim(logs[i])]
        killed = [i for i in culprits if codes[i] < 0]
        failed = [i for i in culprits if codes[i] > 0]
        alive = [i for i, c in enumerate(codes) if c is None]
        if killed:
            i = killed[0]
            why = f"killed by {signal.Signals(-codes[i]).name}"
        elif failed:
            i = failed[0]
            why = f"exit status {codes[i]}: {_tail(logs[i])}"
        elif alive:
            i = alive[0]
            why = "hung: the others' collectives timed out waiting for it"
        else:
            i = next(j for j, c in enumerate(codes) if c)
            why = f"exit status {codes[i]}: {_tail(logs[i])}"
        print(f"recops-tf train: error: worker {i} of {workers} failed ({why}); the other "
              f"workers were stopped (logs: {log_dir})", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_GROUP_FAILURES = ("the group failed (", "Collective has timed out",
                   "Collective ops is aborted", "UNAVAILABLE:", "Socket closed",
                   "Connection reset by peer", "failed to connect")


def _victim(path):
    """Whether a worker failed because its group did (a peer died or stopped answering: its
    collectives were aborted; TensorFlow may then even crash the process), not by itself."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()[-20000:]
    except OSError:
        return False
    return any(marker in text for marker in _GROUP_FAILURES)


def _end(procs, grace=5.0):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _tail(path):
    """The last error line of a worker's log."""
    try:
        with open(path) as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if re.match(r"(recops-tf \w+: error|[\w.]*Error\b)", line)]
    return (errors or [""])[-1][:300]
