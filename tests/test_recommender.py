"""The main job end to end on tiny sizes: synthetic data, the presets and losses, training with
validation and early stopping, export of both builds, a new process that recommends,
TensorBoard summaries, and a run killed mid-epoch and resumed."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from recops_tf import cli
from recops_tf import recommender as rec
from recops_tf.recommender import model as model_module
from recops_tf.recommender import training as training_module

TINY = ["--users", "60", "--items", "40", "--epochs", "1", "--batch-size", "16",
        "--d-model", "16", "--blocks", "1", "--head-dim", "8", "--max-seq-len", "16",
        "--negatives", "8", "--no-progress"]
_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def _tiny_config(**overrides):
    values = dict(epochs=2, batch_size=16, d_model=16, num_blocks=1, head_dim=8,
                  max_seq_len=16, num_negatives=8)
    values.update(overrides)
    return rec.Config.from_preset(overrides.pop("preset", "hstu"), **values)


def test_synthetic_data_is_deterministic_and_needs_a_sequence_model():
    a, b = rec.synthetic(num_users=300, num_items=100, seed=3), rec.synthetic(300, 100, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a.items, b.items))
    assert all(np.array_equal(x, y) for x, y in zip(a.timestamps, b.timestamps))
    assert min(h.min() for h in a.items) >= 1 and max(h.max() for h in a.items) <= 100
    assert all(np.all(np.diff(t) > 0) for t in a.timestamps)

    def best_successor_accuracy(gap):
        # How often the next item is the most frequent one seen `gap` steps after the item.
        pairs = np.concatenate([np.stack([h[:-gap], h[gap:]], 1) for h in a.items])
        counts = np.zeros((101, 101), np.int64)
        np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
        return counts.max(axis=1).sum() / counts.sum()

    # The item two steps back predicts the next one better than the last item does.
    assert best_successor_accuracy(2) > best_successor_accuracy(1) + 0.04


def test_presets_and_overrides():
    large = rec.Config.from_preset("hstu-large", num_blocks=3)
    assert (large.num_blocks, large.num_heads, large.head_dim) == (3, 2, 25)
    assert (large.d_model, large.temperature, large.num_negatives) == (50, 0.05, 128)
    sasrec = rec.Config.from_preset("sasrec")
    assert sasrec.encoder == "sasrec" and not sasrec.relative_bias
    # The seen-item bias (ours, not the paper's) is in every preset, so the encoders are
    # compared with the same head; seen_bias=False is the paper's exact recipe.
    assert all(rec.Config.from_preset(name).seen_bias for name in rec.PRESETS)
    assert rec.Config() == rec.Config.from_preset("auto")
    # auto is the hstu preset's model; what it changes is fitted to the data (profile.fit),
    # it validates an average of the weights and adds a transition prior whose weight it
    # chooses on validation (the paper's recipe does neither).
    assert (dataclasses.replace(rec.Config(), preset="hstu", weight_average=0.0,
                                transition_prior=0.0)
            == rec.Config.from_preset("hstu"))
    assert all(rec.Config.from_preset(name).transition_prior == 0.0
               for name in ("hstu", "hstu-large", "sasrec"))
    assert not rec.Config.from_preset("hstu", seen_bias=False).seen_bias
    with pytest.raises(ValueError, match="preset must be one of"):
        rec.Config.from_preset("bert4rec")
    with pytest.raises(ValueError, match="loss must be one of"):
        rec.Config.from_preset("hstu", loss="hinge").check()
    with pytest.raises(ValueError, match="num_negatives must be at least 1"):
        rec.Config.from_preset("hstu", num_negatives=0).check()


def test_sampled_softmax_masks_accidental_hits():
    model = rec.GenerativeRecommender(10, d_model=8, num_blocks=1, head_dim=4, max_seq_len=4)
    items = tf.RaggedTensor.from_row_lengths(tf.constant([1, 2, 3, 4, 5], tf.int64),
                                             tf.constant([3, 2], tf.int64))
    states = model({"items": items, "timestamps": items}, training=False)
    targets = tf.RaggedTensor.from_row_lengths(tf.constant([2, 3, 4, 6, 7], tf.int64),
                                               tf.constant([3, 2], tf.int64))
    negatives = tf.constant([[3, 9], [7, 1]], tf.int64)  # 3 and 7 hit a target
    pos, neg = model_module._positives_and_negatives(model, states, targets, negatives, False)
    hit = neg.numpy() < -1e8
    assert hit.tolist() == [[False, False], [True, False], [False, False], [False, False],
                            [True, False]]
    # An unmasked logit is the temperature-scaled cosine of state and item.
    s, e = states.flat_values.numpy(), model.item_embeddings(tf.constant([9]), False).numpy()
    np.testing.assert_allclose(neg.numpy()[0, 1], s[0] @ e[0] / 0.05, rtol=1e-5)
    assert np.all(np.abs(pos.numpy()) <= 1 / 0.05 + 1e-3)


@pytest.mark.parametrize("preset,loss,smoothing", [
    ("hstu", "sampled", 0.0), ("hstu", "in-batch", 0.0), ("hstu", "full", 0.0),
    ("hstu", "gbce", 0.0), ("hstu", "full", 0.1), ("hstu", "sampled", 0.1),
    ("sasrec", "sampled", 0.0)])
def test_every_loss_and_encoder_trains(preset, loss, smoothing):
    data = rec.synthetic(num_users=64, num_items=40, seed=1)
    result = rec.train(data, _tiny_config(preset=preset, loss=loss, epochs=3,
                                          label_smoothing=smoothing), progress=False)
    assert result.steps == 3 * 4 and result.epochs == 3
    assert result.last_loss < result.first_loss
    assert [h["epoch"] for h in result.validation] == [1, 2, 3]
    for m in (result.test, result.baselines["markov"], result.baselines["popularity"]):
        assert set(m) == {f"{name}@{k}" for name in ("hr", "ndcg") for k in (5, 10, 20, 50, 200)
                          } | {"mrr"}
        assert 0 <= m["ndcg@10"] <= m["hr@10"] <= m["hr@50"] <= m["hr@200"] == 1.0


@pytest.mark.parametrize("bucket", [False, True])
def test_training_batches_cover_every_user_once_an_epoch(bucket):
    from recops_tf.recommender import training

    data = rec.synthetic(num_users=70, num_items=30, min_len=3, max_len=40, seed=4)
    split = rec.Split.leave_one_out(data)
    config = _tiny_config(bucket_by_length=bucket, batch_size=8)
    epoch_data, steps = training.training_data(split, config)
    train, _ = split.train()
    expected = sorted(tuple(h[-17:]) for h in train if len(h) >= 2)
    for epoch in (0, 1):
        batches = list(epoch_data(epoch))
        assert len(batches) == steps
        seen = sorted(tuple(row) for items, _ in batches for row in items.numpy())
        assert seen == expected
        if bucket:  # a batch holds histories of similar length
            for items, _ in batches:
                lengths = items.row_lengths().numpy()
                assert lengths.max() // 2 == lengths.min() // 2
    orders = [[tuple(r) for b, _ in epoch_data(e) for r in b.numpy()] for e in (0, 1, 0)]
    assert orders[0] != orders[1] and orders[0] == orders[2]  # by (seed, epoch) only
    assert [tuple(r) for b, _ in epoch_data(0, skip=2) for r in b.numpy()] == \
        orders[0][sum(len(b.numpy()) for b, _ in list(epoch_data(0))[:2]):]


def test_early_stopping_keeps_the_best_epoch():
    data = rec.synthetic(num_users=64, num_items=40, seed=2)
    # A learning rate this large diverges: validation peaks early, then patience runs out.
    result = rec.train(data, _tiny_config(epochs=30, patience=2, learning_rate=0.5),
                       progress=False)
    scores = [h["ndcg@10"] for h in result.validation]
    assert result.epochs < 30 and len(scores) == result.best_epoch + 2
    assert scores[result.best_epoch - 1] == max(scores)
    # The model returned is the best epoch's: its validation metric is the best one.
    split = rec.Split.leave_one_out(data)
    again = rec.evaluate(result.model, split, "valid")
    assert again["ndcg@10"] == pytest.approx(max(scores), abs=1e-12)


def test_hstu_preset_beats_both_baselines_on_synthetic_data():
    data = rec.synthetic(num_users=500, num_items=120, num_tastes=8, seed=0)
    config = rec.Config.from_preset("hstu", epochs=20, batch_size=64, d_model=32, head_dim=32,
                               max_seq_len=64, num_negatives=32, patience=0, dropout_rate=0.1,
                               learning_rate=3e-3)
    result = rec.train(data, config, progress=False)
    for name in ("markov", "popularity"):
        assert result.test["hr@10"] > 1.15 * result.baselines[name]["hr@10"], name
        assert result.test["ndcg@10"] > 1.15 * result.baselines[name]["ndcg@10"], name


def test_train_writes_its_figures_before_the_export(tmp_path, monkeypatch):
    """A run whose export fails (a full disk, say) keeps its test figures in --json."""
    def broken(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(rec, "export", broken)
    metrics = tmp_path / "metrics.json"
    with pytest.raises(OSError, match="No space left"):
        cli.main(["train", *TINY, "--out", str(tmp_path / "m"), "--json", str(metrics),
                  "--no-progress"])
    assert 0 <= json.loads(metrics.read_text())["test"]["hr@10"] <= 1


def test_train_export_and_recommend_in_a_new_process(tmp_path, capsys):
    out = tmp_path / "model"
    metrics = tmp_path / "metrics.json"
    assert cli.main(["train", *TINY, "--out", str(out), "--json", str(metrics)]) == 0
    printed = capsys.readouterr().out
    assert "seen items kept" in printed and "seen items excluded" in printed
    assert "markov" in printed and "popularity" in printed
    result = json.loads(metrics.read_text())
    assert 0 <= result["test"]["hr@10"] <= 1 and result["steps"] == 4
    assert sorted(os.listdir(out)) == ["checkpoints", "curves.png", "info.json", "items.txt",
                                       "logs", "model.keras", "run.json", "saved_model"]
    done = subprocess.run([sys.executable, "-m", "recops_tf", "recommend", "--model", str(out),
                           "--history", "1,5,9", "--k", "4"], capture_output=True, text=True,
                          env=_ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    header, *rows = [line.split() for line in done.stdout.strip().splitlines()]
    assert header[0] == "rank" and [r[0] for r in rows] == ["1", "2", "3", "4"]
    scores = [float(r[2]) for r in rows]
    assert scores == sorted(scores, reverse=True)
    assert all(1 <= int(r[1]) <= 40 for r in rows)
    # The same answer in this process, from the API.
    items, _ = rec.recommend(str(out), [1, 5, 9], k=4)
    assert items == [r[1] for r in rows]
    # Re-export from the .keras file: the same recommendations.
    again = tmp_path / "again"
    assert cli.main(["export", "--model", str(out), "--out", str(again)]) == 0
    assert rec.recommend(str(again), [1, 5, 9], k=4)[0] == items


@pytest.mark.parametrize("preset", ["hstu", "sasrec"])
def test_stock_build_exports_too(tmp_path, preset):
    out = tmp_path / "stock"
    assert cli.main(["train", *TINY, "--preset", preset, "--no-fused", "--max-steps", "2",
                     "--out", str(out)]) == 0
    module = tf.saved_model.load(str(out / "saved_model"))
    got = module.recommend(tf.constant([1, 2, 3], tf.int64), tf.constant([1, 2, 3], tf.int64),
                           tf.constant(5, tf.int32))
    assert got["items"].shape == [5] and np.all(np.diff(got["scores"].numpy()) <= 0)
    assert rec.recommend(str(out), [1, 2, 3], k=5)[0] == [str(i) for i in got["items"].numpy()]


def test_tensorboard_summaries(tmp_path):
    logdir = tmp_path / "tb"
    assert cli.main(["train", *TINY, "--logdir", str(logdir)]) == 0
    tags = set()
    for name in os.listdir(logdir):
        for record in tf.data.TFRecordDataset(str(logdir / name)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            tags.update(v.tag for v in event.summary.value)
    assert {"train/loss", "train/steps_per_second", "valid/ndcg@10", "valid/hr@10",
            "valid/mrr"} <= tags


def _run(args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "recops_tf", "train", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_ENV, **kwargs)


def test_a_run_killed_mid_epoch_resumes_to_the_same_metrics(tmp_path):
    args = ["--users", "120", "--items", "50", "--epochs", "3", "--batch-size", "16",
            "--d-model", "16", "--blocks", "1", "--head-dim", "8", "--max-seq-len", "16",
            "--negatives", "8", "--patience", "0", "--no-progress", "--checkpoint-every", "2"]
    whole = _run(args + ["--out", str(tmp_path / "whole"), "--json", str(tmp_path / "a.json")])
    assert whole.wait(timeout=600) == 0, whole.stdout.read()[-3000:]
    # The same run, killed (SIGKILL) once it has checkpointed step 10 (in epoch 2 of 3).
    run = tmp_path / "killed"
    killed = _run(args + ["--out", str(run), "--json", str(tmp_path / "b.json")])
    deadline = time.time() + 600
    while not os.path.exists(run / "checkpoints" / "last" / "ckpt-10.index"):
        assert killed.poll() is None and time.time() < deadline, "no checkpoint at step 10"
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert not (tmp_path / "b.json").exists()
    resumed = _run(["--resume", str(run), "--no-progress"])
    assert resumed.wait(timeout=600) == 0
    log = resumed.stdout.read()
    assert "resumed from" in log, log[-3000:]
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert b["steps"] == a["steps"] == 3 * 8
    assert b["validation"] == a["validation"]
    assert b["test"] == a["test"] and b["last_loss"] == a["last_loss"]


def test_resume_needs_a_run_directory(tmp_path, capsys):
    assert cli.main(["train", "--resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_recommend_rejects_unknown_items(tmp_path, capsys):
    out = tmp_path / "m"
    assert cli.main(["train", *TINY, "--max-steps", "1", "--out", str(out)]) == 0
    assert cli.main(["recommend", "--model", str(out), "--history", "1,999"]) == 2
    assert "not in the model's catalogue: ['999']" in capsys.readouterr().err


@pytest.mark.parametrize("text,message", [
    ("user,item,timestamp\n1,2\n", "bad.csv:2: expected 3 columns"),
    ("usr,item\n1,2\n", "bad.csv:1: the header has no column 'user'"),
])
def test_train_reports_a_bad_data_file(tmp_path, capsys, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    assert cli.main(["train", "--data", str(path), "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_fused_and_stock_models_train_alike():
    data = rec.synthetic(num_users=64, num_items=40, seed=1)
    for fused in (True, False):
        result = rec.train(data, _tiny_config(use_fused=fused, dropout_rate=0.0, loss="full",
                                              l2_norm=False, temperature=1.0), progress=False)
        # The same model on different tables: near-zero logits at the start (raw dot
        # products of small embeddings), so the losses start at log(40) and fall alike.
        assert result.first_loss == pytest.approx(np.log(40), rel=0.05)
        assert result.last_loss < result.first_loss


def test_info(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "tensorflow 2.21" in out and "Recops>RmaSwapMultiTables" in out
    assert "eager_fallback" not in out


def test_bf16_precision_runs_the_encoder_in_bfloat16_and_trains_like_f32():
    """--precision bf16: the model is built under mixed_bfloat16 (the global policy is left
    as it was), its variables stay float32, the HSTU kernels run in bfloat16 and the head in
    float32; with the f32 model's weights its states agree within bfloat16's tolerance, and on
    the same data it trains like the f32 model (falling loss, test HR@10 within 0.1)."""
    import keras

    from recops_tf import testing

    items = tf.ragged.constant([[1, 2, 3, 7, 9, 12, 30], [4, 5, 44]], tf.int64)
    stamps = tf.ragged.constant([[1, 20, 300, 4000, 4001, 4002, 50000], [1, 2, 3]], tf.int64)
    inputs = {"items": items, "timestamps": stamps}
    models = {p: training_module.build_model(_tiny_config(precision=p), 60)
              for p in ("f32", "bf16")}
    assert keras.mixed_precision.dtype_policy().name == "float32"
    for model in models.values():
        model(inputs, training=True)  # builds the layers and grows the table
    for mine, theirs in zip(models["bf16"].weights, models["f32"].weights):
        mine.assign(theirs)
    spec = tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64)
    encode = tf.function(lambda i, t: models["bf16"]({"items": i, "timestamps": t}))
    trace = encode.get_concrete_function(spec, spec)
    hstu = [op for op in trace.graph.get_operations() if op.type == "Recops>HstuDenseForward"]
    assert hstu and all(op.get_attr("T") == tf.bfloat16 for op in hstu)
    assert {v.dtype for v in models["bf16"].trainable_variables} == {"float32"}
    states = {p: m(inputs).flat_values for p, m in models.items()}
    assert states["bf16"].dtype == tf.float32
    rtol, atol = testing.tolerance(tf.bfloat16, reduction=16)
    np.testing.assert_allclose(states["bf16"].numpy(), states["f32"].numpy(), rtol=rtol,
                               atol=atol)
    data = rec.synthetic(num_users=200, num_items=60, num_tastes=4, seed=2)
    results = {p: rec.train(data, _tiny_config(precision=p, epochs=6, learning_rate=3e-3),
                            progress=False) for p in ("f32", "bf16")}
    bf16, f32 = results["bf16"], results["f32"]
    assert bf16.last_loss < 0.5 * bf16.first_loss
    assert abs(bf16.test["hr@10"] - f32.test["hr@10"]) < 0.1, (bf16.test, f32.test)
    with pytest.raises(ValueError, match="precision must be one of"):
        rec.Config.from_preset("hstu", precision="fp8").check()


def test_seen_bias_is_added_to_the_items_already_read():
    model = rec.GenerativeRecommender(10, d_model=8, num_blocks=1, head_dim=4, max_seq_len=4,
                                      seen_bias=True)
    items = tf.RaggedTensor.from_row_lengths(tf.constant([1, 2, 2, 4, 5], tf.int64),
                                             tf.constant([3, 2], tf.int64))
    states = model({"items": items, "timestamps": items}, training=False)
    model.seen_logit.assign(-2.0)
    last = tf.gather(states.flat_values, [2, 4])
    plain = model.scores(last).numpy()
    biased = model.scores(last, seen=items).numpy()
    expected = np.zeros((2, 10))
    expected[0, [0, 1]] = -2.0  # items 1, 2 (2 twice: once)
    expected[1, [3, 4]] = -2.0
    np.testing.assert_allclose(biased - plain, expected, atol=1e-5)
    with tf.GradientTape() as tape:  # the bias's gradient counts each (row, item) pair once
        total = tf.reduce_sum(model.scores(last, seen=items))
    assert tape.gradient(total, model.seen_logit).numpy() == pytest.approx(4.0)
    # In training, position t sees only the items read up to t: item 2 (the target of
    # positions 0 and 1) is seen from position 1 on, item 1 (a negative) from position 0.
    targets = tf.RaggedTensor.from_row_lengths(tf.constant([2, 2, 4, 5, 6], tf.int64),
                                               tf.constant([3, 2], tf.int64))
    negatives = tf.constant([[1, 9], [4, 1]], tf.int64)
    pos, neg = model_module._positives_and_negatives(model, states, targets, negatives, False,
                                                     read=items)
    model.seen_logit.assign(0.0)
    pos0, neg0 = model_module._positives_and_negatives(model, states, targets, negatives, False,
                                                       read=items)
    np.testing.assert_allclose((neg - neg0).numpy(), [[-2, 0]] * 5, atol=1e-5)
    np.testing.assert_allclose((pos - pos0).numpy(), [0, -2, 0, 0, 0], atol=1e-5)
    # The full softmax's dense form gives the same bias for every catalogue item.
    model.seen_logit.assign(-2.0)
    catalogue = tf.broadcast_to(model.catalogue[None], [5, 10])
    np.testing.assert_array_equal(model_module._seen_bias_full(model, states, items).numpy(),
                                  model_module._seen_bias(model, states, items, catalogue).numpy())
    assert model_module._seen_bias_full(model, states, items).numpy()[0, 0] == -2.0  # item 1


@pytest.mark.parametrize("flag", ["--seen-bias", "--no-seen-bias"])
def test_seen_bias_on_and_off_train_and_export(tmp_path, flag):
    out = tmp_path / "seen"
    assert cli.main(["train", *TINY, flag, "--max-steps", "3", "--out", str(out)]) == 0
    assert flag in json.loads((out / "run.json").read_text())["argv"]
    import keras

    loaded = keras.saving.load_model(str(out / "model.keras"))
    on = flag == "--seen-bias"
    assert loaded.seen_bias == on and (loaded.seen_logit is not None) == on
    module = tf.saved_model.load(str(out / "saved_model"))
    got = module.recommend(tf.constant([1, 2, 3], tf.int64), tf.constant([1, 2, 3], tf.int64),
                           tf.constant(5, tf.int32))
    assert rec.recommend(str(out), [1, 2, 3], k=5)[0] == [str(i) for i in got["items"].numpy()]


def test_untied_head_has_its_own_table_trains_checkpoints_and_exports(tmp_path):
    data = rec.synthetic(num_users=64, num_items=30, seed=1)
    config = _tiny_config(share_embeddings=False, epochs=2)
    result = rec.train(data, config, checkpoint_dir=str(tmp_path / "ckpt"), progress=False)
    model = result.model
    assert len(model.tables()) == 2 and result.last_loss < result.first_loss
    ids = tf.constant([1, 2, 3], tf.int64)
    head = model.item_embeddings(ids, training=False)
    inputs = tf.math.l2_normalize(model._raw_embed(ids, False), -1)
    assert not np.allclose(head.numpy(), inputs.numpy())  # two tables, trained apart
    path = rec.export(model, data, str(tmp_path / "out"))
    loaded = tf.saved_model.load(path)
    # The export scores against its frozen copy of the head's (not the input's) items.
    np.testing.assert_array_equal(loaded.item_matrix.numpy(),
                                  model.item_matrix(training=False).numpy())
    history = tf.constant(data.items[0][:5], tf.int64)
    got = loaded.recommend(history, tf.range(5, dtype=tf.int64), tf.constant(5))
    states = training_module.last_states(
        model, tf.RaggedTensor.from_row_lengths(history, [5]),
        tf.RaggedTensor.from_row_lengths(tf.range(5, dtype=tf.int64), [5]))
    scores = model.scores(states, seen=tf.RaggedTensor.from_row_lengths(history, [5]))[0]
    np.testing.assert_allclose(got["scores"].numpy(), tf.math.top_k(scores, 5).values.numpy(),
                               rtol=1e-5, atol=1e-5)
    shared = rec.train(data, _tiny_config(epochs=1), progress=False).model
    assert len(shared.tables()) == 1


@pytest.mark.parametrize("encoder", ["hstu", "sasrec"])
def test_dropout_seed_moves_the_masks_not_the_initial_weights(encoder):
    """Multi-worker ranks build the model with a dropout seed of their own (``rank_seed``):
    the same initial weights, other masks; the same dropout seed, the same masks."""
    def build(dropout_seed):
        tf.keras.utils.set_random_seed(0)
        m = rec.GenerativeRecommender(40, encoder=encoder, d_model=16, num_blocks=1,
                                      head_dim=8, max_seq_len=16, dropout_rate=0.5, seed=5,
                                      dropout_seed=dropout_seed)
        items = tf.ragged.constant([[1, 2, 3, 4], [5, 6, 7]], tf.int64)
        return m, m({"items": items, "timestamps": items * 10}, training=True)

    (base, out), (_, out_same), (other, out_other) = build(None), build(5), build(5 + 7919)
    for a, b in zip(base.get_weights(), other.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(out.flat_values, out_same.flat_values)
    assert not np.allclose(out.flat_values, out_other.flat_values)
    config = _tiny_config(seed=5)

    class Rank:
        world_size, rank = 2, 1
    assert training_module.rank_seed(config) == training_module.rank_seed(config, None) == 5
    assert training_module.rank_seed(config, Rank()) != 5


@pytest.mark.parametrize("policy,tol", [("float32", 1e-5), ("mixed_bfloat16", 3e-2)])
def test_extend_in_steps_equals_the_whole_history(policy, tol):
    """GenerativeRecommender.extend: a history encoded in steps against the cache rows of the
    earlier ones (36 events at once: the tiled kernel on concatenated keys; then 1 and 3 new
    events: the cache read in place; or every step one way, ``in_place`` True or False) gives
    the state and rows of the whole history at once."""
    from recops_tf.layers import hstu_block
    assert 36 > hstu_block.EXTEND_IN_PLACE >= 3
    keras = tf.keras
    keras.mixed_precision.set_global_policy(policy)
    try:
        tf.keras.utils.set_random_seed(0)
        m = rec.GenerativeRecommender(60, encoder="hstu", d_model=16, num_blocks=2,
                                      num_heads=2, head_dim=8, max_seq_len=48, seed=3)
        rng = np.random.default_rng(0)
        items = rng.integers(1, 61, 40).astype(np.int64)
        stamps = np.cumsum(rng.integers(1, 100_000, 40)).astype(np.int64)
        m({"items": tf.ragged.constant([items[:2]]), "timestamps": tf.ragged.constant(
            [stamps[:2]])}, training=False)
        for w in m.weights:  # biases start at 0: give them values, so they count
            if "bias" in w.path and w.dtype == "float32":
                w.assign(rng.normal(0, 0.3, w.shape).astype("float32"))
        whole_rows, whole_state = m.extend(items, stamps, tf.zeros([0, m.cache_width],
                                                                   m.compute_dtype),
                                           tf.zeros([0], tf.int64))
        want = model_module.last_states(m, tf.ragged.constant([items]),
                                        tf.ragged.constant([stamps]))[0]
        f64 = lambda x: tf.cast(x, tf.float64).numpy()  # noqa: E731
        np.testing.assert_allclose(f64(whole_state), f64(want), rtol=tol, atol=tol)
        # in_place None: chosen by the number of new events; True / False: one way for all
        for in_place in (None, True, False):
            past = tf.zeros([0, m.cache_width], m.compute_dtype)
            for lo, hi in ((0, 36), (36, 37), (37, 40)):
                rows, state = m.extend(items[lo:hi], stamps[lo:hi], past, stamps[:lo],
                                       in_place=in_place)
                past = tf.concat([past, rows], 0)
            np.testing.assert_allclose(f64(state), f64(want), rtol=tol, atol=tol)
            np.testing.assert_allclose(f64(past), f64(whole_rows), rtol=tol, atol=tol)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_top_k_by_blocks_equals_tf_top_k_ties_included():
    from recops_tf.recommender.exporting import top_k_by_blocks

    rng = np.random.default_rng(4)
    for _ in range(60):
        block = int(rng.choice([2, 8, 64]))
        width = block * int(rng.integers(1, 40))
        k = int(rng.integers(1, width + 1))
        # few distinct values and many -inf (items excluded): ties everywhere
        scores = rng.integers(-3, 3, size=(3, width)).astype(np.float32)
        scores[rng.random(scores.shape) < 0.3] = -np.inf
        want = tf.math.top_k(scores, k)
        values, indices = top_k_by_blocks(tf.constant(scores), k, block)
        np.testing.assert_array_equal(values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())


def test_an_export_scored_by_blocks_answers_as_the_plain_one(tmp_path, monkeypatch):
    """A catalogue of BLOCKED_TOP_K_FROM items or more is exported with its matrix padded to
    whole blocks and ranked by blocks: the answers are the plain export's."""
    from recops_tf.recommender import exporting

    data = rec.synthetic(num_users=40, num_items=100, seed=2)
    model = rec.train(data, _tiny_config(epochs=1), progress=False).model
    plain = tf.saved_model.load(rec.export(model, data, str(tmp_path / "plain")))
    monkeypatch.setattr(exporting, "BLOCKED_TOP_K_FROM", 64)
    blocked = tf.saved_model.load(rec.export(model, data, str(tmp_path / "blocked")))
    assert plain.item_matrix.shape[0] == 100 and blocked.item_matrix.shape[0] == 128

    def same(a, b):
        np.testing.assert_array_equal(a["items"].numpy(), b["items"].numpy())
        np.testing.assert_allclose(a["scores"].numpy(), b["scores"].numpy(), rtol=1e-5,
                                   atol=1e-5)
        assert (a["items"].numpy() <= 100).all()  # never a padding row

    items = tf.constant([[3, 9, 9, 41], [7, 0, 0, 0]], tf.int64)
    stamps = tf.constant([[1, 2, 3, 4], [5, 0, 0, 0]], tf.int64)
    same(plain.signatures["serving_default"](items=items, timestamps=stamps),
         blocked.signatures["serving_default"](items=items, timestamps=stamps))
    history, times = items[0], stamps[0]
    for k in (1, 5, 100, 500):  # 500: more than the catalogue
        same(plain.recommend(history, times, tf.constant(k)),
             blocked.recommend(history, times, tf.constant(k)))
    state = plain.user_state(history, times)["state"]
    for exclude in (False, True):
        got = blocked.top_k(state, history, tf.constant(100), tf.constant(exclude))
        same(plain.top_k(state, history, tf.constant(100), tf.constant(exclude)), got)
        assert (set(got["items"].numpy()[-3:]) == {3, 9, 41}) == exclude  # -inf: last


def test_the_checkpoint_at_an_epochs_end_holds_its_validation(tmp_path):
    """Validated at each epoch's end (eval_every 0) with a step checkpoint due on that same
    step: the checkpoint made before the validation must not stand in for the one after it
    (the epoch's checkpoint holds its validation and the next epoch's number)."""
    data = rec.synthetic(num_users=64, num_items=30, seed=3)
    config = dataclasses.replace(_tiny_config(eval_every=0, epochs=2, batch_size=32),
                                 checkpoint_every=2)  # 2 steps an epoch
    whole = rec.train(data, config, checkpoint_dir=str(tmp_path / "ckpt"), progress=False)
    assert len(whole.validation) == 2
    reader = tf.train.load_checkpoint(str(tmp_path / "ckpt" / "last" / "ckpt-2"))
    value = {k.split("/")[1]: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
             if k.startswith("state/") and k.endswith(".ATTRIBUTES/VARIABLE_VALUE")}
    assert json.loads(value["history"].decode()) == whole.validation[:1]
    assert (int(value["epoch"]), int(value["steps"])) == (1, 2)


def test_progress_bar_says_no_best_before_the_first_validation(capsys):
    """An epoch that ends before the first validation (--eval-every longer than an epoch) with
    the progress bar: no "best -1.0000 at step -1" line."""
    data = rec.synthetic(num_users=64, num_items=40, seed=2)
    lines = []
    rec.train(data, _tiny_config(epochs=2, eval_every=5, max_steps=5), progress=True,
              log=lines.append)
    capsys.readouterr()
    assert any("best" in line for line in lines), lines
    assert not any("at step -1" in line for line in lines), lines


def test_refit_trains_on_the_validation_items_and_reports_both_figures():
    """refit_epochs: after the choices on validation the kept weights train on every event
    before the test item; the result keeps the test figures before it, the model is the
    refitted one (other weights, the figures of its own evaluation)."""
    data = rec.synthetic(num_users=96, num_items=40, seed=4)
    config = _tiny_config(epochs=2)
    plain = rec.train(data, config, progress=False)
    refitted = rec.train(data, dataclasses.replace(config, refit_epochs=2), progress=False)
    assert plain.test_train_only is None and plain.refit_seconds == 0.0
    # The same run up to the refit: its figures before are the plain run's.
    for metric in ("hr@10", "ndcg@10"):
        assert refitted.test_train_only[metric] == pytest.approx(plain.test[metric], abs=1e-12)
    assert refitted.refit_seconds > 0
    split = rec.Split.leave_one_out(data)
    again = rec.evaluate(refitted.model, split, "test")
    assert again["ndcg@10"] == pytest.approx(refitted.test["ndcg@10"], abs=1e-12)
    moved = [not np.allclose(a, b) for a, b in zip(plain.model.get_weights(),
                                                   refitted.model.get_weights())]
    assert any(moved)
