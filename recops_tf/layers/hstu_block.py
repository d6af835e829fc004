"""Keras layer: a whole HSTU layer (Zhai et al., "Actions Speak Louder than Words") on ragged
sequences, from the fused ops."""
import keras
import tensorflow as tf

from recops_tf.layers._sequences import sequences
from recops_tf.layers.relative_attention_bias import owned_relative_bias
from recops_tf.ops._attention import gr_mask_args
from recops_tf.ops._common import positive_int
from recops_tf.ops.hstu_dense import hstu_attention, hstu_attention_cached
from recops_tf.ops.in_linear_silu import in_linear_silu
from recops_tf.ops.norm_multiply_dropout import norm_multiply_dropout
from recops_tf.ops.relative_attn_bias import DEFAULT_BUCKET_DIVISOR

# HSTUBlock.extend: at most this many new tokens attend the cache in place; more go through
# the tiled kernel (the in-place op loops over every visible key per token, O(n (P + n)) without
# tiles: cheaper for a few tokens, the tiled kernel for a history re-encoded at once).
EXTEND_IN_PLACE = 32


@keras.saving.register_keras_serializable(package="recops_tf")
class HSTUBlock(keras.layers.Layer):
    """One HSTU layer with its residual, on ``[B, (L), d_model]`` ragged (or dense) sequences.

    Per token row x (of every sequence, jagged: no padding):

    * ``U, V, Q, K = split(silu(LayerNorm(x) · W_uvqk + b_uvqk))`` (``in_linear_silu``);
    * ``A = hstu_attention(Q, K, V)`` per sequence (causal by default, SiLU attention, optional
      relative bias fused in the kernel);
    * ``Y = dropout(LayerNorm(A) · w + b) * U)`` (``norm_multiply_dropout``, stateless seeded
      mask, a new one every training step);
    * ``out = x + Y · W_o + b_o``.

    ``use_fused=False`` builds the same block from stock TF ops, with the same weights and the
    same code path: each op is called with ``kernel="reference"`` (the padded attention
    composite, matmul + SiLU + split, LayerNorm · U with the kernel's dropout mask rebuilt
    from the seed): the parity oracle and the speed baseline. The input LayerNorm and
    the output projection are stock Keras/TF in both.

    Args:
      num_heads, head_dim: attention heads and their q/k size.
      max_seq_len: the longest sequence (``hstu_attention``'s ``max_seq_len``).
      value_dim: per-head size of U and V (default ``head_dim``).
      dropout_rate: of ``norm_multiply_dropout`` (training only).
      alpha, silu_scale, mask_type, target_group_size: as in ``hstu_attention``.
      relative_bias: an optional ``RelativeAttentionBias`` (pluggable; its weights become this
        layer's; then call with ``timestamps``).
      epsilon: of both LayerNorms.
      use_fused: the fused ops (default) or the stock-TF composite.
      seed: base seed of the dropout masks.
      kernel_initializer: of the two projections.
      gr_mask: None (the Rec SDK's mask rules) or generative-recommenders' rules (a
        ``recops_tf.compat.gr.GRMask`` or a dict of ``max_attn_len``, ``contextual_seq_len``,
        ``min_full_attn_seq_len``; not with ``target_group_size``): GR's STU layer's
        ``max_attn_len`` / ``contextual_seq_len`` / ``min_full_attn_seq_len`` map here, and
        ``num_targets`` is GR's.

    Call arguments: ``inputs`` (a ``tf.RaggedTensor`` ``[B, (L), d_model]``, or a dense
    ``[B, S, d_model]`` whose rows all have length S); ``timestamps`` (for a relative bias
    with a time part, in the inputs' layout); ``num_targets`` ``[B]`` (causal mask's target
    block; ``target_group_size``); ``training``; ``lengths`` ``[B]``: the row lengths of a
    padded dense input (the padding is skipped and comes out as zeros); ``num_context``
    ``[B]``: the causal mask's context rule (``hstu_attention``'s ``num_context``: the first
    ``num_context[b]`` tokens of sequence b see every non-target token of it; not with
    ``gr_mask``). A dense input whose
    sequence length is unknown when traced (a padded batch, or what Keras' ``model.export()``
    makes of a ragged ``keras.Input``) is refused without ``lengths``: export models on
    ragged inputs with ``recops_tf.saving.export``.

    Inference helpers (what ``call`` and ``extend`` are made of, for callers that run the
    attention themselves, e.g. ``recops_tf.recommender.mfalcon`` over a paged KV cache):
    ``project(rows)`` gives ``(u, v, q, k)`` and ``finish(rows, attn, u)`` the block's output
    rows, so ``finish(x, attention(q, k, v), u)`` with ``u, v, q, k = project(x)`` is the block.

    The layer has no XLA kernel: it sets ``supports_jit = False``, so Keras never compiles a
    model using it with XLA (``jit_compile="auto"`` and ``True`` both run without).
    """

    def __init__(self, num_heads, head_dim, max_seq_len, value_dim=None, dropout_rate=0.0,
                 alpha=1.0, silu_scale=0.0, mask_type="causal", target_group_size=0,
                 relative_bias=None, epsilon=1e-5, use_fused=True, seed=0,
                 kernel_initializer="glorot_uniform", gr_mask=None, **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False  # no XLA kernel: keeps Keras from compiling with XLA
        self.num_heads = positive_int(num_heads, "num_heads", "HSTUBlock")
        self.head_dim = positive_int(head_dim, "head_dim", "HSTUBlock")
        self.max_seq_len = positive_int(max_seq_len, "max_seq_len", "HSTUBlock")
        self.value_dim = positive_int(value_dim or head_dim, "value_dim", "HSTUBlock")
        self.dropout_rate = float(dropout_rate)
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must lie in [0, 1), got {dropout_rate}")
        self.alpha = float(alpha)
        self.silu_scale = float(silu_scale)
        if mask_type not in ("causal", "none"):
            raise ValueError("HSTUBlock supports mask_type 'causal' or 'none'")
        self.mask_type = mask_type
        self.target_group_size = int(target_group_size)
        self.gr_mask = gr_mask_args("HSTUBlock", gr_mask, mask_type, None,
                                    self.target_group_size, None)
        self.epsilon = float(epsilon)
        self.use_fused = bool(use_fused)
        self.seed = int(seed)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.relative_bias = owned_relative_bias(relative_bias, self.max_seq_len)
        self.input_norm = keras.layers.LayerNormalization(epsilon=self.epsilon,
                                                          name="input_norm")

    @property
    def _splits(self):
        hv, hq = self.num_heads * self.value_dim, self.num_heads * self.head_dim
        return [hv, hv, hq, hq]

    def build(self, input_shape):
        d_model = input_shape[-1]
        if d_model is None:
            raise ValueError("HSTUBlock needs a known last input dimension")
        self.input_norm.build(tuple(input_shape[:-1]) + (d_model,))
        nw, hv = sum(self._splits), self.num_heads * self.value_dim
        self.uvqk_kernel = self.add_weight(name="uvqk_kernel", shape=(d_model, nw),
                                           initializer=self.kernel_initializer)
        self.uvqk_bias = self.add_weight(name="uvqk_bias", shape=(nw,), initializer="zeros")
        self.norm_weight = self.add_weight(name="norm_weight", shape=(hv,), initializer="ones")
        self.norm_bias = self.add_weight(name="norm_bias", shape=(hv,), initializer="zeros")
        self.out_kernel = self.add_weight(name="out_kernel", shape=(hv, d_model),
                                          initializer=self.kernel_initializer)
        self.out_bias = self.add_weight(name="out_bias", shape=(d_model,), initializer="zeros")
        self.step = self.add_weight(name="dropout_step", shape=(), dtype="int64",
                                    initializer="zeros", trainable=False)
        if self.relative_bias is not None and not self.relative_bias.built:
            self.relative_bias.build(None)

    @property
    def _kernel(self):
        return "fused" if self.use_fused else "reference"

    def project(self, rows):
        """The block's input side on token rows: ``(u, v, q, k)`` of ``rows`` ``[n, d_model]``.

        ``rows`` are cast to the layer's compute dtype (as ``__call__`` autocasts its inputs),
        then ``u, v, q, k = split(silu(LayerNorm(rows) · W_uvqk + b_uvqk))``
        (``in_linear_silu``): ``u``, ``v`` ``[n, num_heads * value_dim]`` and ``q``, ``k``
        ``[n, num_heads * head_dim]``, in the compute dtype. Row-wise: a token's projections do
        not depend on the other rows. Builds the layer on first use.
        """
        if not self.built:
            self.build(rows.shape)
        rows = tf.cast(rows, self.compute_dtype)
        dtype = rows.dtype
        return tuple(in_linear_silu(self.input_norm(rows), tf.cast(self.uvqk_kernel, dtype),
                                    tf.cast(self.uvqk_bias, dtype), self._splits,
                                    weight_layout="kn", kernel=self._kernel))

    def finish(self, rows, attn, u, training=False):
        """The block's output side: ``rows + (dropout(LayerNorm(attn) · w + b) * u) · W_o +
        b_o`` (``norm_multiply_dropout``, the output projection, the residual).

        Args:
          rows: ``[n, d_model]`` the block's input rows (cast to the compute dtype).
          attn: the attention output of those rows, ``[n, num_heads, value_dim]`` or
            ``[n, num_heads * value_dim]``.
          u: ``[n, num_heads * value_dim]`` from ``project(rows)``.
          training: dropout on (a new mask every call: the layer's step counter advances).

        Returns:
          ``[n, d_model]`` output rows in the compute dtype. Row-wise, like ``project``.
        """
        rows = tf.cast(rows, self.compute_dtype)
        dtype = rows.dtype
        cast = lambda w: tf.cast(w, dtype)  # noqa: E731
        rate = self.dropout_rate if training else 0.0
        seed = tf.stack([tf.constant(self.seed, tf.int64), tf.identity(self.step)])
        y = norm_multiply_dropout(tf.reshape(attn, [-1, self.num_heads * self.value_dim]), u,
                                  cast(self.norm_weight), cast(self.norm_bias),
                                  epsilon=self.epsilon, dropout_rate=rate, seed=seed,
                                  kernel=self._kernel)
        if training and self.dropout_rate > 0.0:
            self.step.assign_add(1)
        return rows + tf.matmul(y, cast(self.out_kernel)) + cast(self.out_bias)

    def _heads(self, x, dim):
        return tf.reshape(x, [-1, self.num_heads, dim])

    def _block(self, rows, splits, timestamps, num_targets, num_context, training):
        """The block on jagged rows ``[T, d_model]``; ``timestamps`` ``[T]`` or None."""
        attn_kw = dict(seq_offsets=splits, max_seq_len=self.max_seq_len, alpha=self.alpha,
                       silu_scale=self.silu_scale, mask_type=self.mask_type,
                       gr_mask=self.gr_mask, kernel=self._kernel)
        if num_targets is not None:
            attn_kw.update(num_target=num_targets, target_group_size=self.target_group_size)
        if num_context is not None:
            attn_kw.update(num_context=num_context)
        if self.relative_bias is not None:
            attn_kw.update(self.relative_bias.attention_kwargs(timestamps, rows.dtype))
        u, v, q, k = self.project(rows)
        dq, dv = self.head_dim, self.value_dim
        attn = hstu_attention(self._heads(q, dq), self._heads(k, dq), self._heads(v, dv),
                              **attn_kw)
        return self.finish(rows, attn, u, training=training)

    def extend(self, rows, past_keys, past_values, timestamps=None, *, key_column=0,
               value_column=0, in_place=None):
        """Incremental inference with a key/value cache, for one sequence.

        ``rows`` ``[n, d_model]`` are the inputs of the sequence's next n tokens; its first P
        tokens are summarised by their keys and values (what earlier calls returned): key j is
        ``past_keys[j, key_column:key_column + num_heads * head_dim]`` and value j
        ``past_values[j, value_column:value_column + num_heads * value_dim]`` (``[P, W]`` rows
        may hold other columns too, e.g. every block's keys and values side by side);
        ``timestamps`` ``[P + n]`` are those of all tokens (with a time bias). Returns
        ``(out, keys, values)``: the block's ``[n, d_model]`` outputs of the new tokens and
        their keys ``[n, num_heads * head_dim]`` and values. ``out`` equals rows P.. of
        ``call`` on the whole sequence (while P + n <= max_seq_len) at O(n (P + n)) attention
        cost instead of O((P + n)^2). With ``in_place=None``, up to `EXTEND_IN_PLACE` new tokens
        attend the cache where it is (``hstu_attention_cached``, fused build) and more are
        concatenated after it and go through the tiled kernel's "delta" layout (faster for
        many), with the same fused relative bias: a ``tf.cond`` on n. ``in_place=True`` takes
        the first way whatever n, ``False`` the second: no branch in the graph. Inference only
        (no dropout); the Rec SDK's causal mask only.
        """
        if self.gr_mask is not None or self.mask_type != "causal" or self.target_group_size:
            raise ValueError("HSTUBlock.extend supports the plain causal mask only")
        u, v, q, k = self.project(rows)
        rows = tf.cast(rows, self.compute_dtype)  # as __call__ autocasts its inputs
        dtype = rows.dtype
        past_keys, past_values = tf.cast(past_keys, dtype), tf.cast(past_values, dtype)
        dq, dv = self.head_dim, self.value_dim
        bias = {}
        if self.relative_bias is not None:
            bias = self.relative_bias.attention_kwargs(timestamps, dtype)
        common = dict(max_seq_len=self.max_seq_len, alpha=self.alpha,
                      silu_scale=self.silu_scale)

        def cached():
            return hstu_attention_cached(
                self._heads(q, dq), self._heads(k, dq), self._heads(v, dv), past_keys,
                past_values, key_column=key_column, value_column=value_column,
                timestamps=bias.get("timestamps"),
                time_bias_weights=bias.get("time_bias_weights"),
                position_bias_weights=bias.get("position_bias_weights"),
                bucket_divisor=bias.get("bucket_divisor", DEFAULT_BUCKET_DIVISOR), **common)

        def concatenated():
            hk, hv = self.num_heads * dq, self.num_heads * dv
            keys = tf.concat([past_keys[:, key_column:key_column + hk], k], 0)
            values = tf.concat([past_values[:, value_column:value_column + hv], v], 0)
            zero = tf.zeros([1], tf.int64)
            return hstu_attention(
                self._heads(q, dq), self._heads(keys, dq), self._heads(values, dv),
                seq_offsets=tf.concat([zero, tf.shape(rows, out_type=tf.int64)[:1]], 0),
                seq_offsets_k=tf.concat([zero, tf.shape(keys, out_type=tf.int64)[:1]], 0),
                max_seq_len_k=self.max_seq_len, mask_type="causal", kernel=self._kernel,
                **bias, **common)

        if not self.use_fused or in_place is False:
            attn = concatenated()
        elif in_place:
            attn = cached()
        else:
            attn = tf.cond(tf.shape(rows)[0] <= EXTEND_IN_PLACE, cached, concatenated)
        return self.finish(rows, attn, u), k, v

    def call(self, inputs, timestamps=None, num_targets=None, training=None, lengths=None,
             num_context=None):
        training = bool(training)
        if self.relative_bias is None and timestamps is not None:
            raise ValueError("HSTUBlock: timestamps need a relative_bias layer")
        seqs = sequences(self, inputs, lengths)
        return seqs.output(self._block(seqs.rows, seqs.offsets, seqs.rows_of(timestamps),
                                       num_targets, num_context, training))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_heads": self.num_heads, "head_dim": self.head_dim,
            "max_seq_len": self.max_seq_len, "value_dim": self.value_dim,
            "dropout_rate": self.dropout_rate, "alpha": self.alpha,
            "silu_scale": self.silu_scale, "mask_type": self.mask_type,
            "target_group_size": self.target_group_size, "epsilon": self.epsilon,
            "use_fused": self.use_fused, "seed": self.seed,
            "gr_mask": None if self.gr_mask is None else self.gr_mask._asdict(),
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "relative_bias": (None if self.relative_bias is None else
                              keras.saving.serialize_keras_object(self.relative_bias)),
        })
        return config
