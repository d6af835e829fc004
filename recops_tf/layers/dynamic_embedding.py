"""DynamicEmbedding: a Keras embedding layer over a growing table."""
import keras
import tensorflow as tf

from recops_tf.ops.embedding_by_address import (DynamicEmbeddingTable, anchored_lookup,
                                                bind_gradient_anchor)


@keras.saving.register_keras_serializable(package="recops_tf")
class DynamicEmbedding(keras.layers.Layer):
    """Embeddings of arbitrary int64 keys from a table that grows during training.

    Keys (dense of any shape, or a RaggedTensor) go in, ``keys.shape + [dim]`` embeddings come
    out. In training (``fit``, or ``training=True``) an unseen key gets a new row, initialised
    from (seed, key) only; in inference (``predict``, ``evaluate``, ``training`` unset) an
    unseen key, like the padding key, reads as zeros and nothing is allocated. There is no
    vocabulary to size in advance: the table grows block by block.

    Train it with ``recops_tf.optimizers.LazyAdam`` (needs ``num_slots >= 2``, the default) or
    ``recops_tf.optimizers.SparseSGD``: the gradient reaches the layer's scalar
    ``gradient_anchor`` weight as a ``tf.IndexedSlices`` keyed by row address, and those
    optimizers update the touched rows (and their co-located m, v) in place. Stock Keras
    optimizers cannot update the table.

    The table is saved by ``tf.train.Checkpoint`` and exported in SavedModels (keys, rows
    and optimizer slots); after a restore, training continues and the table keeps growing.
    Models using it need ``jit_compile=False``.

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
            self.dim, initializer=self.initializer, num_slots=self.num_slots, block_rows=self.block_rows, padding_key=padding_key,
            seed=self.seed, name=f"{self.name}_table")
        self.gradient_anchor = self.add_weight(shape=(), initializer="zeros", trainable=True,
                                               name="gradient_anchor")
        bind_gradient_anchor(self.gradient_anchor, self.table)

    def call(self, keys, training=None):
        training = bool(training)
        if isinstance(keys, tf.RaggedTensor):
            return keys.with_flat_values(self.call(keys.flat_values, training=training))
        keys = tf.convert_to_tensor(keys)
        if keys.dtype != tf.int64:
            keys = tf.cast(keys, tf.int64)
        return self._embed(keys, training)

    def _embed(self, keys, training):
        """The rows of int64 `keys` (a dense tensor of any shape): what a subclass that finds
        rows elsewhere (ShardedEmbedding) overrides, after call's key handling."""
        addresses = self.table.lookup_addresses(keys, training=training)
        return anchored_lookup(self.table, addresses, self.gradient_anchor)

    def save_own_variables(self, store):
        # .keras files: the anchor as Keras stores it, plus the table's keys and full rows.
        super().save_own_variables(store)
        keys, rows = self.table.export()
        store["table_keys"] = keys.numpy()
        store["table_rows"] = rows.numpy()

    def load_own_variables(self, store):
        self.gradient_anchor.assign(store["0"])
        self.table.assign(store["table_keys"][...], store["table_rows"][...])

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
