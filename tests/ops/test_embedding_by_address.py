"""Tests of stem embedding_by_address: the growing table, by-address lookup and update, and
embedding_lookup (the tf.gather drop-in)."""
import concurrent.futures

import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.reference import embedding_by_address as ref
from recops_tf.testing import MODES, assert_close, in_mode
from recops_tf.testing.cases import zipf_ids


def mirrored(num_rows=20, dim=4, num_slots=0, seed=0):
    """A table with key k at row k, and its rows as a dense matrix."""
    rng = np.random.default_rng(seed)
    table = recops_tf.DynamicEmbeddingTable(dim, num_slots=num_slots, initializer="zeros")
    rows = rng.standard_normal((num_rows, table.width)).astype(np.float32)
    table.assign(np.arange(num_rows), rows)
    return table, rows


def rows_of(table, addresses):
    """Row index of each address (-1 for 0), through the table's key order."""
    keys = table.export()[0].numpy()
    by_address = dict(zip(table.lookup_addresses(keys, training=False).numpy(),
                          range(len(keys))))
    return np.array([by_address.get(a, -1) if a else -1 for a in np.ravel(addresses)])


# --- the table ---------------------------------------------------------------------------------

def test_training_lookup_allocates_one_row_per_key():
    table = recops_tf.DynamicEmbeddingTable(3, block_rows=4)
    a = table.lookup_addresses([10, 20, 10, 30]).numpy()
    assert a[0] == a[2] and len({a[0], a[1], a[3]}) == 3 and (a != 0).all()
    assert table.size().numpy() == 3 and table.capacity().numpy() == 4
    b = table.lookup_addresses([20, 40, 50]).numpy()
    assert b[0] == a[1]
    assert table.size().numpy() == 5 and table.capacity().numpy() == 8  # grew by one block
    assert table.export()[0].numpy().tolist() == [10, 20, 30, 40, 50]


def test_inference_lookup_of_unknown_key_is_zero_and_allocates_nothing():
    table = recops_tf.DynamicEmbeddingTable(3)
    known = table.lookup_addresses([1]).numpy()[0]
    a = table.lookup_addresses([1, 2], training=False).numpy()
    assert a.tolist() == [known, 0]
    assert table.size().numpy() == 1
    y = recops_tf.embedding_lookup(table, [2], training=False).numpy()
    assert (y == 0).all()


def test_padding_key_maps_to_zero_address_and_zero_rows():
    table = recops_tf.DynamicEmbeddingTable(2, padding_key=-1)
    a = table.lookup_addresses([-1, 5, -1]).numpy()
    assert a[0] == 0 and a[2] == 0 and a[1] != 0
    assert table.size().numpy() == 1
    y = recops_tf.embedding_lookup_by_address(table, a).numpy()
    assert (y[0] == 0).all() and (y[1] != 0).any()


def test_keys_may_be_ragged_or_int32_and_any_shape():
    table = recops_tf.DynamicEmbeddingTable(2)
    ragged = table.lookup_addresses(tf.ragged.constant([[1, 2], [], [1]]))
    assert isinstance(ragged, tf.RaggedTensor) and ragged.flat_values.shape == [3]
    dense = table.lookup_addresses(tf.constant([[1], [2]], tf.int32))
    assert dense.shape == [2, 1] and dense.numpy()[0, 0] == ragged.flat_values.numpy()[0]
    with pytest.raises(TypeError, match="int32 or int64"):
        table.lookup_addresses(tf.constant([1.0]))


def test_new_rows_depend_only_on_seed_and_key():
    keys = np.arange(100) * 7
    a = recops_tf.DynamicEmbeddingTable(8, seed=3)
    b = recops_tf.DynamicEmbeddingTable(8, seed=3)
    ya = recops_tf.embedding_lookup(a, keys).numpy()
    b.lookup_addresses(keys[::-1])  # another insertion order
    yb = recops_tf.embedding_lookup(b, keys).numpy()
    np.testing.assert_array_equal(ya, yb)
    yc = recops_tf.embedding_lookup(recops_tf.DynamicEmbeddingTable(8, seed=4), keys).numpy()
    assert not np.array_equal(ya, yc)


@pytest.mark.parametrize("initializer,check", [
    ("zeros", lambda y: (y == 0).all()),
    ("uniform", lambda y: y.min() >= -0.05 and y.max() < 0.05 and abs(y.std() - 0.0289) < 3e-3),
    ("normal", lambda y: abs(y.mean()) < 3e-3 and abs(y.std() - 0.05) < 3e-3),
    ("truncated_normal", lambda y: np.abs(y).max() <= 0.1 and abs(y.std() - 0.044) < 3e-3),
])
def test_initializer_distributions(initializer, check):
    table = recops_tf.DynamicEmbeddingTable(16, initializer=initializer, num_slots=2)
    y = recops_tf.embedding_lookup(table, np.arange(2000)).numpy()
    assert check(y)
    slots = table.export()[1].numpy()[:, 16:]
    assert (slots == 0).all()


def test_keras_initializers_map_to_the_kernel():
    import keras

    table = recops_tf.DynamicEmbeddingTable(
        4, initializer=keras.initializers.RandomUniform(1.0, 2.0))
    y = recops_tf.embedding_lookup(table, np.arange(50)).numpy()
    assert y.min() >= 1.0 and y.max() < 2.0
    const = recops_tf.DynamicEmbeddingTable(4, initializer=keras.initializers.Constant(0.5))
    assert (recops_tf.embedding_lookup(const, [3]).numpy() == 0.5).all()
    with pytest.raises(TypeError, match="not supported"):
        recops_tf.DynamicEmbeddingTable(4, initializer=keras.initializers.Orthogonal())
    with pytest.raises(ValueError, match="initializer must be one of"):
        recops_tf.DynamicEmbeddingTable(4, initializer="glorot")
    with pytest.raises(tf.errors.InvalidArgumentError, match="minval < maxval"):
        recops_tf.DynamicEmbeddingTable(4, initializer=keras.initializers.RandomUniform(1, 1))


# --- lookup and update by address --------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_lookup_matches_reference(mode):
    table, rows = mirrored(num_slots=2)
    ids = np.array([0, 19, 3, 3, 7])
    addresses = tf.concat([table.lookup_addresses(ids, training=False), [0]], 0)
    fn = in_mode(lambda a: recops_tf.embedding_lookup_by_address(table, a), mode, [addresses])
    expected = ref.embedding_lookup_by_address(rows, np.append(ids, -1), 4)
    np.testing.assert_array_equal(fn(addresses).numpy(), expected.numpy())
    wide = recops_tf.embedding_lookup_by_address(table, addresses, embedding_dim=12)
    np.testing.assert_array_equal(wide.numpy(),
                                  ref.embedding_lookup_by_address(rows, np.append(ids, -1)))


def test_lookup_keeps_the_shape_of_addresses_and_raggedness():
    table, rows = mirrored()
    ids = tf.ragged.constant([[1, 2, 3], [], [4]], tf.int64)
    y = recops_tf.embedding_lookup(table, ids, training=False)
    assert isinstance(y, tf.RaggedTensor) and y.flat_values.shape == [4, 4]
    np.testing.assert_array_equal(y.flat_values.numpy(), rows[[1, 2, 3, 4]])
    y2 = recops_tf.embedding_lookup_by_address(table, table.lookup_addresses([[1, 2]]))
    assert y2.shape == [1, 2, 4]


@pytest.mark.parametrize("update_type", ["add", "assign"])
@pytest.mark.parametrize("width", [4, 12])
def test_update_matches_reference(update_type, width):
    table, rows = mirrored(num_slots=2)
    ids = np.array([3, 5, 3, 0, 3, 19])
    addresses = table.lookup_addresses(ids, training=False).numpy()
    addresses[1] = 0  # skipped
    values = np.random.default_rng(1).standard_normal((6, width)).astype(np.float32)
    y = recops_tf.embedding_update_by_address(table, addresses, values, update_type)
    np.testing.assert_array_equal(y.numpy(), values)  # the output is the input
    expected = ref.embedding_update_by_address(rows, np.where(addresses == 0, -1, ids), values,
                                               update_type)
    assert_close(table.export()[1], expected, tf.float32)


def test_update_in_a_function_runs_without_using_its_output():
    table, rows = mirrored()
    a = table.lookup_addresses([2], training=False)

    @tf.function
    def step():
        recops_tf.embedding_update_by_address(table, a, [[1.0, 1.0, 1.0, 1.0]])

    step()
    np.testing.assert_allclose(table.export()[1].numpy()[2], rows[2] + 1, rtol=1e-6)


def _weighted_lookup_loss(table, addresses):
    y = recops_tf.embedding_lookup_by_address(table, addresses)
    return tf.reduce_sum(y * tf.constant([[1.0], [2.0], [3.0]]))


@pytest.mark.parametrize("where", ["eager", "tape_in_function", "function_under_tape"])
def test_lookup_gradient_is_indexed_slices_keyed_by_address_without_watch(where):
    """The lookup is watched as a variable read is: no tape.watch, eagerly or traced."""
    table, _ = mirrored()
    a = table.lookup_addresses([1, 2, 1], training=False)

    def gradient(a):
        with tf.GradientTape() as tape:
            loss = (tf.function(_weighted_lookup_loss) if where == "function_under_tape"
                    else _weighted_lookup_loss)(table, a)
        return tape.gradient(loss, table.resource_handle)

    grad = tf.function(gradient)(a) if where == "tape_in_function" else gradient(a)
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_array_equal(grad.indices.numpy(), a.numpy())
    np.testing.assert_array_equal(grad.values.numpy()[:, 0], [1.0, 2.0, 3.0])


def test_lookup_watching_follows_the_tape_and_the_table_is_not_a_source():
    table, _ = mirrored()
    a = table.lookup_addresses([1, 2, 1], training=False)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        loss = _weighted_lookup_loss(table, a)
    assert tape.gradient(loss, table.resource_handle) is None  # as for a variable
    with tf.GradientTape(persistent=True) as tape:
        loss = _weighted_lookup_loss(table, a)
    watched = tape.watched_variables()  # usable as gradient sources, like variables
    assert len(watched) == 1
    np.testing.assert_array_equal(tape.gradient(loss, watched)[0].indices.numpy(), a.numpy())
    with pytest.raises(TypeError, match=r"not a tensor: differentiate w\.r\.t\. "
                                        r"table\.resource_handle"):
        tape.gradient(loss, table)


def test_densifying_a_table_gradient_names_the_optimizers():
    rows = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([8, 16], tf.int64))
    with pytest.raises(ValueError, match="recops_tf.optimizers.LazyAdam or recops_tf"):
        tf.convert_to_tensor(rows)
    with_shape = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 0]), tf.constant([2, 3]))
    np.testing.assert_array_equal(tf.convert_to_tensor(with_shape).numpy(),
                                  [[2.0] * 3, [0.0] * 3])  # TensorFlow's own conversion


def test_table_docstrings():
    import doctest
    import inspect

    init_doc = inspect.getdoc(recops_tf.DynamicEmbeddingTable.__init__)
    assert "padding_key:" in init_doc and "device" not in init_doc  # not TF's inherited one
    finder, runner = doctest.DocTestFinder(recurse=False), doctest.DocTestRunner()
    from recops_tf.ops import embedding_by_address as module
    [test] = finder.find(recops_tf.DynamicEmbeddingTable, "DynamicEmbeddingTable",
                         globs={**vars(module), "tf": tf})
    assert test.examples and runner.run(test).failed == 0


# --- embedding_lookup on variables ------------------------------------------------------------

def test_embedding_lookup_on_a_variable_is_gather_with_a_sparse_gradient():
    var = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))
    ids = tf.ragged.constant([[3, 0], [1]])
    with tf.GradientTape() as tape:
        y = recops_tf.embedding_lookup(var, ids)
        loss = tf.reduce_sum(y.flat_values)
    np.testing.assert_array_equal(y.flat_values.numpy(), tf.gather(var, [3, 0, 1]).numpy())
    assert isinstance(tape.gradient(loss, var), tf.IndexedSlices)
    with pytest.raises(tf.errors.InvalidArgumentError, match="4"):
        recops_tf.embedding_lookup(var, [4])
    with pytest.raises(tf.errors.InvalidArgumentError):
        recops_tf.embedding_lookup(var, [-1])


# --- validation --------------------------------------------------------------------------------

def test_forged_addresses_are_rejected():
    table, _ = mirrored()
    other, _ = mirrored()
    good = int(table.lookup_addresses([5], training=False).numpy()[0])
    row_bytes = 4 * 4
    cases = {
        "misaligned": (good + 4, "not aligned"),
        "negative": (-good, "never negative"),
        "beyond the rows": (good + 100 * row_bytes, "the table has 20 rows"),
        "another table's": (int(other.lookup_addresses([5], training=False).numpy()[0]),
                            "not made by this table"),
        "random": (123456789, "not made by this table"),
    }
    for what, (address, message) in cases.items():
        for fn in (lambda a: recops_tf.embedding_lookup_by_address(table, a),
                   lambda a: recops_tf.embedding_update_by_address(table, a, [[1.0] * 4]),
                   lambda a: recops_tf.sgd_update(table, [[1.0] * 4], a, 0.1)):
            with pytest.raises(tf.errors.InvalidArgumentError, match=message):
                fn(tf.constant([address], tf.int64))


def test_addresses_from_before_a_restore_are_rejected(tmp_path):
    table, _ = mirrored()
    old = table.lookup_addresses([1, 2], training=False)
    path = tf.train.Checkpoint(t=table).save(str(tmp_path / "ck"))
    tf.train.Checkpoint(t=table).restore(path)
    with pytest.raises(tf.errors.InvalidArgumentError, match="restored"):
        recops_tf.embedding_lookup_by_address(table, old)
    fresh = table.lookup_addresses([1, 2], training=False)
    assert recops_tf.embedding_lookup_by_address(table, fresh).shape == [2, 4]


def test_fuzz_of_random_addresses_never_crashes():
    table, rows = mirrored(num_rows=50)
    rng = np.random.default_rng(7)
    fuzz = np.concatenate([rng.integers(-2**63, 2**63 - 1, size=5000, dtype=np.int64),
                           # near-valid: right tag, random offsets
                           int(table.lookup_addresses([0], training=False).numpy()[0]) +
                           rng.integers(-2**20, 2**20, size=5000)])
    rejected = 0
    for chunk in np.array_split(fuzz, 100):
        for a in chunk[:3]:  # some one by one
            try:
                recops_tf.embedding_lookup_by_address(table, [a])
            except tf.errors.InvalidArgumentError:
                rejected += 1
        with pytest.raises(tf.errors.InvalidArgumentError, match="is not a valid address"):
            recops_tf.embedding_lookup_by_address(table, chunk)
    assert rejected >= 290
    # The table is intact.
    np.testing.assert_array_equal(table.export()[1].numpy(), rows)


def test_validation_errors():
    table, _ = mirrored()
    a = table.lookup_addresses([1], training=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="wider than the table's rows"):
        recops_tf.embedding_lookup_by_address(table, a, embedding_dim=5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be a vector"):
        recops_tf.embedding_update_by_address(table, tf.reshape(a, [1, 1]), [[1.0] * 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[N, D\]"):
        recops_tf.embedding_update_by_address(table, a, [[1.0] * 5])
    with pytest.raises(ValueError, match="update_type"):
        recops_tf.embedding_update_by_address(table, a, [[1.0] * 4], update_type="max")
    with pytest.raises(TypeError, match="DynamicEmbeddingTable"):
        recops_tf.embedding_lookup_by_address(tf.Variable([[1.0]]), a)
    with pytest.raises(TypeError, match="int64"):
        recops_tf.embedding_lookup_by_address(table, tf.constant([1], tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than once"):
        table.assign([1, 1], np.zeros((2, 4), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows \[N, 4\]"):
        table.assign([1], np.zeros((1, 5), np.float32))
    padded = recops_tf.DynamicEmbeddingTable(4, padding_key=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="padding key"):
        padded.assign([0], np.zeros((1, 4), np.float32))
    with pytest.raises(ValueError, match="dim"):
        recops_tf.DynamicEmbeddingTable(0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="training must be a scalar"):
        table.lookup_addresses([1], training=[True])
    with pytest.raises(tf.errors.InvalidArgumentError, match="too wide"):
        recops_tf.DynamicEmbeddingTable(2**29)
    with pytest.raises(tf.errors.InvalidArgumentError, match="over 16 GiB"):
        recops_tf.DynamicEmbeddingTable(2**20, block_rows=2**14)


@pytest.mark.parametrize("attrs", [
    dict(dim=2**40, num_slots=2**31 - 1),  # found by the fuzzer: the product overflowed to 0
    dict(dim=1, num_slots=2**63 - 1),
    dict(dim=2**62, num_slots=3),
], ids=["overflow_to_zero", "slots_overflow", "dim_overflow"])
def test_absurd_row_widths_are_errors_not_crashes(attrs):
    from recops_tf.ops._common import lib

    with pytest.raises(tf.errors.InvalidArgumentError, match="too wide"):
        lib().recops_dynamic_embedding_table(**attrs)


def test_absurd_block_rows_are_an_error():
    from recops_tf.ops._common import lib

    with pytest.raises(tf.errors.InvalidArgumentError, match="over 16 GiB"):
        lib().recops_dynamic_embedding_table(dim=4, block_rows=2**62)


# --- persistence -------------------------------------------------------------------------------

def test_checkpoint_round_trip_and_growth_after_restore(tmp_path):
    table = recops_tf.DynamicEmbeddingTable(4, num_slots=2, block_rows=8)
    table.lookup_addresses(np.arange(20) * 3)
    recops_tf.embedding_update_by_address(table, table.lookup_addresses([3]),
                                          np.ones((1, 12), np.float32))
    path = tf.train.Checkpoint(t=table).save(str(tmp_path / "ck"))
    restored = recops_tf.DynamicEmbeddingTable(4, num_slots=2, block_rows=8)
    tf.train.Checkpoint(t=restored).restore(path).assert_consumed()
    for x, y in zip(table.export(), restored.export()):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    restored.lookup_addresses([1000, 1001])
    assert restored.size().numpy() == 22 and restored.capacity().numpy() == 24


def test_saved_model_exports_the_table(tmp_path):
    table, rows = mirrored(num_slots=2)
    module = tf.Module()
    module.table = table

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def serve(keys):
        return recops_tf.embedding_lookup(table, keys, training=False)

    module.serve = serve
    tf.saved_model.save(module, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    keys = tf.constant([0, 7, 19, 99], tf.int64)
    np.testing.assert_array_equal(loaded.serve(keys).numpy(), serve(keys).numpy())


# --- concurrency -------------------------------------------------------------------------------

def test_concurrent_inserts_of_the_same_new_keys_get_one_row_per_key():
    table = recops_tf.DynamicEmbeddingTable(4, block_rows=256)
    keys = np.arange(3000) * 11
    orders = [np.random.default_rng(i).permutation(keys) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda k: (k, table.lookup_addresses(k).numpy()), orders))
    assert table.size().numpy() == len(keys)
    reference = dict(zip(*results[0]))
    assert len(set(reference.values())) == len(keys)
    for k, a in results[1:]:
        assert all(reference[key] == address for key, address in zip(k, a))


def test_concurrent_updates_of_disjoint_rows_lose_nothing():
    table, rows = mirrored(num_rows=64)
    var = tf.Variable(rows)
    addresses = table.lookup_addresses(np.arange(64), training=False).numpy()

    def worker(t):
        mine = np.arange(t, 64, 8)
        for _ in range(25):
            recops_tf.embedding_update_by_address(table, addresses[mine],
                                                  np.ones((len(mine), 4), np.float32))
            recops_tf.sgd_update(var, np.ones((len(mine), 4), np.float32), mine, lr=1.0)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(worker, range(8)))
    np.testing.assert_allclose(table.export()[1].numpy(), rows + 25, rtol=1e-5)
    np.testing.assert_allclose(var.numpy(), rows - 25, rtol=1e-5)


def test_zipf_ids_have_duplicates_within_range():
    ids = zipf_ids(np.random.default_rng(0), 1000, 500)
    assert ids.min() >= 0 and ids.max() < 500 and len(np.unique(ids)) < 900
