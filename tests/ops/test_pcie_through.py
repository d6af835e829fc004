"""Tests of stem pcie_through: the host channel and rma_swap_multi_tables."""
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.ops.pcie_through import SWAP_CLOSED, SWAP_DONE, SWAP_IN_EMPTY, SWAP_OUT_FULL
from recops_tf.reference import pcie_through as ref
from recops_tf.testing import MODES, assert_close

swap = recops_tf.rma_swap_multi_tables


def tables_of(num, rows=12, dim=3, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((rows, dim)).astype(np.float32) for _ in range(num)]


# --- the channel -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_channel_is_fifo_of_any_tensor(mode):
    channel = recops_tf.HostChannel(capacity=3)
    items = [tf.constant([[1.0, 2.0]]), tf.constant([7, 8, 9], tf.int64),
             tf.constant(["a"]), tf.constant(np.ones((2, 0, 3), np.float32))]

    def push(x):
        channel.push(x)

    def pop(dtype):
        return channel.pop(dtype)

    if mode == "function":
        push, pop = tf.function(push), tf.function(pop, reduce_retracing=True)
    for x in items[:3]:
        push(x)
    assert int(channel.size()) == 3
    for x in items[:3]:
        np.testing.assert_array_equal(pop(x.dtype).numpy(), x.numpy())
    push(items[3])
    assert pop(tf.float32).shape == (2, 0, 3)
    assert int(channel.size()) == 0


def test_full_and_empty_channels_time_out_instead_of_hanging():
    channel = recops_tf.HostChannel(capacity=1)
    start = time.monotonic()
    with pytest.raises(tf.errors.DeadlineExceededError, match="stayed empty"):
        channel.pop(timeout=0.1)
    channel.push([1.0])
    with pytest.raises(tf.errors.DeadlineExceededError, match="stayed full"):
        channel.push([2.0], timeout=0.1)
    assert time.monotonic() - start < 5
    np.testing.assert_array_equal(channel.pop(timeout=0).numpy(), [1.0])


def test_an_item_of_another_dtype_stays_in_the_channel():
    channel = recops_tf.HostChannel()
    channel.push(tf.constant([3], tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="next item is int32 \\[1\\], expected float"):
        channel.pop(tf.float32)
    assert channel.pop(tf.int32).numpy().tolist() == [3]


def test_named_channels_are_one_fifo_per_process():
    a = recops_tf.HostChannel(4, name="test_named_channel")
    b = recops_tf.HostChannel(4, name="test_named_channel")
    a.push([5.0])
    assert int(b.size()) == 1
    assert b.pop().numpy().tolist() == [5.0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="exists with capacity 4, asked for 2"):
        recops_tf.HostChannel(2, name="test_named_channel")


def test_close_fails_pushes_and_drains_pops():
    channel = recops_tf.HostChannel()
    channel.push([1.0])
    channel.close()
    with pytest.raises(tf.errors.CancelledError, match="closed"):
        channel.push([2.0])
    assert channel.pop().numpy().tolist() == [1.0]
    with pytest.raises(tf.errors.OutOfRangeError, match="closed and empty"):
        channel.pop()


def test_close_wakes_a_waiting_pop():
    channel = recops_tf.HostChannel()
    closer = threading.Timer(0.2, channel.close)
    closer.start()
    start = time.monotonic()
    with pytest.raises(tf.errors.OutOfRangeError):
        channel.pop(timeout=30)
    assert time.monotonic() - start < 10
    closer.join()


def test_producer_thread_feeds_a_consumer_in_tf_function():
    channel = recops_tf.HostChannel(capacity=2)  # smaller than the stream: push must wait
    items = [np.full((2, 2), i, np.float32) for i in range(20)]

    def produce():
        for x in items:
            channel.push(x, timeout=30)

    producer = threading.Thread(target=produce)
    producer.start()
    pop = tf.function(lambda: channel.pop(timeout=30))
    got = [pop().numpy() for _ in items]
    producer.join(timeout=30)
    assert not producer.is_alive()
    np.testing.assert_array_equal(np.stack(got), np.stack(items))


@pytest.mark.parametrize("bad,error,message", [
    (dict(capacity=0), ValueError, "capacity must be >= 1"),
    (dict(timeout=-1.0), ValueError, "timeout must be finite and >= 0"),
    (dict(timeout=float("inf")), ValueError, "timeout must be finite"),
])
def test_channel_arguments_are_checked(bad, error, message):
    with pytest.raises(error, match=message):
        recops_tf.HostChannel(**{k: v for k, v in bad.items() if k == "capacity"}).pop(
            **{k: v for k, v in bad.items() if k == "timeout"})


def test_channel_ops_reject_other_resources():
    from recops_tf.ops._common import lib

    with pytest.raises(tf.errors.InvalidArgumentError, match="channel must be the handle of a "
                                                          "HostChannel"):
        lib().recops_host_channel_size(tf.Variable(1.0).handle)


# --- the swap ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_tables", [1, 2, 6])
@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
def test_swap_matches_composite(num_tables, index_dtype, mode):
    init = tables_of(num_tables)
    fused, composite = [tf.Variable(x) for x in init], [tf.Variable(x) for x in init]
    channel_in, channel_out = recops_tf.HostChannel(), recops_tf.HostChannel()
    queue_in, queue_out = tf.queue.FIFOQueue(4, [tf.float32]), tf.queue.FIFOQueue(4, [tf.float32])
    swap_in, swap_out = tf.constant([3, 0, 11], index_dtype), tf.constant([5, 3], index_dtype)
    item = np.random.default_rng(1).standard_normal((3, 3 * num_tables)).astype(np.float32)
    channel_in.push(item)
    queue_in.enqueue(item)
    run = swap if mode == "eager" else tf.function(swap)
    assert int(run(swap_in, swap_out, fused, channel_in, channel_out)) == SWAP_DONE
    ref.rma_swap_multi_tables(swap_in, swap_out, composite, queue_in, queue_out)
    for f, c in zip(fused, composite):
        assert_close(f, c, tf.float32)
    assert_close(channel_out.pop(), queue_out.dequeue(), tf.float32)
    assert int(channel_in.size()) == 0 and int(channel_out.size()) == 0


def test_all_reads_happen_before_any_write():
    # Row 1 is swapped out and refilled in the same call; through one channel the item that
    # comes back is the swapped-out one, so rows 0 and 1 end up with the old rows 1 and 2.
    table = tf.Variable([[0.0], [1.0], [2.0], [3.0]])
    channel = recops_tf.HostChannel()
    assert int(swap([0, 1], [1, 2], [table], channel, channel)) == SWAP_DONE
    np.testing.assert_array_equal(table.numpy().ravel(), [1.0, 2.0, 2.0, 3.0])


def test_layout_is_tables_side_by_side_per_row():
    a, b = tf.Variable([[1.0, 2.0], [3.0, 4.0]]), tf.Variable([[5.0, 6.0], [7.0, 8.0]])
    channel_in, channel_out = recops_tf.HostChannel(), recops_tf.HostChannel()
    channel_in.push(np.zeros((0, 4), np.float32))
    assert int(swap([], [1, 0], [a, b], channel_in, channel_out)) == SWAP_DONE
    assert channel_out.pop().numpy().tolist() == [[3.0, 4.0, 7.0, 8.0], [1.0, 2.0, 5.0, 6.0]]


def test_a_row_named_twice_gets_its_last_piece():
    table = tf.Variable(np.zeros((3, 1), np.float32))
    channel = recops_tf.HostChannel()
    channel.push([[1.0], [2.0], [3.0]])
    swap([2, 2, 0], [], [table], channel, recops_tf.HostChannel())
    np.testing.assert_array_equal(table.numpy().ravel(), [3.0, 0.0, 2.0])


@pytest.mark.parametrize("swap_in,swap_out,message", [
    ([0, 12], [1], r"swap_in_index\[1\] = 12 is out of range \[0, 12\)"),
    ([0], [-1], r"swap_out_index\[0\] = -1 is out of range"),
    ([[0]], [1], "swap_in_index must be a vector"),
])
def test_bad_indices_raise_and_nothing_moves(swap_in, swap_out, message):
    init = tables_of(2)
    tables = [tf.Variable(x) for x in init]
    channel_in, channel_out = recops_tf.HostChannel(), recops_tf.HostChannel()
    channel_in.push(np.ones((len(swap_in), 6), np.float32))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        swap(swap_in, swap_out, tables, channel_in, channel_out)
    for t, x in zip(tables, init):
        np.testing.assert_array_equal(t.numpy(), x)
    assert int(channel_out.size()) == 0 and int(channel_in.size()) == 1


def test_tables_must_share_one_float32_shape():
    channel = recops_tf.HostChannel()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"tables\[1\] must be a matrix of tables\[0\]'s shape"):
        swap([], [], [tf.Variable(np.ones((4, 2), np.float32)),
                      tf.Variable(np.ones((4, 3), np.float32))], channel, channel)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tables\[0\] must be float32"):
        swap([], [], [tf.Variable(np.ones((4, 2)))], channel, channel)


def test_one_to_six_tables():
    channel = recops_tf.HostChannel()
    with pytest.raises(ValueError, match="1 to 6 variables, got 7"):
        swap([], [], [tf.Variable([[1.0]]) for _ in range(7)], channel, channel)
    with pytest.raises(ValueError, match="got 0"):
        swap([], [], [], channel, channel)
    from recops_tf.ops._common import lib

    handles = [tf.Variable([[1.0]]).handle for _ in range(7)]
    with pytest.raises(tf.errors.InvalidArgumentError, match="1 to 6 tables, got 7"):
        lib().recops_rma_swap_multi_tables(handles, [0], [0], channel.handle, channel.handle)


def test_a_swap_in_item_of_the_wrong_shape_is_an_error_and_stays():
    table = tf.Variable(np.zeros((4, 2), np.float32))
    channel_in, channel_out = recops_tf.HostChannel(), recops_tf.HostChannel()
    channel_in.push(np.ones((1, 3), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"next item is float \[1,3\], "
                                                             r"expected float \[1,2\]"):
        swap([0], [], [table], channel_in, channel_out)
    assert int(channel_in.size()) == 1
    np.testing.assert_array_equal(table.numpy(), 0)


def test_timeouts_and_closed_channels_are_statuses_and_write_nothing():
    table = tf.Variable(np.zeros((4, 2), np.float32))
    full, empty = recops_tf.HostChannel(capacity=1), recops_tf.HostChannel()
    full.push(np.ones((1, 2), np.float32))
    empty_in = recops_tf.HostChannel()
    assert int(swap([0], [1], [table], empty_in, full, timeout=0.05)) == SWAP_OUT_FULL
    assert int(full.size()) == 1  # nothing pushed
    assert int(swap([0], [1], [table], empty_in, empty, timeout=0.05)) == SWAP_IN_EMPTY
    assert int(empty.size()) == 1  # the swap-out item went out before the wait
    np.testing.assert_array_equal(table.numpy(), 0)
    empty_in.close()
    assert int(swap([0], [1], [table], empty_in, empty, timeout=5)) == SWAP_CLOSED


def test_concurrent_host_producer_and_consumer():
    table = tf.Variable(np.zeros((8, 2), np.float32))
    to_device, to_host = recops_tf.HostChannel(capacity=1), recops_tf.HostChannel(capacity=1)
    steps = 10
    received = []

    def host():
        for step in range(steps):
            to_device.push(np.full((2, 2), step, np.float32), timeout=30)
            received.append(to_host.pop(timeout=30).numpy())

    thread = threading.Thread(target=host)
    thread.start()
    step_fn = tf.function(lambda: swap([0, 1], [0], [table], to_device, to_host, timeout=30))
    statuses = [int(step_fn()) for _ in range(steps)]
    thread.join(timeout=30)
    assert not thread.is_alive() and statuses == [SWAP_DONE] * steps
    # Each step swapped row 0 out (the previous step's piece), then filled rows 0 and 1.
    np.testing.assert_array_equal([r[0, 0] for r in received], [0] + list(range(steps - 1)))
    np.testing.assert_array_equal(table.numpy()[:2], steps - 1)


def test_two_tier_table():
    """A small hot table (a variable with its optimizer slot) caches rows of a large cold store
    on the host; each step the op evicts rows the batch does not need and loads those it does,
    and training touches only hot rows. The cold store plus the hot rows must equal one big
    table trained with the same updates."""
    rng = np.random.default_rng(0)
    num_keys, hot_rows, dim, steps = 40, 6, 3, 12
    cold = rng.standard_normal((num_keys, 2 * dim)).astype(np.float32)  # [embedding | slot]
    full = cold.copy()  # the single-table oracle
    hot = [tf.Variable(np.zeros((hot_rows, dim), np.float32)) for _ in range(2)]
    to_device, to_host = recops_tf.HostChannel(capacity=1), recops_tf.HostChannel(capacity=1)
    # Plan every step: which keys come in to which slots, which keys leave.
    batches = [rng.choice(num_keys, 3, replace=False) for _ in range(steps)]
    slot_key, plans = [-1] * hot_rows, []
    for keys in batches:
        needed = [k for k in keys if k not in slot_key]
        slots_in = [s for s in range(hot_rows) if slot_key[s] not in keys][:len(needed)]
        slots_out = [s for s in slots_in if slot_key[s] >= 0]
        keys_out = [slot_key[s] for s in slots_out]
        for s, k in zip(slots_in, needed):
            slot_key[s] = k
        plans.append(dict(keys_in=np.array(needed, np.int64), keys_out=keys_out,
                          slots_in=np.array(slots_in, np.int64),
                          slots_out=np.array(slots_out, np.int64),
                          rows=[slot_key.index(k) for k in keys]))

    def host():  # the host side of the channels
        for plan in plans:
            to_device.push(cold[plan["keys_in"]], timeout=30)
            cold[plan["keys_out"]] = to_host.pop(timeout=30).numpy()

    thread = threading.Thread(target=host)
    thread.start()
    swap_step = tf.function(lambda i, o: swap(i, o, hot, to_device, to_host, timeout=30))
    for keys, plan in zip(batches, plans):
        assert int(swap_step(plan["slots_in"], plan["slots_out"])) == SWAP_DONE
        # A training step on the batch's hot rows: embedding += 1, slot += key.
        hot[0].scatter_add(tf.IndexedSlices(tf.ones([len(keys), dim]), plan["rows"]))
        hot[1].scatter_add(tf.IndexedSlices(
            tf.constant(np.repeat(keys[:, None], dim, 1), tf.float32), plan["rows"]))
        full[keys, :dim] += 1
        full[keys, dim:] += keys[:, None]
    thread.join(timeout=30)
    assert not thread.is_alive()
    for s, k in enumerate(slot_key):  # write the hot rows back
        if k >= 0:
            cold[k] = np.concatenate([hot[0].numpy()[s], hot[1].numpy()[s]])
    np.testing.assert_allclose(cold, full, rtol=1e-6)
    assert any(len(p["keys_out"]) for p in plans)  # rows really went back and forth
