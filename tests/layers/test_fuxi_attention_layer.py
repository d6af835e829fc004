"""Tests of the FuxiAttention Keras layer."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.layers import FuxiAttention
from recops_tf.testing import assert_close
from recops_tf.testing.layers import fit_briefly, ragged_time_batch, time_span_target

MAX_LEN, D_MODEL = 12, 8
LENGTHS = (5, 0, 12, 1, 7, 9, 2, 4)


def batch(seed=0):
    return ragged_time_batch(LENGTHS, D_MODEL, seed)


def make_layer(**kw):
    keras.utils.set_random_seed(0)
    return FuxiAttention(num_heads=2, head_dim=4, max_seq_len=MAX_LEN, num_buckets=16, **kw)


def test_matches_the_op_with_the_layers_weights():
    x, ts = batch(1)
    layer = make_layer()
    out = layer(x, ts)
    for w in (layer.time_bias.time_weights, layer.position_bias.position_weights):
        w.assign(tf.random.normal(w.shape, seed=3))
    out = layer(x, ts)
    proj = tf.matmul(x.values, layer.kernel) + layer.bias
    q, k, v = [tf.reshape(p, [-1, 2, 4]) for p in tf.split(proj, 3, axis=-1)]
    ts_bias, _ = recops_tf.relative_attn_bias_time(
        ts.to_tensor(shape=[None, MAX_LEN]), layer.time_bias.time_weights[None], duplicate=False)
    pos, _ = recops_tf.toeplitz_position_bias(layer.position_bias.position_weights,
                                              duplicate=False)
    expect = recops_tf.hstu_attention_fuxi(q, k, v, seq_offsets=x.row_splits,
                                           max_seq_len=MAX_LEN, timestamp_bias=ts_bias[0],
                                           position_bias=pos[None])
    assert out.shape[-1] == 24
    assert_close(out.values, expect, tf.float32)


def test_trains_and_learns_both_biases():
    x, ts = batch(2)
    y = time_span_target(ts)
    lengths = tf.maximum(tf.cast(x.row_lengths(), tf.float32), 1.0)[:, None]
    layer, head = make_layer(), keras.layers.Dense(1)

    def loss_fn():
        out = layer(x, ts)
        return tf.reduce_mean((head(tf.reduce_sum(out, axis=1) / lengths) - y) ** 2)

    first, last = fit_briefly(
        loss_fn, lambda: layer.trainable_variables + head.trainable_variables)
    assert last < 0.5 * first, (first, last)
    assert np.abs(layer.time_bias.time_weights.numpy()).max() > 1e-3
    assert np.abs(layer.position_bias.position_weights.numpy()).max() > 1e-3


def test_keras_file_round_trip(tmp_path):
    layer = make_layer(silu_scale=0.5)
    x_in = keras.Input(shape=(MAX_LEN, D_MODEL))
    t_in = keras.Input(shape=(MAX_LEN,), dtype="int64")
    model = keras.Model([x_in, t_in], layer(x_in, t_in))
    layer.time_bias.time_weights.assign(tf.random.normal([16], seed=1))
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(2, MAX_LEN, D_MODEL)).astype(np.float32)
    t = np.cumsum(rng.integers(0, 999, size=(2, MAX_LEN)), axis=1)
    path = str(tmp_path / "fuxi.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded([x, t]).numpy(), model([x, t]).numpy(), rtol=1e-6)


def test_rejects_bad_config():
    with pytest.raises(ValueError, match="mask_type"):
        FuxiAttention(num_heads=2, head_dim=4, max_seq_len=8, mask_type="custom")
