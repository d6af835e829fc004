"""recops_tf.saving.export: SavedModels of Keras models on ragged inputs, loaded in a new
process with no difference from the model."""
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf.layers import DynamicEmbedding, HSTUBlock, RelativeAttentionBias

MAX_LEN, D_MODEL = 8, 16


@keras.saving.register_keras_serializable(package="recops_tf_tests")
class MeanOverTokens(keras.layers.Layer):
    def call(self, x):
        return tf.reduce_mean(x, axis=1)


def ragged_model():
    """Ragged item ids and timestamps -> DynamicEmbedding -> HSTUBlock with a time + position
    bias: a ragged output and a dense (pooled) one."""
    keras.utils.set_random_seed(0)
    items = keras.Input(shape=(None,), dtype="int64", ragged=True, name="items")
    times = keras.Input(shape=(None,), dtype="int64", ragged=True, name="timestamps")
    block = HSTUBlock(2, 4, MAX_LEN, relative_bias=RelativeAttentionBias(
        MAX_LEN, num_buckets=8, initializer="random_normal"))
    states = block(DynamicEmbedding(D_MODEL, seed=3)(items), timestamps=times)
    model = keras.Model({"items": items, "timestamps": times},
                        {"states": states, "pooled": MeanOverTokens()(states)})
    return model


def batch():
    return {"items": tf.ragged.constant([[1, 2, 3], [4, 5], [6], [7, 1, 2, 3, 9]], tf.int64),
            "timestamps": tf.ragged.constant([[1, 20, 300], [4, 50], [6], [1, 2, 3, 400, 5000]],
                                             tf.int64)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(batch, model, SavedModel path): the model exported once for the tests below."""
    x = batch()
    model = ragged_model()
    model(x, training=True)  # the table allocates rows for the keys it sees
    path = recops_tf.saving.export(model, str(tmp_path_factory.mktemp("saving") / "sm"))
    return x, model, path


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    import recops_tf  # registers the kernels

    path, data = sys.argv[1], np.load(sys.argv[2])
    loaded = tf.saved_model.load(path)
    x = {k: tf.RaggedTensor.from_row_lengths(data[k + "_values"], data[k + "_row_lengths"])
         for k in ("items", "timestamps")}
    out = loaded.serve(x)
    flat = loaded.signatures["serving_default"](
        **{k: tf.constant(data[k]) for k in data.files})
    np.savez(sys.argv[3], serve_states=out["states"].values.numpy(),
             serve_lengths=out["states"].row_lengths().numpy(),
             serve_pooled=out["pooled"].numpy(),
             **{"flat_" + k: v.numpy() for k, v in flat.items()})
""")


def test_export_round_trips_in_a_new_process(exported, tmp_path):
    x, model, path = exported
    expected = model(x)
    predicted = model.predict(x, verbose=0)
    inputs = {}
    for key, value in x.items():  # the serving signature's plain tensors
        inputs[f"{key}_values"] = value.values.numpy()
        inputs[f"{key}_row_lengths"] = value.row_lengths().numpy()
    np.savez(tmp_path / "in.npz", **inputs)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, str(script), path, str(tmp_path / "in.npz"),
                    str(tmp_path / "out.npz")], check=True, env=env, timeout=300)
    got = np.load(tmp_path / "out.npz")
    # model(...) and predict, to float32 rounding: bit for bit where TensorFlow's oneDNN
    # rewrites are off (CPUs without AVX-512), a few ulps apart where they are on (the loaded
    # graph's fused matmuls against the eager ones, measured on a Zen 4: up to 2e-7).
    for reference in (expected, predicted):
        states = reference["states"].values.numpy()
        pooled = np.asarray(reference["pooled"])
        for key, want in (("serve_states", states), ("flat_states_values", states),
                          ("serve_pooled", pooled), ("flat_pooled", pooled)):
            np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-6, err_msg=key)
    np.testing.assert_array_equal(got["serve_lengths"], [3, 2, 1, 5])
    np.testing.assert_array_equal(got["flat_states_row_lengths"], [3, 2, 1, 5])
    assert sorted(k for k in got.files if k.startswith("flat_")) == [
        "flat_pooled", "flat_states_row_lengths", "flat_states_values"]


def test_keras_export_of_the_same_model_is_refused(exported, tmp_path):
    # model.export() feeds the layers dense [B, S] inputs: refused rather than attending the
    # padding (issue 19, item 1).
    with pytest.raises(ValueError, match="recops_tf.saving.export"):
        exported[1].export(str(tmp_path / "keras"), verbose=False)


def test_serving_signature_names_and_checks_row_lengths(exported):
    x, _, path = exported
    signature = tf.saved_model.load(path).signatures["serving_default"]
    assert sorted(signature.structured_input_signature[1]) == [
        "items_row_lengths", "items_values", "timestamps_row_lengths", "timestamps_values"]
    with pytest.raises(tf.errors.InvalidArgumentError):
        signature(items_values=x["items"].values,
                  items_row_lengths=tf.constant([3, 2, 1, 4], tf.int64),  # 10 of 11 items
                  timestamps_values=x["timestamps"].values,
                  timestamps_row_lengths=x["timestamps"].row_lengths())


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.block = HSTUBlock(2, 4, MAX_LEN)

    def call(self, x):
        return self.block(x)


def test_subclassed_model_needs_and_takes_a_ragged_signature(tmp_path):
    x = tf.RaggedTensor.from_row_lengths(
        tf.random.stateless_normal([6, D_MODEL], seed=[1, 2]), tf.constant([4, 0, 2], tf.int64))
    model = Subclassed()
    expected = model(x)
    with pytest.raises(ValueError, match="pass input_signature"):
        recops_tf.saving.export(model, str(tmp_path / "a"))
    spec = tf.RaggedTensorSpec([None, None, D_MODEL], tf.float32, 1, tf.int64)
    loaded = tf.saved_model.load(recops_tf.saving.export(model, str(tmp_path / "b"), [spec]))
    # To float32 rounding (see test_export_round_trips_in_a_new_process: oneDNN's rewrites).
    np.testing.assert_allclose(loaded.serve(x).values.numpy(), expected.values.numpy(),
                               rtol=1e-5, atol=1e-6)
    flat = loaded.signatures["serving_default"](inputs_values=x.values,
                                                inputs_row_lengths=x.row_lengths())
    np.testing.assert_allclose(flat["output_0_values"].numpy(), expected.values.numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(flat["output_0_row_lengths"].numpy(), [4, 0, 2])


class Scale(keras.Model):
    """Any ragged structure: scales the flat values by a weight."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(), initializer="ones")

    def call(self, x):
        return x.with_flat_values(x.flat_values * self.w)


def test_ragged_rank_two_round_trips(tmp_path):
    x = tf.RaggedTensor.from_nested_row_lengths(
        tf.range(6.0), [tf.constant([2, 0, 1], tf.int64), tf.constant([1, 3, 2], tf.int64)])
    model = Scale()
    model(x)
    model.w.assign(3.0)
    spec = tf.RaggedTensorSpec([None, None, None], tf.float32, 2, tf.int64)
    loaded = tf.saved_model.load(recops_tf.saving.export(model, str(tmp_path / "sm"), spec))
    flat = loaded.signatures["serving_default"](inputs_values=x.flat_values,
                                                inputs_row_lengths_1=x.row_lengths(),
                                                inputs_row_lengths_2=x.values.row_lengths())
    assert sorted(flat) == ["output_0_row_lengths_1", "output_0_row_lengths_2",
                            "output_0_values"]
    np.testing.assert_array_equal(flat["output_0_values"].numpy(), np.arange(6.0) * 3.0)
    np.testing.assert_array_equal(flat["output_0_row_lengths_2"].numpy(), [1, 3, 2])
