"""Tests of the TokenMixing Keras layer."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.layers import TokenMixing
from recops_tf.reference import token_mixing as ref
from recops_tf.testing import assert_close
from recops_tf.testing.inputs import random_values
from recops_tf.testing.layers import fit_briefly


def test_matches_the_reference_with_the_layers_weights():
    x = random_values([3, 8, 8], tf.float32, 0)
    layer = TokenMixing(epsilon=1e-5, gamma_initializer="random_normal",
                        beta_initializer="random_normal")
    out = layer(x)
    assert_close(out, ref.token_mixing(x, layer.gamma, layer.beta, 1e-5), tf.float32,
                 magnitude=4.0)


def test_trains():
    x = random_values([16, 6, 6], tf.float32, 1)
    y = tf.reduce_sum(x, axis=[1, 2])[:, None]
    keras.utils.set_random_seed(0)
    layer, head = TokenMixing(), keras.layers.Dense(1)

    def loss_fn():
        return tf.reduce_mean((head(tf.reshape(layer(x), [16, -1])) - y) ** 2)

    first, last = fit_briefly(loss_fn, lambda: layer.trainable_variables
                              + head.trainable_variables)
    assert last < 0.5 * first, (first, last)


def test_keras_file_round_trip(tmp_path):
    x = random_values([2, 5, 5], tf.float32, 2)
    inp = keras.Input(shape=(5, 5))
    model = keras.Model(inp, TokenMixing(epsilon=1e-6, beta_initializer="random_normal")(inp))
    path = str(tmp_path / "tm.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(x).numpy(), model(x).numpy())
    assert loaded.layers[-1].get_config()["epsilon"] == 1e-6


def test_rejects_bad_config():
    with pytest.raises(ValueError, match="epsilon"):
        TokenMixing(epsilon=0.0)
    with pytest.raises(ValueError, match="square"):
        TokenMixing()(tf.zeros([2, 3, 4]))


def test_exported_from_the_package():
    assert recops_tf.layers.TokenMixing is TokenMixing
