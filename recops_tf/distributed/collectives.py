"""The Rec SDK's lccl collectives (AllToAll, AllUss, GatherAll) on TensorFlow's collective
runtime: worker processes joined by gRPC, `CollectiveAllToAllV2` / `CollectiveGatherV2` /
`CollectiveReduceV2` ops, usable inside `tf.function`.

TensorFlow's all-to-all moves equal chunks. The variable-size all-to-all (all-to-all-v) of
the seed is built on it: the ranks first gather everyone's send counts (an [R, R] int32
matrix, the seed's ``send_count_matrix`` in rows), every destination chunk is padded to the
largest count ``P`` of the matrix, one equal all-to-all moves ``R * P`` rows per rank, and
the receiver drops the padding. A rank therefore sends ``R * P`` rows where ``sum(counts)``
are needed: nothing extra when the split is even, up to ``R`` times more when one chunk
dominates. The count exchange is ``R * R * 4`` bytes per rank.
"""
import json
import os

import tensorflow as tf

_DEFAULT = []


class Group:
    """The ranks a collective runs over, as this process sees them.

    Made by ``connect`` (no strategy) or ``Group.from_strategy``; the first group made in a
    process becomes the default that every function of ``recops_tf.distributed`` uses when
    given no ``group``.

    Every collective call takes a fresh instance key from a counter (TensorFlow caches a
    collective's shape per key, and all-to-all-v shapes change from call to call), so all
    ranks must issue the same collectives in the same order: run the same program.

    Args:
      rank: this process's rank in ``[0, world_size)``.
      world_size: number of ranks (one CPU device per worker process).
      device: the device the collective ops run on (None: the default placement).
      group_key: TensorFlow collective group key (keep it clear of a strategy's own keys,
        which start at 1).
      timeout: seconds a collective may wait for the other ranks; a rank that died or never
        joined is then an error, never a hang.
        None: no limit (a dead rank still fails the next collective at once; a hung one is
        then for the caller to detect, e.g. a watchdog). TensorFlow holds a sleeping thread
        per collective for its timeout, so hundreds of collectives a second with a 60 s timeout
        keep thousands of threads alive: a training loop should use None and a watchdog
        (``recops_tf.recommender.multiworker`` does).
    """

    def __init__(self, rank, world_size, device=None, group_key=7100, timeout=60.0):
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"rank must be in [0, world_size = {world_size}), got {rank}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")
        self.rank, self.world_size = int(rank), int(world_size)
        self.device, self.group_key = device, int(group_key)
        self.timeout = None if timeout is None else float(timeout)
        with tf.init_scope():
            self._instance = tf.Variable(0, dtype=tf.int32, trainable=False,
                                         name="collective_instance_key")
        if not _DEFAULT:
            _DEFAULT.append(self)

    @classmethod
    def from_strategy(cls, strategy, **kwargs):
        """The group of a ``tf.distribute.MultiWorkerMirroredStrategy`` (one CPU per worker):
        build the strategy first (it connects the workers), then this."""
        resolver = strategy.cluster_resolver
        rank = resolver.task_id if resolver is not None and resolver.task_type else 0
        device = None
        if resolver is not None and resolver.task_type:
            device = f"/job:{resolver.task_type}/replica:0/task:{rank}/device:CPU:0"
        return cls(rank, strategy.num_replicas_in_sync, device=device, **kwargs)

    def _key(self):
        return self._instance.assign_add(1)

    def _attrs(self):
        return dict(group_size=self.world_size, group_key=self.group_key,
                    instance_key=self._key(), ordering_token=[],
                    timeout_seconds=self.timeout or 0.0)

    def _device(self):
        return tf.device(self.device) if self.device else _NullContext()

    def gather(self, x):
        """Concatenation along axis 0 of every rank's ``x`` (same shape on every rank), in rank
        order."""
        if self.world_size == 1:
            return tf.identity(x)
        with self._device():
            return tf.raw_ops.CollectiveGatherV2(input=x, communication_hint="auto",
                                                 **self._attrs())

    def all_reduce_sum(self, x):
        """Elementwise sum of every rank's ``x`` (same shape on every rank)."""
        if self.world_size == 1:
            return tf.identity(x)
        with self._device():
            return tf.raw_ops.CollectiveReduceV2(input=x, merge_op="Add", final_op="Id",
                                                 communication_hint="auto", **self._attrs())

    def all_to_all_equal(self, x):
        """Equal all-to-all: rows ``[d * n/R, (d+1) * n/R)`` of ``x`` go to rank d; the
        received chunks come back concatenated in source-rank order."""
        if self.world_size == 1:
            return tf.identity(x)
        # TensorFlow's op splits dimension 0, which must be the group size.
        rest = tf.shape(x)[1:]
        with self._device():
            out = tf.raw_ops.CollectiveAllToAllV2(
                input=tf.reshape(x, tf.concat([[self.world_size, -1], rest], 0)),
                communication_hint="auto", **self._attrs())
        return tf.reshape(out, tf.concat([[-1], rest], 0))


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def connect(workers=None, rank=None, group_key=7100, timeout=60.0):
    """Joins this process to a group of worker processes without a ``tf.distribute`` strategy
    and returns its ``Group`` (the process default).

    Every worker calls it once, at start-up, before any other TensorFlow work, with the same
    list. The workers may start in any order: the first collective waits for the others (up
    to ``timeout``).

    Args:
      workers: ``["host:port", ...]`` of every worker, in rank order; None reads
        ``TF_CONFIG`` (``cluster.worker`` and ``task.index``), as ``tf.distribute`` does.
      rank: this process's index in ``workers`` (None: from ``TF_CONFIG``).
      group_key, timeout: as ``Group``.
    """
    from tensorflow.core.protobuf import tensorflow_server_pb2
    from tensorflow.python.eager import context

    if workers is None or rank is None:
        config = json.loads(os.environ.get("TF_CONFIG", "{}"))
        workers = workers if workers is not None else config.get("cluster", {}).get("worker")
        rank = rank if rank is not None else config.get("task", {}).get("index")
        if not workers or rank is None:
            raise ValueError("pass workers and rank, or set TF_CONFIG with cluster.worker and "
                             "task.index")
    workers, rank = list(workers), int(rank)
    if not 0 <= rank < len(workers):
        raise ValueError(f"rank must be in [0, {len(workers)}), got {rank}")
    ctx = context.context()
    ctx.configure_collective_ops(collective_leader="/job:worker/replica:0/task:0",
                                 device_filters=(f"/job:worker/task:{rank}",))
    port = int(workers[rank].rsplit(":", 1)[1])
    ctx.enable_collective_ops(tensorflow_server_pb2.ServerDef(
        cluster=tf.train.ClusterSpec({"worker": workers}).as_cluster_def(), job_name="worker",
        task_index=rank, protocol="grpc", port=port,
        # The server reads the collective group leader from here: without it every
        # collective waits for a leader that never answers.
        default_session_config=ctx.config))
    group = Group(rank, len(workers), device=f"/job:worker/replica:0/task:{rank}/device:CPU:0",
                  group_key=group_key, timeout=timeout)
    _DEFAULT[:] = [group]
    return group


def default_group():
    """The process's default ``Group`` (a single-rank group when none was made)."""
    if not _DEFAULT:
        Group(0, 1)
    return _DEFAULT[0]


def _group(group):
    return default_group() if group is None else group


def _counts(send_counts, group, what="send_counts"):
    counts = tf.convert_to_tensor(send_counts)
    if not counts.dtype.is_integer:
        raise TypeError(f"{what} must be integers, got {counts.dtype.name}")
    counts = tf.cast(counts, tf.int32)
    tf.debugging.assert_equal(tf.shape(counts), [group.world_size],
                              message=f"{what} must have one count per rank")
    tf.debugging.assert_non_negative(counts, message=f"{what} must be >= 0")
    return counts


def _exchange(x, matrix, group):
    """All-to-all-v of the rows of ``x`` (grouped by destination) given the [R, R] row-count
    matrix (``matrix[s, d]``: rows rank s sends to rank d)."""
    me, ranks = group.rank, group.world_size
    counts, recv_counts = matrix[me], matrix[:, me]
    tf.debugging.assert_equal(tf.reduce_sum(counts), tf.shape(x)[0],
                              message="send must have sum(send_counts) rows")
    if ranks == 1:
        return tf.identity(x)
    # Pad every destination chunk to the largest count P (at least 1 row, so that the
    # collective's shape is never empty): row j of chunk d is x[start_d + j], or a zero row.
    # When every count is P already (an even split), the rows go as they are.
    chunk = tf.maximum(tf.reduce_max(matrix), 1)
    even = tf.reduce_all(tf.equal(matrix, chunk))
    j = tf.range(chunk)

    def pad():
        starts = tf.cumsum(counts, exclusive=True)
        source = tf.where(j[None, :] < counts[:, None], starts[:, None] + j[None, :],
                          tf.shape(x)[0])
        zero_row = tf.zeros(tf.concat([[1], tf.shape(x)[1:]], 0), x.dtype)
        return tf.gather(tf.concat([x, zero_row], 0), tf.reshape(source, [-1]))

    received = group.all_to_all_equal(tf.cond(even, lambda: tf.identity(x), pad))

    def unpad():  # chunk s (P rows) came from rank s
        keep = tf.reshape(j[None, :] < recv_counts[:, None], [-1])
        return tf.gather(received, tf.reshape(tf.where(keep), [-1]))

    return tf.cond(even, lambda: tf.identity(received), unpad)


def _all_to_all_matrix(x, matrix, group):
    """_exchange with its gradient: the reverse exchange (transposed matrix)."""
    if not x.dtype.is_floating:
        return _exchange(x, matrix, group)

    @tf.custom_gradient
    def exchange(x):
        def grad(dy):
            return _exchange(tf.convert_to_tensor(dy), tf.transpose(matrix), group)

        return _exchange(x, matrix, group), grad

    return exchange(x)


def count_matrix(send_counts, group=None):
    """The [R, R] int32 matrix of every rank's ``send_counts`` (row s: rank s's counts), by a
    gather across the ranks; the seed's ``send_count_matrix`` in rows rather than elements."""
    group = _group(group)
    return group.gather(_counts(send_counts, group)[None, :])


def all_to_all(send, send_counts, group=None, name=None):
    """Variable-size all-to-all (the seed's lccl ``AllToAll``, MPI's alltoallv).

    ``send`` holds the rows for rank 0, then those for rank 1, ...: ``send_counts[d]`` rows
    go to rank d. Every rank receives the rows sent to it concatenated in source-rank order.

    Args:
      send: ``[N, ...]`` tensor (any dtype TensorFlow's collectives take: float32, bfloat16,
        float16, float64, int32, int64), rows grouped by destination.
      send_counts: ``[R]`` integer rows per destination rank, summing to N.
      group: ``Group`` (None: the default).
      name: optional name scope.

    Returns:
      ``(received [sum_s counts_s[me], ...], recv_counts [R] int32)``: ``recv_counts[s]``
      rows came from rank s.

    Gradient: w.r.t. ``send``, the reverse all-to-all of the received rows' gradient.

    Raises:
      InvalidArgumentError: counts that are negative, not one per rank, or do not sum to N.
      DeadlineExceededError / UnavailableError: a rank that did not join within the group's
        timeout, or died (the collective runtime of the process is then unusable).
    """
    group = _group(group)
    with tf.name_scope(name or "all_to_all"):
        send = tf.convert_to_tensor(send, name="send")
        matrix = count_matrix(send_counts, group)
        return _all_to_all_matrix(send, matrix, group), matrix[:, group.rank]


def all_to_all_segment_sum(send, send_counts, restore, num_rows, group=None, name=None):
    """All-to-all, then the received rows summed by segment (the seed's lccl ``AllUss``): the
    backward of a deduplicated sparse lookup, summing every rank's gradients of my rows.

    ``out = zeros([num_rows, ...]); out[restore[r]] += received[r]`` for every received row,
    in received order (deterministic: the seed's ``LCCL_DETERMINISTIC=1``).

    Args:
      send, send_counts, group: as ``all_to_all``.
      restore: ``[N_recv]`` int32/int64 output row of each received row, in ``[0, num_rows)``.
      num_rows: rows of the output.
      name: optional name scope.

    Returns:
      ``[num_rows, ...]`` sums.

    Gradient: w.r.t. ``send``, the gathered output gradient sent back (reverse all-to-all).

    Raises:
      InvalidArgumentError: as ``all_to_all``; ``restore`` not of the received length or out
        of range.
    """
    with tf.name_scope(name or "all_to_all_segment_sum"):
        received, _ = all_to_all(send, send_counts, group)
        restore = tf.convert_to_tensor(restore, name="restore")
        tf.debugging.assert_equal(tf.shape(restore), tf.shape(received)[:1],
                                  message="restore must have one entry per received row")
        tf.debugging.assert_non_negative(restore, message="restore must be >= 0")
        tf.debugging.assert_less(restore, tf.cast(num_rows, restore.dtype),
                                 message="restore must be < num_rows")
        return tf.math.unsorted_segment_sum(received, restore, num_rows)


def gather_all_to_all(table, lookup, send_counts, group=None, name=None):
    """Rows of a local table gathered and sent (the seed's lccl ``GatherAll``):
    ``all_to_all(tf.gather(table, lookup), send_counts)``.

    Args:
      table: ``[V, D]`` tensor or variable.
      lookup: ``[N]`` int32/int64 rows of ``table``, grouped by destination.
      send_counts, group: as ``all_to_all``.
      name: optional name scope.

    Returns:
      ``(received [N_recv, D], recv_counts [R])``.

    Gradient: w.r.t. ``table``, the received rows' gradient sent back and summed into the
    looked-up rows (the seed pairs GatherAll with AllUss), as ``tf.IndexedSlices``.

    Raises:
      InvalidArgumentError: as ``all_to_all``; a ``lookup`` row out of ``[0, V)``.
    """
    with tf.name_scope(name or "gather_all_to_all"):
        lookup = tf.convert_to_tensor(lookup, name="lookup")
        return all_to_all(tf.gather(table, lookup), send_counts, group)


def _rows_of_matrix(send_count_matrix, dim, group):
    matrix = tf.convert_to_tensor(send_count_matrix)
    tf.debugging.assert_equal(tf.shape(matrix), [group.world_size, group.world_size],
                              message="send_count_matrix must be [rank_size, rank_size]")
    tf.debugging.assert_equal(tf.math.floormod(matrix, tf.cast(dim, matrix.dtype)),
                              tf.zeros_like(matrix),
                              message="send_count_matrix counts elements: multiples of dim")
    tf.debugging.assert_non_negative(matrix, message="send_count_matrix must be >= 0")
    return tf.cast(matrix // dim, tf.int32)


def lccl_all_to_all(send_data, send_count_matrix, dim, group=None, name=None):
    """The seed's ``LcclAllToAll`` signature: ``send_count_matrix [R, R]`` (identical on all
    ranks) counts **elements** (rows x dim) rank s sends to rank d; no count exchange is
    needed. Returns ``[N_out, dim]``.

    ``shape_vec``, ``peer_mem``, ``rank`` and ``rank_size`` of the seed are not needed: the
    output row count follows from the matrix and the ranks from the group.

    Raises:
      InvalidArgumentError: a matrix that is not [R, R], negative, not in multiples of dim,
        or whose row for this rank does not match the rows of ``send_data``.
    """
    group = _group(group)
    with tf.name_scope(name or "lccl_all_to_all"):
        rows = tf.reshape(tf.convert_to_tensor(send_data, name="send_data"), [-1, dim])
        return _all_to_all_matrix(rows, _rows_of_matrix(send_count_matrix, dim, group), group)


def lccl_all_uss(send_data, send_count_matrix, restore, num_rows, dim, group=None, name=None):
    """The seed's ``LcclAllUss`` with its element-count matrix: ``lccl_all_to_all`` then
    ``out[restore[r]] += received[r]`` into ``[num_rows, dim]`` zeros, deterministically."""
    with tf.name_scope(name or "lccl_all_uss"):
        received = lccl_all_to_all(send_data, send_count_matrix, dim, group)
        restore = tf.convert_to_tensor(restore, name="restore")
        tf.debugging.assert_equal(tf.shape(restore), tf.shape(received)[:1],
                                  message="restore must have one entry per received row")
        return tf.math.unsorted_segment_sum(received, restore, num_rows)


def lccl_gather_all(emb_table, lookup, send_count_matrix, dim, group=None, name=None):
    """The seed's ``LcclGatherAll``: ``lccl_all_to_all(tf.gather(emb_table, lookup), ...)``
    (its unchecked ``lookup`` is checked here by ``tf.gather``)."""
    with tf.name_scope(name or "lccl_gather_all"):
        return lccl_all_to_all(tf.gather(emb_table, lookup), send_count_matrix, dim, group)
