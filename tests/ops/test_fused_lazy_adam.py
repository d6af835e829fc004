"""Tests of stem fused_lazy_adam: lazy_adam_update on variables and on a table by address."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.reference import fused_lazy_adam as ref
from recops_tf.testing import MODES, assert_close
from recops_tf.testing.cases import zipf_ids

INDEX_DTYPES = (tf.int32, tf.int64)
HYPER = dict(beta1=0.9, beta2=0.99, epsilon=1e-7)


def variables(num_rows=12, dim=5, seed=0):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal((num_rows, dim)), 0.1 * rng.standard_normal((num_rows, dim)),
            rng.random((num_rows, dim))]
    return [np.asarray(x, np.float32) for x in init]


def run_both(indices, index_dtype=tf.int64, mode="eager", num_rows=12, dim=5, lr=0.05):
    init = variables(num_rows, dim)
    fused, composite = [tf.Variable(x) for x in init], [tf.Variable(x) for x in init]
    gradient = np.random.default_rng(3).standard_normal((len(indices), dim)).astype(np.float32)
    indices = tf.constant(indices, index_dtype)

    def step(g, i):
        recops_tf.lazy_adam_update(*fused, g, i, lr, **HYPER)

    if mode == "function":
        step = tf.function(step, input_signature=[tf.TensorSpec([None, dim], tf.float32),
                                                  tf.TensorSpec(None, index_dtype)])
    step(tf.constant(gradient), indices)
    ref.lazy_adam_update(*composite, gradient, indices, lr, **HYPER)
    return init, fused, composite


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("indices", [[3, 0, 11, 3, 3, 7], [-1, 4, -1, 4], [], [[2], [9], [2]]],
                         ids=["duplicates", "negative", "empty", "column"])
def test_matches_composite(indices, index_dtype, mode):
    init, fused, composite = run_both(indices, index_dtype, mode)
    for f, c in zip(fused, composite):
        assert_close(f, c, tf.float32)
    touched = {i for i in np.ravel(indices) if i >= 0}
    untouched = [r for r in range(12) if r not in touched]
    for f, x in zip(fused, init):  # lazy: the other rows are bit-identical
        np.testing.assert_array_equal(f.numpy()[untouched], x[untouched])


def _large_batch(kind, n=4096, num_rows=5000):
    rng = np.random.default_rng(7)
    if kind == "zipf":
        return zipf_ids(rng, n, num_rows)
    if kind == "one_row":
        return np.full(n, 7)
    if kind == "narrow_and_far":  # a few low rows and the last one: most ids in one bucket
        return np.concatenate([rng.integers(0, 8, n - 1), [num_rows - 1]])
    if kind == "negative_mix":
        return np.where(rng.random(n) < 0.3, -1, zipf_ids(rng, n, num_rows))
    return np.arange(n)[::-1]  # "descending": distinct


@pytest.mark.parametrize("kind", ["zipf", "one_row", "narrow_and_far", "negative_mix",
                                  "descending"])
def test_batches_split_among_threads_match_composite(kind):
    # 4,096 ids of 8 floats are enough work to be split into tasks by row range (up to one
    # bucket per hot row); every row must still be updated once with all its gradients.
    indices = _large_batch(kind)
    init, fused, composite = run_both(indices, num_rows=5000, dim=8)
    for f, c in zip(fused, composite):
        assert_close(f, c, tf.float32)
    untouched = np.setdiff1d(np.arange(5000), indices)
    for f, x in zip(fused, init):
        np.testing.assert_array_equal(f.numpy()[untouched], x[untouched])


def test_duplicates_are_summed_before_one_step():
    init = variables()
    a, b = [tf.Variable(x) for x in init], [tf.Variable(x) for x in init]
    g = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    recops_tf.lazy_adam_update(*a, g, [4, 4, 4], 0.1, **HYPER)
    recops_tf.lazy_adam_update(*b, (g[0] + g[1] + g[2])[None], [4], 0.1, **HYPER)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_table_by_address_matches_composite():
    init = variables(num_rows=30, dim=4)
    table = recops_tf.DynamicEmbeddingTable(4, num_slots=2, initializer="zeros")
    table.assign(np.arange(30), np.concatenate(init, 1))
    ids = np.array([5, 29, 5, 0, 12])
    addresses = table.lookup_addresses(ids, training=False).numpy()
    addresses[3] = 0  # skipped
    g = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)
    recops_tf.lazy_adam_update(table, None, None, tf.IndexedSlices(g, addresses), None, 0.01,
                               **HYPER)
    composite = [tf.Variable(x) for x in init]
    ref.lazy_adam_update(*composite, g, np.where(addresses == 0, -1, ids), 0.01, **HYPER)
    rows = table.export()[1].numpy()
    for k, c in enumerate(composite):
        assert_close(rows[:, 4 * k:4 * (k + 1)], c, tf.float32)


def test_a_reader_of_the_old_value_keeps_it():
    var, m, v = [tf.Variable(x) for x in variables()]
    before = tf.identity(var.read_value())
    snapshot = before.numpy().copy()
    recops_tf.lazy_adam_update(var, m, v, np.ones((1, 5), np.float32), [0], 0.1)
    np.testing.assert_array_equal(before.numpy(), snapshot)
    assert not np.array_equal(var.numpy(), snapshot)


def test_out_of_range_index_raises_and_writes_nothing():
    init = variables()
    var, m, v = [tf.Variable(x) for x in init]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[1\] = 12 is out of range"):
        recops_tf.lazy_adam_update(var, m, v, np.ones((2, 5), np.float32), [0, 12], 0.1)
    for x, y in zip((var, m, v), init):
        np.testing.assert_array_equal(x.numpy(), y)


@pytest.mark.parametrize("bad,message", [
    (dict(gradient=np.ones((2, 4), np.float32)), r"gradient must have shape \[N, 5\]"),
    (dict(indices=[0, 1, 2]), r"indices must have shape \[N\] or \[N, 1\]"),
    (dict(lr=[0.1, 0.2]), "lr must be a scalar"),
    (dict(lr=float("nan")), "lr must be finite"),
    (dict(beta1=1.0), r"beta1 must be in \[0, 1\)"),
    (dict(beta2=-0.1), r"beta2 must be in \[0, 1\)"),
    (dict(epsilon=0.0), "epsilon must be positive"),
])
def test_validation(bad, message):
    var, m, v = [tf.Variable(x) for x in variables()]
    args = dict(gradient=np.ones((2, 5), np.float32), indices=[0, 1], lr=0.1)
    args.update(bad)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        recops_tf.lazy_adam_update(var, m, v, **args)


def test_variable_validation():
    var, m, v = [tf.Variable(x) for x in variables()]
    g = np.ones((1, 5), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="of var's shape"):
        recops_tf.lazy_adam_update(var, m, tf.Variable(tf.zeros([12, 4])), g, [0], 0.1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="are the same variable"):
        recops_tf.lazy_adam_update(var, m, m, g, [0], 0.1)
    with pytest.raises(TypeError, match="resource tf.Variable"):
        recops_tf.lazy_adam_update(tf.zeros([12, 5]), m, v, g, [0], 0.1)
    table = recops_tf.DynamicEmbeddingTable(5)
    a = table.lookup_addresses([1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_slots >= 2"):
        recops_tf.lazy_adam_update(table, None, None, g, a, 0.1)
    with pytest.raises(ValueError, match="m=None"):
        recops_tf.lazy_adam_update(table, m, v, g, a, 0.1)
    with pytest.raises(ValueError, match="indices only with a dense"):
        recops_tf.lazy_adam_update(var, m, v, tf.IndexedSlices(g, [0]), [0], 0.1)


@pytest.mark.parametrize("case,message", [
    ("all_float64", "^lazy_adam_update: var must be float32, got float64$"),
    ("m_float64", "^lazy_adam_update: m must be float32, got float64$"),
    ("gradient_float64", "^lazy_adam_update: gradient must be float32, got float64$"),
])
def test_a_dtype_other_than_float32_is_named(case, message):
    """A float64 var is blamed before its float64 gradient is converted."""
    f64 = [tf.Variable(tf.zeros([12, 5], tf.float64)) for _ in range(3)]
    var, m, v = [tf.Variable(x) for x in variables()]
    g, g64 = np.ones((1, 5), np.float32), tf.ones([1, 5], tf.float64)
    args = {"all_float64": (*f64, g64), "m_float64": (var, f64[1], v, g),
            "gradient_float64": (var, m, v, g64)}[case]
    with pytest.raises(TypeError, match=message):
        recops_tf.lazy_adam_update(*args, [0], 0.1)


def test_a_missing_gradient_says_why():
    var, m, v = [tf.Variable(x) for x in variables()]
    with pytest.raises(ValueError, match="^lazy_adam_update: gradient is None: the loss does "
                                         "not depend on var$"):
        recops_tf.lazy_adam_update(var, m, v, None, [0], 0.1)
    table = recops_tf.DynamicEmbeddingTable(5, num_slots=2)
    with pytest.raises(ValueError, match=r"gradient is None.*table\.resource_handle"):
        recops_tf.lazy_adam_update(table, None, None, None, None, 0.1)
