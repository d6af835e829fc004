"""Runs a scenario in several worker processes joined by TensorFlow's collective runtime on
127.0.0.1 (tests and benchmarks of ``recops_tf.distributed``).

``launch(scenario, workers)`` picks free ports, starts one process per rank running
``python -m recops_tf.testing.drivers.multiworker SCENARIO RANK PORTS OUT_DIR``, waits for all
of them (killing every process of the launch after ``timeout`` seconds) and returns each
rank's ``(returncode, results dict, log tail)``. A scenario writes its results with ``save``.

The scenarios' inputs are pure numpy functions of (world size, rank), so the test process
computes the expected results without joining the group.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from recops_tf.recommender.multiworker import free_ports

DTYPES = ("float32", "bfloat16", "int64")


def launch(scenario, workers, timeout=150.0, env=None):
    """[(returncode, results, log tail)] per rank; every process is gone when it returns."""
    ports = ",".join(str(p) for p in free_ports(workers))
    out_dir = tempfile.mkdtemp(prefix=f"recops_{scenario}_")
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    environment.pop("TF_CONFIG", None)
    logs = [open(os.path.join(out_dir, f"log_{r}.txt"), "w+") for r in range(workers)]
    worker = [sys.executable, "-m", "recops_tf.testing.drivers.multiworker", scenario]
    procs = [subprocess.Popen(worker + [str(r), ports, out_dir], stdout=logs[r],
                              stderr=subprocess.STDOUT, env=environment)
             for r in range(workers)]
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outcomes = []
    for r, p in enumerate(procs):
        logs[r].seek(0)
        tail = logs[r].read()[-3000:]
        logs[r].close()
        path = os.path.join(out_dir, f"result_{r}.npz")
        results = dict(np.load(path, allow_pickle=False)) if os.path.exists(path) else {}
        outcomes.append((p.returncode, results, tail))
    return outcomes


# --- inputs (pure numpy) ---------------------------------------------------------------------

def send_case(world, rank, case, dim=3):
    """(send [N, dim] float64, counts [world]) of `rank` for case `case`."""
    rng = np.random.default_rng(1000 * case + 17 * rank + world)
    if case == 0:  # uneven, with empty chunks
        counts = rng.integers(0, 4, size=world)
    elif case == 1:  # rank 0 sends nothing at all
        counts = np.zeros(world, np.int64) if rank == 0 else rng.integers(1, 3, size=world)
    elif case == 2:  # nobody sends anything
        counts = np.zeros(world, np.int64)
    else:  # even
        counts = np.full(world, 2)
    send = rng.integers(-50, 50, size=(int(counts.sum()), dim)).astype(np.float64)
    return send, counts.astype(np.int64)


CASES = (0, 1, 2, 3)


def expected_all_to_all(world, me, case):
    parts, recv_counts = [], []
    for s in range(world):
        send, counts = send_case(world, s, case)
        start = int(counts[:me].sum())
        parts.append(send[start:start + counts[me]])
        recv_counts.append(int(counts[me]))
    return np.concatenate(parts), np.array(recv_counts)


def restore_of(received_rows, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 4, size=received_rows)


def table_of(world, rank):
    return np.random.default_rng(500 + rank).standard_normal((6, 3))


def lookup_case(world, rank):
    rng = np.random.default_rng(900 + rank)
    counts = rng.integers(0, 3, size=world)
    return rng.integers(0, 6, size=int(counts.sum())), counts


def weights_of(rows, seed):
    return np.random.default_rng(seed).standard_normal((rows, 3))


def sharded_batches(steps=50, batch=16, num_keys=64, seed=0):
    """[(keys [batch, 3] int64, labels [batch])] of the parity model, global batches."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        keys = rng.zipf(1.3, size=(batch, 3)) % num_keys
        labels = (keys.sum(1) % 3 == 0).astype(np.float32)
        out.append((keys.astype(np.int64), labels))
    return out


def parity_model(embedding_layer):
    """The parity model's pieces: a pooled embedding and a small dense head."""
    import keras

    dense = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=3))
    return embedding_layer, dense


def parity_loss(embedding, dense, keys, labels, scale):
    import tensorflow as tf

    pooled = tf.reduce_mean(embedding(keys, training=True), axis=1)
    logits = tf.squeeze(dense(pooled), -1)
    per_example = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_sum(per_example) * scale


# --- scenarios (run in the workers) ----------------------------------------------------------

def save(out_dir, rank, **results):
    """Writes the worker's results atomically: a worker killed at the launcher's deadline
    leaves no result file rather than a partial one."""
    path = os.path.join(out_dir, f"result_{rank}.npz")
    with open(path + ".part", "wb") as f:
        np.savez(f, **results)
    os.replace(path + ".part", path)


def _scenario_collectives(group, out_dir):
    import tensorflow as tf

    from recops_tf import distributed as dist

    world, me = group.world_size, group.rank
    results = {}
    a2a = tf.function(lambda x, c: dist.all_to_all(x, c))
    for case in CASES:
        send, counts = send_case(world, me, case)
        for dtype in DTYPES:
            x = tf.constant(send, tf.as_dtype(dtype))
            received, recv_counts = a2a(x, tf.constant(counts))
            results[f"a2a_{case}_{dtype}"] = tf.cast(received, tf.float64).numpy()
            results[f"a2a_counts_{case}_{dtype}"] = recv_counts.numpy()
        # eager too
        received, _ = dist.all_to_all(tf.constant(send, tf.float32), counts)
        results[f"a2a_eager_{case}"] = received.numpy().astype(np.float64)
        # AllUss
        n_recv = int(results[f"a2a_counts_{case}_float32"].sum())
        restore = restore_of(n_recv, 70 + me)
        uss = tf.function(lambda x, c, r: dist.all_to_all_segment_sum(x, c, r, 4))
        results[f"uss_{case}"] = uss(tf.constant(send, tf.float32), counts,
                                     tf.constant(restore)).numpy().astype(np.float64)
        # gradient of all_to_all: d/dsend sum(received * w)
        w = weights_of(n_recv, 80 + me)

        @tf.function
        def grad_a2a(x, c, w):
            with tf.GradientTape() as tape:
                tape.watch(x)
                received, _ = dist.all_to_all(x, c)
                loss = tf.reduce_sum(received * w)
            return tape.gradient(loss, x)

        results[f"grad_a2a_{case}"] = grad_a2a(tf.constant(send), counts,
                                               tf.constant(w)).numpy()
    # GatherAll and its gradient into the table
    table = tf.Variable(table_of(world, me))
    lookup, counts = lookup_case(world, me)

    @tf.function
    def gather_all(lookup, counts):
        with tf.GradientTape() as tape:
            received, recv_counts = dist.gather_all_to_all(table, lookup, counts)
            loss = tf.reduce_sum(received * tf.constant(
                weights_of(int(expected_gather_rows(world, me)), 90 + me)))
        return received, tf.convert_to_tensor(tape.gradient(loss, table))

    received, grad = gather_all(tf.constant(lookup), tf.constant(counts))
    results["gather_all"], results["gather_all_grad"] = received.numpy(), grad.numpy()
    # The seed's element-count matrix form
    matrix = np.stack([send_case(world, s, 0)[1] for s in range(world)]) * 3
    send, _ = send_case(world, me, 0)
    results["lccl_a2a"] = dist.lccl_all_to_all(tf.constant(send, tf.float32), matrix,
                                               3).numpy().astype(np.float64)
    save(out_dir, me, **results)


def expected_gather_rows(world, me):
    return sum(int(lookup_case(world, s)[1][me]) for s in range(world))


def _first_all_to_all(group, out_dir):
    """One all_to_all every rank joins (everyone is up); returns its input and counts.

    The ranks first wait for each other through files in out_dir (up to 120 s): on a loaded
    machine a rank may take longer than the scenario's short collective timeout just to
    start, and that first collective must not time out."""
    import tensorflow as tf

    from recops_tf import distributed as dist

    _file_barrier(out_dir, "ready", group.rank, group.world_size)
    counts = np.ones(group.world_size, np.int64)
    x = tf.ones([group.world_size, 2])
    dist.all_to_all(x, counts)
    # A rank's all_to_all returns once it has its own chunks, while a peer may still be fetching
    # this rank's (a peer pulls them from this process): a rank that dies or stalls right away
    # broke the first exchange itself on a loaded machine. Everyone finishes it first.
    _file_barrier(out_dir, "first", group.rank, group.world_size)
    return x, counts


def _file_barrier(out_dir, name, rank, world):
    """Waits (up to 120 s) until every rank has reached this point: a file per rank in out_dir."""
    open(os.path.join(out_dir, f"{name}{rank}"), "w").close()
    deadline = time.time() + 120
    while time.time() < deadline and not all(
            os.path.exists(os.path.join(out_dir, f"{name}{r}")) for r in range(world)):
        time.sleep(0.05)


def _save_failed_collective(group, out_dir, x, counts):
    """Runs an all_to_all a peer will not join; saves the error it ended with and its duration."""
    from recops_tf import distributed as dist

    start = time.monotonic()
    try:
        dist.all_to_all(x, counts)
        error = "none"
    except Exception as e:  # noqa: BLE001 - the type is the result
        error = f"{type(e).__name__}: {e}"
    save(out_dir, group.rank, error=np.array(error), seconds=np.array(time.monotonic() - start))


def _scenario_dead_worker(group, out_dir):
    x, counts = _first_all_to_all(group, out_dir)
    if group.rank == 1:
        os._exit(3)  # dies without a word
    time.sleep(1.0)
    _save_failed_collective(group, out_dir, x, counts)


def _scenario_silent_worker(group, out_dir):
    x, counts = _first_all_to_all(group, out_dir)
    if group.rank == 1:  # alive, but never joins the next collective
        time.sleep(group.timeout + 3)
        save(out_dir, group.rank, error=np.array("none"), seconds=np.array(0.0))
        return
    _save_failed_collective(group, out_dir, x, counts)


def _scenario_sharded(group, out_dir):
    import tensorflow as tf

    import recops_tf
    from recops_tf import distributed as dist

    world, me = group.world_size, group.rank
    embedding, dense = parity_model(dist.ShardedEmbedding(4, seed=11, initializer="uniform"))
    optimizer = recops_tf.optimizers.LazyAdam(0.05)
    batches = sharded_batches()
    global_batch = batches[0][0].shape[0]

    @tf.function
    def step(keys, labels):
        with tf.GradientTape() as tape:
            loss = parity_loss(embedding, dense, keys, labels, 1.0 / global_batch)
        variables = [embedding.gradient_anchor] + dense.trainable_variables
        grads = tape.gradient(loss, variables)
        # The dense head is data-parallel: sum its gradients over the ranks.
        grads = grads[:1] + [group.all_reduce_sum(g) for g in grads[1:]]
        optimizer.apply(grads, variables)
        return group.all_reduce_sum(loss)

    losses = []
    for keys, labels in batches:
        shard = slice(me, None, world)  # rank r takes every R-th example
        losses.append(float(step(tf.constant(keys[shard]), tf.constant(labels[shard]))))
    save(out_dir, me, losses=np.array(losses), table_size=np.array(int(embedding.table.size())))


def _strategy_group(ports, rank):
    """A MultiWorkerMirroredStrategy over the workers (TF_CONFIG) and its Group."""
    import tensorflow as tf

    from recops_tf import distributed as dist

    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": rank}})
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return strategy, dist.Group.from_strategy(strategy, group_key=7300)


def _scenario_strategy(group, out_dir):
    """all_to_all under a MultiWorkerMirroredStrategy: in strategy.run and in a plain
    tf.function, next to the strategy's own all_reduce."""
    import tensorflow as tf

    from recops_tf import distributed as dist

    strategy, group = group
    world, me = group.world_size, group.rank
    send, counts = send_case(world, me, 0)

    @tf.function
    def replica_step(x, c):
        received, _ = dist.all_to_all(x, c, group=group)
        total = tf.distribute.get_replica_context().all_reduce("sum", tf.reduce_sum(received))
        return received, total

    received, total = strategy.run(replica_step, args=(tf.constant(send, tf.float32),
                                                       tf.constant(counts)))
    plain = tf.function(lambda x, c: dist.all_to_all(x, c, group=group)[0])
    save(out_dir, me, received=received.numpy().astype(np.float64),
         total=np.array(float(total)),
         plain=plain(tf.constant(send, tf.float32), counts).numpy().astype(np.float64))


def _scenario_bench(group, out_dir):
    """all_to_all of RECOPS_BENCH_MB per worker (1 KiB rows), an even or a skewed split
    (RECOPS_BENCH_SPLIT: rank d gets a share proportional to d + 1), against TensorFlow's equal
    all-to-all of the same bytes and a local copy of them."""
    import tensorflow as tf

    from recops_tf import distributed as dist
    from recops_tf._timing import median_seconds

    megabytes = float(os.environ.get("RECOPS_BENCH_MB", "64"))
    reps = int(os.environ.get("RECOPS_BENCH_REPS", "5"))
    split = os.environ.get("RECOPS_BENCH_SPLIT", "even")
    world = group.world_size
    rows = int(megabytes * 2 ** 20 / 1024)
    rows -= rows % world
    share = np.ones(world) if split == "even" else np.arange(1, world + 1, dtype=np.float64)
    counts = np.floor(share / share.sum() * rows).astype(np.int64)
    counts[-1] += rows - counts.sum()
    x = tf.random.uniform([rows, 256])
    a2a = tf.function(lambda x, c: dist.all_to_all(x, c)[0])
    equal = tf.function(group.all_to_all_equal)
    seconds = median_seconds(lambda: a2a(x, counts).numpy(), 1, reps)
    equal_seconds = median_seconds(lambda: equal(x).numpy(), 1, reps)
    source = np.random.default_rng(0).random(rows * 256, dtype=np.float32)
    local = np.empty_like(source)
    copy_seconds = median_seconds(lambda: np.copyto(local, source), 1, reps)
    save(out_dir, group.rank, seconds=np.array(seconds), equal_seconds=np.array(equal_seconds),
         copy_seconds=np.array(copy_seconds), payload_bytes=np.array(rows * 1024),
         moved_bytes=np.array(world * int(counts.max()) * 1024))


SCENARIOS = {"collectives": _scenario_collectives, "dead_worker": _scenario_dead_worker,
             "silent_worker": _scenario_silent_worker, "strategy": _scenario_strategy,
             "sharded": _scenario_sharded, "bench": _scenario_bench}


def main(argv):
    scenario, rank, ports, out_dir = argv[0], int(argv[1]), argv[2].split(","), argv[3]
    from recops_tf import distributed as dist

    timeout = float(os.environ.get("RECOPS_COLLECTIVE_TIMEOUT", "60"))
    if scenario == "strategy":
        group = _strategy_group(ports, rank)
    else:
        group = dist.connect([f"127.0.0.1:{p}" for p in ports], rank, timeout=timeout)
    SCENARIOS[scenario](group, out_dir)
    if scenario not in ("dead_worker", "silent_worker"):
        # No rank exits while a peer may still be fetching its last collective's chunks.
        _file_barrier(out_dir, "exit", rank, len(ports))
    print(json.dumps({"rank": rank, "scenario": scenario, "done": True}), flush=True)
    # The results are saved: skip the interpreter's teardown, which can crash inside
    # TensorFlow after a collective was aborted (a dead or silent peer).
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
