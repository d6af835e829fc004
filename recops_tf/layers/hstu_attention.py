"""Keras layer: HSTU attention over a ragged sequence batch, with its own q/k/v projection."""
import keras
import tensorflow as tf

from recops_tf.layers._sequences import sequences
from recops_tf.layers.relative_attention_bias import owned_relative_bias
from recops_tf.ops._attention import gr_mask_args
from recops_tf.ops._common import positive_int
from recops_tf.ops.hstu_dense import hstu_attention


@keras.saving.register_keras_serializable(package="recops_tf")
class HSTUAttention(keras.layers.Layer):
    """HSTU attention with its q/k/v projection, on ``[B, (L), d_model]`` sequences.

    The input (a ``tf.RaggedTensor`` ``[B, (L), d_model]``, or a dense ``[B, S, d_model]``) is
    projected by one matrix to queries (``num_heads`` heads of ``head_dim``), keys
    (``num_kv_heads`` heads of ``head_dim``) and values (``num_kv_heads`` heads of
    ``value_dim``), then ``recops_tf.hstu_attention`` runs on the jagged rows directly (no
    padding). The output has the input's kind: ``[B, (L), num_heads * value_dim]``.

    The layer projects by itself (rather than taking q, k, v) so that it is a complete,
    trainable unit in a functional model; the gating, normalisation and output projection of a
    full HSTU block are ``recops_tf.layers.HSTUBlock``'s job.

    Args:
      num_heads: query heads.
      head_dim: q/k head size.
      max_seq_len: the longest sequence the layer accepts (the SiLU scale default is
        ``1 / max_seq_len``).
      value_dim: v head size (default ``head_dim``).
      num_kv_heads: key/value heads (GQA; default ``num_heads``; must divide it).
      alpha, silu_scale, mask_type, target_group_size, window_size: as in
        ``recops_tf.hstu_attention``.
      use_bias: add a bias to the projection.
      kernel_initializer, bias_initializer: of the projection.
      relative_bias: an optional ``RelativeAttentionBias`` (same ``max_seq_len``) owned by
        this layer and applied inside the attention kernel, tile by tile: nothing of size
        ``S²`` is built. Its weights are this layer's.
      gr_mask: None (the Rec SDK's mask rules) or generative-recommenders' rules: a
        ``recops_tf.compat.gr.GRMask`` or a dict of ``max_attn_len``, ``contextual_seq_len``,
        ``min_full_attn_seq_len`` (then no ``window_size`` / ``target_group_size``, and
        ``num_target`` is GR's ``num_targets``).

    Call arguments: ``inputs``; optional ``num_context`` / ``num_target`` ``[B]`` counts;
    ``timestamps`` (int, in the inputs' layout: ragged ``[B, (L)]`` or dense ``[B, S]``) for
    a ``relative_bias`` with a time part; optional ``attn_bias``: ``[B, max_seq_len,
    max_seq_len]`` shared by all heads or per head ``[B, num_heads, max_seq_len,
    max_seq_len]`` (not with ``relative_bias``). A shared bias is broadcast over the heads
    here, which stores ``B·N·S²`` values: prefer ``relative_bias`` for HSTU's bias;
    ``lengths`` ``[B]``: the row lengths of a padded dense input (the padding is skipped and
    comes out as zeros). A dense input whose sequence length is unknown when traced (a padded
    batch, or what Keras' ``model.export()`` makes of a ragged ``keras.Input``) is refused
    without ``lengths``: export models on ragged inputs with ``recops_tf.saving.export``.

    The layer has no XLA kernel: it sets ``supports_jit = False``, so Keras never compiles a
    model using it with XLA (``jit_compile="auto"`` and ``True`` both run without).
    """

    def __init__(self, num_heads, head_dim, max_seq_len, value_dim=None, num_kv_heads=None,
                 alpha=1.0, silu_scale=0.0, mask_type="causal", target_group_size=0,
                 window_size=None, use_bias=True, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", relative_bias=None, gr_mask=None, **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False  # no XLA kernel: keeps Keras from compiling with XLA
        self.num_heads = positive_int(num_heads, "num_heads", "HSTUAttention")
        self.head_dim = positive_int(head_dim, "head_dim", "HSTUAttention")
        self.max_seq_len = positive_int(max_seq_len, "max_seq_len", "HSTUAttention")
        self.value_dim = positive_int(value_dim or head_dim, "value_dim", "HSTUAttention")
        self.num_kv_heads = positive_int(num_kv_heads or num_heads, "num_kv_heads",
                                         "HSTUAttention")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads "
                             f"({self.num_heads})")
        self.alpha = float(alpha)
        self.silu_scale = float(silu_scale)
        self.mask_type = mask_type
        if mask_type == "custom":
            raise ValueError("HSTUAttention supports mask_type 'causal' or 'none'")
        self.target_group_size = int(target_group_size)
        self.window_size = None if window_size is None else tuple(int(w) for w in window_size)
        self.gr_mask = gr_mask_args("HSTUAttention", gr_mask, mask_type, None,
                                    self.target_group_size, self.window_size)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.relative_bias = owned_relative_bias(relative_bias, self.max_seq_len)

    @property
    def _widths(self):
        return (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                self.num_kv_heads * self.value_dim)

    def build(self, input_shape):
        d_model = input_shape[-1]
        if d_model is None:
            raise ValueError("HSTUAttention needs a known last input dimension")
        self.kernel = self.add_weight(name="kernel", shape=(d_model, sum(self._widths)),
                                      initializer=self.kernel_initializer)
        self.bias = (self.add_weight(name="bias", shape=(sum(self._widths),),
                                     initializer=self.bias_initializer)
                     if self.use_bias else None)
        if self.relative_bias is not None and not self.relative_bias.built:
            self.relative_bias.build(None)

    def _attend(self, rows, **kwargs):
        proj = tf.matmul(rows, tf.cast(self.kernel, rows.dtype))
        if self.bias is not None:
            proj += tf.cast(self.bias, rows.dtype)
        q, k, v = tf.split(proj, list(self._widths), axis=-1)
        q = tf.reshape(q, [-1, self.num_heads, self.head_dim])
        k = tf.reshape(k, [-1, self.num_kv_heads, self.head_dim])
        v = tf.reshape(v, [-1, self.num_kv_heads, self.value_dim])
        out = hstu_attention(q, k, v, max_seq_len=self.max_seq_len, alpha=self.alpha,
                             silu_scale=self.silu_scale, mask_type=self.mask_type,
                             target_group_size=self.target_group_size,
                             window_size=self.window_size, gr_mask=self.gr_mask, **kwargs)
        return tf.reshape(out, [-1, self.num_heads * self.value_dim])

    def call(self, inputs, num_context=None, num_target=None, attn_bias=None, timestamps=None,
             lengths=None):
        seqs = sequences(self, inputs, lengths)
        counts = {"num_context": num_context, "num_target": num_target}
        if self.relative_bias is not None:
            if attn_bias is not None:
                raise ValueError("HSTUAttention: attn_bias cannot be combined with "
                                 "relative_bias")
            # The attention runs on the jagged rows: one timestamp per row.
            counts.update(self.relative_bias.attention_kwargs(seqs.rows_of(timestamps),
                                                              self.compute_dtype))
        elif timestamps is not None:
            raise ValueError("HSTUAttention: timestamps need a relative_bias layer")
        if attn_bias is not None:
            attn_bias = tf.convert_to_tensor(attn_bias)
            if attn_bias.shape.rank == 3:
                shape = tf.shape(attn_bias)
                attn_bias = tf.broadcast_to(attn_bias[:, None],
                                            [shape[0], self.num_heads, shape[1], shape[2]])
            counts["attn_bias"] = attn_bias
        return seqs.output(self._attend(seqs.rows, seq_offsets=seqs.offsets, **counts))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.num_heads * self.value_dim,)

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_heads": self.num_heads, "head_dim": self.head_dim,
            "max_seq_len": self.max_seq_len, "value_dim": self.value_dim,
            "num_kv_heads": self.num_kv_heads, "alpha": self.alpha,
            "silu_scale": self.silu_scale, "mask_type": self.mask_type,
            "target_group_size": self.target_group_size, "window_size": self.window_size,
            "use_bias": self.use_bias,
            "gr_mask": None if self.gr_mask is None else self.gr_mask._asdict(),
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "relative_bias": (None if self.relative_bias is None else
                              keras.saving.serialize_keras_object(self.relative_bias)),
        })
        return config
