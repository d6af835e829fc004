"""Keras layer: DeBERTa-style disentangled self-attention on the fused op."""
import keras
import tensorflow as tf

from recops_tf.layers._sequences import check_input
from recops_tf.ops._common import positive_int
from recops_tf.ops.disentangle_attention import POS_ATT_TYPES, disentangle_attention


@keras.saving.register_keras_serializable(package="recops_tf")
class DisentangledSelfAttention(keras.layers.Layer):
    """Disentangled self-attention (content and relative position) with its own projections.

    The input ``[B, s, d_model]`` (dense, or a ``tf.RaggedTensor`` ``[B, (L), d_model]``,
    padded to its longest row with the padding keys masked) is projected to queries, keys and
    values (``num_heads`` heads of ``head_dim``). Learned relative-position embeddings
    ``[2 * max_seq_len, d_model]`` (offset ``r = i - j`` at row ``max_seq_len - 1 + r``) go
    through the same key and query projections (DeBERTa's sharing) and become ``pos_key`` /
    ``pos_query`` of ``recops_tf.disentangle_attention``, with ``relative_pos[i, j] = i - j``.
    The output merges the heads: ``[B, s, num_heads * head_dim]`` (ragged for ragged input).

    Args:
      num_heads, head_dim: attention heads and their size.
      max_seq_len: the longest sequence (the position table covers offsets up to it).
      pos_att_type: ``"c2p"``, ``"p2c"`` or ``"c2p|p2c"``.
      use_bias, kernel_initializer: of the projections.
      embeddings_initializer: of the relative-position embeddings.

    Call arguments: ``inputs``; optional ``attention_mask`` ``[B, s]`` (1 = attend, 0 =
    padding key). A dense input whose sequence length is unknown when traced (a padded batch,
    or what Keras' ``model.export()`` makes of a ragged ``keras.Input``) is refused without
    ``attention_mask``.

    The layer has no XLA kernel: it sets ``supports_jit = False``, so Keras never compiles a
    model using it with XLA.
    """

    def __init__(self, num_heads, head_dim, max_seq_len, pos_att_type="c2p|p2c", use_bias=True,
                 kernel_initializer="glorot_uniform", embeddings_initializer="random_normal",
                 **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False  # no XLA kernel: keeps Keras from compiling with XLA
        self.num_heads = positive_int(num_heads, "num_heads", "DisentangledSelfAttention")
        self.head_dim = positive_int(head_dim, "head_dim", "DisentangledSelfAttention")
        self.max_seq_len = positive_int(max_seq_len, "max_seq_len",
                                        "DisentangledSelfAttention")
        if pos_att_type not in POS_ATT_TYPES:
            raise ValueError(f"pos_att_type must be one of {POS_ATT_TYPES}, got "
                             f"{pos_att_type!r}")
        self.pos_att_type = pos_att_type
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, input_shape):
        d_model = input_shape[-1]
        if d_model is None:
            raise ValueError("DisentangledSelfAttention needs a known last input dimension")
        width = self.num_heads * self.head_dim
        self.qkv_kernel = self.add_weight(name="qkv_kernel", shape=(d_model, 3 * width),
                                          initializer=self.kernel_initializer)
        self.qkv_bias = (self.add_weight(name="qkv_bias", shape=(3 * width,),
                                         initializer="zeros") if self.use_bias else None)
        self.rel_embeddings = self.add_weight(name="rel_embeddings",
                                              shape=(2 * self.max_seq_len, d_model),
                                              initializer=self.embeddings_initializer)

    def _project(self, x, part):
        width = self.num_heads * self.head_dim
        kernel = tf.cast(self.qkv_kernel[:, part * width:(part + 1) * width], x.dtype)
        y = tf.tensordot(x, kernel, [[x.shape.rank - 1], [0]])
        if self.qkv_bias is not None:
            y += tf.cast(self.qkv_bias[part * width:(part + 1) * width], x.dtype)
        return y

    def _attend(self, x, mask):
        s = tf.shape(x)[1]
        heads = lambda t: tf.transpose(  # noqa: E731
            tf.reshape(t, [tf.shape(t)[0], -1, self.num_heads, self.head_dim]), [0, 2, 1, 3])
        q, k, v = (heads(self._project(x, i)) for i in range(3))
        # Offsets -(s - 1) .. s: rows max_seq_len - s .. max_seq_len + s of the table.
        rel = tf.cast(self.rel_embeddings, x.dtype)[self.max_seq_len - s:self.max_seq_len + s]
        pos = lambda part: tf.reshape(  # noqa: E731
            self._project(rel, part), [2 * s, self.num_heads, self.head_dim])
        positions = tf.range(s, dtype=tf.int64)
        relative_pos = positions[:, None] - positions[None, :]
        additive = None
        if mask is not None:
            keep = tf.cast(mask, x.dtype)[:, None, None, :]
            additive = (1.0 - keep) * tf.constant(-1e4, x.dtype) + tf.zeros([1, 1, s, 1], x.dtype)
        out, _, _ = disentangle_attention(q, k, v, pos(1), pos(0), relative_pos, additive,
                                          pos_att_type=self.pos_att_type)
        return tf.reshape(tf.transpose(out, [0, 2, 1, 3]),
                          [tf.shape(x)[0], s, self.num_heads * self.head_dim])

    def call(self, inputs, attention_mask=None):
        inputs = check_input(self, inputs, padding_known=attention_mask is not None,
                             remedy="or the padded tensor with its attention_mask")
        if isinstance(inputs, tf.RaggedTensor):
            lengths = inputs.row_lengths()
            dense = inputs.to_tensor()
            mask = tf.sequence_mask(lengths, tf.shape(dense)[1])
            if attention_mask is not None:
                mask &= tf.cast(attention_mask, tf.bool)
            return tf.RaggedTensor.from_tensor(self._attend(dense, mask), lengths=lengths)
        return self._attend(inputs, attention_mask)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.num_heads * self.head_dim,)

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_heads": self.num_heads, "head_dim": self.head_dim,
            "max_seq_len": self.max_seq_len, "pos_att_type": self.pos_att_type,
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
        })
        return config
