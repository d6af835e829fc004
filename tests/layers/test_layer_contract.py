"""What every recops_tf sequence layer shares: the input layouts it accepts (ragged, full
dense, padded dense with lengths) and refuses (a dense input of unknown length, the wrong
rank or ragged rank), and no XLA (``supports_jit = False``)."""
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.layers import (DisentangledSelfAttention, FuxiAttention, HSTUAttention,
                              HSTUBlock, RelativeAttentionBias, TokenMixing)
from recops_tf.testing.layers import ragged_time_batch

D_MODEL, MAX_LEN = 16, 8
LENGTHS = (3, 0, 5, 1)

# name -> (make the layer, extra call kwargs given the ragged timestamps)
SEQUENCE_LAYERS = {
    "HSTUAttention": lambda: HSTUAttention(num_heads=2, head_dim=4, max_seq_len=MAX_LEN),
    "HSTUBlock": lambda: HSTUBlock(num_heads=2, head_dim=4, max_seq_len=MAX_LEN),
    "FuxiAttention": lambda: FuxiAttention(num_heads=2, head_dim=4, max_seq_len=MAX_LEN,
                                           num_buckets=8),
}


def _call(name, layer, x, ts, **kw):
    if name == "FuxiAttention":
        kw["timestamps"] = ts
    return layer(x, **kw)


def _batch():
    x, ts = ragged_time_batch(LENGTHS, D_MODEL, seed=0)
    return x, ts


@pytest.mark.parametrize("name", SEQUENCE_LAYERS)
def test_padded_dense_with_lengths_equals_ragged(name):
    x, ts = _batch()
    layer = SEQUENCE_LAYERS[name]()
    ragged = _call(name, layer, x, ts)
    padded = _call(name, layer, x.to_tensor(), ts.to_tensor(), lengths=x.row_lengths())
    assert isinstance(ragged, tf.RaggedTensor) and not isinstance(padded, tf.RaggedTensor)
    np.testing.assert_array_equal(padded.numpy(), ragged.to_tensor().numpy())  # zeros padded


@pytest.mark.parametrize("name", SEQUENCE_LAYERS)
def test_dense_input_of_unknown_length_is_refused_when_traced(name):
    x, ts = _batch()
    layer = SEQUENCE_LAYERS[name]()
    _call(name, layer, x, ts)  # built
    spec = [tf.TensorSpec([None, None, D_MODEL]), tf.TensorSpec([None, None], tf.int64)]
    traced = tf.function(lambda x, ts: _call(name, layer, x, ts), input_signature=spec)
    with pytest.raises(ValueError, match="sequence length is unknown while tracing"):
        traced.get_concrete_function()
    # With the lengths, the same trace is fine and right.
    lengths = tf.function(lambda x, ts, n: _call(name, layer, x, ts, lengths=n),
                          input_signature=spec + [tf.TensorSpec([None], tf.int64)])
    out = lengths(x.to_tensor(), ts.to_tensor(), x.row_lengths())
    # To float32 rounding, not bit for bit: traced, TensorFlow's oneDNN matmul of the block's
    # projections may take another kernel than eagerly (on an AVX-512 Zen 4, HSTUBlock's
    # outputs differed by an ulp; equal with TF_ENABLE_ONEDNN_OPTS=0).
    np.testing.assert_allclose(out.numpy(), _call(name, layer, x, ts).to_tensor().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_disentangled_attention_refuses_unknown_length_without_its_mask():
    layer = DisentangledSelfAttention(num_heads=2, head_dim=4, max_seq_len=MAX_LEN)
    x, _ = _batch()
    layer(x)
    spec = tf.TensorSpec([None, None, D_MODEL])
    with pytest.raises(ValueError, match="with its attention_mask"):
        tf.function(layer, input_signature=[spec]).get_concrete_function()
    masked = tf.function(lambda x, m: layer(x, attention_mask=m),
                         input_signature=[spec, tf.TensorSpec([None, None], tf.int32)])
    assert masked.get_concrete_function().structured_outputs.shape.as_list() == [None, None, 8]


def test_lengths_are_checked():
    x, _ = _batch()
    layer = SEQUENCE_LAYERS["HSTUBlock"]()
    dense = x.to_tensor()
    with pytest.raises(tf.errors.InvalidArgumentError, match="lengths must be <= S"):
        layer(dense, lengths=tf.constant([3, 0, 6, 1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="lengths must be >= 0"):
        layer(dense, lengths=tf.constant([3, -1, 5, 1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="one entry per row"):
        layer(dense, lengths=tf.constant([3, 0, 5], tf.int64))
    with pytest.raises(ValueError, match="lengths are for a padded dense input"):
        layer(x, lengths=x.row_lengths())


@keras.saving.register_keras_serializable(package="recops_tf_tests")
class Wrapper(keras.layers.Layer):
    """A user layer without compute_output_shape: Keras infers its output by tracing call()
    on a dense placeholder of unknown length, which is not an endpoint."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.block = HSTUBlock(num_heads=2, head_dim=4, max_seq_len=MAX_LEN)

    def call(self, x):
        return self.block(x)


def test_keras_shape_inference_is_not_refused():
    inp = keras.Input(shape=(None, D_MODEL), ragged=True)
    model = keras.Model(inp, Wrapper()(inp))
    x, _ = _batch()
    assert model(x).row_lengths().numpy().tolist() == list(LENGTHS)


# ---- issue 19 item 8: what was passed and what is expected ---------------------------------

@pytest.mark.parametrize("name", SEQUENCE_LAYERS)
def test_wrong_layouts_name_what_was_passed(name):
    x, ts = _batch()
    layer = SEQUENCE_LAYERS[name]()
    two_ragged = tf.RaggedTensor.from_row_lengths(x, tf.constant([2, 2], tf.int64))
    with pytest.raises(ValueError, match=rf"{name} expects a tf.RaggedTensor \[B, \(L\), "
                       r"d_model\] .* got a tf.RaggedTensor \[2, \(L1\), \(L2\), 16\] "
                       r"\(ragged_rank 2\)"):
        _call(name, layer, two_ragged, ts)
    with pytest.raises(ValueError, match=r"or a dense \[B, S, d_model\] tensor, got a dense "
                       r"tensor \[8, 16\]: a batch of sequences needs its sequence axis"):
        _call(name, layer, tf.ones([8, D_MODEL]), ts)


def test_constructor_checks_sizes():
    with pytest.raises(ValueError, match="HSTUBlock: max_seq_len must be a positive int, got 0"):
        HSTUBlock(num_heads=2, head_dim=4, max_seq_len=0)
    with pytest.raises(ValueError, match="HSTUAttention: num_heads must be a positive int"):
        HSTUAttention(num_heads=0, head_dim=4, max_seq_len=MAX_LEN)


# ---- issue 19 item 6: no XLA ----------------------------------------------------------------

ALL_LAYERS = {
    **SEQUENCE_LAYERS,
    "DisentangledSelfAttention": lambda: DisentangledSelfAttention(2, 4, MAX_LEN),
    "RelativeAttentionBias": lambda: RelativeAttentionBias(MAX_LEN),
    "TokenMixing": lambda: TokenMixing(),
}


def _model_with(name):
    if name == "TokenMixing":
        inp = keras.Input(shape=(4, 4))
    elif name == "RelativeAttentionBias":
        inp = keras.Input(shape=(MAX_LEN,), dtype="int64")
    else:
        inp = keras.Input(shape=(MAX_LEN, D_MODEL))
    layer = ALL_LAYERS[name]()
    if name == "FuxiAttention":
        times = keras.Input(shape=(MAX_LEN,), dtype="int64")
        return keras.Model([inp, times], layer(inp, times))
    return keras.Model(inp, layer(inp))


def _fake_gpu(monkeypatch):
    """Keras' jit_compile="auto" picks XLA when a non-CPU device is present and every layer
    supports it (keras.src.trainers.trainer: _resolve_auto_jit_compile, model_supports_jit)."""
    gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
    real = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda device_type=None: real(device_type) + [gpu])


@pytest.mark.parametrize("name", ALL_LAYERS)
def test_layers_opt_out_of_xla(name, monkeypatch):
    assert ALL_LAYERS[name]().supports_jit is False
    _fake_gpu(monkeypatch)
    model = _model_with(name)
    model.compile(loss="mse")  # jit_compile="auto"
    assert model.jit_compile is False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.compile(loss="mse", jit_compile=True)
    assert model.jit_compile is False
    assert any("doesn't support `jit_compile=True`" in str(w.message) for w in caught)


def test_a_stock_model_would_pick_xla_on_a_gpu_machine(monkeypatch):
    # The control of the test above: the fake GPU is what makes "auto" pick XLA.
    _fake_gpu(monkeypatch)
    inp = keras.Input(shape=(4,))
    model = keras.Model(inp, keras.layers.Dense(1)(inp))
    model.compile(loss="mse")
    assert model.jit_compile is True


def test_on_cpu_auto_is_no_xla_and_forced_xla_has_no_kernel():
    model = _model_with("TokenMixing")
    model.compile(loss="mse")
    assert model.jit_compile is False  # a CPU-only machine: Keras never picks XLA
    x = tf.ones([2, 4, 4])
    forced = tf.function(lambda x: recops_tf.token_mixing(x, tf.ones([4]), tf.zeros([4])),
                         jit_compile=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="OpKernel for XLA"):
        forced(x)
