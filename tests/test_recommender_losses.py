"""The loss levers against their definitions: label smoothing (Keras' form, over every
candidate or the unmasked ones) and gSASRec's gBCE (its beta, and the loss on the positive and
sampled negatives)."""
import numpy as np
import pytest
import tensorflow as tf

from recops_tf import recommender as rec
from recops_tf.recommender import model as model_module


def _reference_cross_entropy(logits, target, smoothing, valid):
    out = []
    for z, t, ok in zip(logits, target, valid):
        z, ok = z.astype(np.float64), ok.copy()
        ok[t] = True
        p = np.exp(z[ok] - z[ok].max())
        p /= p.sum()
        label = np.zeros(ok.sum())
        label[np.flatnonzero(ok).tolist().index(t)] = 1.0 - smoothing
        label += smoothing / ok.sum()
        out.append(-(label * np.log(p)).sum())
    return np.array(out)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("masked", [False, True])
def test_cross_entropy_with_label_smoothing(smoothing, masked):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 9)).astype(np.float32) * 3
    target = rng.integers(0, 9, 6)
    valid = rng.uniform(size=(6, 9)) > 0.3 if masked else np.ones((6, 9), bool)
    valid[np.arange(6), target] = True
    z = np.where(valid, logits, model_module._HIT).astype(np.float32)
    got = model_module._cross_entropy(tf.constant(z), tf.constant(z[np.arange(6), target]),
                                      smoothing, tf.constant(valid) if masked else None)
    np.testing.assert_allclose(got.numpy(), _reference_cross_entropy(z, target, smoothing,
                                                                     valid), rtol=1e-5)


def test_gbce_beta():
    assert model_module.gbce_beta(128, 1001, t=0.0) == pytest.approx(1.0)  # plain BCE
    assert model_module.gbce_beta(128, 1001, t=1.0) == pytest.approx(128 / 1000)
    alpha = 256 / 3415
    assert model_module.gbce_beta(256, 3416, 0.75) == pytest.approx(
        alpha * (0.75 * (1 - 1 / alpha) + 1 / alpha))


def test_gbce_loss_on_the_positive_and_the_negatives():
    data = rec.synthetic(num_users=8, num_items=20, seed=2)
    model = rec.training.build_model(rec.Config.from_preset(
        "hstu", d_model=8, num_blocks=1, head_dim=8, max_seq_len=16, seen_bias=False), 20)
    lengths = [min(len(h), 6) for h in data.items]
    items = tf.RaggedTensor.from_row_lengths(
        np.concatenate([h[:n] for h, n in zip(data.items, lengths)]), lengths)
    stamps = tf.RaggedTensor.from_row_lengths(
        np.concatenate([t[:n] for t, n in zip(data.timestamps, lengths)]), lengths)
    negatives = tf.constant(np.random.default_rng(1).integers(1, 21, (8, 5)), tf.int64)
    got = model_module.next_item_loss(model, items, stamps, "gbce", negatives, training=False,
                                      gbce_t=0.5)
    states = model({"items": items[:, :-1], "timestamps": stamps[:, :-1]}, training=False)
    pos, neg = model_module._positives_and_negatives(model, states, items[:, 1:], negatives,
                                                     False)
    pos, neg = pos.numpy().astype(np.float64), neg.numpy().astype(np.float64)
    beta = model_module.gbce_beta(5, 20, 0.5)
    sigmoid = lambda x: 1 / (1 + np.exp(-x))
    neg_terms = np.where(neg < -1e8, 0.0, -np.log1p(-sigmoid(np.maximum(neg, -50))))
    expected = np.mean(-beta * np.log(sigmoid(pos)) + neg_terms.sum(1))
    assert got.numpy() == pytest.approx(expected, rel=1e-5)


def test_loss_settings_are_checked():
    with pytest.raises(ValueError, match="label_smoothing must lie"):
        rec.Config.from_preset("auto", label_smoothing=1.0).check()
    with pytest.raises(ValueError, match="gbce_t must lie"):
        rec.Config.from_preset("auto", gbce_t=1.5).check()


def test_learning_rate_schedules():
    from recops_tf.recommender import training
    config = rec.Config.from_preset("auto", learning_rate=2e-3)
    assert training.learning_rate_schedule(config) == 2e-3  # constant, no warm-up: the float
    warm = training.learning_rate_schedule(
        rec.Config.from_preset("auto", learning_rate=2e-3, warmup_steps=100))
    rates = [float(warm(s)) for s in (0, 50, 100, 5000)]
    assert rates == pytest.approx([0.0, 1e-3, 2e-3, 2e-3])
    cosine = training.learning_rate_schedule(rec.Config.from_preset(
        "auto", learning_rate=2e-3, warmup_steps=100, lr_schedule="cosine", min_steps=1100))
    rates = [float(cosine(s)) for s in (50, 100, 600, 1100, 9000)]
    floor = training.LR_FLOOR * 2e-3
    assert rates == pytest.approx([1e-3, 2e-3, (2e-3 + floor) / 2, floor, floor])
    # without a minimum budget the cosine spans the run's step bound
    bounded = training.learning_rate_schedule(rec.Config.from_preset(
        "auto", lr_schedule="cosine"), total_steps=400)
    assert float(bounded(0)) == pytest.approx(1e-3) and float(bounded(400)) == pytest.approx(1e-4)


def test_learning_rate_schedule_settings_are_checked(capsys):
    from recops_tf import cli
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        rec.Config.from_preset("auto", lr_schedule="linear").check()
    with pytest.raises(ValueError, match="warmup_steps must be at least 0"):
        rec.Config.from_preset("auto", warmup_steps=-1).check()
    with pytest.raises(ValueError, match="decays between warmup_steps"):
        rec.Config.from_preset("auto", lr_schedule="cosine", warmup_steps=500,
                               min_steps=200).check()
    assert cli.main(["train", "--users", "40", "--items", "30", "--lr-schedule", "cosine",
                     "--warmup-steps", "50", "--max-steps", "20", "--min-steps", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "decays between warmup_steps (50) and min_steps" in err[0]


@pytest.mark.parametrize("fused", [True, False])
def test_weight_decay_is_decoupled_and_leaves_the_item_tables(fused):
    """One step from the same weights and batch with and without weight decay: each decayed
    matrix differs by exactly learning_rate x weight_decay x its value before the step (the
    Adam step of the two is the same: the gradients are taken before the decay); biases and
    the item tables do not differ at all."""
    from recops_tf.recommender import training
    items = tf.ragged.constant([[1, 4, 2, 7], [3, 5, 6]], tf.int64)
    stamps = tf.ragged.constant([[10, 20, 30, 40], [5, 6, 7]], tf.int64)
    after = {}
    for decay in (0.0, 0.25):
        config = rec.Config.from_preset("auto", d_model=8, head_dim=8, max_seq_len=8,
                                        loss="full", dropout_rate=0.0, learning_rate=0.01,
                                        weight_decay=decay, use_fused=fused, seed=3).check()
        tf.keras.utils.set_random_seed(3)
        model = training.build_model(config, 9)
        model({"items": items[:, :1], "timestamps": stamps[:, :1]}, training=False)
        model.item_matrix(training=False)
        before = [v.numpy().copy() for v in model.trainable_variables]
        optimizer = training.make_optimizer(config)
        step = training.train_step(model, optimizer, tf.random.Generator.from_seed(0), config,
                                   9)
        step(items, stamps)
        decayed = {id(v) for v in training.decayed_variables(model)}
        after[decay] = ([v.numpy() for v in model.trainable_variables], before,
                        [id(v) in decayed for v in model.trainable_variables],
                        model.item_matrix(training=False).numpy())
    (plain, before, decayed, table0), (shrunk, _, _, table1) = after[0.0], after[0.25]
    assert any(decayed) and all(before[i].ndim >= 2 for i, d in enumerate(decayed) if d)
    for i, value in enumerate(plain):
        want = value - (0.01 * 0.25 * before[i] if decayed[i] else 0.0)
        np.testing.assert_allclose(shrunk[i], want, rtol=1e-5, atol=1e-7, err_msg=str(i))
    np.testing.assert_array_equal(table0, table1)
    with pytest.raises(ValueError, match="weight_decay must lie"):
        rec.Config.from_preset("auto", weight_decay=-0.1).check()


@pytest.mark.parametrize("loss,smoothing", [("sampled", 0.0), ("sampled", 0.1), ("gbce", 0.0)])
@pytest.mark.parametrize("fused", [True, False])
def test_per_position_negatives_from_the_catalogue_logits_equal_the_gathered_ones(
        monkeypatch, loss, smoothing, fused):
    """Per-position negatives on a small catalogue take their logits from the [P, num_items]
    product (`DENSE_NEGATIVES_PER_ITEM`): the loss and every gradient equal those of the
    gathered item embeddings, hits of the positive masked and the seen-item bias included
    (negatives drawn to contain the positives and items already read)."""
    items = tf.ragged.constant([[1, 4, 2, 7, 4], [3, 5, 6], [2, 8]], tf.int64)
    stamps = tf.ragged.constant([[10, 20, 30, 40, 50], [5, 6, 7], [1, 2]], tf.int64)
    config = rec.Config.from_preset("auto", d_model=8, head_dim=8, max_seq_len=8, loss=loss,
                                    dropout_rate=0.0, use_fused=fused, seed=2).check()
    from recops_tf.recommender import training
    tf.keras.utils.set_random_seed(2)
    model = training.build_model(config, 9)
    model({"items": items[:, :1], "timestamps": stamps[:, :1]}, training=False)
    model.item_matrix(training=False)
    model.seen_logit.assign(0.7)
    positions = int(tf.size(items[:, 1:].flat_values))
    negatives = tf.constant(np.random.default_rng(0).integers(1, 10, (positions, 6)), tf.int64)
    targets = items[:, 1:].flat_values.numpy()
    assert (negatives.numpy() == targets[:, None]).any()  # some hits to mask
    out = {}
    for factor in (0, model_module.DENSE_NEGATIVES_PER_ITEM):
        monkeypatch.setattr(model_module, "DENSE_NEGATIVES_PER_ITEM", factor)
        assert model_module._dense_negatives(model, negatives) == bool(factor)
        with tf.GradientTape() as tape:
            value = model_module.next_item_loss(model, items, stamps, loss, negatives,
                                                training=True, per_position=True,
                                                label_smoothing=smoothing)
        grads = tape.gradient(value, model.trainable_variables)
        out[factor] = (value.numpy(), [_rows(g) for g in grads if g is not None])
    (loss0, grads0), (loss1, grads1) = out.values()
    np.testing.assert_allclose(loss1, loss0, rtol=1e-5)
    assert len(grads0) == len(grads1) and len(grads0) > 3
    for g0, g1 in zip(grads0, grads1):
        np.testing.assert_allclose(g1, g0, rtol=1e-4, atol=1e-5 * max(np.abs(g0).max(), 1.0))


def _rows(gradient):
    """A gradient as a dense array; an IndexedSlices (the growing table's rows keyed by
    address, in any order, repeats allowed) as its rows summed by index, in index order."""
    if not isinstance(gradient, tf.IndexedSlices):
        return gradient.numpy()
    indices, values = gradient.indices.numpy(), gradient.values.numpy()
    keys, where = np.unique(indices, return_inverse=True)
    summed = np.zeros((len(keys),) + values.shape[1:], values.dtype)
    np.add.at(summed, where.reshape(-1), values)
    return summed


@pytest.mark.parametrize("smoothing,graph", [(0.0, False), (0.1, False), (0.1, True)])
def test_fused_full_softmax_equals_the_catalogue_logits(monkeypatch, smoothing, graph):
    """The full softmax through `fused_linear_cross_entropy` (the default of the fused model)
    gives the loss and every gradient of the [P, num_items] logits composite, the seen-item
    bias (items read twice included) and label smoothing included; in a tf.function (`graph`)
    the table's gradient is the kernel's item gradient with the batch's rows added in place
    (the covering lookup's InplaceAdd), the same rows as the composite's two lookups."""
    items = tf.ragged.constant([[1, 4, 2, 7, 4, 4], [3, 5, 6], [2, 8], [9]], tf.int64)
    stamps = tf.ragged.constant([[10, 20, 30, 40, 50, 60], [5, 6, 7], [1, 2], [3]], tf.int64)
    config = rec.Config.from_preset("auto", d_model=8, head_dim=8, max_seq_len=8, loss="full",
                                    dropout_rate=0.0, seed=3).check()
    from recops_tf.recommender import training
    tf.keras.utils.set_random_seed(3)
    model = training.build_model(config, 9)
    model({"items": items[:, :1], "timestamps": stamps[:, :1]}, training=False)
    model.item_matrix(training=False)
    model.seen_logit.assign(0.7)
    out = []
    for fused in (True, False):
        monkeypatch.setattr(model, "use_fused", fused, raising=False)

        def loss_and_grads():
            with tf.GradientTape() as tape:
                value = model_module.next_item_loss(model, items, stamps, "full",
                                                    training=True, label_smoothing=smoothing)
            return value, tape.gradient(value, model.trainable_variables)

        if graph:
            fn = tf.function(loss_and_grads)
            ops = {op.type for op in fn.get_concrete_function().graph.get_operations()}
            assert ("InplaceAdd" in ops) == fused
            value, grads = fn()
        else:
            value, grads = loss_and_grads()
        monkeypatch.setattr(model, "use_fused", True, raising=False)
        out.append((value.numpy(), [_rows(g) for g in grads if g is not None]))
    (fused_loss, fused_grads), (loss, grads) = out
    np.testing.assert_allclose(fused_loss, loss, rtol=1e-5)
    assert len(fused_grads) == len(grads) and len(grads) > 3
    for g0, g1 in zip(grads, fused_grads):
        np.testing.assert_allclose(g1, g0, rtol=1e-4, atol=1e-5 * max(np.abs(g0).max(), 1.0))


def test_bf16_precision_puts_the_full_softmax_on_bfloat16():
    """--precision bf16: the fused full softmax runs on bfloat16 inputs (the tiles' path)
    and gives the float32 model's loss within bfloat16's tolerance, with float32 gradients."""
    from recops_tf import testing
    from recops_tf.recommender import training
    items = tf.ragged.constant([[1, 4, 2, 7, 4], [3, 5, 6], [2, 8]], tf.int64)
    stamps = tf.ragged.constant([[10, 20, 30, 40, 50], [5, 6, 7], [1, 2]], tf.int64)
    values = {}
    for precision in ("f32", "bf16"):
        config = rec.Config.from_preset("auto", d_model=16, head_dim=16, max_seq_len=8,
                                        loss="full", dropout_rate=0.0, seed=4,
                                        precision=precision).check()
        tf.keras.utils.set_random_seed(4)
        model = training.build_model(config, 9)
        model({"items": items[:, :1], "timestamps": stamps[:, :1]}, training=False)
        if precision == "bf16":
            for mine, theirs in zip(model.weights, values["f32"][1].weights):
                mine.assign(theirs)
        fn = tf.function(lambda: model_module.next_item_loss(model, items, stamps, "full"))
        # A training step's loss: the one-pass op (gradients made in the forward).
        ops = [op for op in fn.get_concrete_function().graph.get_operations()
               if op.type == "Recops>FusedLinearCrossEntropyWithGrad"]
        assert ops and ops[0].get_attr("T") == (tf.bfloat16 if precision == "bf16"
                                                else tf.float32)
        with tf.GradientTape() as tape:
            value = fn()
        grads = [g for g in tape.gradient(value, model.trainable_variables) if g is not None]
        assert grads and all(g.dtype == tf.float32 for g in grads)
        values[precision] = (float(value), model)
    rtol, atol = testing.tolerance(tf.bfloat16, magnitude=4.0, reduction=16)
    np.testing.assert_allclose(values["bf16"][0], values["f32"][0], rtol=rtol, atol=atol)


@pytest.mark.parametrize("loss,per", [("sampled", "sequence"), ("sampled", "position"),
                                      ("full", "sequence")])
def test_bf16_precision_without_the_fused_ops_trains(loss, per):
    """--no-fused --precision bf16: the Keras tables return bfloat16 under mixed_bfloat16 and
    the head is float32; every loss builds and gives a finite loss (a dtype TypeError once)."""
    from recops_tf.recommender import training
    items = tf.ragged.constant([[1, 4, 2, 7, 4], [3, 5, 6], [2, 8]], tf.int64)
    stamps = tf.ragged.constant([[10, 20, 30, 40, 50], [5, 6, 7], [1, 2]], tf.int64)
    config = rec.Config.from_preset("auto", d_model=16, head_dim=16, max_seq_len=8, loss=loss,
                                    negatives_per=per, num_negatives=4, use_fused=False,
                                    precision="bf16", seed=4).check()
    model = training.build_model(config, 9)  # (sets the policy while it builds)
    step = training.train_step(model, training.make_optimizer(config),
                               tf.random.Generator.from_seed(0), config, 9)
    value = float(step(items, stamps))
    assert np.isfinite(value) and value > 0
