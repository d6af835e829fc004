"""The ``kernel=`` switch of the public functions that layers build on: ``"reference"`` runs the
stock-TF composite behind the same arguments, layouts and checks as ``"fused"``, so a layer's
fused and reference paths are one code path (HSTUBlock's ``use_fused``)."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf as rt
from recops_tf import testing
from recops_tf.ops.ln_mul import ln_mul
from recops_tf.ops.norm_multiply_dropout import norm_multiply_dropout

RNG = np.random.default_rng(7)


def _t(*shape):
    return tf.constant(RNG.normal(size=shape), tf.float32)


def _ragged(lengths, *inner):
    return tf.RaggedTensor.from_row_lengths(_t(sum(lengths), *inner), lengths)


TS = tf.ragged.constant([[1, 5, 9, 20], [], [3, 4, 100, 200, 300]], tf.int64)
Q = _ragged([4, 0, 5], 2, 4)
D = _t(2, 5, 2, 4)
X, U = _t(6, 8), _t(6, 8)
W = _t(8, 8)
TARGETS = [0, 3, 7, 1, 2, 5]  # X's rows among W's
FLCE_BIAS, FLCE_EXTRA = _t(8), _t(3)


def _cases():
    """(name, fn(kernel) -> output(s), inputs to differentiate)."""
    rel = dict(timestamps=TS, time_bias_weights=_t(8), position_bias_weights=_t(11))
    ts_bias, pos_bias = _t(2, 5, 5), _t(1, 5, 5)
    return [
        ("hstu_ragged", lambda kernel, q: rt.hstu_attention(q, q, q, max_seq_len=6,
                                                            kernel=kernel), Q),
        ("hstu_ragged_relative_bias",
         lambda kernel, q: rt.hstu_attention(q, q, q, max_seq_len=6, kernel=kernel, **rel), Q),
        ("hstu_dense_targets", lambda kernel, d: rt.hstu_attention(
            d, d, d, num_target=[2, 1], target_group_size=1, kernel=kernel), D),
        ("hstu_jagged_window", lambda kernel, d: rt.hstu_attention(
            tf.reshape(d, [10, 2, 4]), tf.reshape(d, [10, 2, 4]), tf.reshape(d, [10, 2, 4]),
            seq_offsets=[0, 3, 10], max_seq_len=7, window_size=(2, 0), kernel=kernel), D),
        ("fuxi_dense", lambda kernel, d: rt.hstu_attention_fuxi(
            d, d, d, timestamp_bias=ts_bias, position_bias=pos_bias, kernel=kernel), D),
        ("fuxi_ragged", lambda kernel, q: rt.hstu_attention_fuxi(q, q, q, max_seq_len=6,
                                                                 kernel=kernel), Q),
        ("in_linear_silu", lambda kernel, x: rt.in_linear_silu(
            x, W, tf.zeros([8]), [2, 2, 2, 2], kernel=kernel), X),
        ("ln_mul", lambda kernel, x: ln_mul(x, U, tf.ones([8]), tf.zeros([8]), kernel=kernel),
         X),
        ("norm_multiply_dropout", lambda kernel, x: norm_multiply_dropout(
            x, U, tf.ones([8]), tf.zeros([8]), dropout_rate=0.3, seed=[1, 2], kernel=kernel),
         X),
        ("fused_linear_cross_entropy", lambda kernel, x: rt.fused_linear_cross_entropy(
            x, W, TARGETS, kernel=kernel), X),
        ("fused_linear_cross_entropy_options", lambda kernel, x: rt.fused_linear_cross_entropy(
            x, W, TARGETS, temperature=0.5, bias=FLCE_BIAS,
            extra_logits=([0, 5, 5], [2, 7, 7], FLCE_EXTRA),
            label_smoothing=0.1, weights=[1.0, 0.0, 2.0, 1.0, 1.0, 0.5], return_lse=True,
            kernel=kernel), X),
        ("fused_linear_cross_entropy_ragged", lambda kernel, s: rt.fused_linear_cross_entropy(
            s, W, tf.ragged.constant([[1, 0, 7, 3], [], [2, 2, 6]]), normalize=True,
            kernel=kernel), _ragged([4, 0, 3], 8)),
    ]


def _flat(out):
    outs = out if isinstance(out, tuple) else (out,)
    return [o.flat_values if isinstance(o, tf.RaggedTensor) else o for o in outs]


@pytest.mark.parametrize("name,fn,x", _cases(), ids=[c[0] for c in _cases()])
def test_reference_kernel_equals_fused(name, fn, x):
    """Same values, same output kind, and the same gradient (TF's autodiff of the composite
    against the fused backward)."""
    grads, values = {}, {}
    for kernel in ("fused", "reference"):
        with tf.GradientTape() as tape:
            tape.watch(x.flat_values if isinstance(x, tf.RaggedTensor) else x)
            out = fn(kernel, x)
            loss = sum(tf.reduce_sum(o * o) for o in _flat(out))
        values[kernel] = _flat(out)
        assert type(out) is type(fn("fused", x))
        grads[kernel] = tape.gradient(loss, x.flat_values if isinstance(x, tf.RaggedTensor)
                                      else x)
    rtol, atol = testing.tolerance(tf.float32, reduction=16)
    for fused, reference in zip(values["fused"], values["reference"]):
        np.testing.assert_allclose(fused.numpy(), reference.numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(tf.convert_to_tensor(grads["fused"]).numpy(),
                               tf.convert_to_tensor(grads["reference"]).numpy(), rtol=rtol,
                               atol=10 * atol)


def test_reference_kernel_in_tf_function():
    f = tf.function(lambda q: rt.hstu_attention(q, q, q, max_seq_len=6, kernel="reference"))
    np.testing.assert_allclose(f(Q).flat_values.numpy(),
                               rt.hstu_attention(Q, Q, Q, max_seq_len=6).flat_values.numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call", [
    lambda: rt.hstu_attention(D, D, D, kernel="xla"),
    lambda: rt.hstu_attention_fuxi(D, D, D, kernel=None),
    lambda: rt.in_linear_silu(X, W, tf.zeros([8]), [2, 2, 2, 2], kernel="stock"),
    lambda: ln_mul(X, U, tf.ones([8]), tf.zeros([8]), kernel=True),
    lambda: norm_multiply_dropout(X, U, tf.ones([8]), tf.zeros([8]), kernel="Fused"),
    lambda: rt.fused_linear_cross_entropy(X, W, TARGETS, kernel="fast"),
])
def test_unknown_kernel_is_a_value_error(call):
    with pytest.raises(ValueError, match="kernel must be 'fused' or 'reference'"):
        call()


@pytest.mark.parametrize("call,message", [
    (lambda kernel: rt.hstu_attention(Q, Q, Q, max_seq_len=4, kernel=kernel), "max_seq_len"),
    (lambda kernel: rt.hstu_attention(D, D, D, attn_bias=_t(2, 2, 5, 4), kernel=kernel),
     "attn_bias"),
    (lambda kernel: rt.hstu_attention(D, D, D, num_target=[1, 1, 1], kernel=kernel),
     "num_target"),
    (lambda kernel: rt.hstu_attention_fuxi(D, D, D, timestamp_bias=_t(2, 5, 4),
                                           position_bias=_t(1, 5, 5), kernel=kernel),
     "timestamp_bias"),
    (lambda kernel: ln_mul(X, U, tf.ones([1]), tf.zeros([1]), kernel=kernel), None),
    (lambda kernel: ln_mul(X, U, tf.ones([8]), tf.zeros([8]), epsilon=0.0, kernel=kernel),
     "epsilon"),
    (lambda kernel: norm_multiply_dropout(X, U[:, :4], tf.ones([8]), tf.zeros([8]),
                                          kernel=kernel), None),
    (lambda kernel: rt.in_linear_silu(X, W, tf.zeros([7]), [2, 2, 2, 2], kernel=kernel),
     "bias"),
    (lambda kernel: rt.fused_linear_cross_entropy(X, W, [0, 3, 7, 1, 2, 8], kernel=kernel),
     "targets"),
    (lambda kernel: rt.fused_linear_cross_entropy(X, W, TARGETS, bias=tf.zeros([7]),
                                                  kernel=kernel), "bias"),
    (lambda kernel: rt.fused_linear_cross_entropy(X, W, TARGETS, extra_logits=([6], [0], [1.0]),
                                                  kernel=kernel), "extra_positions"),
])
@pytest.mark.parametrize("kernel", ["fused", "reference"])
def test_reference_kernel_refuses_what_fused_refuses(call, message, kernel):
    """A broadcastable bias, a too-long sequence or a bad count would give the composite
    silent garbage: both kernels raise InvalidArgumentError."""
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        call(kernel)
