"""``recops-tf train --workers N``: the recommender trained by several worker processes on
TensorFlow's own distributed runtime (its gRPC servers and collective ops), through the
project's ``recops_tf.distributed.Group`` rather than ``tf.distribute.MultiWorkerMirroredStrategy``:
the item tables are model-parallel ``ShardedEmbedding``s (key k on rank k mod N, its optimizer
slots beside it, updated by the fused LazyAdam on the owner), which a mirrored strategy would
replicate; the dense weights are data-parallel (gradients summed with the group's all-reduce).

* One machine: ``--workers N`` starts N local worker processes (``launch``) on free ports of
  127.0.0.1 and watches them: a worker that exits with an error, or is killed, stops the job
  (the others are ended) with its name in the error; one that stops answering (stopped,
  hung) is named by the others' watchdogs after ``--worker-timeout`` (``_Watchdog``).
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
    """Ends this worker (exit status 1, one line naming the group failure) when the group
    cannot go on. The group's collectives have no timeout of their own (TensorFlow keeps a
    sleeping thread per collective for its timeout: thousands at a training step's rate), so
    a peer that stops answering would leave this worker waiting for ever.

    * A peer stopped or hung: a thread of this worker's own asks every peer's TensorFlow
      server for its status (the worker service's ``GetStatus``, over gRPC) every few
      seconds. A peer that answered once and has then given no answer for `timeout` seconds
      is stopped (SIGSTOP, a frozen machine or link): this worker ends, naming it. The answer
      comes from the peer's gRPC threads, not from its training loop, so it does not depend
      on what the peer is doing or on the machine's load: a peer tracing a function, writing
      its first checkpoint or evaluating on a loaded machine answers in milliseconds.
    * No progress: no `beat` (a training step, an evaluation batch) for `stall` seconds while
      every peer answers (a deadlock). A backstop with a generous bound: progress is a
      measure of work, and a peer's one-time work (tracing, its first checkpoint, an
      evaluation) counts against it on every worker waiting for that peer, for as long as
      the machine's load makes it last; a bound of `timeout` on it ended healthy groups on a
      loaded machine, naming the wrong worker.

    `peers`: ``{rank: "host:port"}`` of the other workers' servers (None: progress only)."""

    def __init__(self, rank, timeout, stall, peers=None):
        self.rank, self.timeout, self.stall = rank, float(timeout), float(stall)
        self.last, self.stopped = time.monotonic(), False
        self.peers = dict(peers or {})
        # each probe's deadline, and the probes' period: several probes within the timeout
        self.probe = min(max(self.timeout / 4, 0.5), 5.0)
        threading.Thread(target=self._watch, daemon=True, name="recops-watchdog").start()
        if self.peers:
            threading.Thread(target=self._probe_peers, daemon=True,
                             name="recops-peer-probe").start()

    def beat(self):
        self.last = time.monotonic()

    def _fail(self, why):
        if self.stopped:
            return
        sys.stderr.write(f"recops-tf train: error: worker {self.rank}: the group failed "
                         f"({why})\n")
        sys.stderr.flush()
        os._exit(1)

    def _watch(self):
        while not self.stopped:
            time.sleep(min(1.0, self.stall / 4))
            idle = time.monotonic() - self.last
            if idle > self.stall:
                self._fail(f"no progress for {idle:.0f} s while every worker answered: the "
                           f"workers are stuck")

    def _probe_peers(self):
        import grpc

        options = [("grpc.enable_http_proxy", 0),  # a peer is reached directly
                   ("grpc.initial_reconnect_backoff_ms", 200),
                   ("grpc.min_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
        calls = {}
        for rank, address in self.peers.items():
            channel = grpc.insecure_channel(address, options=options)
            # bytes in, bytes out: any answer is an answer (an empty GetStatusRequest)
            calls[rank] = channel.unary_unary("/tensorflow.WorkerService/GetStatus")
        silent = {}  # rank: when its current run of unanswered probes began
        armed = set()  # the peers that answered once (a peer starting up is not silent)
        while not self.stopped:
            began = time.monotonic()
            for rank, call in calls.items():
                start = time.monotonic()
                try:
                    call(b"", timeout=self.probe, wait_for_ready=True)
                    armed.add(rank)
                    silent.pop(rank, None)
                    continue
                except grpc.RpcError:
                    pass
                now = time.monotonic()
                if now - start > 2 * self.probe + 1.0:
                    # this worker itself was stopped (the probe outlived its deadline): the
                    # silence is not the peer's
                    silent.clear()
                    break
                if rank not in armed:
                    continue
                since = silent.setdefault(rank, start)
                if now - since >= self.timeout:
                    self._fail(f"worker {rank} stopped answering: no answer for "
                               f"{now - since:.0f} s")
            time.sleep(max(self.probe - (time.monotonic() - began), 0.05))


_WATCHDOG = []


def beat():
    """Marks progress of this worker (a training step, an evaluation batch)."""
    if _WATCHDOG:
        _WATCHDOG[0].beat()


def stop_watchdog():
    """After the last collective (the chief then exports alone, the others exit)."""
    if _WATCHDOG:
        _WATCHDOG[0].stopped = True


def cluster_group(timeout=60.0):
    """This process's ``Group`` when ``TF_CONFIG`` names a cluster of several workers, else
    None. Joins the cluster (TensorFlow's gRPC server of this worker starts here), and starts
    the watchdog (`_Watchdog`): it ends the worker when a peer that answered has stopped
    answering for `timeout` seconds, or when the group makes no progress for 10 minutes
    (10 x `timeout` when longer)."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    workers = config.get("cluster", {}).get("worker") or []
    if len(workers) < 2:
        return None
    task = config.get("task", {})
    if task.get("type", "worker") != "worker" or "index" not in task:
        raise ValueError("TF_CONFIG: task must be {'type': 'worker', 'index': i}")
    from recops_tf import distributed

    group = distributed.connect(workers, int(task["index"]), timeout=None)
    peers = {i: address for i, address in enumerate(workers) if i != group.rank}
    _WATCHDOG[:] = [_Watchdog(group.rank, float(timeout), max(600.0, 10 * float(timeout)),
                              peers)]
    return group


def unsharded(model, config, num_items, group):
    """A one-process model equal to the sharded `model` (every rank calls it: the tables'
    shards are gathered to every rank)."""
    import tensorflow as tf

    from recops_tf.recommender.training import _ragged, build_model

    whole = build_model(config, num_items, transition_pairs=model.transition_pairs,
                        transition_rules=(model.transition_depth, model.transition_decay))
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
    the others failed waiting for it (hung: the one their watchdogs found silent, else the
    first still running after `settle` seconds). All exit 0: 0."""
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
        # victim: give the others a moment to fail too, then name the cause (at once when a
        # victim names a peer that stopped answering and is still running).
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) and not _victim(logs[i]) for i, c in enumerate(codes)):
                break
            if any(codes[j] is None for i, c in enumerate(codes) if c not in (None, 0)
                   for j in _silent(logs[i])):
                break
            time.sleep(poll)
        codes = [p.poll() for p in procs]
        _end(procs)
        culprits = [i for i, c in enumerate(codes) if c not in (None, 0) and
                    not _victim(logs[i])]
        killed = [i for i in culprits if codes[i] < 0]
        failed = [i for i in culprits if codes[i] > 0]
        alive = [i for i, c in enumerate(codes) if c is None]
        silent = {j for i, c in enumerate(codes) if c not in (None, 0) for j in _silent(logs[i])}
        alive.sort(key=lambda i: i not in silent)  # the one the others found silent first
        if killed:
            i = killed[0]
            why = f"killed by {signal.Signals(-codes[i]).name}"
        elif failed:
            i = failed[0]
            why = f"exit status {codes[i]}: {_tail(logs[i])}"
        elif alive:
            i = alive[0]
            why = ("hung: it stopped answering the others" if i in silent else
                   "hung: the others timed out waiting for it")
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


def _silent(path):
    """The ranks a failed worker's watchdog found silent (`_Watchdog`), from its log."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()[-20000:]
    except OSError:
        return []
    return [int(k) for k in re.findall(r"the group failed \(worker (\d+) stopped answering",
                                       text)]


def _end(procs, grace=5.0):
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:  # a stopped worker ends now, not after the grace
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
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
