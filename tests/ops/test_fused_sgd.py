"""Tests of stem fused_sgd: sgd_update on variables and on a table by address."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.reference import fused_sgd as ref
from recops_tf.testing import MODES, assert_close

INDEX_DTYPES = (tf.int32, tf.int64)


def init(num_rows=10, dim=3, seed=0):
    return np.random.default_rng(seed).standard_normal((num_rows, dim)).astype(np.float32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("indices", [[1, 9, 1, 1, 0], [-1, 2, -5], [], [[4], [4]]],
                         ids=["duplicates", "negative", "empty", "column"])
def test_matches_composite(indices, index_dtype, weight_decay, mode):
    x = init()
    fused, composite = tf.Variable(x), tf.Variable(x)
    g = np.random.default_rng(1).standard_normal((len(indices), 3)).astype(np.float32)
    idx = tf.constant(indices, index_dtype)

    def step(g, i):
        recops_tf.sgd_update(fused, g, i, 0.5, weight_decay)

    if mode == "function":
        step = tf.function(step)
    step(tf.constant(g), idx)
    ref.sgd_update(composite, g, idx, 0.5, weight_decay)
    assert_close(fused, composite, tf.float32)


def test_duplicates_accumulate_with_weight_decay_per_occurrence():
    var = tf.Variable([[2.0]])
    recops_tf.sgd_update(var, [[1.0], [3.0]], [0, 0], lr=0.1, weight_decay=0.5)
    # each occurrence: -0.1 * (g + 0.5 * 2.0)
    np.testing.assert_allclose(var.numpy(), [[2.0 - 0.1 * (1 + 1) - 0.1 * (3 + 1)]], rtol=1e-6)


def test_table_by_address_matches_composite():
    x = init(num_rows=20, dim=4)
    table = recops_tf.DynamicEmbeddingTable(4, initializer="zeros")
    table.assign(np.arange(20), x)
    ids = np.array([3, 3, 19, 7])
    addresses = table.lookup_addresses(ids, training=False).numpy()
    addresses[2] = 0
    g = np.ones((4, 4), np.float32)
    recops_tf.sgd_update(table, g, addresses, 0.1, weight_decay=0.01)
    composite = tf.Variable(x)
    ref.sgd_update(composite, g, np.where(addresses == 0, -1, ids), 0.1, 0.01)
    assert_close(table.export()[1], composite, tf.float32)


def test_addresses_must_match_the_gradient_rows():
    table = recops_tf.DynamicEmbeddingTable(3, num_slots=2)
    a = table.lookup_addresses([1, 2])
    for step in (lambda: recops_tf.sgd_update(table, np.ones((3, 3), np.float32), a, 0.1),
                 lambda: recops_tf.lazy_adam_update(table, None, None,
                                                    np.ones((3, 3), np.float32), a, 0.1)):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="address must be a vector of gradient's 3 rows"):
            step()


def test_out_of_range_raises_and_writes_nothing():
    x = init()
    var = tf.Variable(x)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[2\] = 10 is out of range"):
        recops_tf.sgd_update(var, np.ones((3, 3), np.float32), [0, 1, 10], 0.1)
    np.testing.assert_array_equal(var.numpy(), x)


@pytest.mark.parametrize("bad,message", [
    (dict(gradient=np.ones((2, 2), np.float32)), r"gradient must have shape \[N, 3\]"),
    (dict(indices=[[0, 1]]), r"indices must have shape \[N\] or \[N, 1\]"),
    (dict(lr=[0.1]), "lr must be a scalar"),
    (dict(weight_decay=-1.0), "weight_decay must be >= 0"),
])
def test_validation(bad, message):
    args = dict(gradient=np.ones((2, 3), np.float32), indices=[0, 1], lr=0.1)
    args.update(bad)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        recops_tf.sgd_update(tf.Variable(init()), **args)
    with pytest.raises(TypeError, match="^sgd_update: var must be float32, got float64$"):
        recops_tf.sgd_update(tf.Variable(tf.zeros([10, 3], tf.float64)),
                             tf.ones((1, 3), tf.float64), [0], 0.1)
