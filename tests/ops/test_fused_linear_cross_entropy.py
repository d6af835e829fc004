"""Tests of stem fused_linear_cross_entropy: the loss and lse against the float64 oracle of
the stock composite (the whole [P, N] logits), every option, both gradients, ragged input,
errors, and the blocks' edges (positions across 64-position tiles, items across 256-item
tiles)."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.testing import (MODES, assert_close, assert_gradients_match_reference,
                               assert_matches_reference, assert_numeric_gradient,
                               assert_second_order_raises, in_mode)
from recops_tf.testing.inputs import random_values

DTYPES = (tf.float64, tf.float32, tf.bfloat16)
flce = recops_tf.fused_linear_cross_entropy


def problem(P, N, d, dtype, seed=0, extras=0):
    rng = np.random.default_rng(seed)
    s = random_values([P, d], dtype, seed)
    e = random_values([N, d], dtype, seed + 1)
    y = tf.constant(rng.integers(0, N, P), tf.int64)
    b = random_values([N], dtype, seed + 2)
    pos = tf.constant(rng.integers(0, max(P, 1), extras), tf.int64)
    items = tf.constant(rng.integers(0, N, extras), tf.int64)
    v = random_values([extras], dtype, seed + 3, low=-2.0, high=2.0)
    w = tf.cast(tf.constant((rng.uniform(size=P) > 0.25) * rng.uniform(0.5, 2.0, P)), dtype)
    return s, e, y, b, pos, items, v, w


def fns(y, pos, items, w, **options):
    """(fused, reference) of (states, items, bias, extra values) -> (loss, lse)."""
    def call(kernel):
        def fn(s, e, b, v):
            kw = dict(options)
            if kw.pop("with_bias", False):
                kw["bias"] = b
            if kw.pop("with_extras", False):
                kw["extra_logits"] = (pos, items, v)
            if kw.pop("with_weights", False):
                kw["weights"] = tf.cast(w, s.dtype)
            return flce(s, e, y, return_lse=True, kernel=kernel, **kw)
        return fn
    return call("fused"), call("reference")


OPTIONS = {
    "plain": {},
    "temperature": {"temperature": 0.25},
    "bias": {"with_bias": True},
    "extras": {"with_extras": True},
    "smoothing": {"label_smoothing": 0.2},
    "weights": {"with_weights": True},
    "normalize": {"normalize": True, "temperature": 0.1},
    "all": {"temperature": 0.5, "with_bias": True, "with_extras": True, "label_smoothing": 0.1,
            "with_weights": True},
}


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_options_match_reference(dtype, option):
    P, N, d = 70, 300, 16
    s, e, y, b, pos, items, v, w = problem(P, N, d, dtype, extras=150)
    fused, ref = fns(y, pos, items, w, **OPTIONS[option])
    args = [s, e, b, v]
    # The logits are sums of d products over temperatures down to 0.1 (magnitudes ~10); lse
    # sums N exponentials.
    assert_matches_reference(fused, ref, args, dtype, magnitude=10.0, reduction=N)
    assert_gradients_match_reference(fused, ref, args, [0, 1, 2, 3], dtype, magnitude=4.0,
                                     reduction=N)


# (2200, 301, 20): more than the 32 position blocks (2,048 positions) whose softmax gradient the
# bfloat16 backward multiplies at once, an odd item block, d padded to 32.
@pytest.mark.parametrize("shape", [(1, 1, 1), (5, 3, 4), (64, 256, 8), (65, 257, 33),
                                   (130, 513, 2), (0, 7, 4), (3, 600, 0), (2200, 301, 20)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_tile_edges(dtype, shape):
    P, N, d = shape
    s, e, y, b, pos, items, v, w = problem(P, N, d, dtype, extras=2 * P)
    fused, ref = fns(y, pos, items, w, with_bias=True, with_extras=True)
    assert_matches_reference(fused, ref, [s, e, b, v], dtype, magnitude=4.0, reduction=N)
    assert_gradients_match_reference(fused, ref, [s, e, b, v], [0, 1, 2, 3], dtype,
                                     magnitude=4.0, reduction=N)


def test_defaults_are_sparse_softmax_cross_entropy():
    s, e, y, *_ = problem(40, 90, 12, tf.float32)
    logits = tf.matmul(s, e, transpose_b=True)
    expected = tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    assert_close(flce(s, e, y), expected, tf.float32, magnitude=4.0, reduction=90)
    loss, lse = flce(s, e, y, return_lse=True)
    assert_close(lse, tf.reduce_logsumexp(logits, 1), tf.float32, magnitude=4.0, reduction=90)
    assert loss.dtype == tf.float32 and loss.shape == [40]


def test_numeric_gradient():
    s, e, y, b, pos, items, v, w = problem(6, 9, 3, tf.float64, extras=8)
    fused, _ = fns(y, pos, items, w, temperature=0.7, with_bias=True, with_extras=True,
                   label_smoothing=0.15, with_weights=True)
    assert_numeric_gradient(fused, [s, e, b, v], [0, 1, 2, 3])


@pytest.mark.parametrize("mode", MODES)
def test_modes(mode):
    s, e, y, b, pos, items, v, w = problem(70, 300, 16, tf.float32, extras=50)
    fused, ref = fns(y, pos, items, w, with_bias=True, with_extras=True, label_smoothing=0.1)
    assert_matches_reference(in_mode(fused, mode, [s, e, b, v]), ref, [s, e, b, v], tf.float32,
                             magnitude=4.0, reduction=300)


def test_ragged_states_and_targets():
    s, e, y, *_ = problem(9, 20, 5, tf.float32)
    states = tf.RaggedTensor.from_row_lengths(s, [4, 0, 5])
    targets = tf.RaggedTensor.from_row_lengths(y, [4, 0, 5])
    loss = flce(states, e, targets)
    assert isinstance(loss, tf.RaggedTensor)
    assert loss.row_lengths().numpy().tolist() == [4, 0, 5]
    assert_close(loss.flat_values, flce(s, e, y), tf.float32)


def test_variables_and_int32_targets():
    s, e, y, *_ = problem(30, 50, 8, tf.float32)
    sv, ev = tf.Variable(s), tf.Variable(e)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(flce(sv, ev, tf.cast(y, tf.int32)))
    gs, ge = tape.gradient(loss, [sv, ev])
    with tf.GradientTape() as tape:
        ref = tf.reduce_sum(flce(sv, ev, y, kernel="reference"))
    rs, re = tape.gradient(ref, [sv, ev])
    assert_close([loss, gs, ge], [ref, rs, re], tf.float32, magnitude=4.0, reduction=50)


def test_masked_items_and_weights():
    """-inf extra logits remove items from a position's softmax; weight-0 positions give 0
    loss, 0 lse and no gradient."""
    s, e, y, *_ = problem(4, 6, 3, tf.float64)
    y = tf.constant([0, 1, 2, 3], tf.int64)
    pos = tf.constant([0, 0, 1], tf.int64)
    items = tf.constant([4, 5, 0], tf.int64)
    v = tf.constant([-np.inf] * 3, tf.float64)
    w = tf.constant([1.0, 1.0, 0.0, 2.0], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(s)
        loss, lse = flce(s, e, y, extra_logits=(pos, items, v), weights=w, return_lse=True)
        total = tf.reduce_sum(loss) + tf.reduce_sum(lse)
    g = tape.gradient(total, s)
    logits = tf.matmul(s, e, transpose_b=True).numpy()
    expected0 = np.log(np.exp(logits[0, :4]).sum()) - logits[0, 0]
    np.testing.assert_allclose(loss[0].numpy(), expected0, rtol=1e-12)
    assert loss[2].numpy() == 0.0 and lse[2].numpy() == 0.0
    np.testing.assert_array_equal(g[2].numpy(), 0.0)
    np.testing.assert_allclose(loss[3].numpy(),
                               2.0 * (np.log(np.exp(logits[3]).sum()) - logits[3, 3]),
                               rtol=1e-12)


def test_duplicate_extras_are_summed():
    s, e, y, *_ = problem(3, 5, 2, tf.float64)
    pos, items = tf.constant([1, 1], tf.int64), tf.constant([2, 2], tf.int64)
    v = tf.constant([0.5, 0.25], tf.float64)
    once = flce(s, e, y, extra_logits=([1], [2], tf.constant([0.75], tf.float64)))
    assert_close(flce(s, e, y, extra_logits=(pos, items, v)), once, tf.float64)
    sparse = tf.SparseTensor([[1, 2]], tf.constant([0.75], tf.float64), [3, 5])
    assert_close(flce(s, e, y, extra_logits=sparse), once, tf.float64)


def test_large_catalogue_tiles_agree_with_reference_in_float64():
    """More items than threads x tiles, several position tiles: the lanes' partial logsumexps
    merge to the oracle."""
    s, e, y, b, pos, items, v, w = problem(200, 3000, 8, tf.float64, extras=400)
    fused, ref = fns(y, pos, items, w, with_bias=True, with_extras=True, label_smoothing=0.05,
                     with_weights=True, temperature=0.3)
    assert_matches_reference(fused, ref, [s, e, b, v], tf.float64, magnitude=10.0,
                             reduction=3000)
    assert_gradients_match_reference(fused, ref, [s, e, b, v], [0, 1, 2, 3], tf.float64,
                                     magnitude=10.0, reduction=3000)


def test_second_order_raises():
    s, e, y, *_ = problem(4, 5, 3, tf.float32)
    assert_second_order_raises(lambda s: flce(s, e, y), [s])


@pytest.mark.parametrize("kernel", ["fused", "reference"])
@pytest.mark.parametrize("change, message", [
    (dict(targets=[0, 9]), "targets"),
    (dict(targets=[0, -1]), "targets"),
    (dict(extra_logits=([2], [0], [1.0])), "extra_positions"),
    (dict(extra_logits=([0], [5], [1.0])), "extra_items"),
    (dict(bias=[1.0, 2.0]), "bias"),
    (dict(weights=[1.0]), "weights"),
])
def test_bad_runtime_values_are_invalid_arguments(kernel, change, message):
    args = dict(states=tf.ones([2, 3]), items=tf.ones([5, 3]), targets=[0, 1])
    args.update(change)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        flce(kernel=kernel, **args)


def test_bad_runtime_values_inside_tf_function():
    fn = tf.function(lambda t: flce(tf.ones([2, 3]), tf.ones([5, 3]), t),
                     input_signature=[tf.TensorSpec([None], tf.int64)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"targets\[1\] = 7"):
        fn(tf.constant([0, 7], tf.int64))


@pytest.mark.parametrize("call, error, message", [
    (lambda: flce(tf.ones([2, 3], tf.float16), tf.ones([5, 3], tf.float16), [0, 1]), TypeError,
     "float32, bfloat16 or float64"),
    (lambda: flce(tf.ones([2, 3]), tf.ones([5, 3], tf.float64), [0, 1]), TypeError,
     "same dtype"),
    (lambda: flce(tf.ones([2, 3]), tf.ones([5, 3]), [0.0, 1.0]), TypeError, "int32 or int64"),
    (lambda: flce(tf.ones([2, 3]), tf.ones([5, 3]), [0, 1], temperature=0.0), ValueError,
     "temperature"),
    (lambda: flce(tf.ones([2, 3]), tf.ones([5, 3]), [0, 1], label_smoothing=1.0), ValueError,
     "label_smoothing"),
    (lambda: flce(tf.ones([2, 3, 1]), tf.ones([5, 3]), [0, 1]), ValueError, "rank 2"),
    (lambda: flce(tf.ones([2, 3]), tf.ones([5, 3]), [0, 1], extra_logits=[1, 2]), TypeError,
     "extra_logits"),
    (lambda: flce(tf.RaggedTensor.from_row_lengths(tf.ones([2, 3]), [2]), tf.ones([5, 3]),
                  [0, 1]), ValueError, "ragged targets"),
    (lambda: flce(tf.ones([2, 3]), tf.ones([5, 3]), [0, 1], kernel="fast"), ValueError,
     "kernel"),
])
def test_bad_arguments_raise_at_trace_time(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_mismatched_item_width_is_invalid_argument():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="d"):
        flce(tf.ones([2, 3]), tf.ones([5, 4]), [0, 1])


def test_deterministic_sums():
    s, e, y, *_ = problem(150, 2000, 16, tf.float32)
    runs = []
    for _ in range(2):
        with tf.GradientTape() as tape:
            tape.watch([s, e])
            loss = tf.reduce_sum(flce(s, e, y))
        runs.append([loss.numpy()] + [g.numpy() for g in tape.gradient(loss, [s, e])])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_keras_training_step_lowers_the_loss():
    """The op as a Keras loss head: a few optimizer steps on a fixed batch lower it."""
    s, e, y, *_ = problem(64, 500, 16, tf.float32)
    states, items = tf.Variable(s), tf.Variable(e)
    opt = tf.keras.optimizers.Adam(0.05)
    first = None
    for _ in range(20):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(flce(states, items, y, normalize=True, temperature=0.1))
        opt.apply_gradients(zip(tape.gradient(loss, [states, items]), [states, items]))
        first = float(loss) if first is None else first
    assert float(loss) < 0.5 * first


def test_normalize_numeric_gradient_and_zero_rows():
    """normalize: the items are normalised inside the kernel; its gradient through the norm
    (and a zero row, whose norm is clamped as tf.math.l2_normalize clamps it)."""
    s, e, y, b, pos, items, v, w = problem(6, 9, 3, tf.float64, extras=8)
    fused, ref = fns(y, pos, items, w, normalize=True, temperature=0.5, with_extras=True)
    # The normalisation's curvature makes the central differences' own error ~1e-5 (the
    # reference's numeric gradient is as far off; their analytic gradients agree to 1e-15).
    assert_numeric_gradient(fused, [s, e, b, v], [0, 1, 3], max_error=2e-5)
    e = tf.concat([e[:4], tf.zeros([1, 3], tf.float64), e[5:]], 0)
    assert_matches_reference(fused, ref, [s, e, b, v], tf.float64)
    assert_gradients_match_reference(fused, ref, [s, e, b, v], [0, 1, 3], tf.float64)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_item_gradient_in_the_items_own_buffer(dtype, normalize):
    """In a tf.function the items are an intermediate only the op reads, so its gradient op
    may write dItems over them (forward_input): the gradients equal the reference kernel's,
    with the items' rows read before their gradients are written (the targets' rows too)."""
    rng = np.random.default_rng(3)
    raw = tf.constant(rng.standard_normal((600, 19)).astype(np.float32))
    states = tf.constant(rng.standard_normal((130, 19)).astype(np.float32))
    targets = tf.constant(rng.integers(0, 600, 130), tf.int64)

    def grads(kernel):
        @tf.function
        def run():
            with tf.GradientTape() as tape:
                tape.watch([raw, states])
                items = tf.cast(raw * 2.0, dtype)  # a fresh buffer, the op its only reader
                loss = recops_tf.fused_linear_cross_entropy(
                    tf.cast(states, dtype), items, targets, temperature=0.5,
                    normalize=normalize, kernel=kernel)
                total = tf.reduce_sum(loss)
            return tape.gradient(total, [raw, states])
        return [g.numpy() for g in run()]

    for got, want in zip(grads("fused"), grads("reference")):
        rtol, atol = (2e-2, 2e-2) if dtype == tf.bfloat16 else (1e-4, 1e-5)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * max(np.abs(want).max(), 1))


# gradients_in_forward: the forward makes the gradients for a unit upstream in one pass over
# the logits (panels of up to 4 position blocks per thread), the backward scales them. d 20, 33
# and 50 take dE's last 4, 1 and 2 columns by dot products (the float GEMM's), 21 by its GEMM.
@pytest.mark.parametrize("panels", ["panels", "budget 0: forward then backward"])
@pytest.mark.parametrize("shape", [(70, 300, 16), (5, 3, 4), (2200, 301, 20), (130, 513, 33),
                                   (200, 400, 50), (90, 200, 21)])
@pytest.mark.parametrize("option", ["plain", "all", "normalize"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_in_forward_match_reference(dtype, option, shape, panels, monkeypatch):
    if panels != "panels":
        monkeypatch.setenv("RECOPS_FLCE_PANEL_MB", "0")
    P, N, d = shape
    s, e, y, b, pos, items, v, w = problem(P, N, d, dtype, extras=2 * P)
    options = dict(OPTIONS[option])

    def mean_loss(kernel):
        def fn(s, e, b, v):
            kw = dict(options)
            if kw.pop("with_bias", False):
                kw["bias"] = b
            if kw.pop("with_extras", False):
                kw["extra_logits"] = (pos, items, v)
            if kw.pop("with_weights", False):
                kw["weights"] = tf.cast(w, s.dtype)
            loss = flce(s, e, y, kernel=kernel, gradients_in_forward=kernel == "fused", **kw)
            # A mean over positions: one upstream value for every position (the one-pass case).
            return tf.reduce_mean(loss)[None]
        return fn

    args = [s, e, b, v]
    assert_matches_reference(mean_loss("fused"), mean_loss("reference"), args, dtype,
                             magnitude=10.0, reduction=N)
    assert_gradients_match_reference(mean_loss("fused"), mean_loss("reference"), args,
                                     [0, 1, 2, 3], dtype, magnitude=4.0, reduction=N)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_in_forward_with_any_upstream(dtype):
    """Per-position upstream gradients and lse's: the backward runs from scratch, exactly."""
    s, e, y, b, pos, items, v, w = problem(130, 300, 16, dtype, extras=200)
    fused, ref = fns(y, pos, items, w, with_bias=True, with_extras=True, label_smoothing=0.1)

    def fused_in_forward(s, e, b, v):
        return flce(s, e, y, return_lse=True, bias=b, extra_logits=(pos, items, v),
                    label_smoothing=0.1, gradients_in_forward=True)

    args = [s, e, b, v]
    assert_matches_reference(fused_in_forward, ref, args, dtype, magnitude=4.0, reduction=300)
    assert_gradients_match_reference(fused_in_forward, ref, args, [0, 1, 2, 3], dtype,
                                     magnitude=4.0, reduction=300)


def test_gradients_in_forward_equal_the_two_pass_gradients_in_float64():
    """The one-pass gradients (panels) and forward + backward, float64, the same to rounding."""
    s, e, y, *_ = problem(300, 1000, 24, tf.float64)
    out = []
    for one_pass in (False, True):
        with tf.GradientTape() as tape:
            tape.watch([s, e])
            loss = tf.reduce_sum(flce(s, e, y, temperature=0.3, gradients_in_forward=one_pass))
        out.append([loss] + tape.gradient(loss, [s, e]))
    for a, b in zip(*out):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("one_pass", [False, True])
def test_bfloat16_loss_is_the_float64_loss_of_its_values(one_pass):
    """bfloat16 inputs: products exact in float, sums in float, the logits' exp on a cubic
    (AVX-512; relative error below 1e-4): the loss and the logsumexp are the float64 op's on
    the same (bfloat16) values to 2e-4, over logits spanning 60 and more."""
    s, e, y, *_ = problem(300, 1000, 24, tf.bfloat16)
    out = {}
    for dtype in (tf.bfloat16, tf.float64):
        s_, e_ = tf.cast(s, dtype), tf.cast(e, dtype)
        with tf.GradientTape() as tape:
            tape.watch([s_, e_])
            loss, lse = flce(s_, e_, y, temperature=0.15, return_lse=True,
                             gradients_in_forward=one_pass)
        tape.gradient(tf.reduce_mean(loss), [s_, e_])
        out[dtype] = [tf.cast(t, tf.float64).numpy() for t in (loss, lse)]
    z = tf.cast(s, tf.float64).numpy() @ tf.cast(e, tf.float64).numpy().T / 0.15
    assert np.median(np.ptp(z, axis=1)) > 60
    for got, want in zip(out[tf.bfloat16], out[tf.float64]):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)


@pytest.mark.parametrize("panels", ["panels", "budget 0: forward then backward"])
def test_gradients_in_forward_round_bfloat16_once(panels, monkeypatch):
    """bfloat16: the unit gradients stay float until the upstream's factor (a mean's 1 / 300)
    is applied, so each gradient is rounded to bfloat16 once, as forward + backward rounds
    it, and is as close to the float64 oracle (rounded in the forward and again after the
    factor, as first written, the one-pass gradients' mean error is 1.15-1.18x the two-pass
    one's here; rounded once, 0.99x)."""
    if panels != "panels":
        monkeypatch.setenv("RECOPS_FLCE_PANEL_MB", "0")
    s, e, y, *_ = problem(300, 1000, 24, tf.bfloat16)
    grads = []
    for dtype, one_pass in ((tf.float64, False), (tf.bfloat16, False), (tf.bfloat16, True)):
        s_, e_ = tf.cast(s, dtype), tf.cast(e, dtype)
        with tf.GradientTape() as tape:
            tape.watch([s_, e_])
            loss = tf.reduce_mean(flce(s_, e_, y, temperature=0.3, gradients_in_forward=one_pass))
        grads.append([tf.cast(g, tf.float64).numpy() for g in tape.gradient(loss, [s_, e_])])
    oracle, two, one = grads
    for k in range(2):
        err_two = np.mean(np.abs(two[k] - oracle[k]))
        err_one = np.mean(np.abs(one[k] - oracle[k]))
        assert err_one <= 1.08 * err_two, (k, err_one, err_two)


def test_gradients_in_forward_past_the_panel_limit_calls_the_plain_op(monkeypatch):
    """Past PANEL_MAX_ITEMS the kernel would run forward then backward: the wrapper calls the
    plain op (no unit gradients held, no scaling pass), with the same gradients."""
    import sys
    # The module, not recops_tf.ops' function of the same name.
    module = sys.modules["recops_tf.ops.fused_linear_cross_entropy"]
    s, e, y, *_ = problem(30, 40, 8, tf.float32)

    def ops_and_grads():
        @tf.function
        def step(s, e):
            with tf.GradientTape() as tape:
                tape.watch([s, e])
                loss = tf.reduce_mean(flce(s, e, y, gradients_in_forward=True))
            return tape.gradient(loss, [s, e])
        graph = step.get_concrete_function(s, e).graph
        return {op.type for op in graph.get_operations()}, step(s, e)

    below, grads_below = ops_and_grads()
    monkeypatch.setitem(module.PANEL_MAX_ITEMS, tf.float32, 39)
    past, grads_past = ops_and_grads()
    assert "FusedLinearCrossEntropyWithGrad" in {t.split(">")[-1] for t in below}
    assert {t.split(">")[-1] for t in past} & {"FusedLinearCrossEntropyWithGrad"} == set()
    assert "FusedLinearCrossEntropy" in {t.split(">")[-1] for t in past}
    for a, b in zip(grads_below, grads_past):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_gradients_in_forward_deterministic():
    s, e, y, *_ = problem(700, 2000, 16, tf.float32)
    runs = []
    for _ in range(2):
        with tf.GradientTape() as tape:
            tape.watch([s, e])
            loss = tf.reduce_mean(flce(s, e, y, gradients_in_forward=True))
        runs.append([loss.numpy()] + [g.numpy() for g in tape.gradient(loss, [s, e])])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_apply_grad_checks_the_unit_gradients_shapes():
    s, e, y, *_ = problem(8, 20, 4, tf.float32)
    from recops_tf.ops._common import lib
    lib = lib()
    empty = tf.zeros([0], tf.float32)
    idx = tf.zeros([0], tf.int64)
    loss, lse, ds, de, db, dx = lib.recops_fused_linear_cross_entropy_with_grad(
        s, e, y, empty, idx, idx, empty, empty, Tout=tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="unit_ditems must have the shape"):
        lib.recops_fused_linear_cross_entropy_apply_grad(
            tf.ones([8]), tf.zeros([8]), ds, de[:3], db, dx, s, e, y, empty, idx, idx, empty,
            empty, lse)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dloss must be"):
        lib.recops_fused_linear_cross_entropy_apply_grad(
            tf.ones([7]), tf.zeros([8]), ds, de, db, dx, s, e, y, empty, idx, idx, empty,
            empty, lse)
