"""Tests of the HSTUBlock Keras layer: parity with its stock-TF build, training, saving."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from recops_tf.layers import HSTUBlock, RelativeAttentionBias
from recops_tf.testing import assert_close
from recops_tf.testing.layers import fit_briefly, ragged_time_batch, time_span_target

D_MODEL, MAX_LEN = 16, 24
LENGTHS = (5, 0, 24, 1, 13, 9)


def batch(seed=0):
    return ragged_time_batch(LENGTHS, D_MODEL, seed)


def pair(**kw):
    """A fused block and a stock-TF block with the same weights."""
    keras.utils.set_random_seed(0)
    kw = {"num_heads": 2, "head_dim": 4, "max_seq_len": MAX_LEN, **kw}
    rel = kw.pop("relative_bias", None)
    fused = HSTUBlock(**kw, relative_bias=rel() if rel else None)
    stock = HSTUBlock(**kw, use_fused=False, relative_bias=rel() if rel else None)
    return fused, stock


def _init(fused, stock, x, ts):
    fused(x, timestamps=ts) if fused.relative_bias else fused(x)
    stock(x, timestamps=ts) if stock.relative_bias else stock(x)
    stock.set_weights(fused.get_weights())
    # Non-zero biases so that every parameter's gradient path is exercised.
    rng = np.random.default_rng(1)
    for w in fused.weights + stock.weights:
        if w.dtype != "int64" and len(w.shape) == 1:
            w.assign(rng.normal(size=w.shape) * 0.3 + (1.0 if "weight" in w.path else 0.0))
    stock.set_weights(fused.get_weights())


@pytest.mark.parametrize("rel", [None, "time_and_position"])
def test_fused_equals_stock_tf_block(rel):
    x, ts = batch(1)
    make_rel = (lambda: RelativeAttentionBias(MAX_LEN, num_buckets=12,
                                              initializer="random_normal")) if rel else None
    fused, stock = pair(relative_bias=make_rel, value_dim=6)
    _init(fused, stock, x, ts)
    kw = {"timestamps": ts} if rel else {}
    with tf.GradientTape(persistent=True) as tape:
        out_f = fused(x, **kw)
        out_s = stock(x, **kw)
        loss_f = tf.reduce_sum(out_f.values ** 2)
        loss_s = tf.reduce_sum(out_s.values ** 2)
    assert_close(out_f.values, out_s.values, tf.float32, magnitude=4.0, reduction=64)
    g_f = tape.gradient(loss_f, fused.trainable_variables)
    g_s = tape.gradient(loss_s, stock.trainable_variables)
    assert len(g_f) == len(g_s) == len(fused.trainable_variables)
    for a, b in zip(g_f, g_s):
        assert_close(tf.convert_to_tensor(a), tf.convert_to_tensor(b), tf.float32,
                     magnitude=50.0, reduction=400)


def test_dense_input_equals_ragged():
    x, _ = batch(2)
    fused, _ = pair()
    dense = x[2:3].to_tensor()  # one full-length sequence
    out = fused(dense)
    assert_close(out[0], fused(x[2:3]).values, tf.float32)


def test_dropout_is_seeded_per_step_and_off_in_inference():
    x, _ = batch(3)
    block = HSTUBlock(num_heads=2, head_dim=4, max_seq_len=MAX_LEN, dropout_rate=0.5)
    infer1, infer2 = block(x), block(x)
    np.testing.assert_array_equal(infer1.values.numpy(), infer2.values.numpy())
    train1 = block(x, training=True).values.numpy()
    train2 = block(x, training=True).values.numpy()
    assert not np.allclose(train1, train2)  # a new mask every step
    assert int(block.step.numpy()) == 2


def test_trains_with_relative_bias():
    x, ts = batch(4)
    y = time_span_target(ts)
    keras.utils.set_random_seed(0)
    block = HSTUBlock(num_heads=2, head_dim=4, max_seq_len=MAX_LEN,
                      relative_bias=RelativeAttentionBias(MAX_LEN, num_buckets=16))
    head = keras.layers.Dense(1)
    lengths = tf.maximum(tf.cast(x.row_lengths(), tf.float32), 1.0)[:, None]

    def loss_fn():
        out = block(x, timestamps=ts, training=True)
        return tf.reduce_mean((head(tf.reduce_sum(out, axis=1) / lengths) - y) ** 2)

    first, last = fit_briefly(loss_fn, lambda: block.trainable_variables
                              + head.trainable_variables)
    assert last < 0.5 * first, (first, last)


def _model(block):
    inp = keras.Input(shape=(MAX_LEN, D_MODEL))
    return keras.Model(inp, block(inp))


def test_keras_file_round_trip(tmp_path):
    x, _ = batch(5)
    block, _ = pair(dropout_rate=0.1)
    model = _model(block)
    dense = x.to_tensor(shape=[None, MAX_LEN, D_MODEL])
    path = str(tmp_path / "block.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(dense).numpy(), model(dense).numpy())
    assert loaded.layers[-1].get_config()["dropout_rate"] == 0.1


def test_saved_model_round_trip(tmp_path):
    x, _ = batch(6)
    block, _ = pair()
    model = _model(block)
    dense = x.to_tensor(shape=[None, MAX_LEN, D_MODEL])
    expected = model(dense).numpy()
    path = str(tmp_path / "saved")
    model.export(path)
    loaded = tf.saved_model.load(path)
    np.testing.assert_allclose(loaded.serve(dense).numpy(), expected, rtol=1e-6, atol=1e-6)


def test_rejects_bad_config():
    with pytest.raises(ValueError, match="dropout_rate"):
        HSTUBlock(num_heads=2, head_dim=4, max_seq_len=MAX_LEN, dropout_rate=1.0)
    with pytest.raises(ValueError, match="mask_type"):
        HSTUBlock(num_heads=2, head_dim=4, max_seq_len=MAX_LEN, mask_type="custom")
    with pytest.raises(ValueError, match="must equal max_seq_len"):
        HSTUBlock(num_heads=2, head_dim=4, max_seq_len=MAX_LEN,
                  relative_bias=RelativeAttentionBias(MAX_LEN + 1))
    with pytest.raises(ValueError, match="need a relative_bias"):
        HSTUBlock(num_heads=2, head_dim=4, max_seq_len=MAX_LEN)(batch()[0],
                                                              timestamps=batch()[1])
