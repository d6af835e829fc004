"""Tests of the Keras 3 optimizers recops_tf.optimizers.LazyAdam and SparseSGD."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.optimizers import LazyAdam, SparseSGD
from recops_tf.reference import fused_lazy_adam as ref_adam
from recops_tf.reference import fused_sgd as ref_sgd
from recops_tf.testing import assert_close

BATCHES = [np.array([3, 1, 3, 0]), np.array([7, 3]), np.array([1, 1, 1]), np.array([], int)]


def sparse_grad(step, ids, dim):
    g = np.random.default_rng(step).standard_normal((len(ids), dim)).astype(np.float32)
    return tf.IndexedSlices(tf.constant(g), tf.constant(ids, tf.int64),
                            dense_shape=tf.constant([10, dim], tf.int64))


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_lazy_adam_matches_the_composite_over_steps(dtype):
    """Multi-step parity with TF-Addons LazyAdam (bias-corrected lr, composite update)."""
    init = np.random.default_rng(0).standard_normal((10, 4))
    var = tf.Variable(init, dtype=dtype)
    # lr exact in float32: Keras keeps the learning rate in a float32 variable.
    opt = LazyAdam(learning_rate=0.0625, beta_1=0.8, beta_2=0.95, epsilon=1e-6)
    composite = [tf.Variable(init, dtype=dtype), tf.Variable(tf.zeros([10, 4], dtype)),
                 tf.Variable(tf.zeros([10, 4], dtype))]
    for step, ids in enumerate(BATCHES):
        grad = sparse_grad(step, ids, 4)
        opt.apply([tf.IndexedSlices(tf.cast(grad.values, dtype), grad.indices,
                                    grad.dense_shape)], [var])
        t = step + 1
        lr = 0.0625 * np.sqrt(1 - 0.95 ** t) / (1 - 0.8 ** t)
        ref_adam.lazy_adam_update(*composite, tf.cast(grad.values, dtype), grad.indices,
                                  tf.constant(lr, dtype), 0.8, 0.95, 1e-6)
    assert_close(var, composite[0], dtype)
    untouched = [r for r in range(10) if r not in np.concatenate(BATCHES)]
    np.testing.assert_array_equal(var.numpy()[untouched],
                                  init.astype(dtype.as_numpy_dtype)[untouched])


def test_lazy_adam_dense_gradient_equals_keras_adam():
    init = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    a, b = tf.Variable(init), tf.Variable(init)
    ours, keras_adam = LazyAdam(0.01), keras.optimizers.Adam(0.01)
    for step in range(3):
        g = tf.constant(np.random.default_rng(step).standard_normal((5, 3)), tf.float32)
        ours.apply([g], [a])
        keras_adam.apply([g], [b])
    assert_close(a, b, tf.float32)


def test_sparse_sgd_matches_the_composite_and_decays_only_touched_rows():
    init = np.random.default_rng(2).standard_normal((10, 4)).astype(np.float32)
    var, composite = tf.Variable(init), tf.Variable(init)
    opt = SparseSGD(learning_rate=0.1, weight_decay=0.01)
    for step, ids in enumerate(BATCHES):
        grad = sparse_grad(step, ids, 4)
        opt.apply([grad], [var])
        ref_sgd.sgd_update(composite, grad.values, grad.indices, 0.1, 0.01)
    assert_close(var, composite, tf.float32)
    untouched = [r for r in range(10) if r not in np.concatenate(BATCHES)]
    np.testing.assert_array_equal(var.numpy()[untouched], init[untouched])


def test_sparse_sgd_dense_and_float64_paths():
    init = np.ones((2, 2))
    dense = tf.Variable(init, dtype=tf.float32)
    SparseSGD(0.5, weight_decay=0.1).apply([tf.ones([2, 2])], [dense])
    np.testing.assert_allclose(dense.numpy(), 1 - 0.5 * (1 + 0.1), rtol=1e-6)
    var64 = tf.Variable(init, dtype=tf.float64)
    SparseSGD(0.5, weight_decay=0.1).apply(
        [tf.IndexedSlices(tf.ones([2, 2], tf.float64), tf.constant([1, 1]))], [var64])
    np.testing.assert_allclose(var64.numpy(), [[1, 1], [1 - 2 * 0.5 * 1.1] * 2], rtol=1e-12)


def test_configs_round_trip():
    for opt in (LazyAdam(0.02, beta_1=0.7, epsilon=1e-5, clipnorm=1.0),
                SparseSGD(0.3, weight_decay=0.02)):
        config = opt.get_config()
        clone = type(opt).from_config(config)
        assert clone.get_config() == config
        restored = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
        assert type(restored) is type(opt) and restored.get_config() == config
    with pytest.raises(ValueError, match="weight_decay"):
        LazyAdam(weight_decay=0.1)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        SparseSGD(weight_decay=-1)


@pytest.mark.parametrize("optimizer", [lambda: LazyAdam(0.05), lambda: SparseSGD(0.5)],
                         ids=["lazy_adam", "sparse_sgd"])
def test_fit_with_a_keras_embedding_and_sparse_gradients(optimizer):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(256, 3))
    y = (ids[:, 0] % 2).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(50, 4),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer(), jit_compile=False,
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    first = model.evaluate(ids, y, verbose=0)
    model.fit(ids, y, epochs=8, batch_size=32, verbose=0)
    assert model.evaluate(ids, y, verbose=0) < 0.8 * first


def test_stock_fused_op_runs_in_the_optimizer():
    """The sparse float32 path is the fused kernel (its op is in the traced step)."""
    var = tf.Variable(tf.zeros([4, 2]))
    opt = LazyAdam(0.1)
    opt.build([var])

    @tf.function
    def step():
        opt.apply([tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1]))], [var])

    ops = {op.type for op in step.get_concrete_function().graph.get_operations()}
    assert "Recops>LazyAdam" in ops
    opt_sgd = SparseSGD(0.1)
    opt_sgd.build([var])
    sgd_step = tf.function(
        lambda: opt_sgd.apply([tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1]))], [var]))
    assert "Recops>Sgd" in {op.type for op in sgd_step.get_concrete_function().graph
                            .get_operations()}


def _table_and_twin(num_slots=2):
    """A table with keys 0..5, and a twin with the same rows (the oracle's copy)."""
    rows = np.random.default_rng(4).standard_normal((6, 3 * (1 + num_slots))).astype(np.float32)
    tables = [recops_tf.DynamicEmbeddingTable(3, num_slots=num_slots) for _ in range(2)]
    for t in tables:
        t.assign(np.arange(6), rows)
    return tables


def _table_gradient(table, keys):
    with tf.GradientTape() as tape:
        y = recops_tf.embedding_lookup(table, keys, training=False)
        loss = tf.reduce_sum(y * tf.range(1.0, 4.0))
    return tape.gradient(loss, table.resource_handle), tape


def test_lazy_adam_steps_a_raw_table_with_bias_correction():
    table, twin = _table_and_twin()
    opt = LazyAdam(0.0625, beta_1=0.8, beta_2=0.95, epsilon=1e-6)
    for step, keys in enumerate([[1, 4, 1], [4, 2]]):
        grad, _ = _table_gradient(table, keys)
        opt.apply_gradients([(grad, table)])
        t = step + 1
        recops_tf.lazy_adam_update(twin, None, None, _table_gradient(twin, keys)[0], None,
                                   0.0625 * np.sqrt(1 - 0.95 ** t) / (1 - 0.8 ** t),
                                   beta1=0.8, beta2=0.95, epsilon=1e-6)
    assert int(opt.iterations) == 2
    assert_close(table.export()[1], twin.export()[1], tf.float32)  # lr_t rounds differently


def test_sparse_sgd_steps_a_raw_table_given_as_the_tapes_watched_variable():
    table, twin = _table_and_twin(num_slots=0)
    grad, tape = _table_gradient(table, [0, 5, 0])
    [watched] = tape.watched_variables()  # what the lookup recorded: stands for the table
    SparseSGD(0.5, weight_decay=0.1).apply_gradients([(grad, watched)])
    recops_tf.sgd_update(twin, _table_gradient(twin, [0, 5, 0])[0], None, 0.5, 0.1)
    np.testing.assert_array_equal(table.export()[1].numpy(), twin.export()[1].numpy())


def test_global_clipnorm_keeps_sparse_gradients_sparse():
    """Keras' global-norm clipping would densify an IndexedSlices (and fail for a table's)."""
    table, twin = _table_and_twin(num_slots=0)
    grad, _ = _table_gradient(table, [2, 3])
    norm = float(tf.norm(grad.values))
    var = tf.Variable(tf.ones([4, 3]))
    var_grad = tf.IndexedSlices(tf.fill([1, 3], 2.0), tf.constant([1]), tf.constant([4, 3]))
    SparseSGD(1.0, global_clipnorm=1.0).apply_gradients([(grad, table), (var_grad, var)])
    scale = 1.0 / np.hypot(norm, np.sqrt(12.0))
    twin_grad = _table_gradient(twin, [2, 3])[0]
    recops_tf.sgd_update(twin, twin_grad.values * scale, twin_grad.indices, 1.0)
    np.testing.assert_allclose(table.export()[1].numpy(), twin.export()[1].numpy(), rtol=1e-6)
    expected = np.ones((4, 3), np.float32)
    expected[1] -= 2.0 * scale
    np.testing.assert_allclose(var.numpy(), expected, rtol=1e-6)


def test_lazy_adam_docstring_example_runs():
    import doctest

    from recops_tf.optimizers import lazy_adam

    [test] = doctest.DocTestFinder(recurse=False).find(
        LazyAdam, "LazyAdam", globs={**vars(lazy_adam), "recops_tf": recops_tf})
    assert test.examples and doctest.DocTestRunner().run(test).failed == 0


@pytest.mark.parametrize("optimizer", [lambda: LazyAdam(0.1), lambda: SparseSGD(0.1)],
                         ids=["lazy_adam", "sparse_sgd"])
def test_sparse_gradients_of_vectors_and_rank_3_tables(optimizer):
    """tf.gather of a bias vector or of a [V, a, b] table gives IndexedSlices the row kernel
    (float32 matrices) does not take: the stock-op step updates exactly the gathered rows."""
    vector = tf.Variable(tf.zeros([6]))
    cube = tf.Variable(tf.zeros([5, 2, 3]))
    opt = optimizer()
    with tf.GradientTape() as tape:
        loss = (tf.reduce_sum(tf.gather(vector, [1, 4])) +
                tf.reduce_sum(tf.gather(cube, [2])))
    grads = tape.gradient(loss, [vector, cube])
    assert all(isinstance(g, tf.IndexedSlices) for g in grads)
    opt.apply(grads, [vector, cube])
    assert np.flatnonzero(vector.numpy()).tolist() == [1, 4]
    moved = np.flatnonzero(np.abs(cube.numpy()).sum(axis=(1, 2)))
    assert moved.tolist() == [2] and np.all(cube.numpy()[2] < 0)
