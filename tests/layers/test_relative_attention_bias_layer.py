"""Tests of the RelativeAttentionBias Keras layer, alone and feeding HSTUAttention."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.layers import HSTUAttention, RelativeAttentionBias
from recops_tf.reference import relative_attn_bias as ref
from recops_tf.testing import assert_close
from recops_tf.testing.layers import fit_briefly, ragged_time_batch, time_span_target

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


def _fused_parts(**rab_kw):
    keras.utils.set_random_seed(0)
    rab = RelativeAttentionBias(MAX_LEN, num_buckets=16, initializer="random_normal", **rab_kw)
    return rab, HSTUAttention(num_heads=2, head_dim=4, max_seq_len=MAX_LEN, relative_bias=rab)


@pytest.mark.parametrize("parts", [{}, {"use_time": False}, {"use_position": False}])
def test_fused_relative_bias_equals_the_bias_plane(parts):
    x, ts = batch(5)
    rab, attn = _fused_parts(**parts)
    fused = attn(x, timestamps=ts)
    plain = HSTUAttention(num_heads=2, head_dim=4, max_seq_len=MAX_LEN)
    plain(x)
    plain.set_weights(attn.get_weights()[:2])
    assert_close(fused.values, plain(x, attn_bias=rab(ts)).values, tf.float32)
    # Dense inputs with dense [B, S] timestamps: the same rows.
    dense = attn(x.to_tensor(), timestamps=ts.to_tensor())
    lengths = x.row_lengths()
    assert_close(tf.RaggedTensor.from_tensor(dense, lengths).values, fused.values, tf.float32)


def test_hstu_model_with_fused_relative_bias_trains():
    x, ts = batch(2)
    y = time_span_target(ts)
    lengths = tf.maximum(tf.cast(x.row_lengths(), tf.float32), 1.0)[:, None]
    rab, attn = _fused_parts()
    head = keras.layers.Dense(1)

    def loss_fn():
        out = attn(x, timestamps=ts)
        return tf.reduce_mean((head(tf.reduce_sum(out, axis=1) / lengths) - y) ** 2)

    attn(x, timestamps=ts)  # builds the layer and its relative bias
    before = [rab.time_weights.numpy().copy(), rab.position_weights.numpy().copy()]
    first, last = fit_briefly(loss_fn, lambda: attn.trainable_variables + head.trainable_variables)
    assert last < 0.5 * first, (first, last)
    # The bias weights are the attention layer's and were trained through the fused kernel.
    assert any(v is rab.time_weights for v in attn.trainable_variables)
    assert np.abs(rab.time_weights.numpy() - before[0]).max() > 1e-3
    assert np.abs(rab.position_weights.numpy() - before[1]).max() > 1e-3


def test_fused_relative_bias_keras_file_round_trip(tmp_path):
    x, ts = batch(6)
    _, attn = _fused_parts()
    inp = keras.Input(shape=(MAX_LEN, D_MODEL))
    times = keras.Input(shape=(MAX_LEN,), dtype="int64")
    model = keras.Model([inp, times], attn(inp, timestamps=times))
    args = [x.to_tensor(shape=[None, MAX_LEN, D_MODEL]), ts.to_tensor(shape=[None, MAX_LEN])]
    path = str(tmp_path / "fused_rab.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(args).numpy(), model(args).numpy())
    rab = loaded.layers[-1].relative_bias
    assert isinstance(rab, RelativeAttentionBias) and rab.num_buckets == 16


def test_fused_relative_bias_rejects_misuse():
    x, ts = batch(7)
    rab, attn = _fused_parts()
    with pytest.raises(ValueError, match="cannot be combined"):
        attn(x, timestamps=ts, attn_bias=rab(ts))
    with pytest.raises(ValueError, match="needs timestamps"):
        attn(x)
    with pytest.raises(ValueError, match="need a relative_bias"):
        HSTUAttention(num_heads=2, head_dim=4, max_seq_len=MAX_LEN)(x, timestamps=ts)
    with pytest.raises(ValueError, match="must equal max_seq_len"):
        HSTUAttention(num_heads=2, head_dim=4, max_seq_len=MAX_LEN + 1, relative_bias=rab)
    with pytest.raises(TypeError, match="RelativeAttentionBias"):
        HSTUAttention(num_heads=2, head_dim=4, max_seq_len=MAX_LEN, relative_bias="zeros")
