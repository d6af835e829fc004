"""Tests of the DisentangledSelfAttention Keras layer."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.layers import DisentangledSelfAttention
from recops_tf.reference import disentangle_attention as ref
from recops_tf.testing import assert_close
from recops_tf.testing.inputs import random_values
from recops_tf.testing.layers import fit_briefly

D_MODEL, MAX_LEN = 12, 10


def make(**kw):
    keras.utils.set_random_seed(0)
    return DisentangledSelfAttention(num_heads=2, head_dim=3, max_seq_len=MAX_LEN, **kw)


def expected(layer, x, mask=None):
    """The layer's math from its weights and the stock-TF reference op."""
    b, s = x.shape[0], x.shape[1]
    w, bias, emb = layer.qkv_kernel, layer.qkv_bias, layer.rel_embeddings
    proj = lambda t, i: tf.tensordot(t, w[:, 6 * i:6 * i + 6], 1) + bias[6 * i:6 * i + 6]  # noqa
    heads = lambda t: tf.transpose(tf.reshape(t, [b, s, 2, 3]), [0, 2, 1, 3])  # noqa: E731
    rel = emb[MAX_LEN - s:MAX_LEN + s]
    pos = lambda i: tf.reshape(proj(rel, i), [2 * s, 2, 3])  # noqa: E731
    r = tf.range(s, dtype=tf.int64)
    additive = None
    if mask is not None:
        additive = tf.broadcast_to((1.0 - tf.cast(mask, tf.float32))[:, None, None, :] * -1e4,
                                   [b, 1, s, s])
    out, _, _ = ref.disentangle_attention(heads(proj(x, 0)), heads(proj(x, 1)),
                                          heads(proj(x, 2)), pos(1), pos(0),
                                          r[:, None] - r[None, :], additive,
                                          pos_att_type=layer.pos_att_type)
    return tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [b, s, 6])


@pytest.mark.parametrize("pos_att_type", ["c2p|p2c", "c2p", "p2c"])
def test_matches_the_reference_with_the_layers_weights(pos_att_type):
    x = random_values([3, 7, D_MODEL], tf.float32, 0)
    layer = make(pos_att_type=pos_att_type)
    out = layer(x)
    assert out.shape == [3, 7, 6]
    assert_close(out, expected(layer, x), tf.float32, magnitude=4.0, reduction=20)


def test_ragged_input_masks_padding():
    x = random_values([3, 7, D_MODEL], tf.float32, 1)
    lengths = [7, 2, 5]
    rx = tf.RaggedTensor.from_tensor(x, lengths=lengths)
    layer = make()
    out = layer(rx)
    assert isinstance(out, tf.RaggedTensor)
    mask = tf.sequence_mask(lengths, 7)
    full = expected(layer, rx.to_tensor(), mask)
    assert_close(out.values, tf.RaggedTensor.from_tensor(full, lengths=lengths).values,
                 tf.float32, magnitude=4.0, reduction=20)


def test_trains():
    x = random_values([16, 6, D_MODEL], tf.float32, 2)
    y = tf.reduce_sum(x[:, :, :3] * x[:, ::-1, 3:6], axis=[1, 2])[:, None]
    layer, head = make(), keras.layers.Dense(1)

    def loss_fn():
        return tf.reduce_mean((head(tf.reduce_mean(layer(x), axis=1)) - y) ** 2)

    first, last = fit_briefly(loss_fn, lambda: layer.trainable_variables
                              + head.trainable_variables)
    assert last < 0.5 * first, (first, last)
    assert np.abs(layer.rel_embeddings.numpy()).max() > 0


def test_keras_file_round_trip(tmp_path):
    x = random_values([2, MAX_LEN, D_MODEL], tf.float32, 3)
    inp = keras.Input(shape=(MAX_LEN, D_MODEL))
    model = keras.Model(inp, make(pos_att_type="c2p")(inp))
    path = str(tmp_path / "dsa.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(x).numpy(), model(x).numpy())
    assert loaded.layers[-1].get_config()["pos_att_type"] == "c2p"


def test_rejects_bad_config():
    with pytest.raises(ValueError, match="pos_att_type"):
        make(pos_att_type="c2c")


def test_exported_from_the_package():
    assert recops_tf.layers.DisentangledSelfAttention is DisentangledSelfAttention
