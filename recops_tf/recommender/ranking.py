"""The ranking task (``recops-tf train --task ranking``): HSTU as a ranker of candidates, as
generative-recommenders' DLRM-v3 runs it, and the baselines it is compared with in the same
harness and split (``ranking_data.py``: the data, the split and the tasks).

* ``HSTURanker``: per user one jagged sequence ``[contextual tokens | history events |
  candidates]``. A contextual token per user feature (the user id first); a history event is
  its item's embedding plus its action's (the rating) plus the embeddings of its position from
  the end and of the log2 bucket of its age at the query time (generative-recommenders'
  positional encoder: in the input, not an attention bias); a candidate is its item's
  embedding plus the "no action" embedding. The ``HSTUBlock``s run with ``num_targets`` the
  candidates and ``target_group_size=1``: each candidate attends to the contextual tokens, the
  whole history and itself, never to another candidate, so its score does not depend on what
  else is ranked beside it (and candidates can be scored in micro-batches over one cached
  history: ``mfalcon.py``). The candidates' outputs feed an MLP and one logit per task.
* ``DLRMRanker``: a stock-Keras DLRM-style model: an embedding per user feature, the
  candidate's, the mean of the history's item and item + action embeddings, their pairwise
  dot products and an MLP.
* ``TwoTowerRanker``: a trained retrieval ``GenerativeRecommender``'s user state and candidate
  embedding (frozen) fed to an MLP.
* ``trivial_baselines``: the item's training like rate / mean rating / popularity, and the
  user's own.

Losses (per candidate, masked as ``ranking_data`` says): binary cross-entropy for ``watch``
and ``like``, squared error for ``rating``, weighted by ``RankingConfig.task_weights``;
early stopping on the validation loss.
"""
import copy
import dataclasses
import math
import time

import keras
import numpy as np
import tensorflow as tf

from recops_tf.layers.hstu_block import HSTUBlock
from recops_tf.recommender import ranking_data as rd
from recops_tf.recommender import ranking_metrics

TASKS = rd.TASKS
_RAGGED = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)
INPUT_SPEC = {"context": tf.TensorSpec([None, None], tf.int64), "items": _RAGGED,
              "actions": _RAGGED, "timestamps": _RAGGED, "candidates": _RAGGED,
              "query_time": tf.TensorSpec([None], tf.int64)}


@dataclasses.dataclass
class RankingConfig:
    """The knobs of a ranking run (``recops-tf train --task ranking`` flags)."""
    d_model: int = 64
    num_blocks: int = 2
    num_heads: int = 2
    head_dim: int = 32
    max_seq_len: int = 200  # history events read (the last ones)
    dropout_rate: float = 0.2
    hidden: int = 128  # the heads' MLP width
    targets: int = 10  # real candidates per user in training (its next events)
    negative_ratio: int = 1  # sampled candidates per real one
    holdout: int = 5  # validation and test events per user
    like_threshold: float = 4.0
    task_weights: dict = dataclasses.field(
        default_factory=lambda: {"watch": 1.0, "like": 1.0, "rating": 1.0})
    batch_size: int = 64
    learning_rate: float = 1e-3
    eval_every: int = 100  # steps
    patience: int = 5  # validations without a better validation loss
    min_steps: int = 1000
    max_steps: int = 20000
    micro_batch: int = 64  # M-FALCON's candidates per micro-batch (export, serving)
    # The HSTU ranker's auxiliary generative loss: each history event's output predicts the
    # next event's item (softmax over the catalogue, l2-normalised, temperature 0.05), the
    # retrieval model's task on the same sequence (0: off).
    next_item_weight: float = 1.0
    # The tasks whose weighted validation loss selects the step (early stopping, the weights
    # kept): those of the held-out events themselves by default. Measured on MovieLens-100K:
    # `like` and `rating` overfit within a few hundred steps while `watch` (and the
    # auxiliary loss) keep improving; a criterion summing all three kept late steps whose
    # `like` was over-confident (NE 0.90 against 0.83-0.84, seed-dependent).
    validation_tasks: tuple = ("like", "rating")
    # An exponential average of the trainable weights, updated after every step with this
    # decay (0: off), is what each validation scores and what is kept: the validation loss
    # of the raw weights swings between validations at a constant learning rate, and the
    # step kept was whichever swing was lowest. 0.99 averages over about one validation
    # interval (100 steps); the first steps are debiased (decay min(d, (1 + t) / (10 + t))).
    weight_average: float = 0.99
    seed: int = 0

    def check(self):
        for name in ("d_model", "num_blocks", "num_heads", "head_dim", "max_seq_len", "hidden",
                     "targets", "holdout", "batch_size", "eval_every", "max_steps",
                     "micro_batch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 <= self.weight_average < 1.0:
            raise ValueError(f"weight_average must lie in [0, 1), got {self.weight_average}")
        if not self.next_item_weight >= 0:
            raise ValueError(f"next_item_weight must be >= 0, got {self.next_item_weight}")
        if int(self.negative_ratio) < 0 or int(self.patience) < 1 or int(self.min_steps) < 0:
            raise ValueError("negative_ratio and min_steps must be >= 0 and patience >= 1")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        unknown = set(self.task_weights) - set(TASKS)
        if unknown:
            raise ValueError(f"unknown task(s) {sorted(unknown)}; the tasks are {TASKS}")
        if any(w < 0 for w in self.task_weights.values()) or \
                not any(w > 0 for w in self.task_weights.values()):
            raise ValueError(f"task weights must be >= 0 and one positive, got "
                             f"{self.task_weights}")
        if not self.validation_tasks or set(self.validation_tasks) - set(TASKS) or \
                not any(self.task_weights.get(t, 0) > 0 for t in self.validation_tasks):
            raise ValueError(f"validation_tasks must be tasks of {TASKS} with one of positive "
                             f"weight, got {self.validation_tasks}")
        return self


def parse_task_weights(text):
    """``"watch=1,like=1,rating=0.5"`` -> dict (tasks not named keep weight 1)."""
    weights = {t: 1.0 for t in TASKS}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        name, eq, value = part.partition("=")
        if not eq or name.strip() not in TASKS:
            raise ValueError(f"--task-weights: expected task=weight with a task of {TASKS}, "
                             f"got {part!r}")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--task-weights: {value!r} is not a number") from None
    return weights


def to_inputs(batch):
    """A ``ranking_data.Batch`` as the models' input dict of tensors."""
    def ragged(pair):
        return tf.RaggedTensor.from_row_lengths(tf.constant(pair[0], tf.int64),
                                                tf.constant(pair[1], tf.int64))
    return {"context": tf.constant(batch.context, tf.int64), "items": ragged(batch.items),
            "actions": ragged(batch.actions), "timestamps": ragged(batch.timestamps),
            "candidates": ragged(batch.candidates),
            "query_time": tf.constant(batch.query_time, tf.int64)}


def time_buckets(query_time, timestamps):
    """log2 buckets of ``query_time - timestamps`` seconds (0 for the query time itself)."""
    age = tf.maximum(tf.cast(query_time - timestamps, tf.float32), 0.0)
    bucket = tf.cast(tf.floor(tf.math.log1p(age) / math.log(2.0)), tf.int64)
    return tf.minimum(bucket, rd.TIME_BUCKETS - 1)


class _Heads(keras.layers.Layer):
    """An MLP and one output per task: logits of ``watch`` and ``like``, the ``rating``."""

    def __init__(self, hidden, dropout_rate, seed, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(hidden, activation="relu", name="hidden",
                                         kernel_initializer=keras.initializers.GlorotUniform(
                                             seed=seed))
        self.dropout = keras.layers.Dropout(dropout_rate, seed=seed + 1)
        self.out = keras.layers.Dense(len(TASKS), name="tasks",
                                      kernel_initializer=keras.initializers.GlorotUniform(
                                          seed=seed + 2))

    def call(self, x, training=None):
        y = self.out(self.dropout(self.hidden(x), training=training))
        return {task: y[:, i] for i, task in enumerate(TASKS)}


def _embedding(rows, dim, seed, name):
    return keras.layers.Embedding(rows, dim, name=name, embeddings_initializer=(
        keras.initializers.TruncatedNormal(stddev=0.02, seed=seed)))


class _Ranker(keras.Model):
    """Shared: the item, action and context embeddings; ``call`` returns per-task outputs
    over the flat candidates ``[sum T]``."""

    def __init__(self, num_items, num_actions, context_sizes, config, **kwargs):
        super().__init__(**kwargs)
        self.num_items, self.num_actions = int(num_items), int(num_actions)
        self.context_sizes, self.config = [int(s) for s in context_sizes], config
        d, seed = config.d_model, config.seed
        self.item_embedding = _embedding(self.num_items + 1, d, seed, "items")
        self.action_embedding = _embedding(self.num_actions + 1, d, seed + 1, "actions")
        self.context_embeddings = [_embedding(s, d, seed + 20 + i, f"context_{i}")
                                   for i, s in enumerate(self.context_sizes)]
        self.heads = _Heads(config.hidden, config.dropout_rate, seed + 5, name="heads")

    def predictions(self, outputs):
        """Probabilities of the binary tasks, the rating as is."""
        return {t: (outputs[t] if t == "rating" else tf.sigmoid(outputs[t])) for t in TASKS}


class HSTURanker(_Ranker):
    """HSTU over ``[context | history | candidates]`` (see the module doc)."""

    def __init__(self, num_items, num_actions, context_sizes, config, **kwargs):
        super().__init__(num_items, num_actions, context_sizes, config, **kwargs)
        d, seed = config.d_model, config.seed
        self.positions = _embedding(config.max_seq_len + 1, d, seed + 2, "positions")
        self.ages = _embedding(rd.TIME_BUCKETS, d, seed + 3, "ages")
        self.input_dropout = keras.layers.Dropout(config.dropout_rate, seed=seed + 4)
        # The blocks' attention scale is fixed by the history's length, not by how many
        # candidates are scored at once (silu_scale 0 would mean 1 / max_seq_len).
        self.context_len = len(self.context_sizes)
        self.max_len = self.context_len + config.max_seq_len + max(
            config.targets * (1 + config.negative_ratio),
            config.holdout * (1 + config.negative_ratio), config.micro_batch)
        scale = 1.0 / (self.context_len + config.max_seq_len)
        self.blocks = [HSTUBlock(config.num_heads, config.head_dim, self.max_len,
                                 dropout_rate=config.dropout_rate, silu_scale=scale,
                                 target_group_size=1, seed=seed + 10 + i, name=f"hstu_{i}")
                       for i in range(config.num_blocks)]

    def history_rows(self, context, items, actions, timestamps, query_time, training=False):
        """``[B, (C + L), d]`` ragged inputs of the contextual tokens and history events."""
        d = self.config.d_model
        ctx = tf.stack([emb(context[:, i]) for i, emb in enumerate(self.context_embeddings)],
                       1)
        lengths = items.row_lengths()
        from_end = (tf.repeat(lengths, lengths) - tf.ragged.range(lengths).flat_values)
        age = time_buckets(tf.repeat(query_time, lengths), timestamps.flat_values)
        hist = (self.item_embedding(items.flat_values) +
                self.action_embedding(actions.flat_values) +
                self.positions(tf.minimum(from_end, self.config.max_seq_len)) + self.ages(age))
        ctx = tf.RaggedTensor.from_tensor(ctx)
        rows = tf.concat([ctx, items.with_flat_values(hist)], axis=1)
        return rows.with_flat_values(self.input_dropout(rows.flat_values * d ** 0.5,
                                                        training=training))

    def candidate_rows(self, candidates, training=False):
        """Flat ``[sum T, d]`` inputs of candidate tokens (no action, position 0, age 0)."""
        d = self.config.d_model
        flat = candidates.flat_values
        zero = tf.zeros_like(flat)
        x = (self.item_embedding(flat) + self.action_embedding(zero) + self.positions(zero) +
             self.ages(zero))
        return self.input_dropout(x * d ** 0.5, training=training)

    def call(self, inputs, training=None):
        training = bool(training)
        cands = inputs["candidates"]
        history = self.history_rows(inputs["context"], inputs["items"], inputs["actions"],
                                    inputs["timestamps"], inputs["query_time"], training)
        x = tf.concat([history, cands.with_flat_values(self.candidate_rows(cands, training))],
                      axis=1)
        num_targets = cands.row_lengths()
        for block in self.blocks:
            x = block(x, num_targets=num_targets, training=training)
        # The candidates' rows: the last T_b of each sequence.
        starts = x.row_starts() + history.row_lengths()
        rows = tf.repeat(starts, num_targets) + tf.ragged.range(num_targets).flat_values
        out = self.heads(tf.gather(x.flat_values, rows), training=training)
        if training and self.config.next_item_weight > 0:
            out["next_item"] = self._next_item_loss(x, inputs["items"])
        return out

    def _next_item_loss(self, x, items):
        """Mean softmax cross-entropy of each history event's output against the next event's
        item, over the catalogue (a sampled softmax of 512 uniform negatives when a batch's
        histories could make more than 30 M logits)."""
        lengths = items.row_lengths()
        first = x.row_starts() + self.context_len  # the first history row of each sequence
        reads = tf.maximum(lengths - 1, 0)
        at = tf.repeat(first, reads) + tf.ragged.range(reads).flat_values
        targets = items[:, 1:].flat_values
        states = tf.math.l2_normalize(tf.gather(x.flat_values, at), -1, epsilon=1e-12)
        catalogue = tf.math.l2_normalize(self.item_embedding.embeddings[1:], -1,
                                         epsilon=1e-12)
        positions = tf.shape(targets, out_type=tf.int64)[0]
        c = self.config
        if c.batch_size * c.max_seq_len * self.num_items <= 30_000_000:  # full softmax
            logits = tf.matmul(states, catalogue, transpose_b=True) / 0.05
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(targets - 1, logits)
        else:
            negatives = tf.random.uniform([512], 0, self.num_items, tf.int64)
            pos = tf.reduce_sum(states * tf.gather(catalogue, targets - 1), -1) / 0.05
            neg = tf.matmul(states, tf.gather(catalogue, negatives), transpose_b=True) / 0.05
            neg = tf.where(negatives[None] == targets[:, None] - 1, -1e9, neg)
            logits = tf.concat([pos[:, None], neg], 1)
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(
                tf.zeros_like(targets), logits)
        return tf.reduce_sum(loss) / tf.cast(tf.maximum(positions, 1), tf.float32)


class DLRMRanker(_Ranker):
    """The stock-Keras DLRM-style baseline (see the module doc)."""

    def __init__(self, num_items, num_actions, context_sizes, config, **kwargs):
        super().__init__(num_items, num_actions, context_sizes, config, **kwargs)
        init = keras.initializers.GlorotUniform
        self.bottom = keras.layers.Dense(config.hidden, activation="relu",
                                         kernel_initializer=init(seed=config.seed + 7))

    def call(self, inputs, training=None):
        cands = inputs["candidates"]
        n = cands.row_lengths()
        items, actions = inputs["items"], inputs["actions"]
        hist_items = tf.reduce_mean(items.with_flat_values(
            self.item_embedding(items.flat_values)), 1)
        hist_both = tf.reduce_mean(items.with_flat_values(
            self.item_embedding(items.flat_values) +
            self.action_embedding(actions.flat_values)), 1)
        user = [emb(inputs["context"][:, i]) for i, emb in enumerate(self.context_embeddings)]
        per_user = tf.stack(user + [hist_items, hist_both], 1)  # [B, F, d]
        features = tf.concat([tf.repeat(per_user, n, axis=0),
                              self.item_embedding(cands.flat_values)[:, None]], 1)
        dots = tf.matmul(features, features, transpose_b=True)
        f = features.shape[1]
        upper = np.triu_indices(f, 1)
        pairs = tf.gather(tf.reshape(dots, [-1, f * f]), upper[0] * f + upper[1], axis=1)
        x = tf.concat([tf.reshape(features, [-1, f * self.config.d_model]), pairs], 1)
        return self.heads(self.bottom(x), training=training)


class TwoTowerRanker(_Ranker):
    """A trained retrieval model's user state and candidate embedding (frozen) and an MLP."""

    def __init__(self, retrieval, num_actions, context_sizes, config, **kwargs):
        super().__init__(retrieval.num_items, num_actions, context_sizes, config, **kwargs)
        self.retrieval = retrieval
        self.retrieval.trainable = False

    def call(self, inputs, training=None):
        from recops_tf.recommender.model import last_states

        cands = inputs["candidates"]
        items = inputs["items"]
        cut = tf.minimum(items.row_lengths(), self.retrieval.max_seq_len)
        tail = lambda r: tf.ragged.boolean_mask(  # noqa: E731
            r, tf.ragged.range(r.row_lengths()) >= tf.expand_dims(r.row_lengths() - cut, 1))
        state = last_states(self.retrieval, tail(items), tail(inputs["timestamps"]))
        state = tf.repeat(state, cands.row_lengths(), axis=0)
        item = self.retrieval.item_embeddings(cands.flat_values, training=False)
        dot = tf.reduce_sum(state * item, -1, keepdims=True) / self.retrieval.temperature
        return self.heads(tf.concat([state, item, state * item, dot], 1), training=training)


MODELS = {"hstu": HSTURanker, "dlrm": DLRMRanker}


def losses(outputs, labels, masks, weights):
    """(weighted total, per-task) masked mean losses of a batch."""
    per = {}
    for task in TASKS:
        m = masks[task]
        count = tf.maximum(tf.reduce_sum(m), 1.0)
        if task == "rating":
            value = tf.square(outputs[task] - labels[task])
        else:
            value = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels[task],
                                                            logits=outputs[task])
        per[task] = tf.reduce_sum(value * m) / count
    total = tf.add_n([weights.get(t, 0.0) * per[t] for t in TASKS])
    if "next_item" in outputs:  # the HSTU ranker's auxiliary loss (training only)
        per["next_item"] = outputs["next_item"]
        total += weights.get("next_item", 0.0) * per["next_item"]
    return total, per


def _labels(batch):
    return ({t: tf.constant(v) for t, v in batch.labels.items()},
            {t: tf.constant(v) for t, v in batch.masks.items()})


def predict(model, batches):
    """Per-task flat predictions over `batches` (NumPy), their labels, masks and users."""
    call = _predictor(model)
    out, labels, masks, users = {t: [] for t in TASKS}, {t: [] for t in TASKS}, \
        {t: [] for t in TASKS}, []
    for batch in batches:
        pred = call(to_inputs(batch))
        for t in TASKS:
            out[t].append(pred[t].numpy())
            labels[t].append(batch.labels[t])
            masks[t].append(batch.masks[t])
        users.append(np.repeat(batch.users, batch.candidates[1]))
    cat = lambda d: {t: np.concatenate(v) for t, v in d.items()}  # noqa: E731
    return cat(out), cat(labels), cat(masks), np.concatenate(users)


def _predictor(model):
    fn = getattr(model, "_recops_predict", None)
    if fn is None:
        @tf.function(input_signature=[INPUT_SPEC])
        def fn(inputs):
            return model.predictions(model(inputs, training=False))
        model._recops_predict = fn
    return fn


def evaluate(model, data, which, config, batches=None):
    """Per-task metrics of `model` on the `which` ('valid' / 'test') blocks."""
    batches = batches or rd.evaluation_batches(data, which, 256, config.max_seq_len,
                                               config.negative_ratio, config.seed)
    pred, labels, masks, users = predict(model, batches)
    return ranking_metrics.task_metrics(pred, labels, masks, users)


def _validation_loss(model, batches, weights, tasks=TASKS):
    pred, labels, masks, _ = predict(model, batches)
    total = 0.0
    for t in tasks:
        keep = masks[t] > 0
        if t == "rating":
            value = float(np.mean((pred[t][keep] - labels[t][keep]) ** 2))
        else:
            value = ranking_metrics.log_loss(labels[t][keep], pred[t][keep])
        total += weights.get(t, 0.0) * value
    return total


@dataclasses.dataclass
class FitResult:
    steps: int
    best_step: int
    seconds: float
    first_loss: float
    last_loss: float
    validation: list  # per validation: {"step", "loss"}


def fit(model, data, config, log=print, name="hstu", progress=False):
    """Trains `model` (any ranker of this module) on `data`'s training events; validation loss
    every ``eval_every`` steps, early stopping after ``patience`` validations without a
    better one (not before ``min_steps``), the best validation's weights kept. `progress`: a
    bar (loss, steps/s) over the steps to the next validation; a line per validation
    either way."""
    config.check()
    tf.keras.utils.set_random_seed(config.seed)
    weights = dict(config.task_weights, next_item=config.next_item_weight)
    optimizer = keras.optimizers.Adam(config.learning_rate, beta_2=0.98)
    valid = rd.evaluation_batches(data, "valid", 256, config.max_seq_len,
                                  config.negative_ratio, config.seed)
    decay = float(config.weight_average)
    averaged = list(model.trainable_variables) if decay > 0 else []
    average = [tf.Variable(v, trainable=False) for v in averaged]
    updates = tf.Variable(0.0, trainable=False)

    @tf.function(input_signature=[INPUT_SPEC, {t: tf.TensorSpec([None]) for t in TASKS},
                                  {t: tf.TensorSpec([None]) for t in TASKS}])
    def step(inputs, labels, masks):
        with tf.GradientTape() as tape:
            total, _ = losses(model(inputs, training=True), labels, masks, weights)
        variables = model.trainable_variables
        optimizer.apply(tape.gradient(total, variables), variables)
        if average:
            d = tf.minimum(decay, (1.0 + updates) / (10.0 + updates))
            for a, v in zip(average, averaged):
                a.assign(d * a + (1.0 - d) * v)
            updates.assign_add(1.0)
        return total

    def validate():
        """(validation loss, the model's weights as validated) with the average in place."""
        raw = [v.numpy() for v in averaged]
        for a, v in zip(average, averaged):
            v.assign(a)
        value = _validation_loss(model, valid, weights, config.validation_tasks)
        scored = [v.numpy() for v in model.weights]
        for value_raw, v in zip(raw, averaged):
            v.assign(value_raw)
        return value, scored

    history, best, best_step, bad = [], math.inf, 0, 0
    best_weights = None
    steps, epoch, first, last = 0, 0, None, None
    began = time.perf_counter()
    bar, window = None, time.perf_counter()
    while steps < config.max_steps:
        for batch in rd.training_batches(data, epoch, config.seed, config.batch_size,
                                         config.max_seq_len, config.targets,
                                         config.negative_ratio):
            if progress and bar is None:
                bar = keras.utils.Progbar(config.eval_every, stateful_metrics=["loss",
                                                                              "steps/s"])
                window = time.perf_counter()
            labels, masks = _labels(batch)
            last = float(step(to_inputs(batch), labels, masks))
            first = last if first is None else first
            steps += 1
            validating = steps % config.eval_every == 0 or steps == config.max_steps
            if bar is not None:
                done = (steps - 1) % config.eval_every + 1
                bar.update(done, [("loss", last), ("steps/s", done / max(
                    time.perf_counter() - window, 1e-9))], finalize=validating)
            if validating:
                bar = None
                value, scored = validate()
                history.append({"step": steps, "loss": value})
                if value < best:
                    best, best_step, bad = value, steps, 0
                    best_weights = scored
                else:
                    bad += 1
                log(f"{name} step {steps}: loss {last:.4f}, valid loss {value:.4f} "
                    f"(best {best:.4f} at step {best_step})")
                if bad >= config.patience and steps >= config.min_steps:
                    break
            if steps >= config.max_steps:
                break
        else:
            epoch += 1
            continue
        break
    if best_weights is not None:
        for v, value in zip(model.weights, best_weights):
            v.assign(value)
    return FitResult(steps, best_step, time.perf_counter() - began, first, last, history)


def build(kind, data, config, retrieval=None):
    """A ranker of `kind` ('hstu', 'dlrm' or 'two-tower' with a trained `retrieval` model),
    built on a first batch. Its initial weights are a function of ``config.seed``: the
    global seeds are set first, since some layers draw from them (``HSTUBlock``'s projections
    take Keras' default initializer, whose seed is drawn when the layer is made; unseeded,
    each process began the ranker at another point whatever ``--seed`` said)."""
    tf.keras.utils.set_random_seed(config.seed)
    if kind == "two-tower":
        model = TwoTowerRanker(retrieval, data.num_actions, data.context_sizes, config)
    else:
        model = MODELS[kind](data.num_items, data.num_actions, data.context_sizes, config)
    first = rd.evaluation_batches(data, "valid", 2, config.max_seq_len, 1, config.seed)[0]
    model(to_inputs(first), training=False)
    return model


def train_retrieval(data, seed=0, log=print, **overrides):
    """The retrieval HSTU (``recops-tf train``'s defaults, fitted to the data) trained on the
    ranking split's training and validation events only (its own leave-one-out split ends at
    the last validation event): the two-tower baseline's towers."""
    from recops_tf.recommender import profile as prof
    from recops_tf.recommender.data import Dataset
    from recops_tf.recommender.training import Config, train

    ends = [data.bounds(u)[1] for u in range(data.num_users)]
    keep = [u for u, e in enumerate(ends) if e >= 3]
    ds = Dataset([data.items[u][:ends[u]] for u in keep],
                 [data.timestamps[u][:ends[u]] for u in keep], data.num_items, data.source)
    config = Config.from_preset("auto", seed=seed, **overrides)
    config, _ = prof.fit(prof.profile(ds), config, set(overrides))
    return train(ds, config.check(), progress=False, log=log).model


def _rates(data, which):
    """Per item: shrunk training like rate and mean rating, and popularity (event count over
    the largest); per user: shrunk like rate and mean rating. Everything before the `which`
    block counts (the test's history includes the validation events)."""
    counts, likes, sums = (np.zeros(data.num_items + 1) for _ in range(3))
    user_like, user_mean = np.zeros(data.num_users), np.zeros(data.num_users)
    mean, like_rate = data.train_mean()
    for u in range(data.num_users):
        end = data.block(u, which)[0]
        items, r = data.items[u][:end], data.ratings[u][:end]
        np.add.at(counts, items, 1)
        np.add.at(likes, items, r >= data.like_threshold)
        np.add.at(sums, items, r)
        user_like[u] = ((r >= data.like_threshold).sum() + like_rate) / (len(r) + 1)
        user_mean[u] = (r.sum() + mean) / (len(r) + 1)
    prior = 5.0  # shrinkage toward the global rates (events' worth)
    return ((likes + prior * like_rate) / (counts + prior),
            (sums + prior * mean) / (counts + prior), counts / max(counts.max(), 1.0),
            user_like, user_mean)


def trivial_metrics(data, which, config):
    """Per-task metrics of two trivial baselines on the `which` blocks (the models'
    candidates): ``item``: the item's like rate, mean rating and popularity; ``user``: the
    user's own like rate and mean rating (popularity for ``watch``)."""
    item_like, item_mean, pop, user_like, user_mean = _rates(data, which)
    b = rd.evaluation_batches(data, which, 1 << 30, config.max_seq_len,
                              config.negative_ratio, config.seed)[0]
    cands = b.candidates[0]
    users = np.repeat(b.users, b.candidates[1])
    item_pred = {"watch": np.clip(pop[cands], 1e-6, 1 - 1e-6), "like": item_like[cands],
                 "rating": item_mean[cands]}
    user_pred = {"watch": item_pred["watch"], "like": user_like[users],
                 "rating": user_mean[users]}
    return {name: ranking_metrics.task_metrics(pred, b.labels, b.masks, users)
            for name, pred in (("item", item_pred), ("user", user_pred))}


def clone_config(config, **changes):
    out = copy.deepcopy(config)
    for k, v in changes.items():
        setattr(out, k, v)
    return out


def run(data, config, log=print, baselines=("dlrm", "two-tower"), retrieval_overrides=None,
        progress=False):
    """The whole task: the HSTU ranker and the `baselines` trained on `data` (each with the
    same config, split and candidates), and the trivial baselines; returns ``(hstu model,
    report)``, the report a JSON-able dict: per model the test metrics, steps, seconds and
    best step."""
    config.check()
    report = {"models": {}, "config": dataclasses.asdict(config)}
    models = {}
    kinds = ["hstu"] + [b for b in baselines]
    for kind in kinds:
        retrieval = None
        extra = {}
        if kind == "two-tower":
            began = time.perf_counter()
            log("two-tower: training the retrieval HSTU (recops-tf train's defaults) on the "
                "training and validation events")
            retrieval = train_retrieval(data, config.seed, log=lambda *a, **k: None,
                                        **(retrieval_overrides or {}))
            extra["retrieval_seconds"] = time.perf_counter() - began
        model = build(kind, data, config, retrieval)
        result = fit(model, data, config, log=log, name=kind, progress=progress)
        models[kind] = model
        report["models"][kind] = dict(
            test=evaluate(model, data, "test", config), steps=result.steps,
            best_step=result.best_step, seconds=result.seconds, first_loss=result.first_loss,
            last_loss=result.last_loss, validation=result.validation, **extra)
    for name, metrics in trivial_metrics(data, "test", config).items():
        report["models"][name] = {"test": metrics}
    report["data"] = dict(source=data.source, users=data.num_users, items=data.num_items,
                          actions=[float(v) for v in data.action_values],
                          context=data.context_names, like_threshold=data.like_threshold,
                          holdout=data.holdout,
                          test_events=int(sum(data.block(u, "test")[2] - data.block(u, "test")[1]
                                              for u in range(data.num_users))))
    return models["hstu"], report


COLUMNS = (("like", "auc"), ("like", "gauc"), ("like", "ne"), ("like", "log_loss"),
           ("rating", "rmse"), ("watch", "auc"), ("watch", "ne"))


def table(report):
    """The report's test metrics as an aligned text table, one row per model."""
    head = f"  {'model':<10}" + "".join(f"{t + ' ' + m:>14}" for t, m in COLUMNS)
    lines = [head]
    for name, entry in report["models"].items():
        test = entry["test"]
        lines.append(f"  {name:<10}" + "".join(f"{test[t][m]:>14.4f}" for t, m in COLUMNS))
    return "\n".join(lines)


# -- export ------------------------------------------------------------------------------------

def _check_user(model, context, items, actions, timestamps, candidates):
    """Assertions of one user's request (InvalidArgumentError with a message). The sizes are
    checked first: the value checks compare `context` with a [C] vector, which fails with a
    shape error of its own when run beside a wrong size (the two raced)."""
    length = tf.size(items)
    sizes = [
        tf.debugging.assert_positive(length, message="the history is empty: ranking needs "
                                     "at least one event"),
        tf.debugging.assert_equal(tf.size(actions), length,
                                  message="actions: one per history item"),
        tf.debugging.assert_equal(tf.size(timestamps), length,
                                  message="timestamps: one per history item"),
        tf.debugging.assert_equal(tf.size(context), len(model.context_sizes),
                                  message=f"context: {len(model.context_sizes)} feature codes"),
    ]
    with tf.control_dependencies(sizes):
        return sizes + _check_values(model, context, items, actions, candidates)


def _check_values(model, context, items, actions, candidates):
    """The ids' and codes' ranges (run after `_check_user`'s sizes)."""
    checks = []
    for what, ids, top in (("items", items, model.num_items),
                           ("candidates", candidates, model.num_items),
                           ("actions", actions, model.num_actions)):
        checks += [tf.debugging.assert_positive(ids, message=f"{what}: ids start at 1"),
                   tf.debugging.assert_less_equal(ids, tf.constant(top, tf.int64),
                                                  message=f"{what}: an id is past 1..{top}")]
    checks += [tf.debugging.assert_non_negative(context, message="context: codes are >= 0"),
               tf.debugging.assert_less(context, tf.constant(model.context_sizes, tf.int64),
                                        message="context: a code is past its feature's "
                                        "vocabulary")]
    return checks


def _rank_one(model, context, items, actions, timestamps, candidates, query_time):
    """Per-task predictions ``[m]`` of one user's candidates: M-FALCON over the cached
    history (``mfalcon.py``)."""
    from recops_tf.recommender import mfalcon

    with tf.control_dependencies(_check_user(model, context, items, actions, timestamps,
                                             candidates)):
        keep = model.config.max_seq_len
        one = lambda x: tf.RaggedTensor.from_row_lengths(  # noqa: E731
            x[-keep:], tf.shape(x[-keep:], out_type=tf.int64))
        history = model.history_rows(context[None], one(items), one(actions), one(timestamps),
                                     query_time[None]).flat_values
        cands = tf.RaggedTensor.from_row_lengths(candidates, tf.shape(candidates,
                                                                      out_type=tf.int64))
        rows = model.candidate_rows(cands)
    cache = mfalcon.history_cache(model.blocks, history)
    out = mfalcon.score_targets(model.blocks, cache, rows, micro_batch=model.config.micro_batch)
    return model.predictions(model.heads(out))


def _functions(model):
    vec = lambda name: tf.TensorSpec([None], tf.int64, name=name)  # noqa: E731
    mat = lambda name: tf.TensorSpec([None, None], tf.int64, name=name)  # noqa: E731

    @tf.function(input_signature=[vec("context"), vec("items"), vec("actions"),
                                  vec("timestamps"), vec("candidates"),
                                  tf.TensorSpec([], tf.int64, name="query_time")])
    def rank(context, items, actions, timestamps, candidates, query_time):
        return _rank_one(model, context, items, actions, timestamps, candidates, query_time)

    @tf.function(input_signature=[mat("context"), mat("items"), mat("actions"),
                                  mat("timestamps"), mat("candidates"), vec("query_time")])
    def serving_default(context, items, actions, timestamps, candidates, query_time):
        rows = tf.shape(items)[0]
        checks = [tf.debugging.assert_equal(tf.shape(x)[0], rows, message=f"{n}: one row per "
                                            "user") for n, x in (
            ("context", context), ("actions", actions), ("timestamps", timestamps),
            ("candidates", candidates), ("query_time", query_time))]
        checks += [tf.debugging.assert_equal(tf.shape(x), tf.shape(items),
                                             message=f"{n}: the shape of items")
                   for n, x in (("actions", actions), ("timestamps", timestamps))]
        with tf.control_dependencies(checks):
            width = tf.shape(candidates)[1]

        def one(i):
            length = tf.reduce_sum(tf.cast(items[i] > 0, tf.int32))
            count = tf.reduce_sum(tf.cast(candidates[i] > 0, tf.int32))
            pred = _rank_one(model, context[i], items[i, :length], actions[i, :length],
                             timestamps[i, :length], candidates[i, :count], query_time[i])
            return tf.stack([tf.pad(pred[t], [[0, width - count]]) for t in TASKS])

        out = tf.map_fn(one, tf.range(rows), fn_output_signature=tf.TensorSpec(
            [len(TASKS), None], tf.float32))
        return {t: out[:, i] for i, t in enumerate(TASKS)}

    return {"rank": rank, "serving_default": serving_default}


def export(model, data, out_dir, report=None):
    """Writes ``out_dir/saved_model`` with two signatures, ``out_dir/items.txt`` and
    ``out_dir/info.json`` (the feature vocabularies and action values); returns the
    SavedModel's path.

    * ``rank`` (one user): ``context`` ``[C]`` feature codes, ``items`` / ``actions`` /
      ``timestamps`` ``[L]`` (the history, oldest first; the last ``max_seq_len`` are read),
      ``candidates`` ``[m]`` item ids, ``query_time`` (scalar) -> ``watch``, ``like``
      (probabilities) and ``rating`` ``[m]``; scored by M-FALCON over the cached history.
    * ``serving_default`` (TF Serving's, batchable): the same as ``[B, ...]`` rows, histories
      and candidates padded at the end with 0 -> ``[B, M]`` outputs (0 at padding).

    Ids are the model's: item i is line i of ``items.txt``; ``info.json`` lists the action
    of each rating value and each context feature's vocabulary."""
    import json
    import os

    from recops_tf.saving import tracked_root

    os.makedirs(out_dir, exist_ok=True)
    root = tracked_root(model)
    functions = _functions(model)
    for name, fn in functions.items():
        setattr(root, name, fn)
    path = os.path.join(out_dir, "saved_model")
    tf.saved_model.save(root, path, signatures={
        name: fn.get_concrete_function() for name, fn in functions.items()})
    with open(os.path.join(out_dir, "items.txt"), "w") as f:
        f.write("\n".join(str(n) for n in data.item_names) + "\n")
    with open(os.path.join(out_dir, "info.json"), "w") as f:
        json.dump({"task": "ranking", "source": data.source, "num_items": data.num_items,
                   "num_users": data.num_users, "tasks": list(TASKS),
                   "actions": {f"{v:g}": a + 1 for a, v in enumerate(data.action_values)},
                   "context": {name: vocab for name, vocab in zip(data.context_names,
                                                                 data.context_vocab)},
                   "max_seq_len": model.config.max_seq_len,
                   "config": dataclasses.asdict(model.config), "report": report or {}},
                  f, indent=1)
    return path
