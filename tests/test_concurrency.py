"""Concurrency: TF runs one kernel instance per graph node, so one tf.function called from several
Python threads (or inter-op parallelism) calls each kernel's Compute concurrently. Results must
not depend on it: every stateless op gives bitwise the single-threaded result, the HSTU kernels
also when the concurrent calls have different inputs, and the stateful ops (table inserts,
optimizer steps) lose and duplicate nothing."""
import concurrent.futures
import threading

import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf import _ops_table
from recops_tf.bench import vjp
from recops_tf.testing import cases

THREADS = 8
CALLS = 4  # per thread


def run_in_threads(work, threads=THREADS):
    """[work(t) for t in range(threads)], each on its own thread, all started together."""
    barrier = threading.Barrier(threads)

    def start(t):
        barrier.wait()
        return work(t)

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(start, range(threads)))


def arrays(outputs):
    return [t.numpy() for t in tf.nest.flatten(outputs, expand_composites=True)]


def assert_bitwise_equal(got, want, what):
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"{what}, output {i}")


def stateless_cases():
    """The first tiny benchmark shape of every stateless stem; every one of hstu_dense (the
    plain, paged and relative-bias paths)."""
    for row in _ops_table.OPS:
        if row.stateful:
            continue
        shapes = row.bench["tiny"] if row.stem == "hstu_dense" else row.bench["tiny"][:1]
        for i, shape in enumerate(shapes):
            yield pytest.param(row.stem, shape, id=f"{row.stem}-{i}")


@pytest.mark.parametrize("stem,shape", list(stateless_cases()))
def test_one_function_from_many_threads_gives_the_single_threaded_bits(stem, shape):
    case = cases.build(stem, shape)
    fns = {"forward": tf.function(case.fused)}
    if case.diff:
        upstream = case.upstream()
        fns["forward+backward"] = vjp(case.fused, case.diff, upstream)
    for mode, fn in fns.items():
        want = arrays(fn(*case.args))  # traced and run once, alone
        results = run_in_threads(lambda t: [arrays(fn(*case.args)) for _ in range(CALLS)])
        for t, calls in enumerate(results):
            for c, got in enumerate(calls):
                assert_bitwise_equal(got, want, f"{stem} {mode}: thread {t} call {c}")


# --- HSTU: one kernel instance, different inputs per call ---------------------------------------

MAX_LEN, HEADS, DIM = 160, 2, 8
ROWS = tf.TensorSpec([None, HEADS, DIM], tf.float32)
OFFSETS = tf.TensorSpec([None], tf.int64)


def hstu_inputs(seed, variant):
    """Inputs of one call: batch size, lengths and (relative bias) the number of time buckets
    differ from call to call, so a kernel keeping per-call state in members mixes calls up."""
    rng = np.random.default_rng(seed)
    batch = 1 + seed % 5
    lengths = rng.integers(MAX_LEN // 2, MAX_LEN + 1, size=batch)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rows = int(offsets[-1])
    q, k, v, dout = (rng.standard_normal((rows, HEADS, DIM)).astype(np.float32)
                     for _ in range(4))
    inputs = [q, k, v, dout, offsets]
    if variant == "relative_bias":
        timestamps = np.concatenate([np.cumsum(rng.integers(0, 86400, size=n)) for n in lengths])
        inputs += [timestamps.astype(np.int64),
                   rng.standard_normal(int(rng.choice([9, 33, 129]))).astype(np.float32),
                   rng.standard_normal(2 * MAX_LEN - 1).astype(np.float32)]
    elif variant == "fuxi":
        inputs += [rng.standard_normal((batch, MAX_LEN, MAX_LEN)).astype(np.float32),
                   rng.standard_normal((1, MAX_LEN, MAX_LEN)).astype(np.float32)]
    return [tf.constant(x) for x in inputs]


def hstu_function(variant):
    """One tf.function (so one instance of each kernel) of forward and backward, for inputs of
    any batch size and length."""
    extra = {"plain": [],
             "relative_bias": [tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.float32),
                               tf.TensorSpec([2 * MAX_LEN - 1], tf.float32)],
             "fuxi": [tf.TensorSpec([None, MAX_LEN, MAX_LEN], tf.float32),
                      tf.TensorSpec([1, MAX_LEN, MAX_LEN], tf.float32)]}[variant]

    @tf.function(input_signature=[ROWS, ROWS, ROWS, ROWS, OFFSETS] + extra)
    def forward_backward(q, k, v, dout, offsets, *extra):
        watched = [q, k, v, *(extra[1:] if variant == "relative_bias" else extra)]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            if variant == "fuxi":
                out = recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=offsets,
                                                    max_seq_len=MAX_LEN, timestamp_bias=extra[0],
                                                    position_bias=extra[1])
                # Upstream for the three channels [O_s | O_t | O_p]: dout for each.
                dout = tf.tile(tf.reshape(dout, [-1, HEADS * DIM]), [1, 3])
            else:
                bias = {} if variant == "plain" else dict(
                    timestamps=extra[0], time_bias_weights=extra[1],
                    position_bias_weights=extra[2])
                out = recops_tf.hstu_attention(q, k, v, seq_offsets=offsets,
                                               max_seq_len=MAX_LEN, **bias)
        return [out] + tape.gradient(out, watched, output_gradients=dout)

    return forward_backward


@pytest.mark.parametrize("variant", ["plain", "relative_bias", "fuxi"])
def test_hstu_concurrent_calls_with_different_inputs(variant):
    fn = hstu_function(variant)
    inputs = [hstu_inputs(seed, variant) for seed in range(6)]
    want = [arrays(fn(*x)) for x in inputs]

    def work(t):
        # Every thread runs every input, each thread in its own order.
        order = [(t + i) % len(inputs) for i in range(len(inputs))] * 2
        return [(i, arrays(fn(*inputs[i]))) for i in order]

    for t, calls in enumerate(run_in_threads(work)):
        for i, got in calls:
            assert_bitwise_equal(got, want[i], f"{variant}: thread {t}, input {i}")


# --- stateful ops ---------------------------------------------------------------------------------

def test_concurrent_training_lookups_of_new_keys_get_one_row_per_key():
    table = recops_tf.DynamicEmbeddingTable(4, block_rows=64)
    lookup = tf.function(lambda keys: table.lookup_addresses(keys, training=True),
                         input_signature=[tf.TensorSpec([None], tf.int64)])
    universe = np.arange(2000, dtype=np.int64) * 7 + 3
    rounds = 3

    def work(t):
        rng = np.random.default_rng(t)
        seen = []
        for r in range(rounds):
            # Overlapping subsets of the keys new this round, in a thread-specific order.
            new = universe[r * len(universe) // rounds:(r + 1) * len(universe) // rounds]
            keys = rng.permutation(np.concatenate([new[t % 2::2], new[:100]]))
            seen.append((keys, lookup(keys).numpy()))
        return seen

    address = {}
    for t, seen in enumerate(run_in_threads(work)):
        for keys, addresses in seen:
            assert (addresses != 0).all()
            for key, a in zip(keys.tolist(), addresses.tolist()):
                assert address.setdefault(key, a) == a, f"key {key}: two rows (thread {t})"
    assert len(address) == len(universe)  # every key was looked up by some thread
    assert len(set(address.values())) == len(address), "two keys share a row"
    assert table.size().numpy() == len(universe)
    assert sorted(table.export()[0].numpy().tolist()) == sorted(universe.tolist())


NUM_ROWS, WIDTH, STEPS = 64, 4, 25


def sgd_targets():
    """[(name, step, value)] for a variable and for a table by address, both starting from the
    returned rows: step(gradient, rows) is one tf.function (one kernel instance) and value()
    the target's rows as a numpy array."""
    start = np.random.default_rng(0).integers(-50, 50, size=(NUM_ROWS, WIDTH)).astype(np.float32)
    var = tf.Variable(start)
    table = recops_tf.DynamicEmbeddingTable(WIDTH, initializer="zeros")
    table.assign(np.arange(NUM_ROWS), start)
    addresses = table.lookup_addresses(np.arange(NUM_ROWS), training=False)
    spec = [tf.TensorSpec([None, WIDTH], tf.float32), tf.TensorSpec([None], tf.int64)]

    @tf.function(input_signature=spec)
    def var_step(gradient, rows):
        recops_tf.sgd_update(var, gradient, rows, lr=1.0)

    @tf.function(input_signature=spec)
    def table_step(gradient, rows):
        recops_tf.sgd_update(table, gradient, tf.gather(addresses, rows), 1.0)

    targets = [("variable", var_step, var.numpy),
               ("table", table_step, lambda: table.export()[1].numpy())]
    return targets, start


@pytest.mark.parametrize("rows_of_thread", ["disjoint", "same"])
def test_concurrent_sgd_steps_lose_nothing(rows_of_thread):
    targets, start = sgd_targets()

    def rows(t):
        # Disjoint: thread t owns rows t, t + 8, ...; same: every thread steps every row, some
        # twice in one step (duplicates accumulate).
        if rows_of_thread == "disjoint":
            return np.arange(t, NUM_ROWS, THREADS)
        return np.concatenate([np.arange(NUM_ROWS), np.arange(0, NUM_ROWS, 3)])

    def gradient(t):
        # Small integers, lr 1, no weight decay: every sum is exact in float32, in any order.
        return np.tile(np.arange(1, WIDTH + 1, dtype=np.float32) * (t + 1), (len(rows(t)), 1))

    expected = start.copy()
    for t in range(THREADS):
        np.subtract.at(expected, rows(t), STEPS * gradient(t))
    for name, step, value in targets:
        def work(t):
            for _ in range(STEPS):
                step(gradient(t), rows(t))

        run_in_threads(work)
        np.testing.assert_array_equal(value(), expected, err_msg=name)
