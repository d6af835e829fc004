"""Tests of the RelativeAttentionBias Keras layer, alone and feeding HSTUAttention."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.layers import HSTUAttention, RelativeAttentionBias
from recops_tf.reference import relative_attn_bias as ref
from recops_tf.testing import assert_close, fit_briefly, ragged_time_batch, time_span_target

MAX_LEN, D_MODEL = 12, 8
LENGTHS = (5, 0, 12, 1, 7, 9, 2, 4)


def batch(seed=0):
    return ragged_time_batch(LENGTHS, D_MODEL, seed)


def test_matches_time_and_toeplitz_references():
    _, ts = batch(1)
    layer = RelativeAttentionBias(MAX_LEN, num_buckets=20, initializer="random_normal")
    bias = layer(ts)
    padded = ts.to_tensor(shape=[None, MAX_LEN])
    time_bias, _ = ref.relative_attn_bias_time(padded, layer.time_weights[None],
                                               duplicate=False)
    pos, _ = ref.toeplitz_position_bias(layer.position_weights.numpy(), duplicate=False)
    assert bias.shape == (len(LENGTHS), MAX_LEN, MAX_LEN)
    assert_close(bias, time_bias[0] + pos[None], tf.float32)


def test_dense_timestamps_are_padded_to_max_seq_len():
    layer = RelativeAttentionBias(MAX_LEN, num_buckets=8, initializer="random_normal")
    dense = tf.constant([[0, 10, 400]], tf.int64)
    bias = layer(dense)
    assert_close(bias[:, :3, :3], layer(tf.ragged.constant([[0, 10, 400]]))[:, :3, :3],
                 tf.float32)


def _model_parts():
    keras.utils.set_random_seed(0)
    return (RelativeAttentionBias(MAX_LEN, num_buckets=16),
            HSTUAttention(num_heads=2, head_dim=4, max_seq_len=MAX_LEN),
            keras.layers.Dense(1))


def test_hstu_model_with_relative_bias_trains():
    x, ts = batch(2)
    # The target depends on the time span of each sequence, which only the bias sees.
    y = time_span_target(ts)
    lengths = tf.maximum(tf.cast(x.row_lengths(), tf.float32), 1.0)[:, None]
    rab, attn, head = _model_parts()

    def loss_fn():
        out = attn(x, attn_bias=rab(ts))
        return tf.reduce_mean((head(tf.reduce_sum(out, axis=1) / lengths) - y) ** 2)

    first, last = fit_briefly(loss_fn, lambda: (rab.trainable_variables
                                                + attn.trainable_variables
                                                + head.trainable_variables))
    assert last < 0.5 * first, (first, last)
    # Both bias tables learned something (their gradients flow through the fused ops).
    assert np.abs(rab.time_weights.numpy()).max() > 1e-3
    assert np.abs(rab.position_weights.numpy()).max() > 1e-3


def test_bias_gradient_reaches_both_tables_through_hstu():
    x, ts = batch(3)
    rab, attn, _ = _model_parts()
    with tf.GradientTape() as tape:
        out = attn(x, attn_bias=rab(ts))
        loss = tf.reduce_sum(out.values ** 2)
    g_time, g_pos = tape.gradient(loss, [rab.time_weights, rab.position_weights])
    g_time, g_pos = tf.convert_to_tensor(g_time), tf.convert_to_tensor(g_pos)
    assert np.abs(g_time.numpy()).max() > 0 and np.abs(g_pos.numpy()).max() > 0


def test_keras_file_round_trip(tmp_path):
    _, ts = batch(4)
    layer = RelativeAttentionBias(MAX_LEN, num_buckets=10, bucket_divisor=0.5,
                                  initializer="random_normal")
    inp = keras.Input(shape=(MAX_LEN,), dtype="int64")
    model = keras.Model(inp, layer(inp))
    dense = ts.to_tensor(shape=[None, MAX_LEN])
    path = str(tmp_path / "rab.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(dense).numpy(), model(dense).numpy())
    assert loaded.layers[-1].get_config()["bucket_divisor"] == 0.5


def test_rejects_bad_config():
    with pytest.raises(ValueError, match="use_time or use_position"):
        RelativeAttentionBias(MAX_LEN, use_time=False, use_position=False)
    with pytest.raises(ValueError, match="positive"):
        RelativeAttentionBias(MAX_LEN, num_buckets=0)


def test_exported_from_the_package():
    assert recops_tf.layers.RelativeAttentionBias is RelativeAttentionBias
