"""Keras layer: Fuxi-α attention (semantic + temporal + positional channels) on ragged input."""
import keras
import tensorflow as tf

from recops_tf.layers._sequences import Sequences
from recops_tf.layers.relative_attention_bias import RelativeAttentionBias
from recops_tf.ops._common import positive_int
from recops_tf.ops.hstu_dense_fuxi import hstu_attention_fuxi
from recops_tf.ops.relative_attn_bias import toeplitz_position_bias


@keras.saving.register_keras_serializable(package="recops_tf")
class FuxiAttention(keras.layers.Layer):
    """Fuxi-α attention with its own q/k/v projection and learned relative biases.

    Takes ``[B, (L), d_model]`` rows (ragged, or dense ``[B, S, d_model]``) and their
    ``[B, (L)]`` timestamps. The rows are projected to q, k, v (``num_heads`` heads of
    ``head_dim``). A learned time-bucket bias and a learned Toeplitz position bias (the two
    halves of a ``RelativeAttentionBias`` the layer owns) become the temporal and positional
    channels of ``recops_tf.hstu_attention_fuxi``. The output is ``[B, (L), 3 * num_heads *
    head_dim]``: semantic | temporal | positional blocks, head-major.

    Args:
      num_heads, head_dim: attention heads and their size.
      max_seq_len: the longest sequence (the bias planes' extent; the SiLU scale default is
        ``1 / max_seq_len``).
      num_buckets, bucket_divisor: of the time buckets (as ``relative_attn_bias_time``).
      silu_scale, mask_type: as in ``recops_tf.hstu_attention_fuxi`` ("causal" or "none").
      use_bias, kernel_initializer, bias_initializer: of the projection.

    Call arguments: ``inputs``, ``timestamps`` (``[B, (L)]`` ragged or ``[B, S]`` dense);
    ``lengths`` ``[B]``: the row lengths of a padded dense input (the padding is skipped and
    comes out as zeros). A dense input whose sequence length is unknown when traced is refused
    without ``lengths`` (see ``HSTUAttention``).

    The layer has no XLA kernel: it sets ``supports_jit = False``, so Keras never compiles a
    model using it with XLA.
    """

    def __init__(self, num_heads, head_dim, max_seq_len, num_buckets=129,
                 bucket_divisor=0.301, silu_scale=0.0, mask_type="causal", use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False  # no XLA kernel: keeps Keras from compiling with XLA
        self.num_heads = positive_int(num_heads, "num_heads", "FuxiAttention")
        self.head_dim = positive_int(head_dim, "head_dim", "FuxiAttention")
        self.max_seq_len = positive_int(max_seq_len, "max_seq_len", "FuxiAttention")
        self.num_buckets = int(num_buckets)
        self.bucket_divisor = float(bucket_divisor)
        self.silu_scale = float(silu_scale)
        if mask_type not in ("causal", "none"):
            raise ValueError("FuxiAttention supports mask_type 'causal' or 'none'")
        self.mask_type = mask_type
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.time_bias = RelativeAttentionBias(max_seq_len, num_buckets, bucket_divisor,
                                               use_position=False, name="time_bias")
        self.position_bias = RelativeAttentionBias(max_seq_len, use_time=False,
                                                   name="position_bias")

    def build(self, input_shape):
        d_model = input_shape[-1]
        if d_model is None:
            raise ValueError("FuxiAttention needs a known last input dimension")
        width = 3 * self.num_heads * self.head_dim
        self.kernel = self.add_weight(name="kernel", shape=(d_model, width),
                                      initializer=self.kernel_initializer)
        self.bias = (self.add_weight(name="bias", shape=(width,),
                                     initializer=self.bias_initializer)
                     if self.use_bias else None)
        self.time_bias.build(None)
        self.position_bias.build(None)

    def _project(self, rows):
        proj = tf.matmul(rows, tf.cast(self.kernel, rows.dtype))
        if self.bias is not None:
            proj += tf.cast(self.bias, rows.dtype)
        return [tf.reshape(x, [-1, self.num_heads, self.head_dim])
                for x in tf.split(proj, 3, axis=-1)]

    def call(self, inputs, timestamps, lengths=None):
        seqs = Sequences(self, inputs, lengths)
        ts_bias = self.time_bias(timestamps)  # [B, S, S]
        pos_bias = toeplitz_position_bias(
            tf.cast(self.position_bias.position_weights, ts_bias.dtype), duplicate=False)[0][None]
        q, k, v = self._project(seqs.rows)
        out = hstu_attention_fuxi(q, k, v, seq_offsets=seqs.splits, max_seq_len=self.max_seq_len,
                                  timestamp_bias=tf.cast(ts_bias, q.dtype),
                                  position_bias=tf.cast(pos_bias, q.dtype),
                                  silu_scale=self.silu_scale, mask_type=self.mask_type)
        return seqs.output(out)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (3 * self.num_heads * self.head_dim,)

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_heads": self.num_heads, "head_dim": self.head_dim,
            "max_seq_len": self.max_seq_len, "num_buckets": self.num_buckets,
            "bucket_divisor": self.bucket_divisor, "silu_scale": self.silu_scale,
            "mask_type": self.mask_type, "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        })
        return config
