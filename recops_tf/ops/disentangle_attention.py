"""DeBERTa-style disentangled attention with the Rec SDK's index semantics (stem
disentangle_attention)."""
import math

import tensorflow as tf

from recops_tf.ops._common import lib, value_tensors

POS_ATT_TYPES = ("c2p", "p2c", "c2p|p2c")


def disentangle_attention(query, key, value, pos_key, pos_query, relative_pos, attn_mask=None,
                          pos_att_type="c2p|p2c", score_scale=None, name=None):
    """Disentangled (content-to-position, position-to-content) attention, fused.

    Definition (the Rec SDK's, spec §16; not HuggingFace's, whose p2c negates the index):
    ``idx[i, j] = clamp(relative_pos[i, j] + s - 1, 0, 2s - 1)``;
    ``c2p[b, h, i, j] = Q[b, h, i] · pos_key[idx[i, j], h]``;
    ``p2c[b, h, i, j] = K[b, h, j] · pos_query[idx[j, i], h]``;
    ``W = score_scale · (Q · Kᵀ + c2p + p2c) + attn_mask``; ``P = softmax_j(W)``; ``O = P · V``.
    The position terms are gathered from the two ``[s, 2s]`` position-score matrices
    (``Q · pos_keyᵀ``, ``K · pos_queryᵀ``), never from an ``[s, s, d]`` gather; one work item
    per (batch, head), float32 accumulation (float64 for float64). Any s (the seed: 256 only).

    Args:
      query, key, value: ``[b, n, s, d]`` float32, bfloat16, float16 or float64.
      pos_key, pos_query: ``[2s, n, d]``.
      relative_pos: int ``[s, s]``, ``[1, s, s]`` or ``[1, 1, s, s]`` (shared by batches and
        heads).
      attn_mask: additive ``[b, 1, s, s]`` or ``[b, s, s]`` (e.g. 0 / -1e4), or None.
      pos_att_type: ``"c2p"``, ``"p2c"`` or ``"c2p|p2c"``.
      score_scale: the scale; None means ``1 / sqrt(d · (1 + number of position types))``
        (DeBERTa's).
      name: optional op name.

    Returns:
      ``(output [b, n, s, d], probs [b, n, s, s], weights [b, n, s, s])`` (weights: the
      pre-softmax scores including bias and mask).

    Gradient: w.r.t. query, key, value, pos_key and pos_query, through all three outputs
    (``DisentangleAttentionGrad``; the position tables' gradients are summed over the batch
    in a fixed order); none for relative_pos and attn_mask. Second order: not implemented.

    Raises:
      InvalidArgumentError: shapes (q / k / v differ, position tables not ``[2s, n, d]``,
        relative_pos not ``s x s``, a mask of the wrong shape).
      TypeError: query not float32/float16/bfloat16/float64, or another tensor of a different dtype.
      ValueError: an unknown pos_att_type.

    Example:

    >>> q = tf.zeros([1, 1, 2, 4]); pos = tf.zeros([4, 1, 4])
    >>> out, probs, _ = disentangle_attention(q, q, q, pos, pos, [[0, -1], [1, 0]])
    >>> probs.numpy()[0, 0].tolist()
    [[0.5, 0.5], [0.5, 0.5]]
    """
    if pos_att_type == "p2c|c2p":
        pos_att_type = "c2p|p2c"
    if pos_att_type not in POS_ATT_TYPES:
        raise ValueError(f"pos_att_type must be one of {POS_ATT_TYPES}, got {pos_att_type!r}")
    with tf.name_scope(name or "disentangle_attention"):
        query, key, value, pos_key, pos_query, attn_mask = value_tensors(
            "disentangle_attention", query=query, key=key, value=value, pos_key=pos_key,
            pos_query=pos_query, attn_mask=attn_mask)
        relative_pos = tf.cast(relative_pos, tf.int64)
        if score_scale is None:
            d = query.shape[-1]
            if d is None:
                raise ValueError("score_scale must be given when d is not static")
            score_scale = 1.0 / math.sqrt(d * (1 + len(pos_att_type.split("|"))))
        mask = tf.zeros([0], query.dtype) if attn_mask is None else attn_mask
        return tuple(lib().recops_disentangle_attention(
            query, key, value, pos_key, pos_query, relative_pos, mask,
            pos_att_type=pos_att_type, score_scale=float(score_scale)))


@tf.RegisterGradient("Recops>DisentangleAttention")
def _disentangle_attention_grad(op, d_out, d_probs, d_weights):
    outs = op.outputs
    d_out = tf.zeros_like(outs[0]) if d_out is None else d_out
    d_probs = tf.zeros_like(outs[1]) if d_probs is None else d_probs
    d_weights = tf.zeros_like(outs[2]) if d_weights is None else d_weights
    grads = lib().recops_disentangle_attention_grad(
        d_out, d_probs, d_weights, *op.inputs, pos_att_type=op.get_attr("pos_att_type"),
        score_scale=op.get_attr("score_scale"))
    return list(grads) + [None, None]


@tf.RegisterGradient("Recops>DisentangleAttentionGrad")
def _disentangle_attention_grad_grad(op, *grads):
    raise NotImplementedError("second-order gradients of disentangle_attention are not "
                              "implemented")
