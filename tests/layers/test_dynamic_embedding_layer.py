"""Tests of the DynamicEmbedding Keras layer (growing table + LazyAdam / SparseSGD)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from recops_tf.layers import DynamicEmbedding
from recops_tf.optimizers import LazyAdam, SparseSGD


def data(n=256, fields=4, vocab=60, seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, vocab, size=(n, fields)).astype(np.int64) * 1_000_003
    y = ((keys[:, 0] // 1_000_003) % 2).astype(np.float32)
    return keys, y


def model_with(layer, fields=4, optimizer=None):
    inputs = keras.Input((fields,), dtype="int64")
    out = keras.layers.Dense(1)(keras.layers.Flatten()(layer(inputs)))
    model = keras.Model(inputs, out)
    model.compile(optimizer=optimizer or LazyAdam(0.02), jit_compile=False,
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def test_shapes_dense_and_ragged():
    layer = DynamicEmbedding(6)
    assert layer(tf.constant([[1, 2, 3]], tf.int64), training=True).shape == [1, 3, 6]
    ragged = layer(tf.ragged.constant([[1, 2], [3]], tf.int64), training=True)
    assert isinstance(ragged, tf.RaggedTensor) and ragged.flat_values.shape == [3, 6]
    assert layer.compute_output_shape((None, 3)) == (None, 3, 6)


def test_inference_gives_zeros_for_unseen_keys_and_does_not_grow():
    layer = DynamicEmbedding(4, padding_key=0)
    seen = layer(tf.constant([5, 0], tf.int64), training=True).numpy()
    assert (seen[1] == 0).all() and (seen[0] != 0).any()
    out = layer(tf.constant([5, 6], tf.int64)).numpy()  # training unset: inference
    np.testing.assert_array_equal(out[0], seen[0])
    assert (out[1] == 0).all() and layer.table.size().numpy() == 1


@pytest.mark.parametrize("optimizer", [lambda: LazyAdam(0.02), lambda: SparseSGD(0.5)],
                         ids=["lazy_adam", "sparse_sgd"])
def test_fit_grows_the_table_and_learns(optimizer):
    keys, y = data()
    keras.utils.set_random_seed(0)
    layer = DynamicEmbedding(8)
    model = model_with(layer, optimizer=optimizer())
    model.fit(keys, y, epochs=6, batch_size=32, verbose=0)
    assert layer.table.size().numpy() == len(np.unique(keys))
    assert model.evaluate(keys, y, verbose=0) < 0.5  # 0.69 at chance
    unseen = keys + 1
    np.testing.assert_array_equal(layer(unseen).numpy(), 0)
    assert layer.table.size().numpy() == len(np.unique(keys))


def test_checkpoint_saved_model_and_continued_training(tmp_path):
    """Acceptance 4: fit, save (checkpoint and SavedModel), restore, same table, train on."""
    keys, y = data()
    keras.utils.set_random_seed(0)
    layer = DynamicEmbedding(8)
    model = model_with(layer)
    model.fit(keys, y, epochs=2, batch_size=64, verbose=0)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(
        str(tmp_path / "ckpt"))
    model.export(str(tmp_path / "saved"), format="tf_saved_model", verbose=False)

    restored_layer = DynamicEmbedding(8)
    restored = model_with(restored_layer)
    restored.optimizer.build(restored.trainable_variables)
    tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).restore(
        path).assert_consumed()
    for a, b in zip(layer.table.export(), restored_layer.table.export()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())  # keys, rows, m and v
    np.testing.assert_array_equal(restored.predict(keys, verbose=0),
                                  model.predict(keys, verbose=0))
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    served = loaded.serve(tf.constant(keys))
    np.testing.assert_allclose(served.numpy(), model.predict(keys, verbose=0), rtol=1e-6)

    # Training continues identically from either copy, and the table keeps growing.
    more = keys[:128] + 7
    for m in (model, restored):
        m.fit(more, y[:128], epochs=1, batch_size=64, verbose=0, shuffle=False)
    for a, b in zip(layer.table.export(), restored_layer.table.export()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    assert restored_layer.table.size().numpy() == len(np.unique(np.concatenate([keys, more])))


def test_keras_file_round_trip_and_config(tmp_path):
    keys, y = data(n=64)
    layer = DynamicEmbedding(4, initializer=keras.initializers.RandomNormal(0.0, 0.1),
                             padding_key=-1, num_slots=2, block_rows=128, seed=5)
    model = model_with(layer)
    model.fit(keys, y, epochs=1, batch_size=32, verbose=0)
    model.save(str(tmp_path / "m.keras"))
    loaded = keras.models.load_model(str(tmp_path / "m.keras"))
    np.testing.assert_array_equal(loaded.predict(keys, verbose=0), model.predict(keys, verbose=0))
    clone = DynamicEmbedding.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    assert clone.table.block_rows == 128 and clone.table.padding_key == -1


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])  # densifies / scatters the gradient
def test_a_stock_keras_optimizer_is_refused_with_the_ones_to_use(optimizer):
    keys, y = data(n=8)
    model = model_with(DynamicEmbedding(2), optimizer=keras.optimizers.get(optimizer))
    with pytest.raises((ValueError, TypeError),
                       match="recops_tf.optimizers.LazyAdam or recops_tf"):
        model.fit(keys, y, epochs=1, batch_size=8, verbose=0)


def test_float_keys_are_refused_and_other_integer_dtypes_are_keys():
    layer = DynamicEmbedding(3)
    with pytest.raises(TypeError, match="keys must be integers, got float32"):
        layer(tf.constant([1.0, 1.7]), training=True)
    with pytest.raises(TypeError, match="keys must be integers, got float"):
        layer(tf.ragged.constant([[1.0], [2.0]]), training=True)
    wide = layer(tf.constant([3, 9], tf.int64), training=True).numpy()
    np.testing.assert_array_equal(layer(tf.constant([3, 9], tf.int16)).numpy(), wide)
    assert layer.table.size().numpy() == 2


def test_no_xla_for_models_with_the_layer():
    from keras.src.trainers.trainer import model_supports_jit  # what jit_compile="auto" asks

    inputs = keras.Input((2,), dtype="int64")
    layer = DynamicEmbedding(2)
    model = keras.Model(inputs, keras.layers.Flatten()(layer(inputs)))
    assert layer.supports_jit is False and not model_supports_jit(model)
    assert model_supports_jit(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    with pytest.warns(UserWarning, match="doesn't support `jit_compile=True`"):
        model.compile(loss="mse", jit_compile=True)
    assert model.jit_compile is False


def test_count_params_is_rows_times_dim_and_grows():
    inputs = keras.Input((3,), dtype="int64")
    layer = DynamicEmbedding(4, padding_key=0)
    model = keras.Model(inputs, layer(inputs))
    assert layer.count_params() == 0
    layer(tf.constant([[5, 6, 0]], tf.int64), training=True)
    assert layer.count_params() == 2 * 4
    layer(tf.constant(np.arange(1, 301).reshape(100, 3), tf.int64), training=True)
    assert layer.count_params() == 300 * 4
    lines = []
    model.summary(print_fn=lines.append)
    row = next(line for line in "\n".join(lines).splitlines() if "dynamic_embedding" in line)
    assert "1,200" in row


def _summed_by_key(gradient):
    """An IndexedSlices keyed by address as {address: summed row}."""
    out = {}
    for i, row in zip(gradient.indices.numpy(), gradient.values.numpy()):
        out[i] = out.get(i, 0.0) + row
    return out


@pytest.mark.parametrize("graph", [False, True])
def test_covering_lookup_gives_one_gradient_equal_to_two_lookups(graph):
    """covering_lookup(keys, positions) reads the same rows as two lookups and gives the
    anchor one IndexedSlices of len(keys) rows whose sums by address are the two lookups'
    (repeated positions accumulate); an upstream another op also reads (a broadcast) is not
    written in place: a second call gives the same gradient."""
    layer = DynamicEmbedding(5, seed=1)
    keys = tf.constant([11, 12, 13, 14], tf.int64)
    positions = tf.constant([2, 0, 2, 3, 2], tf.int64)
    weights = tf.reshape(tf.range(25, dtype=tf.float32), [5, 5]) / 10.0

    def both():
        with tf.GradientTape() as tape:
            rows, part = layer.covering_lookup(keys, positions, training=True)
            loss = tf.reduce_sum(rows) + tf.reduce_sum(part * weights)
        with tf.GradientTape() as tape2:
            loss2 = (tf.reduce_sum(layer(keys, training=True)) +
                     tf.reduce_sum(layer(tf.gather(keys, positions), training=True) * weights))
        return (rows, part, tape.gradient(loss, layer.gradient_anchor),
                tape2.gradient(loss2, layer.gradient_anchor), loss, loss2)

    fn = tf.function(both) if graph else both
    for _ in range(2):
        rows, part, one, two, loss, loss2 = fn()
        np.testing.assert_array_equal(part.numpy(), tf.gather(rows, positions).numpy())
        np.testing.assert_allclose(loss.numpy(), loss2.numpy(), rtol=1e-6)
        assert one.values.shape[0] == 4 and two.values.shape[0] == 9
        got, want = _summed_by_key(one), _summed_by_key(two)
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-6)


def test_covering_lookup_checks_its_keys():
    layer = DynamicEmbedding(3)
    with pytest.raises(TypeError, match="rank-1 integer keys"):
        layer.covering_lookup(tf.constant([[1, 2]], tf.int64), [0])
    with pytest.raises(TypeError, match="rank-1 integer keys"):
        layer.covering_lookup(tf.constant([1.0, 2.0]), [0])
    with pytest.raises(tf.errors.InvalidArgumentError):
        layer.covering_lookup(tf.constant([1, 2], tf.int64), [5], training=True)
