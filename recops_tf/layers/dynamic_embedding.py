"""DynamicEmbedding: a Keras embedding layer over a growing table."""
import keras
import tensorflow as tf

from recops_tf.ops.embedding_by_address import (DynamicEmbeddingTable, anchored_lookup,
                                                anchored_lookup_covering, bind_gradient_anchor)


@keras.saving.register_keras_serializable(package="recops_tf")
class DynamicEmbedding(keras.layers.Layer):
    """Embeddings of arbitrary int64 keys from a table that grows during training.

    Keys (dense of any shape, or a RaggedTensor) go in, ``keys.shape + [dim]`` embeddings come
    out. In training (``fit``, or ``training=True``) an unseen key gets a new row, initialised
    from (seed, key) only; in inference (``predict``, ``evaluate``, ``training`` unset) an
    unseen key, like the padding key, reads as zeros and nothing is allocated. There is no
    vocabulary to size in advance: the table grows block by block.

    Keys must be integers (any integer dtype; cast to int64): float keys are refused, not
    truncated (declare the input ``keras.Input(..., dtype="int64")``).

    Train it with ``recops_tf.optimizers.LazyAdam`` (needs ``num_slots >= 2``, the default) or
    ``recops_tf.optimizers.SparseSGD``: the gradient reaches the layer's scalar
    ``gradient_anchor`` weight as a ``tf.IndexedSlices`` keyed by row address, and those
    optimizers update the touched rows (and their co-located m, v) in place. Stock Keras
    optimizers cannot update the table: they fail, with a message naming these two (Adagrad's
    is a shape error of its sparse update).

    The table is saved by ``tf.train.Checkpoint`` and exported in SavedModels (keys, rows
    and optimizer slots); after a restore, training continues and the table keeps growing.
    There is no XLA kernel: the layer sets ``supports_jit = False``, so Keras'
    ``jit_compile="auto"`` never picks XLA (and ``jit_compile=True`` falls back with a
    warning). ``count_params()`` (the ``model.summary()`` column) is rows in use × ``dim``,
    and grows with the table; the scalar anchor is the only Keras weight.

    Args:
      dim: embedding width.
      initializer: as ``DynamicEmbeddingTable`` (name or Keras initializer).
      padding_key: key that always embeds to zeros (None: none).
      num_slots: optimizer slots per row (2 for LazyAdam, 0 is enough for SparseSGD).
      block_rows: rows allocated at a time.
      seed: initializer seed.
    """

    def __init__(self, dim, initializer="uniform", padding_key=None, num_slots=2,
                 block_rows=65536, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.dim = int(dim)
        self.initializer = (initializer if isinstance(initializer, str)
                            else keras.initializers.get(initializer))
        self.padding_key = padding_key
        self.num_slots = int(num_slots)
        self.block_rows = int(block_rows)
        self.seed = int(seed)
        self.table = DynamicEmbeddingTable(
            self.dim, initializer=self.initializer, num_slots=self.num_slots,
            block_rows=self.block_rows, padding_key=padding_key, seed=self.seed,
            name=f"{self.name}_table")
        self.supports_jit = False  # what Keras' model_supports_jit reads, layer by layer
        self.gradient_anchor = self.add_weight(shape=(), initializer="zeros", trainable=True,
                                               name="gradient_anchor")
        bind_gradient_anchor(self.gradient_anchor, self.table)

    def call(self, keys, training=None):
        training = bool(training)
        if isinstance(keys, tf.RaggedTensor):
            return keys.with_flat_values(self.call(keys.flat_values, training=training))
        keys = tf.convert_to_tensor(keys)
        if not keys.dtype.is_integer:
            raise TypeError(f"{type(self).__name__} keys must be integers, got "
                            f"{keys.dtype.name} (a cast would merge keys: 1.0 and 1.7 would "
                            f"share a row); declare the input with dtype='int64'")
        if keys.dtype != tf.int64:
            keys = tf.cast(keys, tf.int64)
        return self._embed(keys, training)

    def _embed(self, keys, training):
        """The rows of int64 `keys` (a dense tensor of any shape): what a subclass that finds
        rows elsewhere (ShardedEmbedding) overrides, after call's key handling."""
        addresses = self.table.lookup_addresses(keys, training=training)
        return anchored_lookup(self.table, addresses, self.gradient_anchor)

    def covering_lookup(self, keys, positions, training=None):
        """``(rows, rows[positions])`` for int64 `keys` ``[N]`` and `positions` ``[M]``
        (0-based into `keys`) from one lookup whose gradient is one IndexedSlices of the ``N``
        rows (``anchored_lookup_covering``): what a loss over every row of `keys` that also
        reads some of them elsewhere (a full softmax over the catalogue and the batch's items
        as inputs) uses instead of two calls, whose gradients the tape would concatenate."""
        keys = tf.convert_to_tensor(keys)
        if not keys.dtype.is_integer or keys.shape.rank != 1:
            raise TypeError(f"covering_lookup takes rank-1 integer keys, got {keys.dtype.name} "
                            f"of rank {keys.shape.rank}")
        addresses = self.table.lookup_addresses(tf.cast(keys, tf.int64), training=bool(training))
        return anchored_lookup_covering(self.table, addresses, self.gradient_anchor, positions)

    def save_own_variables(self, store):
        # .keras files: the anchor as Keras stores it, plus the table's keys and full rows.
        super().save_own_variables(store)
        keys, rows = self.table.export()
        store["table_keys"] = keys.numpy()
        store["table_rows"] = rows.numpy()

    def load_own_variables(self, store):
        self.gradient_anchor.assign(store["0"])
        self.table.assign(store["table_keys"][...], store["table_rows"][...])

    def count_params(self):
        """The table's parameters: rows in use × ``dim`` (grows as keys arrive; the slots
        and the scalar gradient anchor are not counted)."""
        with tf.init_scope():
            return int(self.table.size()) * self.dim

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.dim,)

    def get_config(self):
        config = super().get_config()
        initializer = self.initializer
        if not isinstance(initializer, str):
            initializer = keras.initializers.serialize(initializer)
        config.update(dim=self.dim, initializer=initializer, padding_key=self.padding_key,
                      num_slots=self.num_slots, block_rows=self.block_rows, seed=self.seed)
        return config
