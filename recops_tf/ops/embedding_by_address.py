"""A growing embedding table and the Rec SDK's by-address lookup and update (stem
embedding_by_address)."""
import numbers

import tensorflow as tf
from tensorflow.python import pywrap_tfe
from tensorflow.python.framework import tensor_conversion_registry

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

    Training: a lookup under a ``tf.GradientTape`` is watched automatically, as a variable
    read is, and the gradient is ``tape.gradient(loss, table.resource_handle)``: a
    ``tf.IndexedSlices`` of the upstream rows keyed by address. Step it with
    ``recops_tf.lazy_adam_update(table, None, None, grad, None, lr)`` /
    ``recops_tf.sgd_update(table, grad, None, lr)``, or hand ``(grad, table)`` to
    ``recops_tf.optimizers.LazyAdam`` / ``SparseSGD`` (bias correction, clipping and the
    step count as for a variable). The table itself is not a tensor: ``tape.gradient(loss,
    table)`` raises. A ``tf.function`` traced before, without a tape, and then called under
    one needs ``tape.watch(table.resource_handle)`` (tapes are told of a function's
    variables, not of its tables). Inside Keras models use ``recops_tf.layers.DynamicEmbedding``.

    The table is a ``tf.train.Checkpoint``-able resource (keys and full rows are saved; a
    restore retags the table, so addresses from before the restore are rejected, and growth
    continues) and is exported with a SavedModel. Lookups and inserts are thread-safe; a
    new key seen by several threads at once gets one row.

    Example:

    >>> table = DynamicEmbeddingTable(dim=2, num_slots=2)
    >>> with tf.GradientTape() as tape:
    ...     loss = tf.reduce_sum(embedding_lookup(table, [7, 8, 7]))
    >>> grad = tape.gradient(loss, table.resource_handle)
    >>> grad.values.shape, int(table.size())
    (TensorShape([3, 2]), 2)
    """

    def __init__(self, dim, initializer="uniform", num_slots=0, block_rows=65536,
                 padding_key=None, seed=0, name="dynamic_embedding_table"):
        """Creates an empty table; its resource is made at once, eagerly (outside any
        ``tf.function`` being traced), on the CPU.

        Args:
          dim: embedding width (``>= 1``).
          initializer: how a new row's embedding is drawn: ``"uniform"`` (default,
            [-0.05, 0.05)), ``"normal"``, ``"truncated_normal"`` (stddev 0.05), ``"zeros"``,
            or a Keras ``Zeros``, ``Constant``, ``RandomUniform``, ``RandomNormal`` or
            ``TruncatedNormal`` instance.
          num_slots: optimizer slots per row (2 for LazyAdam, 0 for SGD).
          block_rows: rows allocated at a time (``>= 1``).
          padding_key: an int key that always maps to address 0 (None: no padding key).
          seed: seed of the initializer.
          name: name of the resource.

        Raises:
          ValueError: ``dim < 1``, ``num_slots < 0``, ``block_rows < 1``, or an unknown
            initializer name.
          TypeError: a non-int ``padding_key``, or an unsupported Keras initializer.
          InvalidArgumentError: rows too wide, or a block over 16 GiB.
        """
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

    def __repr__(self):
        # Also what TensorFlow prints when a table is passed where a tensor is expected
        # (``tape.gradient(loss, table)``, ``tape.watch(table)``), hence the hint.
        return (f"<recops_tf.DynamicEmbeddingTable {self._name!r} dim={self.dim} "
                f"num_slots={self.num_slots} (not a tensor: differentiate w.r.t. "
                f"table.resource_handle)>")

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


class _TableAccess:
    """What a ``tf.GradientTape`` records when a table is looked up, as a variable read
    records the variable: the tape watches ``handle``, the table's resource handle, so
    ``tape.gradient(loss, table.resource_handle)`` needs no ``tape.watch``. It shows in
    ``tape.watched_variables()``; there, like a variable, it is a valid gradient source
    (``_should_act_as_resource_variable``: the tape differentiates w.r.t. its ``handle``) and
    ``recops_tf.optimizers`` accept it for its table. Nothing saves or captures it."""

    __slots__ = ("table",)
    _should_act_as_resource_variable = True
    trainable = True

    def __init__(self, table):
        self.table = table

    @property
    def handle(self):
        return self.table.resource_handle

    def __repr__(self):
        return f"<lookups of {self.table!r}>"


def _watch_on_tapes(table):
    """Marks `table` as accessed on every active tape that watches accessed variables (what
    ``ResourceVariable.read_value`` does); call it before the op that uses the handle."""
    if pywrap_tfe.TFE_Py_TapeSetIsEmpty():
        return
    access = getattr(table, "_tape_access", None)
    if access is None:
        access = table._tape_access = _TableAccess(table)
    pywrap_tfe.TFE_Py_TapeVariableAccessed(access)


def _lookup(table, addresses, embedding_dim, watch=True):
    """Rows at addresses of any shape (the op takes a vector); `watch`: mark the table as
    accessed on the active tapes (off where another gradient path is used)."""
    if watch:
        _watch_on_tapes(table)
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
    address: ``tape.gradient(loss, table.resource_handle)`` (the lookup is watched
    automatically, as a variable read is; not with ``watch_accessed_variables=False``),
    which ``lazy_adam_update`` / ``sgd_update`` and ``recops_tf.optimizers`` (given
    ``(grad, table)``) apply by address; none for ``addresses``. ``tape.gradient(loss,
    table)`` raises: the table is not a tensor.

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

    Gradient: a ``tf.IndexedSlices`` w.r.t. ``params`` (the variable; for a table,
    ``table.resource_handle``, keyed by address, watched automatically: see
    ``embedding_lookup_by_address``); none for ``ids``.

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
    # The identity makes the indices an op of the backward graph: a forward tensor returned
    # as is would not be captured when the lookup runs in a tf.function under an outer tape.
    return [tf.IndexedSlices(grad, tf.identity(op.inputs[1])), None]


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


_STOCK_OPTIMIZER = (
    "The gradient of a recops_tf DynamicEmbedding layer or DynamicEmbeddingTable is an "
    "IndexedSlices of rows keyed by address: stock Keras optimizers cannot update the table; "
    "train it with recops_tf.optimizers.LazyAdam or recops_tf.optimizers.SparseSGD.")


def _refuse_sparse_update(*args, **kwargs):
    raise TypeError(f"A sparse update of a table's scalar gradient anchor (a stock optimizer "
                    f"stepping it). {_STOCK_OPTIMIZER}")


def bind_gradient_anchor(anchor, table):
    """Marks the scalar variable `anchor` (Keras or tf) as standing for `table`.

    Stock Keras optimizers cannot step a table: the dense ones densify its gradient (the
    IndexedSlices conversion below names recops_tf.optimizers), the sparse ones scatter into
    the anchor, whose scatter methods are replaced here by one that says the same;
    recops_tf.optimizers never scatter into an anchor."""
    setattr(anchor, _ANCHOR_ATTR, table)
    variable = anchor
    if hasattr(anchor, "value") and not isinstance(anchor, tf.Variable):
        variable = anchor.value  # a Keras variable: its tf.Variable
        setattr(variable, _ANCHOR_ATTR, table)
    for method in ("scatter_add", "scatter_sub", "scatter_update"):
        setattr(variable, method, _refuse_sparse_update)


def table_of_anchor(variable):
    """The DynamicEmbeddingTable a gradient-anchor variable stands for, or None."""
    return getattr(variable, _ANCHOR_ATTR, None)


def optimizer_variable(target):
    """`target` itself, or for a DynamicEmbeddingTable (or a tape's record of its lookups,
    from ``tape.watched_variables()``) the scalar variable that stands for it in a Keras
    optimizer: a gradient anchor made on first use, eagerly, and not tracked (its value is
    never used, only its identity)."""
    table = target.table if isinstance(target, _TableAccess) else target
    if not isinstance(table, DynamicEmbeddingTable):
        return target
    anchor = getattr(table, "_gradient_anchor", None)
    if anchor is None:
        with tf.init_scope():
            anchor = tf.Variable(0.0, trainable=True, name=f"{table._name}_gradient_anchor")
        bind_gradient_anchor(anchor, table)
        table._gradient_anchor = anchor
    return anchor


def anchored_lookup(table, addresses, anchor):
    """``embedding_lookup_by_address(table, addresses)`` whose gradient reaches `anchor` as a
    ``tf.IndexedSlices`` of the upstream rows keyed by address (flattened)."""

    @tf.custom_gradient
    def lookup(anchor_value):
        rows = _lookup(table, addresses, table.dim, watch=False)

        def grad(upstream):
            return tf.IndexedSlices(tf.reshape(upstream, [-1, table.dim]),
                                    tf.reshape(addresses, [-1]))

        return rows, grad

    return lookup(tf.convert_to_tensor(anchor))


# Gradient ops whose row-gradient output nothing but the consumer reads: a tensor they made
# that may be written in place (InplaceAdd writes through aliases, so this is checked by op).
_FRESH_GRADIENT_OPS = frozenset({"Recops>FusedLinearCrossEntropyGrad",
                                "Recops>FusedLinearCrossEntropyApplyGrad"})


def _fresh(t):
    """Whether graph tensor `t` is the output of an op in `_FRESH_GRADIENT_OPS`, or a cast
    of one to a type of another width (a new buffer; --precision bf16's gradient of the
    loss's items). An eager tensor, or any other producer, is not: it may be shared."""
    try:
        op = t.op
        if op.type == "Cast" and op.inputs[0].dtype.size != t.dtype.size:
            op = op.inputs[0].op
        return op.type in _FRESH_GRADIENT_OPS
    except AttributeError:
        return False


def anchored_lookup_covering(table, addresses, anchor, positions):
    """``(rows, rows[positions])``: the rows of `addresses` ``[N]`` and, from the same
    lookup, the ``[M]`` rows at `positions` (0-based into `addresses`), whose gradient reaches
    `anchor` as one ``tf.IndexedSlices`` of ``N`` rows: the second output's upstream rows are
    added into the first's in place (``tensor_scatter_nd_add``).

    Two `anchored_lookup` calls of one table give the anchor two IndexedSlices, which the tape
    concatenates: a copy of all ``N + M`` gradient rows. When one set of rows covers the
    other (a softmax over the whole catalogue and the batch's own items), this lookup leaves
    the ``[N, d]`` gradient the only one (at 1,000,000 x 50 float32 rows, 200 MB less at a
    step's peak). The optimizer's result is the same: it sums a row's gradients either way.
    """
    positions = tf.convert_to_tensor(positions, tf.int64)

    @tf.custom_gradient
    def lookup(anchor_value):
        rows = _lookup(table, addresses, table.dim, watch=False)
        part = tf.gather(rows, positions)

        def grad(d_rows, d_part):
            d_rows = (tf.zeros_like(rows) if d_rows is None
                      else tf.convert_to_tensor(d_rows, rows.dtype))
            if d_part is not None:
                d_part = tf.convert_to_tensor(d_part, rows.dtype)
                if _fresh(d_rows):
                    # InplaceAdd writes into its input's buffer (duplicates accumulate);
                    # TensorScatterAdd would copy all N rows first (TF's CPU kernel does
                    # not forward its input).
                    d_rows = tf.raw_ops.InplaceAdd(x=d_rows, i=tf.cast(positions, tf.int32),
                                                   v=d_part)
                else:
                    d_rows = tf.tensor_scatter_nd_add(d_rows, positions[:, None], d_part)
            return tf.IndexedSlices(d_rows, tf.reshape(addresses, [-1]))

        return (rows, part), grad

    return lookup(tf.convert_to_tensor(anchor))


# A table's gradient is an IndexedSlices keyed by address, with no dense_shape: no dense
# update can apply it. TensorFlow's error when one is densified (a stock Keras optimizer
# does) says only "without dense_shape"; this conversion runs first and says what to use.
def _sparse_only_gradient_to_tensor(value, dtype=None, name=None, as_ref=False):
    del dtype, as_ref
    if value.dense_shape is not None:
        return NotImplemented  # TensorFlow's own conversion
    argument = f" for argument `{name}`" if name else ""
    raise ValueError(f"Tensor conversion requested for an IndexedSlices without "
                     f"dense_shape{argument}. {_STOCK_OPTIMIZER}")


tensor_conversion_registry.register_tensor_conversion_function(
    tf.IndexedSlices, _sparse_only_gradient_to_tensor, priority=99)
