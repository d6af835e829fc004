"""A sequential (next-item) generative recommender from the library's layers: growing item
embeddings, a stack of HSTU blocks with a learned relative (time + position) bias, on ragged
user histories; trained with a softmax over the whole catalogue."""
import keras
import numpy as np
import tensorflow as tf

from recops_tf.layers.dynamic_embedding import DynamicEmbedding
from recops_tf.layers.hstu_block import HSTUBlock
from recops_tf.layers.relative_attention_bias import RelativeAttentionBias


@keras.saving.register_keras_serializable(package="recops_tf")
class GenerativeRecommender(keras.Model):
    """Next-item model: ``[B, (L)]`` item ids and timestamps in, ``[B, (L), d_model]`` user
    states out; ``scores(states)`` rates every catalogue item (ids ``1..num_items``).

    ``use_fused=True``: ``DynamicEmbedding`` items (train with
    ``recops_tf.optimizers.LazyAdam``) and the fused HSTU blocks. ``use_fused=False``: the same
    model from stock TF (``keras.layers.Embedding``, the blocks' reference paths), for parity
    and speed comparison.
    """

    def __init__(self, num_items, d_model=64, num_blocks=2, num_heads=2, head_dim=32,
                 max_seq_len=64, dropout_rate=0.1, use_fused=True, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.num_items, self.d_model, self.num_blocks = int(num_items), int(d_model), num_blocks
        self.num_heads, self.head_dim, self.max_seq_len = num_heads, head_dim, int(max_seq_len)
        self.dropout_rate, self.use_fused, self.seed = float(dropout_rate), bool(use_fused), seed
        init = keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)
        if self.use_fused:
            self.item_embedding = DynamicEmbedding(self.d_model, initializer="uniform",
                                                   seed=seed, name="items")
        else:
            self.item_embedding = keras.layers.Embedding(self.num_items + 1, self.d_model,
                                                         embeddings_initializer=init,
                                                         name="items")
        self.blocks = [
            HSTUBlock(num_heads, head_dim, self.max_seq_len, dropout_rate=self.dropout_rate,
                      relative_bias=RelativeAttentionBias(self.max_seq_len, name=f"bias_{i}"),
                      use_fused=self.use_fused, seed=seed + i, name=f"hstu_{i}")
            for i in range(num_blocks)]
        self.final_norm = keras.layers.LayerNormalization(name="final_norm")
        self.catalogue = tf.constant(np.arange(1, self.num_items + 1), tf.int64)

    def _embed(self, ids, training):
        if self.use_fused:
            return self.item_embedding(ids, training=training)
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(self.item_embedding(ids.flat_values))
        return self.item_embedding(ids)

    def call(self, inputs, training=None):
        items, timestamps = inputs["items"], inputs["timestamps"]
        x = self._embed(items, training) * (self.d_model ** 0.5)
        for block in self.blocks:
            x = block(x, timestamps=timestamps, training=training)
        return x.with_flat_values(self.final_norm(x.flat_values))

    def item_matrix(self, training=None):
        """``[num_items, d_model]`` embeddings of items 1..num_items."""
        return self._embed(self.catalogue, training)

    def scores(self, states, training=None):
        """``[N, num_items]`` logits of every catalogue item for ``[N, d_model]`` states
        (column j is item j + 1)."""
        return tf.matmul(states, self.item_matrix(training), transpose_b=True)

    def get_build_config(self):
        return {"built": bool(self.built)}

    def build_from_config(self, config):
        # Creates every weight (for .keras loading) with one call on a one-item history.
        if config.get("built"):
            one = tf.RaggedTensor.from_row_lengths(tf.constant([1], tf.int64),
                                                   tf.constant([1], tf.int64))
            self({"items": one, "timestamps": one}, training=False)
            self.item_matrix(training=False)

    def get_config(self):
        config = super().get_config()
        config.update(num_items=self.num_items, d_model=self.d_model,
                      num_blocks=self.num_blocks, num_heads=self.num_heads,
                      head_dim=self.head_dim, max_seq_len=self.max_seq_len,
                      dropout_rate=self.dropout_rate, use_fused=self.use_fused, seed=self.seed)
        return config


def next_item_loss(model, items, timestamps, training=True):
    """Mean softmax cross-entropy of predicting item t+1 from the state at t, over every
    position of every (ragged) history."""
    states = model({"items": items, "timestamps": timestamps}, training=training)
    inputs = states[:, :-1].flat_values
    targets = items[:, 1:].flat_values - 1
    logits = model.scores(inputs, training=training)
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits))


def last_states(model, items, timestamps):
    """``[B, d_model]`` state after each history's last item (inference)."""
    states = model({"items": items, "timestamps": timestamps}, training=False)
    return tf.gather(states.flat_values, states.row_limits() - 1)
