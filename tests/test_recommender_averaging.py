"""The weight average (``Config.weight_average``, ``--weight-average``): the average's
arithmetic over dense variables and the growing item tables, the raw weights back after a
validation, and a run with it killed and resumed to the same metrics."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf.recommender as rec
from recops_tf import cli
from recops_tf.recommender import averaging, training


def _config(**overrides):
    values = dict(epochs=2, batch_size=16, d_model=16, num_blocks=1, head_dim=8,
                  max_seq_len=16, num_negatives=8, patience=0)
    values.update(overrides)
    return rec.Config.from_preset("hstu", **values)


def _built_model(num_items=30):
    model = training.build_model(_config(), num_items)
    items = tf.ragged.constant([[1, 2, 3]], dtype=tf.int64)
    model({"items": items, "timestamps": items}, training=False)
    model.item_matrix(training=True)  # a row for every item
    assert int(model.tables()[0].size()) == num_items
    return model


def _dense(model):
    return [v.numpy() for v in model.variables if tf.as_dtype(v.dtype).is_floating]


def _rows(model):
    keys, rows = (t.numpy() for t in model.tables()[0].export())
    return rows[np.argsort(keys)]


def _shift(model, by):
    for v in model.variables:
        if tf.as_dtype(v.dtype).is_floating:
            v.assign_add(tf.fill(v.shape, tf.cast(by, v.dtype)))
    table = model.tables()[0]
    keys, rows = table.export()
    table.assign(keys, rows + by)


def test_the_average_weighs_each_update_by_the_decay_and_swaps_back():
    model = _built_model()
    start_dense, start_rows = _dense(model), _rows(model)
    average = averaging.WeightAverage(model, 0.75)
    average.update()  # the first update copies the weights
    _shift(model, 1.0)
    average.update()  # 0.75 x start + 0.25 x (start + 1)
    _shift(model, 1.0)
    average.update()  # 0.75 x (start + 0.25) + 0.25 x (start + 2) = start + 0.6875
    raw_dense, raw_rows = _dense(model), _rows(model)
    with average.swapped():
        for got, want in zip(_dense(model), start_dense):
            np.testing.assert_allclose(got, want + 0.6875, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(_rows(model), start_rows + 0.6875, rtol=1e-6, atol=1e-6)
    for got, want in zip(_dense(model), raw_dense):  # the raw weights are back, exactly
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_rows(model), raw_rows)


def test_a_table_row_new_since_the_last_update_starts_at_its_value():
    model = _built_model(num_items=10)
    average = averaging.WeightAverage(model, 0.5)
    table = model.tables()[0]
    keys, rows = (t.numpy() for t in table.export())
    table.assign(keys[:-1], rows[:-1])  # one item missing at the first update
    average.update()
    table.assign(keys, rows + 2.0)
    average.update()
    got_keys, got_rows = average.keys[0].numpy(), average.rows[0].numpy()
    np.testing.assert_array_equal(got_keys, np.sort(keys))
    by_key = dict(zip(got_keys, got_rows))
    np.testing.assert_allclose(by_key[keys[-1]], rows[-1] + 2.0, rtol=1e-6)  # new: its value
    np.testing.assert_allclose(by_key[keys[0]], rows[0] + 1.0, rtol=1e-6)  # averaged


@pytest.mark.parametrize("decay", [-0.1, 1.0])
def test_a_decay_outside_zero_one_is_refused(decay, capsys):
    with pytest.raises(ValueError, match=r"weight_average must lie in \[0, 1\)"):
        _config(weight_average=decay).check()
    assert cli.main(["train", "--users", "30", "--items", "20", "--weight-average",
                     str(decay), "--no-progress"]) == 2
    assert "weight_average must lie in [0, 1)" in capsys.readouterr().err


def test_a_run_with_the_average_validates_it_and_resumes_to_the_same_metrics(tmp_path):
    data = rec.synthetic(num_users=64, num_items=30, seed=5)
    config = _config(eval_every=2, max_steps=8, epochs=0, weight_average=0.6)
    whole = rec.train(data, config, checkpoint_dir=str(tmp_path / "whole"), progress=False)
    raw = rec.train(data, _config(eval_every=2, max_steps=8, epochs=0), progress=False)
    # The same steps and losses; validated on other weights (the average).
    assert raw.last_loss == whole.last_loss
    assert [v["ndcg@10"] for v in raw.validation] != [v["ndcg@10"] for v in whole.validation]
    # Stopped at step 4 and resumed: the average (in the checkpoint) carries on.
    half = _config(eval_every=2, max_steps=4, epochs=0, weight_average=0.6)
    rec.train(data, half, checkpoint_dir=str(tmp_path / "split"), progress=False)
    resumed = rec.train(data, config, checkpoint_dir=str(tmp_path / "split"), resume=True,
                        progress=False)
    assert resumed.validation == whole.validation
    assert resumed.test == whole.test
    # The tested model is the best validation's average.
    assert training.evaluate(resumed.model, rec.evaluation.Split.leave_one_out(data),
                             "valid")["ndcg@10"] == pytest.approx(
                                 max(v["ndcg@10"] for v in whole.validation))

