"""The Rec SDK's host swap of table rows (stem pcie_through): a bounded host channel and
``rma_swap_multi_tables``."""
import tensorflow as tf

from recops_tf.ops._common import index_tensor, lib
from recops_tf.ops._sparse_step import resource_handle

MAX_TABLES = 6

# Status of rma_swap_multi_tables.
SWAP_DONE, SWAP_OUT_FULL, SWAP_IN_EMPTY, SWAP_CLOSED = 0, 1, 2, 3


class HostChannel:
    """A bounded FIFO of tensors in host memory, between graph ops and Python threads.

    The channel ``rma_swap_multi_tables`` pushes evicted rows to and pops new rows from (the
    Rec SDK's shared-memory ring queue). Items are whole tensors of any dtype and shape; pushing
    and popping copy nothing. Every wait is bounded: a push into a full channel or a pop from an
    empty one raises ``tf.errors.DeadlineExceededError`` after ``timeout`` seconds, and ends
    early (``CancelledError``) when the step is cancelled, so a missing producer or consumer is
    an error, never a hang.

    A channel with a ``name`` is process-wide: every ``HostChannel(name=...)`` of the process
    (same capacity) is the same FIFO, as the seed's queues are named
    ``"{table}_d2h_{channel}"``. Without a name each object is its own channel, freed with its
    last handle.

    Usable eagerly (blocking ops release the GIL, so Python threads can produce and consume
    while a model step waits) and inside ``tf.function`` (the handle is captured).

    Args:
      capacity: maximum number of items (>= 1); the seed's queues hold 50.
      name: optional process-wide name.

    Raises:
      InvalidArgumentError: a named channel that exists with another capacity.

    Example:

    >>> channel = HostChannel(capacity=2)
    >>> channel.push([[1.0, 2.0]])
    >>> channel.push(tf.constant([7], tf.int64))
    >>> int(channel.size())
    2
    >>> channel.pop(tf.float32).numpy().tolist()
    [[1.0, 2.0]]
    """

    def __init__(self, capacity=50, name=None):
        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.name = name
        with tf.init_scope():  # one eager handle, captured by any tf.function
            self._handle = lib().recops_host_channel(capacity=self.capacity,
                                                     shared_name=name or "")

    @property
    def handle(self):
        return self._handle

    def push(self, value, timeout=10.0, name=None):
        """Appends ``value`` (anything ``tf.convert_to_tensor`` takes), waiting up to
        ``timeout`` seconds for room; ``DeadlineExceededError`` when the channel stays full,
        ``CancelledError`` when it is closed."""
        value = tf.convert_to_tensor(value, name="value")
        return lib().recops_host_channel_push(self._handle, value,
                                              timeout_seconds=_timeout(timeout), name=name)

    def pop(self, dtype=tf.float32, timeout=10.0, name=None):
        """Removes and returns the oldest item, waiting up to ``timeout`` seconds for one;
        ``DeadlineExceededError`` when the channel stays empty, ``OutOfRangeError`` when it is
        closed and empty, ``InvalidArgumentError`` (the item stays) when it is not ``dtype``."""
        return lib().recops_host_channel_pop(self._handle, dtype=tf.as_dtype(dtype),
                                             timeout_seconds=_timeout(timeout), name=name)

    def size(self, name=None):
        """Number of items waiting (int64 scalar)."""
        return lib().recops_host_channel_size(self._handle, name=name)

    def close(self, name=None):
        """Closes the channel: waiting and later pushes fail; pops drain what is left."""
        return lib().recops_host_channel_close(self._handle, name=name)


def _timeout(timeout):
    timeout = float(timeout)
    if not timeout >= 0 or timeout == float("inf"):
        raise ValueError(f"timeout must be finite and >= 0 seconds, got {timeout}")
    return timeout


def rma_swap_multi_tables(swap_in_index, swap_out_index, tables, channel_in, channel_out,
                          timeout=10.0, name=None):
    """Swaps rows of up to six tables with the host, in place (the Rec SDK's
    ``RmaSwapMultiTables``, DDR mode).

    With ``T = len(tables)`` tables of one shape ``[V, D]`` (an embedding and its optimizer
    slots) and ``E = T * D``:

    1. swap-out: pushes **one** item ``S [N_out, E]`` to ``channel_out`` with
       ``S[i, t*D:(t+1)*D] = tables[t][swap_out_index[i]]``;
    2. swap-in: pops **one** item ``H [N_in, E]`` from ``channel_in`` and writes
       ``tables[t][swap_in_index[i]] = H[i, t*D:(t+1)*D]``.

    Every read happens before any write, so a row may be swapped out and refilled in the same
    call; a row named twice in ``swap_in_index`` gets its last piece. An item is pushed and
    popped even when ``N_out`` or ``N_in`` is 0, so producer and consumer see one item per
    call. The tables are not locked while the op waits on a channel.

    Args:
      swap_in_index: ``[N_in]`` int32/int64 rows to fill, each in ``[0, V)``.
      swap_out_index: ``[N_out]`` int32/int64 rows to evict, each in ``[0, V)``.
      tables: 1 to 6 float32 ``[V, D]`` resource variables (tf or Keras) of one shape.
      channel_in: ``HostChannel`` the swap-in item is popped from.
      channel_out: ``HostChannel`` the swap-out item is pushed to (may be ``channel_in``).
      timeout: seconds each channel wait may take (finite).
      name: optional op name.

    Returns:
      int64 scalar status: ``SWAP_DONE`` (0); ``SWAP_OUT_FULL`` (1): ``channel_out`` stayed
      full, nothing pushed or written; ``SWAP_IN_EMPTY`` (2): ``channel_in`` stayed empty, the
      swap-out item was pushed, nothing written; ``SWAP_CLOSED`` (3): a channel was closed.
      (The seed returns one such word per AI core.)

    Gradient: none (it moves rows; it is not differentiable).

    Raises:
      InvalidArgumentError: an index outside ``[0, V)``, indices that are not vectors,
        tables that are not float32 matrices of one shape, more than six tables, a swap-in
        item that is not float32 ``[N_in, E]`` (it is left in the channel).

    Example:

    >>> table = tf.Variable([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    >>> channel = HostChannel(capacity=4)
    >>> channel.push([[9.0, 9.0]])  # the row the host sends in
    >>> int(rma_swap_multi_tables([1], [2], [table], channel, channel))
    0
    >>> table.numpy().tolist()  # row 1 filled from the host
    [[0.0, 0.0], [9.0, 9.0], [2.0, 2.0]]
    >>> channel.pop().numpy().tolist()  # row 2 went out
    [[2.0, 2.0]]
    """
    tables = list(tables)
    if not 1 <= len(tables) <= MAX_TABLES:
        raise ValueError(f"tables must hold 1 to {MAX_TABLES} variables, got {len(tables)}")
    for channel, what in ((channel_in, "channel_in"), (channel_out, "channel_out")):
        if not isinstance(channel, HostChannel):
            raise TypeError(f"{what} must be a HostChannel, got {type(channel).__name__}")
    with tf.name_scope(name or "rma_swap_multi_tables"):
        handles = [resource_handle(t, f"tables[{i}]") for i, t in enumerate(tables)]
        swap_in_index = tf.cast(index_tensor(swap_in_index, "swap_in_index"), tf.int64)
        swap_out_index = tf.cast(index_tensor(swap_out_index, "swap_out_index"), tf.int64)
        return lib().recops_rma_swap_multi_tables(handles, swap_in_index, swap_out_index,
                                                  channel_in.handle, channel_out.handle,
                                                  timeout_seconds=_timeout(timeout))


for _op in ("RmaSwapMultiTables", "HostChannel", "HostChannelPush", "HostChannelPop",
            "HostChannelSize", "HostChannelClose"):
    tf.no_gradient(f"Recops>{_op}")
