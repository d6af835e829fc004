"""Tests of the HSTUAttention Keras layer."""
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.layers import HSTUAttention
from recops_tf.testing import assert_close

D_MODEL, MAX_LEN = 8, 12


def ragged_batch(seed=0, lengths=(5, 0, 12, 1)):
    rng = np.random.default_rng(seed)
    rows = rng.uniform(-1, 1, size=(sum(lengths), D_MODEL)).astype(np.float32)
    return tf.RaggedTensor.from_row_lengths(rows, np.array(lengths, np.int64))


def make_layer(**kw):
    kw.setdefault("num_heads", 2)
    kw.setdefault("head_dim", 4)
    kw.setdefault("max_seq_len", MAX_LEN)
    return HSTUAttention(**kw)


def test_matches_the_op_with_the_layers_weights():
    x = ragged_batch()
    layer = make_layer(num_kv_heads=1, value_dim=3, silu_scale=0.5)
    out = layer(x)
    assert isinstance(out, tf.RaggedTensor)
    assert out.shape.as_list() == [4, None, 6]
    proj = x.values @ layer.kernel + layer.bias
    q, k, v = tf.split(proj, [8, 4, 3], axis=-1)
    expected = recops_tf.hstu_attention(
        tf.reshape(q, [-1, 2, 4]), tf.reshape(k, [-1, 1, 4]), tf.reshape(v, [-1, 1, 3]),
        seq_offsets=x.row_splits, max_seq_len=MAX_LEN, silu_scale=0.5)
    assert_close(out.values, tf.reshape(expected, [-1, 6]), tf.float32)


def test_dense_input():
    layer = make_layer()
    x = tf.random.stateless_uniform([3, 5, D_MODEL], seed=[1, 2])
    out = layer(x)
    assert out.shape == [3, 5, 8]
    ragged = layer(tf.RaggedTensor.from_tensor(x))
    assert_close(out, ragged.to_tensor(), tf.float32)


@keras.saving.register_keras_serializable(package="recops_tf_tests")
class RaggedMean(keras.layers.Layer):
    def call(self, x):
        return tf.reduce_mean(x, axis=1)


def _model(layer):
    inp = keras.Input(shape=(None, D_MODEL), ragged=True)
    seq = layer(inp)
    pooled = RaggedMean()(seq)
    return keras.Model(inp, keras.layers.Dense(1)(pooled))


def test_trains_in_a_keras_model():
    keras.utils.set_random_seed(0)
    x = ragged_batch(0, (5, 3, 12, 1, 7, 9, 2, 4))
    y = tf.reduce_sum(tf.reduce_mean(x, axis=1), axis=1, keepdims=True) * 3.0
    model = _model(make_layer())
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse", jit_compile=False)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat(40)
    history = model.fit(ds, epochs=1, verbose=0).history["loss"]
    first = float(model.evaluate(tf.data.Dataset.from_tensors((x, y)), verbose=0))
    model2 = _model(make_layer())  # untrained reference
    model2.compile(loss="mse", jit_compile=False)
    untrained = float(model2.evaluate(tf.data.Dataset.from_tensors((x, y)), verbose=0))
    assert history and first < 0.5 * untrained


def test_keras_file_round_trip(tmp_path):
    x = ragged_batch(1)
    model = _model(make_layer(num_kv_heads=1, window_size=(4, 0), alpha=0.5))
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert_close(loaded(x), model(x), tf.float32)
    config = loaded.layers[1].get_config()
    assert config["window_size"] == (4, 0) and config["num_kv_heads"] == 1


def test_saved_model_round_trip(tmp_path):
    layer = make_layer()
    x = ragged_batch(2)
    layer(x)
    module = tf.Module()
    module.layer = layer
    module.serve = tf.function(
        lambda r: layer(r).values,
        input_signature=[tf.RaggedTensorSpec([None, None, D_MODEL], tf.float32, 1, tf.int64)])
    path = os.path.join(tmp_path, "sm")
    tf.saved_model.save(module, path)
    loaded = tf.saved_model.load(path)
    assert_close(loaded.serve(x), layer(x).values, tf.float32)


def test_rejects_bad_config():
    with pytest.raises(ValueError, match="must divide"):
        make_layer(num_heads=3, num_kv_heads=2)
    with pytest.raises(ValueError, match="'causal' or 'none'"):
        make_layer(mask_type="custom")
