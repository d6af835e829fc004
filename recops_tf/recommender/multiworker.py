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
import signal
import subprocess
import sys
import time

import numpy as np

WORKER_ENV = "RECOPS_WORKER"  # set by `launch` in the workers it starts


def cluster_group(timeout=60.0):
    """This process's ``Group`` when ``TF_CONFIG`` names a cluster of several workers, else
    None. Joins the cluster (TensorFlow's gRPC server of this worker starts here)."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    workers = config.get("cluster", {}).get("worker") or []
    if len(workers) < 2:
        return None
    task = config.get("task", {})
    if task.get("type", "worker") != "worker" or "index" not in task:
        raise ValueError("TF_CONFIG: task must be {'type': 'worker', 'index': i}")
    from recops_tf import distributed

    return distributed.connect(workers, int(task["index"]), timeout=timeout)


def unsharded(model, config, num_items, group):
    """A one-process model equal to the sharded `model` (every rank calls it: the tables'
    shards are gathered to every rank)."""
    import tensorflow as tf

    from recops_tf.recommender.training import _ragged, build_model

    whole = build_model(config, num_items)
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


def _free_ports(count):
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def launch(argv, workers, log_dir=None, poll=0.2):
    """Runs ``recops-tf train ARGV`` as `workers` local processes; returns the exit status.

    The chief's output is this process's; the others' go to ``log_dir/worker-<i>.log`` (a
    temporary directory when None). When a worker exits with an error (or is killed) the
    others are ended and the error names it; all exit 0: 0."""
    import tempfile

    log_dir = log_dir or tempfile.mkdtemp(prefix="recops_workers_")
    os.makedirs(log_dir, exist_ok=True)
    hosts = [f"127.0.0.1:{p}" for p in _free_ports(workers)]
    procs, logs = [], []
    for i in range(workers):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": {"worker": hosts},
                                                     "task": {"type": "worker", "index": i}}),
                   **{WORKER_ENV: "1"})
        path = os.path.join(log_dir, f"worker-{i}.log")
        logs.append(path)
        out = None if i == 0 else open(path, "w")
        procs.append(subprocess.Popen([sys.executable, "-m", "recops_tf", "train", *argv],
                                      env=env, stdout=out, stderr=subprocess.STDOUT if out
                                      else None))
    previous = {sig: signal.signal(sig, lambda *_: _end(procs)) for sig in (signal.SIGTERM,)}
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i = failed[0]
                _end(procs)
                code = codes[i]
                why = (f"killed by {signal.Signals(-code).name}" if code < 0 else
                       f"exit status {code}")
                tail = "" if i == 0 else _tail(logs[i])
                print(f"recops-tf train: error: worker {i} of {workers} failed ({why})"
                      f"{': ' + tail if tail else ''}; the other workers were stopped"
                      f"{'' if i == 0 else f' (its log: {logs[i]})'}", file=sys.stderr)
                return 1
            if all(c == 0 for c in codes):
                return 0
            time.sleep(poll)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or [""])[-1][:300]
