"""Composite reference of stem disentangle_attention in stock TF (the Rec SDK golden's math:
position scores gathered by the clamped index; also the benchmark baseline)."""
import math

import tensorflow as tf


def disentangle_attention(query, key, value, pos_key, pos_query, relative_pos, attn_mask=None,
                          pos_att_type="c2p|p2c", score_scale=None):
    s = tf.shape(query)[2]
    if score_scale is None:
        score_scale = 1.0 / math.sqrt(query.shape[-1] * (1 + len(pos_att_type.split("|"))))
    rel = tf.reshape(tf.cast(relative_pos, tf.int32), [s, s])
    idx = tf.clip_by_value(rel + s - 1, 0, 2 * s - 1)
    shape = tf.shape(query)
    idx = tf.broadcast_to(idx, [shape[0], shape[1], s, s])  # [b, h, i, j]
    scores = tf.einsum("bhid,bhjd->bhij", query, key)
    if "c2p" in pos_att_type:
        c2p = tf.einsum("bhid,phd->bhip", query, pos_key)  # [b, h, s, 2s]
        scores += tf.gather(c2p, idx, axis=3, batch_dims=3)  # c2p[b, h, i, idx[i, j]]
    if "p2c" in pos_att_type:
        p2c = tf.einsum("bhjd,phd->bhjp", key, pos_query)  # [b, h, s, 2s]
        # p2c[b, h, j, idx[j, i]], transposed to [b, h, i, j].
        scores += tf.linalg.matrix_transpose(tf.gather(p2c, idx, axis=3, batch_dims=3))
    weights = tf.cast(score_scale, query.dtype) * scores
    if attn_mask is not None:
        mask = tf.convert_to_tensor(attn_mask, query.dtype)
        weights += tf.reshape(mask, [tf.shape(mask)[0], 1, s, s])
    probs = tf.nn.softmax(weights, axis=-1)
    return tf.einsum("bhij,bhjd->bhid", probs, value), probs, weights
