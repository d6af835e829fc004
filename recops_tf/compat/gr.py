"""generative-recommenders (GR) compatibility: GR's ``hstu_mha`` with its argument names, order,
defaults, layouts and mask rules, on recops_tf's fused HSTU kernel.

A GR model's attention call ports as is::

    from recops_tf.compat import gr
    out = gr.hstu_mha(max_seq_len, alpha, q, k, v, seq_offsets, causal=True,
                      num_targets=num_targets, max_attn_len=256, contextual_seq_len=3)

The mask is GR's (``GRMask``), evaluated per 64 x 64 score tile inside the kernel, forward
and backward: never built as a ``[B, N, N]`` plane. docs/gr_compat.md maps every GR argument.
"""
import tensorflow as tf

from recops_tf.ops._attention import GRMask
from recops_tf.ops.hstu_dense import hstu_attention
from recops_tf.reference.hstu_dense import gr_visibility

__all__ = ["GRMask", "hstu_mha", "valid_attn_mask"]

# GR's HammerKernel names -> recops_tf's kernel switch.
_KERNELS = {"fused": "fused", "reference": "reference", "pytorch": "reference",
            "triton": "fused", "triton_cc": "fused", "tlx": "fused", "cuda": "fused"}


def _kernel(kernel):
    name = getattr(kernel, "name", kernel)
    if not isinstance(name, str) or name.lower() not in _KERNELS:
        raise ValueError(f"hstu_mha: kernel must be 'fused' or 'reference' (or a GR "
                         f"HammerKernel), got {kernel!r}")
    return _KERNELS[name.lower()]


def _gr_mask(fn, max_attn_len, contextual_seq_len, min_full_attn_seq_len):
    """GR's three mask arguments as a checked GRMask (errors name `fn`'s arguments)."""
    return GRMask.of(GRMask(max_attn_len, contextual_seq_len, min_full_attn_seq_len),
                     owner=f"{fn}: ")


def hstu_mha(max_seq_len, alpha, q, k, v, seq_offsets, causal=True, dropout_pr=0.0,
             training=True, num_targets=None, attn_scale=None, max_attn_len=0,
             contextual_seq_len=0, min_full_attn_seq_len=0, sort_by_length=False,
             kernel="fused", enable_tma=False):
    """GR's ``hstu_mha``: jagged HSTU attention with GR's mask rules.

    ``out_i = sum_j silu(alpha * q_i . k_j) * s_i * m_ij * v_j`` per sequence and head, with
    ``s_i = attn_scale`` (per query row, or one scalar; default ``1 / max_seq_len``) and ``m``
    GR's valid-attention mask (``GRMask`` gives the rules).

    Args:
      max_seq_len: the longest sequence (Python int).
      alpha: the score multiplier (a float; a 32-bit attribute, see docs/gr_compat.md).
      q, k: ``[L, H, D]`` jagged queries / keys (same shape); v: ``[L, H, V]``.
      seq_offsets: ``[B+1]`` int32/int64 offsets.
      causal: GR's causal (True) or bidirectional (False) rules.
      dropout_pr, training: attention dropout. Only ``0`` (or ``training=False``) is
        supported, as in GR's Triton and CUDA kernels; otherwise ValueError.
      num_targets: optional ``[B]`` int targets per sequence (at most its length).
      attn_scale: optional ``[L]`` per-row scale (jagged like q) or a scalar tensor; it is
        differentiable.
      max_attn_len, contextual_seq_len, min_full_attn_seq_len: GR's mask arguments (ints >= 0).
      sort_by_length, enable_tma: accepted for GR's signature; no effect (work items are
        balanced by cost whatever the order).
      kernel: ``"fused"`` or ``"reference"`` (the stock-TF composite with GR's mask built
        densely), or a GR ``HammerKernel`` (PYTORCH -> reference, the others -> fused).

    Returns:
      ``[L, H, V]``.

    Gradient: w.r.t. q, k, v and attn_scale.

    Raises:
      InvalidArgumentError: bad offsets, a sequence longer than max_seq_len, num_targets of the
        wrong length or larger than a sequence, q / k / v shapes that do not agree.
      ValueError: dropout in training, a negative or non-integer mask argument, an unknown
        kernel.
      TypeError: non-float q, k, v; a ragged or dense-layout argument.
    """
    if training and dropout_pr:
        raise ValueError(f"hstu_mha: dropout_pr > 0 in training is not supported (got "
                         f"{dropout_pr!r}); GR's Triton and CUDA kernels do not support it "
                         "either: pass 0 and drop the attention output instead")
    if not isinstance(causal, bool):
        raise TypeError(f"hstu_mha: causal must be a Python bool, got {causal!r}")
    gr_mask = _gr_mask("hstu_mha", max_attn_len, contextual_seq_len, min_full_attn_seq_len)
    kernel = _kernel(kernel)
    with tf.name_scope("hstu_mha"):
        scaled = attn_scale is not None
        out = hstu_attention(q, k, v, seq_offsets=seq_offsets, max_seq_len=max_seq_len,
                             alpha=alpha, silu_scale=1.0 if scaled else 0.0,
                             mask_type="causal" if causal else "none", num_target=num_targets,
                             gr_mask=gr_mask, kernel=kernel)
        if not scaled:
            return out
        # s_i multiplies row i of the attention weights, so it multiplies output row i: the
        # kernel runs with scale 1 and the rows are scaled here (exact; its gradient follows).
        scale = tf.convert_to_tensor(attn_scale, dtype_hint=out.dtype)
        if scale.dtype != out.dtype:
            raise TypeError(f"hstu_mha: attn_scale must have q's dtype {out.dtype.name}, got "
                            f"{scale.dtype.name}")
        if scale.shape.rank not in (None, 0, 1):
            raise ValueError(f"hstu_mha: attn_scale must be a scalar or [L] (one per row), "
                             f"got shape {scale.shape}")
        if scale.shape.rank == 1:
            tf.debugging.assert_equal(tf.shape(scale)[0], tf.shape(out)[0],
                                      message="hstu_mha: attn_scale must have one entry per "
                                      "row of q")
            scale = scale[:, None, None]
        return out * scale


def valid_attn_mask(seq_offsets, max_seq_len, causal=True, num_targets=None, max_attn_len=0,
                    contextual_seq_len=0, min_full_attn_seq_len=0):
    """GR's valid-attention mask as a dense boolean ``[B, max_seq_len, max_seq_len]`` (False
    outside each sequence): for inspection, or a custom mask elsewhere. ``hstu_mha`` never
    builds it."""
    gr_mask = _gr_mask("valid_attn_mask", max_attn_len, contextual_seq_len,
                       min_full_attn_seq_len)
    return gr_visibility(tf.cast(seq_offsets, tf.int64), max_seq_len, causal, num_targets,
                         *gr_mask)[:, 0]
