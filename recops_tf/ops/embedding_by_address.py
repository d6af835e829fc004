"""A growing embedding table and the Rec SDK's by-address lookup and update (stem
embedding_by_address)."""
import numbers

import tensorflow as tf

from recops_tf.ops._common import index_tensor, lib

# Initializer names and their default (a, b): constant; uniform bounds; normal mean, stddev.
_DEFAULT_PARAMS = {"zeros": (0.0, 0.0), "constant": (0.0, 0.0), "uniform": (-0.05, 0.05),
                   "normal": (0.0, 0.05), "truncated_normal": (0.0, 0.05)}
_INITIALIZERS = tuple(_DEFAULT_PARAMS)


def _initializer_attrs(initializer):
    """(name, a, b) of the kernel's row initializer, from a name, a Keras initializer or its
    config; a and b are the constant, the uniform bounds or the normal mean and stddev."""
    import keras

    if isinstance(initializer, str):
        name = {"random_uniform": "uniform", "random_normal": "normal"}.get(initializer,
                                                                           initializer)
        if name not in _INITIALIZERS:
            raise ValueError(f"initializer must be one of {_INITIALIZERS} or a Keras "
                             f"Zeros/Constant/RandomUniform/RandomNormal/TruncatedNormal, got "
                             f"{initializer!r}")
        return (name,) + _DEFAULT_PARAMS[name]
    inits = keras.initializers
    if isinstance(initializer, inits.Zeros):
        return "zeros", 0.0, 0.0
    if isinstance(initializer, inits.Constant):
        return "constant", float(initializer.value), 0.0
    if isinstance(initializer, inits.RandomUniform):
        return "uniform", float(initializer.minval), float(initializer.maxval)
    if isinstance(initializer, inits.TruncatedNormal):
        return "truncated_normal", float(initializer.mean), float(initializer.stddev)
    if isinstance(initializer, inits.RandomNormal):
        return "normal", float(initializer.mean), float(initializer.stddev)
    raise TypeError(f"initializer {initializer!r} is not supported: use a name in "
                    f"{_INITIALIZERS} or a Keras Zeros/Constant/RandomUniform/RandomNormal/"
                    f"TruncatedNormal")


class DynamicEmbeddingTable(tf.saved_model.experimental.TrackableResource):
    """A growing embedding table: int64 keys map to float32 rows allocated on first sight.

    Rows hold ``dim * (1 + num_slots)`` floats, ``[embedding | slot 0 | slot 1 ...]``: the
    Rec SDK's dynamic-expansion table with the optimizer state co-located (LazyAdam uses two
    slots, m and v; SGD none). Rows are allocated ``block_rows`` at a time and never move.

    ``lookup_addresses(keys, training=True)`` maps keys to int64 *addresses*, the Rec SDK's
    by-address ABI. An address is a handle that every kernel validates against the table
    (tag, alignment, row range) before touching memory, never a pointer: a forged, stale or
    another table's address raises ``InvalidArgumentError``. Address 0 means "no row": the
    padding key, and unknown keys outside training, map to 0, which looks up as zeros and is
    skipped by updates.

    A new row's embedding is a function of ``(seed, key, column)`` only: it does not depend
    on the order keys arrive in, the batch, or the thread count. Optimizer slots start at 0.

    The table is a ``tf.train.Checkpoint``-able resource (keys and full rows are saved; a
    restore retags the table, so addresses from before the restore are rejected, and growth
    continues) and is exported with a SavedModel. Lookups and inserts are thread-safe; a
    new key seen by several threads at once gets one row.

    Args:
      dim: embedding width.
      initializer: ``"uniform"`` (default, [-0.05, 0.05)), ``"normal"``,
        ``"truncated_normal"`` (stddev 0.05), ``"zeros"``, or a Keras ``Zeros``,
        ``Constant``, ``RandomUniform``, ``RandomNormal`` or ``TruncatedNormal`` instance.
      num_slots: optimizer slots per row (2 for LazyAdam, 0 for SGD).
      block_rows: rows allocated at a time.
      padding_key: a key that always maps to address 0 (None: no padding key).
      seed: seed of the initializer.
      name: name of the resource.
    """

    def __init__(self, dim, initializer="uniform", num_slots=0, block_rows=65536,
                 padding_key=None, seed=0, name="dynamic_embedding_table"):
        if int(dim) < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if int(num_slots) < 0 or int(block_rows) < 1:
            raise ValueError(f"num_slots must be >= 0 and block_rows >= 1, got {num_slots} "
                             f"and {block_rows}")
        if padding_key is not None and not isinstance(padding_key, numbers.Integral):
            raise TypeError(f"padding_key must be an int or None, got {padding_key!r}")
        self.dim = int(dim)
        self.num_slots = int(num_slots)
        self.block_rows = int(block_rows)
        self.padding_key = None if padding_key is None else int(padding_key)
        self.seed = int(seed)
        self.initializer = initializer
        self._init_attrs = _initializer_attrs(initializer)
        self._name = name
        super().__init__()
        with tf.init_scope():  # create the table now, outside any function being traced
            self.resource_handle  # noqa: B018

    @property
    def width(self):
        """Floats per row: ``dim * (1 + num_slots)``."""
        return self.dim * (1 + self.num_slots)

    def _create_resource(self):
        kind, a, b = self._init_attrs
        return lib().recops_dynamic_embedding_table(
            dim=self.dim, num_slots=self.num_slots, block_rows=self.block_rows,
            initializer=kind, init_a=a, init_b=b, seed=self.seed,
            has_padding_key=self.padding_key is not None,
            padding_key=self.padding_key or 0, name=self._name)

    def _initialize(self):
        pass

    def lookup_addresses(self, keys, training=True, name=None):
        """The int64 address of each key's row (same shape as ``keys``; a RaggedTensor in,
        a RaggedTensor out).

        In training an unknown key gets a new row; otherwise (and for the padding key) the
        address is 0. ``training`` may be a Python or a tensor bool."""
        with tf.name_scope(name or "lookup_addresses"):
            if isinstance(keys, tf.RaggedTensor):
                return keys.with_flat_values(self.lookup_addresses(keys.flat_values, training))
            keys = tf.cast(index_tensor(keys, "keys"), tf.int64)
            training = tf.convert_to_tensor(training, tf.bool, name="training")
            return lib().recops_dynamic_embedding_lookup_addresses(self.resource_handle, keys,
                                                                    training)

    def size(self):
        """Number of keys (rows in use), an int64 scalar tensor."""
        return lib().recops_dynamic_embedding_table_size(self.resource_handle)[0]

    def capacity(self):
        """Rows allocated (a multiple of ``block_rows``), an int64 scalar tensor."""
        return lib().recops_dynamic_embedding_table_size(self.resource_handle)[1]

    def export(self):
        """``(keys [S] int64, rows [S, width] float32)``: every key and its full row
        (embedding then slots), in the order the rows were allocated."""
        return lib().recops_dynamic_embedding_table_export(self.resource_handle)

    def assign(self, keys, rows):
        """Replaces the contents with ``keys[i] -> rows[i]`` (full rows). Keys must be unique
        and not the padding key. Addresses handed out before are invalid afterwards."""
        keys = tf.convert_to_tensor(keys, tf.int64, name="keys")
        rows = tf.convert_to_tensor(rows, tf.float32, name="rows")
        return lib().recops_dynamic_embedding_table_import(self.resource_handle, keys, rows)

    def _serialize_to_tensors(self):
        keys, rows = self.export()
        return {"keys": keys, "rows": rows}

    def _restore_from_tensors(self, restored_tensors):
        return self.assign(restored_tensors["keys"], restored_tensors["rows"])


def _address_vector(addresses):
    addresses = tf.convert_to_tensor(addresses, dtype_hint=tf.int64, name="addresses")
    if addresses.dtype != tf.int64:
        raise TypeError(f"addresses must be int64, got {addresses.dtype.name}")
    return addresses


def _check_table(table):
    if not isinstance(table, DynamicEmbeddingTable):
        raise TypeError(f"table must be a recops_tf.DynamicEmbeddingTable, got "
                        f"{type(table).__name__}")


def _lookup(table, addresses, embedding_dim):
    """Rows at addresses of any shape (the op takes a vector)."""
    flat = tf.reshape(addresses, [-1])
    rows = lib().recops_embedding_lookup_by_address(table.resource_handle, flat,
                                                    embedding_dim=embedding_dim)
    return tf.reshape(rows, tf.concat([tf.shape(addresses), [embedding_dim]], 0))


def embedding_lookup_by_address(table, addresses, embedding_dim=None, name=None):
    """Rows of a growing table by address: ``y[..., :] = row(addresses[...])[:embedding_dim]``.

    The Rec SDK's ``EmbeddingLookupByAddress``. Address 0 yields zeros. Every other address is
    checked against the table before any row is read.

    Args:
      table: a ``DynamicEmbeddingTable``.
      addresses: int64 addresses of any shape (from ``table.lookup_addresses``), or a
        RaggedTensor of them.
      embedding_dim: columns to read from the start of each row, at most ``table.width``
        (default ``table.dim``: the embedding; ``3 * dim`` reads ``[embedding | m | v]``).
      name: optional op name.

    Returns:
      float32 ``addresses.shape + [embedding_dim]`` (ragged where ``addresses`` is).

    Gradient: w.r.t. the table, a ``tf.IndexedSlices`` of the upstream rows keyed by
    address (what ``tape.gradient(loss, table.resource_handle)`` returns, and what
    ``recops_tf.optimizers`` apply by address); none for ``addresses``.

    Raises:
      InvalidArgumentError: an address that is negative, another table's or from before a
        restore, not aligned to a row, or beyond the table's rows (the message names its
        position and value); ``embedding_dim`` wider than the rows.

    Example:

    >>> table = DynamicEmbeddingTable(dim=2, initializer="zeros")
    >>> addresses = table.lookup_addresses([7, 8, 7])
    >>> embedding_lookup_by_address(table, tf.concat([addresses, [0]], 0)).shape
    TensorShape([4, 2])
    """
    _check_table(table)
    with tf.name_scope(name or "embedding_lookup_by_address"):
        if isinstance(addresses, tf.RaggedTensor):
            return addresses.with_flat_values(
                embedding_lookup_by_address(table, addresses.flat_values, embedding_dim))
        addresses = _address_vector(addresses)
        return _lookup(table, addresses, int(embedding_dim or table.dim))


def embedding_update_by_address(table, addresses, values, update_type="add", name=None):
    """Updates rows of a growing table by address (the Rec SDK's ``EmbeddingUpdateByAddress``).

    For every ``addresses[i] != 0``, the first ``D`` columns of its row get ``values[i]``
    added (``update_type="add"``: the values of duplicate addresses are summed in order,
    then added) or assigned
    (``"assign"``: the last duplicate wins, deterministically). Address 0 is skipped. All
    addresses are validated before any row is written, so a bad one changes nothing.

    Args:
      table: a ``DynamicEmbeddingTable``.
      addresses: ``[N]`` int64 addresses.
      values: ``[N, D]`` float32 with ``D <= table.width`` (slot columns follow the
        embedding: ``D = 3 * dim`` writes ``[embedding | m | v]``).
      update_type: ``"add"`` or ``"assign"`` (the seed's 0 and 1 are accepted too).
      name: optional op name.

    Returns:
      ``values`` (the op's output is a dependency handle: run it or use the result).

    Gradient: none (a state update).

    Raises:
      InvalidArgumentError: a bad address (see ``embedding_lookup_by_address``), ``values``
        not ``[N, D]`` with ``D <= table.width``, an unknown ``update_type``.

    Example:

    >>> table = DynamicEmbeddingTable(dim=2, initializer="zeros")
    >>> a = table.lookup_addresses([3])
    >>> _ = embedding_update_by_address(table, a, [[1., 2.]])
    >>> embedding_lookup_by_address(table, a).numpy().tolist()
    [[1.0, 2.0]]
    """
    _check_table(table)
    kinds = {"add": 0, "assign": 1, 0: 0, 1: 1}
    if update_type not in kinds:
        raise ValueError(f"update_type must be 'add' or 'assign', got {update_type!r}")
    with tf.name_scope(name or "embedding_update_by_address"):
        addresses = _address_vector(addresses)
        values = tf.convert_to_tensor(values, tf.float32, name="values")
        return lib().recops_embedding_update_by_address(
            table.resource_handle, addresses, values, update_type=kinds[update_type])


def embedding_lookup(params, ids, training=True, name=None):
    """Drop-in for ``tf.gather(params, ids)`` on embedding tables.

    - ``params`` a ``tf.Variable`` (or Keras variable, or tensor) ``[V, D]``: rows
      ``params[ids]``, every id checked in ``[0, V)`` (TensorFlow's CPU gather raises for
      any other); the gradient w.r.t. ``params`` is a
      ``tf.IndexedSlices`` (what ``recops_tf.optimizers`` update sparsely).
    - ``params`` a ``DynamicEmbeddingTable``: ``ids`` are keys; ``table.lookup_addresses(ids,
      training)`` then ``embedding_lookup_by_address`` (unknown keys grow the table in
      training and read as zeros otherwise).

    Args:
      params: ``[V, D]`` variable or tensor, or a ``DynamicEmbeddingTable``.
      ids: int32/int64 of any shape, or a RaggedTensor of them.
      training: for a table, whether unknown keys get rows.
      name: optional op name.

    Returns:
      ``ids.shape + [D]`` (ragged where ``ids`` is).

    Gradient: a ``tf.IndexedSlices`` w.r.t. ``params`` (the variable, or the table's
    resource handle keyed by address); none for ``ids``.

    Raises:
      InvalidArgumentError: an id outside ``[0, V)`` for a variable.

    Example:

    >>> embedding_lookup(tf.Variable([[1., 1.], [2., 2.]]), [[1], [0]]).numpy().tolist()
    [[[2.0, 2.0]], [[1.0, 1.0]]]
    """
    with tf.name_scope(name or "embedding_lookup"):
        if isinstance(params, DynamicEmbeddingTable):
            return embedding_lookup_by_address(params, params.lookup_addresses(ids, training))
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(embedding_lookup(params, ids.flat_values))
        ids = index_tensor(ids, "ids")
        if hasattr(params, "value") and not isinstance(params, tf.Variable):
            params = params.value  # a Keras variable: gather from its tf.Variable
        return tf.gather(params, ids)  # the CPU gather checks every id against [0, V)


@tf.RegisterGradient("Recops>EmbeddingLookupByAddress")
def _embedding_lookup_by_address_grad(op, grad):
    return [tf.IndexedSlices(grad, op.inputs[1]), None]


tf.no_gradient("Recops>DynamicEmbeddingTable")
tf.no_gradient("Recops>DynamicEmbeddingLookupAddresses")
tf.no_gradient("Recops>DynamicEmbeddingTableSize")
tf.no_gradient("Recops>DynamicEmbeddingTableExport")
tf.no_gradient("Recops>DynamicEmbeddingTableImport")
tf.no_gradient("Recops>EmbeddingUpdateByAddress")


# --- Training a table with Keras optimizers ---------------------------------------------------
# Keras optimizers update variables. A table is trained through a scalar "gradient anchor"
# variable bound to it: lookups made with `anchored_lookup` give the anchor a gradient that is an
# IndexedSlices of rows keyed by address, and recops_tf.optimizers apply it to the table.
_ANCHOR_ATTR = "_recops_dynamic_table"


def bind_gradient_anchor(anchor, table):
    """Marks the scalar variable `anchor` (Keras or tf) as standing for `table`."""
    setattr(anchor, _ANCHOR_ATTR, table)
    if hasattr(anchor, "value") and not isinstance(anchor, tf.Variable):
        setattr(anchor.value, _ANCHOR_ATTR, table)


def table_of_anchor(variable):
    """The DynamicEmbeddingTable a gradient-anchor variable stands for, or None."""
    return getattr(variable, _ANCHOR_ATTR, None)


def anchored_lookup(table, addresses, anchor):
    """``embedding_lookup_by_address(table, addresses)`` whose gradient reaches `anchor` as a
    ``tf.IndexedSlices`` of the upstream rows keyed by address (flattened)."""

    @tf.custom_gradient
    def lookup(anchor_value):
        rows = _lookup(table, addresses, table.dim)

        def grad(upstream):
            return tf.IndexedSlices(tf.reshape(upstream, [-1, table.dim]),
                                    tf.reshape(addresses, [-1]))

        return rows, grad

    return lookup(tf.convert_to_tensor(anchor))
