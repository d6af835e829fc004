"""Training of the sequential recommenders: the HSTU paper's recipe as presets, a tf.data
pipeline over ragged batches, validation every epoch with early stopping, checkpoints that a
killed run resumes from, TensorBoard summaries; then the test metrics next to the baselines,
export and serving."""
import dataclasses
import json
import math
import os
import time

import keras
import numpy as np
import tensorflow as tf

from recops_tf.optimizers.lazy_adam import LazyAdam
from recops_tf.recommender import averaging, evaluation, multiworker, scoring
from recops_tf.recommender.model import (ENCODERS, LOSSES, GenerativeRecommender, last_states,
                                         next_item_loss)


AUTO = -1.0  # Config.transition_prior: chosen on the validation split (TRANSITION_PRIOR_GRID)


@dataclasses.dataclass
class Config:
    """Every knob of a run; ``Config.from_preset(name, **overrides)`` gives the paper's recipes
    (``"auto"``: HSTU with the settings ``profile.fit`` fits to the data, ``train``'s
    default)."""
    preset: str = "auto"
    encoder: str = "hstu"
    epochs: int = 100  # at most this many epochs (0: no bound in epochs, max_steps bounds)
    batch_size: int = 128
    learning_rate: float = 1e-3
    lr_schedule: str = "constant"  # or "cosine": see `learning_rate_schedule`
    warmup_steps: int = 0  # linear warm-up from 0 to learning_rate over this many steps
    # decoupled weight decay (AdamW's) of the encoder's and head's matrices each step,
    # w -= learning_rate x weight_decay x w; not of biases, norms or the item tables (see
    # `decayed_variables`)
    weight_decay: float = 0.0
    d_model: int = 50
    num_blocks: int = 2
    num_heads: int = 1
    head_dim: int = 50
    max_seq_len: int = 200
    dropout_rate: float = 0.2
    l2_norm: bool = True
    temperature: float = 0.05
    loss: str = "sampled"
    num_negatives: int = 128
    negatives_per: str = "sequence"  # or "position" (a set per position, as GR samples)
    label_smoothing: float = 0.0  # softmax losses: the target's mass is 1 - this
    gbce_t: float = 0.75  # loss "gbce": gSASRec's calibration (0: plain BCE, 1: calibrated)
    relative_bias: bool = True
    seen_bias: bool = True  # a learned logit bias of items already in the history (ours)
    share_embeddings: bool = True  # the head scores with the input item table (tied)
    use_fused: bool = True
    precision: str = "f32"  # or "bf16": Keras' mixed_bfloat16 (bf16 compute, f32 variables)
    seed: int = 0
    patience: int = 10  # validations without a better metric before stopping (0: never)
    eval_every: int = 0  # validate every this many steps (0: at the end of every epoch)
    min_steps: int = 0  # no early stop before this many steps
    validation_metric: str = "ndcg@10"
    exclude_seen: bool = False
    bucket_by_length: bool = False
    checkpoint_every: int = 0  # > 0: also checkpoint every this many steps
    max_steps: int = 0  # > 0: stop after this many steps (smoke runs)
    # > 0: validate, keep and test an exponential average of the weights taken at each
    # validation, this its decay (recommender/averaging.py); 0: the raw weights (the presets';
    # "auto" fits it: profile.fit)
    weight_average: float = 0.0
    # > 0: once the best step and the prior's weight are chosen on validation, continue
    # training the kept weights this many epochs on every user's events before the test item
    # (the training parts and the validation items: the refit), a fresh optimizer, no
    # validation; test and export the refitted model (Result.test_train_only keeps the
    # figures before it). 0: none (the presets'); "auto" fits it (profile.fit)
    refit_epochs: int = 0
    # > 0: at inference, add this x sum_k decay^k log(1 + n(h[-1 - k], j)) to item j's logit
    # (GenerativeRecommender's transition prior: sequential rules over the history's last
    # items, their window, depth and decay those the sequential-rules baseline chooses on the
    # validation split; n counts the events known before the target: the training parts for
    # the validation, every event before the test item for the test, every event in the
    # export); 0: none (the papers' presets); AUTO (-1, "auto", the default): the value of
    # TRANSITION_PRIOR_GRID (extended while its last is the best) with the best validation
    # metric, chosen after training (the encoder is trained without it either way)
    transition_prior: float = AUTO

    @classmethod
    def from_preset(cls, name, **overrides):
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {name!r}")
        values = dict(PRESETS[name], preset=name)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def check(self):
        if self.encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {self.encoder!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        for name in ("batch_size", "d_model", "num_blocks", "num_heads", "head_dim",
                     "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("epochs", "patience", "eval_every", "min_steps", "max_steps",
                     "checkpoint_every", "warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0, got {getattr(self, name)}")
        if self.epochs == 0 and self.max_steps == 0:
            raise ValueError("epochs 0 (no bound in epochs) needs max_steps > 0")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got "
                             f"{self.precision!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got "
                             f"{self.lr_schedule!r}")
        horizon = self.min_steps or self.max_steps
        if self.lr_schedule == "cosine" and horizon and horizon <= self.warmup_steps:
            raise ValueError(f"lr_schedule 'cosine' decays between warmup_steps "
                             f"({self.warmup_steps}) and min_steps (else max_steps, {horizon}):"
                             f" give more steps or a shorter warm-up")
        if self.negatives_per not in ("sequence", "position"):
            raise ValueError(f"negatives_per must be 'sequence' or 'position', got "
                             f"{self.negatives_per!r}")
        if self.loss != "full" and self.num_negatives < 1:
            raise ValueError(f"num_negatives must be at least 1, got {self.num_negatives}")
        if not 0.0 <= self.weight_decay < 1.0:
            raise ValueError(f"weight_decay must lie in [0, 1), got {self.weight_decay}")
        if int(self.refit_epochs) < 0:
            raise ValueError(f"refit_epochs must be >= 0, got {self.refit_epochs}")
        if not 0.0 <= self.weight_average < 1.0:
            raise ValueError(f"weight_average must lie in [0, 1), got {self.weight_average}")
        if not (self.transition_prior >= 0.0 or self.transition_prior == AUTO):
            raise ValueError(f"transition_prior must be >= 0 or 'auto', got "
                             f"{self.transition_prior}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must lie in [0, 1), got {self.label_smoothing}")
        if not 0.0 <= self.gbce_t <= 1.0:
            raise ValueError(f"gbce_t must lie in [0, 1], got {self.gbce_t}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must lie in [0, 1), got {self.dropout_rate}")
        if not self.temperature > 0 or not self.learning_rate > 0:
            raise ValueError("temperature and learning_rate must be positive")
        valid = {f"{m}@{k}" for m in ("hr", "ndcg") for k in evaluation.KS} | {"mrr"}
        if self.validation_metric not in valid:
            raise ValueError(f"validation_metric must be one of {sorted(valid)}")
        return self


# The HSTU paper's ML-1M recipes (generative-recommenders' public configs): item embeddings of
# 50, l2-normalised states and items at temperature 0.05, sampled softmax with 128 uniform
# negatives, dropout 0.2, Adam at 1e-3, batch 128, 200 items of history. One addition of ours in
# every preset: ``seen_bias`` (a learned logit bias of items already in the history; on
# MovieLens it is what lifts HR@10 from the Markov chain's level, docs/reproduce_hstu.md);
# ``seen_bias=False`` (``--no-seen-bias``) gives the paper's exact recipe.
PRESETS = {
    # The default: the HSTU preset's model, its loss, history, batch and schedule fitted to the
    # data by profile.fit (each choice printed with its reason; a flag given overrides it).
    "auto": dict(encoder="hstu", num_blocks=2, num_heads=1, head_dim=50, relative_bias=True,
                 seen_bias=True),
    # The papers' recipes: the raw weights, no average, no transition prior.
    "hstu": dict(encoder="hstu", num_blocks=2, num_heads=1, head_dim=50, relative_bias=True,
                 seen_bias=True, weight_average=0.0, transition_prior=0.0),
    "hstu-large": dict(encoder="hstu", num_blocks=8, num_heads=2, head_dim=25,
                       relative_bias=True, seen_bias=True, weight_average=0.0,
                       transition_prior=0.0),
    "sasrec": dict(encoder="sasrec", num_blocks=2, num_heads=1, head_dim=50,
                   relative_bias=False, seen_bias=True, weight_average=0.0,
                   transition_prior=0.0),
}


# Config.transition_prior: AUTO chooses the weight of the transition prior among these, on the
# validation split, once the encoder is trained (a tie keeps the smaller weight); while the
# largest weight tried is the best, it goes on doubling it up to TRANSITION_PRIOR_MAX. Where the
# item-to-item chain is most of the signal the best weight lies past the grid: on a listening
# log of 500 users, half their plays repeats, the validation NDCG@10 rose from 0.271 at 16 to
# 0.290 at 32, 0.300 at 64 and 0.304 at 256 (level past it).
TRANSITION_PRIOR_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
TRANSITION_PRIOR_MAX = 1024.0


# Config.lr_schedule: the learning rate after the warm-up, constant (generative-recommenders')
# or a cosine from learning_rate down to LR_FLOOR x learning_rate over the minimum step budget
# (`min_steps`, else the run's step bound), then held there until early stopping.
LR_SCHEDULES = ("constant", "cosine")
LR_FLOOR = 0.1

# Config.precision -> the Keras dtype policy the model is built under.
PRECISIONS = {"f32": "float32", "bf16": "mixed_bfloat16"}


def rank_seed(config, group=None):
    """The seed of a rank's own dropout masks: ``config.seed`` in one process, and one per
    rank over a `group` of several, so that the ranks' slices of a global batch get
    independent masks as one process's rows do. (The sampled negatives need none: every
    rank draws the global batch's and keeps its rows'.)"""
    if group is None or group.world_size == 1:
        return config.seed
    return config.seed + 7919 * group.rank


def build_model(config, num_items, group=None, transition_pairs=0,
                transition_rules=(1, 1.0)):
    """The model of ``config``, its layers built under the dtype policy of
    ``config.precision`` (the global policy is restored afterwards); with a `group` of
    several ranks, its item tables sharded over them and its dropout masks drawn from a
    seed of the rank's own (the same masks on every rank's slice of the batch would be
    correlated noise, not the one-process run's)."""
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy(PRECISIONS[config.precision])
    try:
        return GenerativeRecommender(
            num_items, encoder=config.encoder, d_model=config.d_model,
            num_blocks=config.num_blocks, num_heads=config.num_heads,
            head_dim=config.head_dim, max_seq_len=config.max_seq_len,
            dropout_rate=config.dropout_rate, l2_norm=config.l2_norm,
            temperature=config.temperature, relative_bias=config.relative_bias,
            use_fused=config.use_fused, seed=config.seed, seen_bias=config.seen_bias,
            share_embeddings=config.share_embeddings, transition_pairs=transition_pairs,
            transition_depth=transition_rules[0], transition_decay=transition_rules[1],
            table_group=group, dropout_seed=rank_seed(config, group))
    finally:
        keras.mixed_precision.set_dtype_policy(previous)


_SPEC = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)


def _ragged(seqs):
    lengths = np.array([len(s) for s in seqs], np.int64)
    values = np.concatenate(seqs).astype(np.int64) if len(seqs) else np.zeros(0, np.int64)
    return tf.RaggedTensor.from_row_lengths(values, lengths)


def _tail(seqs, length):
    return [s[-length:] for s in seqs]


def training_data(split, config, part="train"):
    """A function of (epoch, steps to skip) returning that epoch's tf.data batches of ragged
    ``(items, timestamps)``: every user's training sequence (its last ``max_seq_len + 1``
    items: the model reads the first ones and predicts each next one), in an order that
    depends only on (seed, epoch), optionally grouped by length. Returns also the number of
    batches per epoch. ``part="refit"``: the sequences end with the validation item (every
    event before the test item)."""
    items, stamps = split.train() if part == "train" else split.history("test")
    keep = [u for u, h in enumerate(items) if len(h) >= 2]
    if not keep:
        raise ValueError("no user has a training sequence of 2 or more items")
    items = _tail([items[u] for u in keep], config.max_seq_len + 1)
    stamps = _tail([stamps[u] for u in keep], config.max_seq_len + 1)
    base = tf.data.Dataset.from_tensor_slices((_ragged(items), _ragged(stamps)))
    count, batch = len(items), config.batch_size
    width = max(1, (config.max_seq_len + 1) // 8)

    def epoch_data(epoch, skip=0):
        data = base.shuffle(count, seed=config.seed * 100003 + epoch,
                            reshuffle_each_iteration=False)
        if config.bucket_by_length:
            data = data.group_by_window(
                key_func=lambda i, t: tf.size(i, out_type=tf.int64) // width,
                reduce_func=lambda key, window: window.ragged_batch(batch),
                window_size=batch)
        else:
            data = data.ragged_batch(batch)
        return data.skip(skip).prefetch(2)

    if config.bucket_by_length:  # the batch count depends on the grouping: count it once
        steps = int(epoch_data(0).reduce(np.int64(0), lambda n, _: n + 1))
    else:
        steps = math.ceil(count / batch)
    return epoch_data, steps


def learning_rate_schedule(config, total_steps=math.inf):
    """``config.learning_rate`` as the optimizer takes it: the float itself (constant, no
    warm-up), else a Keras schedule of the optimizer's step: a linear warm-up from 0 over
    ``warmup_steps``, then constant (``lr_schedule="constant"``) or a cosine down to `LR_FLOOR`
    x the rate by step ``min_steps`` (or `total_steps`, the run's bound, without a minimum),
    held at the floor after."""
    peak, warmup = config.learning_rate, config.warmup_steps
    if config.lr_schedule == "constant" and warmup == 0:
        return peak
    horizon = config.min_steps or (total_steps if math.isfinite(total_steps) else 0)
    decay = max(int(horizon) - warmup, 1)
    if config.lr_schedule == "constant":
        return keras.optimizers.schedules.CosineDecay(0.0, 1, alpha=1.0, warmup_target=peak,
                                                      warmup_steps=warmup)
    if horizon <= warmup:
        raise ValueError(f"lr_schedule 'cosine' decays from warmup_steps ({warmup}) to "
                         f"min_steps or the run's step bound ({horizon or 'none'}): give a "
                         f"larger min_steps or max_steps")
    if warmup == 0:
        return keras.optimizers.schedules.CosineDecay(peak, decay, alpha=LR_FLOOR)
    return keras.optimizers.schedules.CosineDecay(0.0, decay, alpha=LR_FLOOR,
                                                  warmup_target=peak, warmup_steps=warmup)


def make_optimizer(config, total_steps=math.inf):
    """generative-recommenders' optimizer: Adam(W) with betas (0.9, 0.98), epsilon 1e-8 and no
    weight decay; LazyAdam (row-sparse, fused) for the growing table of the fused build. Its
    learning rate follows `learning_rate_schedule` (`total_steps`: the run's step bound)."""
    rate = learning_rate_schedule(config, total_steps)
    if config.use_fused:
        return LazyAdam(rate, beta_2=0.98, epsilon=1e-8)
    return keras.optimizers.Adam(rate, beta_2=0.98, epsilon=1e-8)


def decayed_variables(model):
    """The variables ``Config.weight_decay`` decays: every trainable matrix (rank >= 2) but the
    item tables'. The tables are left alone in both builds: the fused build's growing table
    is updated lazily, row by row, and with the l2-normalised head (the default) an item's
    score does not depend on its row's norm, so decaying the rows would change only their
    effective step size."""
    tables = {id(v) for layer in (model.item_embedding, model.output_embedding)
              if layer is not None for v in layer.trainable_variables}
    return [v for v in model.trainable_variables
            if len(v.shape) >= 2 and id(v) not in tables]


# train_step's check that the ranks run the same step: the step number mod this rides in
# the dense gradients' all-reduce (a float32 sum of R copies stays exact)
STEP_CHECK_MODULUS = 1 << 20


def train_step(model, optimizer, generator, config, num_items, group=None):
    """The tf.function of one training step on a ragged batch ``(items, timestamps)`` (each
    row its last ``max_seq_len + 1`` items); draws the step's negatives from `generator`:
    ``config.num_negatives`` per sequence (or per position), uniform over the catalogue
    (``sampled``) or over the batch's targets (``in-batch``). Returns the loss.

    With a `group` of R ranks every rank gets the same global batch and negatives and keeps
    rows ``rank, rank + R, ...``: its loss is its positions' sum over the global batch's
    positions, the dense gradients are summed over the ranks (the sharded tables' row
    gradients already reach their owners), so the step is the one-rank step up to float
    order (and dropout masks, drawn per rank from seeds of their own: ``rank_seed``). The
    all-reduce also sums the ranks' step numbers: ranks out of step fail the step with an
    ``InvalidArgumentError`` instead of training on a mix of two steps."""
    n_neg, per_position = config.num_negatives, config.negatives_per == "position"
    world = 1 if group is None else group.world_size
    decayed = decayed_variables(model) if config.weight_decay else []
    anchors = {id(layer.gradient_anchor) for layer in (model.item_embedding,
                                                       model.output_embedding)
               if layer is not None and hasattr(layer, "gradient_anchor")}

    @tf.function(input_signature=[_SPEC, _SPEC], jit_compile=False)
    def step(items, timestamps):
        rows = tf.shape(items.row_splits, out_type=tf.int64)[0] - 1
        if per_position:
            rows = tf.size(items[:, 1:].flat_values, out_type=tf.int64)
        negatives = None
        if config.loss in ("sampled", "gbce"):
            negatives = generator.uniform([rows, n_neg], 1, num_items + 1, dtype=tf.int64)
        elif config.loss == "in-batch":
            targets = items[:, 1:].flat_values
            pick = generator.uniform([rows, n_neg], 0, tf.size(targets, out_type=tf.int64),
                                     dtype=tf.int64)
            negatives = tf.gather(targets, pick)
        if world > 1:
            positions = tf.cast(tf.size(items[:, 1:].flat_values), tf.float32)
            mine = tf.range(group.rank, tf.shape(items.row_splits, out_type=tf.int64)[0] - 1,
                            world)
            if negatives is not None and per_position:
                negatives = tf.gather(tf.RaggedTensor.from_row_lengths(
                    negatives, items[:, 1:].row_lengths()), mine).flat_values
            elif negatives is not None:
                negatives = tf.gather(negatives, mine)
            items, timestamps = tf.gather(items, mine), tf.gather(timestamps, mine)
        with tf.GradientTape() as tape:
            loss = next_item_loss(model, items, timestamps, config.loss, negatives,
                                  training=True, per_position=per_position,
                                  label_smoothing=config.label_smoothing,
                                  gbce_t=config.gbce_t,
                                  reduction="sum" if world > 1 else "mean")
            if world > 1:
                loss /= positions
        variables = model.trainable_variables
        grads = tape.gradient(loss, variables)
        checks = []
        if world > 1:  # one all-reduce of every dense gradient and the loss, flattened
            dense = [i for i, (g, v) in enumerate(zip(grads, variables))
                     if g is not None and id(v) not in anchors]
            parts = [tf.convert_to_tensor(grads[i]) for i in dense]
            # the step's number rides along (mod 2^20, exact in float32 for any world
            # size): ranks a step apart would pair one step's collectives with another's
            # without any other error, silently training on a mix of two steps
            tick = tf.cast(optimizer.iterations % STEP_CHECK_MODULUS, tf.float32)
            summed = group.all_reduce_sum(tf.concat(
                [tf.reshape(tf.cast(g, tf.float32), [-1]) for g in parts]
                + [loss[None], tick[None]], 0))
            pieces = tf.split(summed, [int(np.prod(g.shape)) for g in parts] + [1, 1])
            checks.append(tf.debugging.assert_equal(
                pieces[-1][0], tick * world,
                message=f"rank {group.rank} of {world}: the ranks are out of step (their "
                        f"step numbers, mod {STEP_CHECK_MODULUS}, do not all equal this "
                        f"rank's); stopping rather than mixing two steps' gradients"))
            for i, g, piece in zip(dense, parts, pieces):
                grads[i] = tf.cast(tf.reshape(piece, tf.shape(g)), g.dtype)
            loss = pieces[-2][0]
        with tf.control_dependencies(checks):  # no update before the ranks are checked
            if decayed:  # AdamW's order: decay at the current rate, then the Adam step
                rate = tf.cast(optimizer.learning_rate, tf.float32) * config.weight_decay
                for v in decayed:
                    v.assign_sub(tf.cast(rate, v.dtype) * v)
            optimizer.apply(grads, variables)
        return loss

    return step


def scorer(model):
    """A tf.function of ragged (items, timestamps) histories to ``[B, num_items]`` scores
    (one per model, traced once)."""
    score = getattr(model, "_recops_scorer", None)
    if score is None:
        @tf.function(input_signature=[_SPEC, _SPEC], jit_compile=False)
        def score(items, timestamps):
            return model.scores(last_states(model, items, timestamps), seen=items)
        model._recops_scorer = score
    return score


def ranker(model, exclude_seen, block=None):
    """A tf.function of ragged (items, timestamps) histories, ragged seen items and ``[B]``
    targets to the targets' 0-based ranks among every catalogue item, as
    ``evaluation.ranks`` defines them on ``model.scores`` (ties by item id; with
    `exclude_seen` the seen items leave the ranking, the target stays), computed by blocks of
    item columns (``scoring.blocked_ranks``: memory O(B x block), never the ``[B, num_items]``
    scores; one per model, protocol and block, traced once)."""
    key = f"_recops_ranker_{bool(exclude_seen)}_{block}"
    rank = getattr(model, key, None)
    if rank is None:
        @tf.function(input_signature=[_SPEC, _SPEC, _SPEC, tf.TensorSpec([None], tf.int64)],
                     jit_compile=False)
        def rank(items, timestamps, seen, targets):
            return scoring.model_ranks(model, last_states(model, items, timestamps), targets,
                                       seen=items, exclude=seen if exclude_seen else None,
                                       block=block)

        setattr(model, key, rank)
    return rank


# Users per evaluation batch: about EVAL_POSITIONS positions of history (max_seq_len each at
# most), within [MIN_EVAL_BATCH, MAX_EVAL_BATCH] users. Few large batches cost less than many
# small ones (each a call of the ranker with its fixed costs): on Amazon Toys (19,412 users,
# 40 items of history) batches of 4,096 users ranked the catalogue in 0.65 s, of 256 in 1.3 s.
EVAL_POSITIONS = 1 << 17
MIN_EVAL_BATCH = 256
MAX_EVAL_BATCH = 4096


def eval_batch_size(max_seq_len):
    """The users per evaluation batch for histories of at most `max_seq_len` items."""
    return int(min(MAX_EVAL_BATCH, max(MIN_EVAL_BATCH, EVAL_POSITIONS // max(1, max_seq_len))))


def _eval_batches(split, which, max_seq_len, users, batch_size):
    """The ranker's inputs for `users` of `split`'s `which` target, in batches of
    `batch_size`: ragged (truncated items, their timestamps, every seen item) and the
    ``[B]`` targets. Built once per (split, which, length, users, batch) and kept on the
    split: validation ranks the same users every time."""
    cache = split.__dict__.setdefault("_recops_eval_batches", {})
    key = (which, max_seq_len, batch_size, users.tobytes())
    if key not in cache:
        histories, stamps = split.history(which)
        targets, _ = split.targets(which)
        batches = []
        for first in range(0, len(users), batch_size):
            part = users[first:first + batch_size]
            batches.append((_ragged(_tail([histories[u] for u in part], max_seq_len)),
                            _ragged(_tail([stamps[u] for u in part], max_seq_len)),
                            _ragged([histories[u] for u in part]),
                            tf.constant(targets[part])))
        cache.clear()  # one protocol at a time: validation's, then the test's
        cache[key] = batches
    return cache[key]


def evaluate(model, split, which="test", exclude_seen=False, batch_size=None,
             ks=evaluation.KS, group=None, block=None):
    """HR@k, NDCG@k and MRR of `model` on each user's `which` ('valid' or 'test') target,
    ranking the whole catalogue from the state after the user's (truncated) history, by
    blocks of `block` item columns (default: ``scoring.default_block``), `batch_size` users
    at a time (default: ``eval_batch_size(model.max_seq_len)``). With a `group` of R ranks,
    each rank ranks users ``rank, rank + R, ...`` (the same number of batches on every rank)
    and the ranks are gathered: every rank returns the metrics of all users."""
    targets, _ = split.targets(which)
    if len(targets) and (targets.min() < 1 or targets.max() > model.num_items):
        raise ValueError(f"targets must be item ids in 1..{model.num_items}")
    if batch_size is None:
        batch_size = eval_batch_size(model.max_seq_len)
    world = 1 if group is None else group.world_size
    users = np.arange(len(targets))
    if world > 1:
        share = -(-len(users) // world)
        users = users[group.rank::world]
        valid = np.arange(share) < len(users)
        users = np.concatenate([users, np.zeros(share - len(users), np.int64)])
    rank = ranker(model, exclude_seen, block)
    out = []
    for items, stamps, seen, batch_targets in _eval_batches(split, which, model.max_seq_len,
                                                            users, batch_size):
        if world > 1:
            multiworker.beat()
        out.append(rank(items, stamps, seen, batch_targets).numpy())
    ranks = np.concatenate(out) if out else np.zeros(0, np.int64)
    if world > 1:  # the padding users' ranks marked -1, then dropped
        ranks = group.gather(tf.constant(np.where(valid, ranks, -1))).numpy()
        ranks = ranks[ranks >= 0]
    return evaluation.metrics(ranks, ks)


# The transition prior's tables hold at most this many pairs (12 bytes each: 96 MB): the
# sequential rules' window is capped so that window x events stays below it.
MAX_TRANSITION_PAIRS = 8_000_000


def transition_rules(dataset, split):
    """The transition prior's rules: ``((window, depth, decay), counts)``, the settings the
    sequential-rules baseline chose on the validation split, and ``counts(which)``, the
    ``evaluation.transitions`` table of every event of `dataset` (its shape, the model's)
    counting the events a model may know before `which`'s target ('valid': the training
    parts; 'test': those and the validation items; None: every event, for the export)."""
    num_items = dataset.num_items
    events = sum(len(h) for h in dataset.items)
    settings = evaluation.sequential_rules_settings(
        split, num_items, max_window=max(1, MAX_TRANSITION_PAIRS // max(events, 1)))
    window = settings[0]
    every = evaluation.transitions(dataset.items, num_items, window)

    def counts(which):
        if which is None:
            return every
        known = evaluation.transitions(split.history(which)[0], num_items, window)
        return evaluation.recount(every, known, num_items)
    return settings, counts


def choose_transition_prior(model, split, config, group=None):
    """Sets the weight of `model`'s transition prior: ``config.transition_prior``, or under
    AUTO the weight with the best validation metric among ``TRANSITION_PRIOR_GRID``, extended
    by doublings of its last weight while that is the best, up to ``TRANSITION_PRIOR_MAX``
    (the encoder's weights are not touched). Returns ``{"value": weight, "validation":
    {weight: metric}}`` (the metrics measured, in the order tried: only under AUTO)."""
    if config.transition_prior != AUTO:
        model.transition_weight.assign(config.transition_prior)
        return {"value": float(config.transition_prior), "validation": {}}
    scores = {}

    def leader():
        return max(scores, key=lambda w: (scores[w], -w))

    weights = list(TRANSITION_PRIOR_GRID)
    while weights:
        weight = weights.pop(0)
        model.transition_weight.assign(weight)
        scores[weight] = evaluate(model, split, "valid", config.exclude_seen,
                                  group=group)[config.validation_metric]
        if not weights and leader() == weight and weight < TRANSITION_PRIOR_MAX:
            weights.append(weight * 2)
    best = leader()
    model.transition_weight.assign(best)
    return {"value": best, "validation": {str(w): v for w, v in scores.items()}}


def refit(model, split, config, num_items, group=None, log=print):
    """Continues training `model` (the kept weights) ``config.refit_epochs`` epochs on every
    user's events before the test item: the training parts and the validation item, whose
    transition the training never saw (on 5-item histories one transition in four). A fresh
    optimizer (its warm-up again), the run's loss and negatives, no validation (the
    validation items are now trained on). Returns the seconds it took."""
    began = time.perf_counter()
    epoch_data, steps = training_data(split, config, part="refit")
    optimizer = make_optimizer(config)
    optimizer.build(model.trainable_variables)
    generator = tf.random.Generator.from_seed(config.seed + 1)
    step = train_step(model, optimizer, generator, config, num_items, group)
    loss = None
    for epoch in range(config.refit_epochs):
        # Orders of their own: (seed, REFIT_ORDERS + epoch), not the training epochs'.
        for items, stamps in epoch_data(REFIT_ORDERS + epoch):
            loss = step(items, stamps)
    seconds = time.perf_counter() - began
    log(f"refit: {config.refit_epochs} epoch(s) of {steps} steps on the training parts and "
        f"the validation items in {seconds:.1f} s, loss {float(loss):.3f}")
    return seconds


# The refit's epochs shuffle with epoch numbers from here (a training run never reaches it).
REFIT_ORDERS = 1 << 30


@dataclasses.dataclass
class Result:
    model: GenerativeRecommender
    config: Config
    test: dict  # the model's test metrics under config.exclude_seen
    test_other: dict  # ... under the other protocol
    baselines: dict  # {"popularity": ..., "markov": ...} under config.exclude_seen
    baselines_other: dict
    # per validation: {"epoch", "step", "train_loss" (the loss of the step it follows),
    # metric: value, ...}
    validation: list
    best_epoch: int  # the epoch under way at the best validation
    best_step: int
    epochs: int  # epochs begun (counting resumed ones)
    steps: int
    train_seconds: float
    first_loss: float
    last_loss: float
    steps_per_epoch: int = 0
    first_step_seconds: float = 0.0  # this call's first step (tracing included)
    validation_seconds: float = 0.0  # this call's validations
    # {"value": the transition prior's weight, "validation": {weight: metric}} (the grid's,
    # under config.transition_prior AUTO), "test_without": the test metrics with weight 0 (if
    # the weight is not 0); {} without the prior
    transition_prior: dict = dataclasses.field(default_factory=dict)
    # With config.refit_epochs: the test metrics (config.exclude_seen) of the kept weights
    # before the refit, and the refit's seconds; test is the refitted model's
    test_train_only: dict = None
    refit_seconds: float = 0.0


def _scalar(tag, value):
    """A TensorBoard scalar summary, as ``tf.summary.scalar`` writes it, without needing the
    tensorboard package installed (only to view the logs)."""
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    tf.summary.write(tag, tf.constant(value, tf.float32), metadata=metadata)


class _State(tf.Module):
    """The loop's own checkpointed state."""

    def __init__(self):
        super().__init__(name="train_state")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.best = tf.Variable(-1.0, dtype=tf.float64, trainable=False)
        self.best_epoch = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self.best_step = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self.bad_validations = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.first_loss = tf.Variable(float("nan"), dtype=tf.float64, trainable=False)
        self.last_loss = tf.Variable(float("nan"), dtype=tf.float64, trainable=False)
        self.history = tf.Variable("[]", dtype=tf.string, trainable=False)


def _common_checkpoint(manager, group):
    """The newest checkpoint step every rank kept (each keeps its last two): a worker killed
    between the ranks' saves of one step leaves the others a step ahead, and ranks resumed
    from different steps would run different collectives. None if there is none."""
    kept = manager.checkpoints or [p for p in [manager.latest_checkpoint] if p]
    steps = [int(p.rsplit("-", 1)[1]) for p in kept][-2:]
    mine = np.full(2, -1, np.int64)
    mine[:len(steps)] = steps
    every = group.gather(tf.constant(mine)).numpy().reshape(group.world_size, 2)
    common = set(every[0]).intersection(*map(set, every[1:])) - {-1}
    if not common:
        return None
    step = max(common)
    return next(p for p in kept if p.endswith(f"-{step}"))


def train(dataset, config, checkpoint_dir=None, resume=False, logdir=None, progress=True,
          log=print, on_validation=None, group=None):
    """Trains `config`'s model on `dataset`'s leave-one-out training part, validating every
    ``config.eval_every`` steps or every epoch (early stopping on
    ``config.validation_metric``, the best validation's weights kept), and returns a
    ``Result`` with the test metrics next to the baselines.

    ``on_validation(step, value)``: called after each validation; a true answer stops the run
    there (a tuner's pruning), the best validation's weights still kept and tested.

    ``checkpoint_dir``: a checkpoint every epoch (and every ``config.checkpoint_every``
    steps) of the model (the growing table and its optimizer slots included), the optimizer,
    the negative sampler's RNG and the loop's position; ``resume=True`` continues from the
    newest one. ``logdir``: TensorBoard summaries (loss, steps/s, validation metrics).

    ``group``: a ``recops_tf.distributed.Group`` of R worker processes, each calling `train`
    with the same arguments (see ``recommender/multiworker.py``): each trains on its 1/R of
    every global batch, holds its shard of the item tables (and their optimizer slots), sums
    the dense gradients with the others, validates and tests its share of the users and
    gathers the metrics; checkpoints go to ``checkpoint_dir/worker-<rank>`` (resume with the
    same R). Every rank returns the same ``Result``; its model holds this rank's shard.
    """
    config.check()
    tf.keras.utils.set_random_seed(config.seed)
    split = evaluation.Split.leave_one_out(dataset)
    num_items = dataset.num_items
    epoch_data, steps_per_epoch = training_data(split, config)
    world = 1 if group is None else group.world_size
    if world > 1 and not config.use_fused:
        raise ValueError("multi-worker training shards the fused build's item tables: drop "
                         "--no-fused")
    prior_counts = prior_rules = None
    if config.transition_prior != 0:
        prior_rules, prior_counts = transition_rules(dataset, split)
    model = build_model(config, num_items, group,
                        transition_pairs=len(prior_counts(None)[1]) if prior_rules else 0,
                        transition_rules=prior_rules[1:] if prior_rules else (1, 1.0))
    total_steps = config.max_steps if config.max_steps > 0 else math.inf
    if config.epochs > 0:
        total_steps = min(total_steps, config.epochs * steps_per_epoch)
    optimizer = make_optimizer(config, total_steps)
    generator = tf.random.Generator.from_seed(config.seed)
    state = _State()
    step = train_step(model, optimizer, generator, config, num_items, group)

    # Build every variable (model and optimizer) before a restore.
    build_items = _ragged([np.array([1, 1], np.int64)])
    model({"items": build_items[:, :1], "timestamps": build_items[:, :1]}, training=False)
    model.item_matrix(training=False)
    optimizer.build(model.trainable_variables)
    if model.transition_pairs:  # what the validation may know: the training parts
        model.set_transitions(prior_counts("valid"))
    if world > 1:  # every rank starts from the chief's dense weights
        for v in model.variables:
            if tf.as_dtype(v.dtype).is_floating:
                v.assign(group.all_reduce_sum(tf.convert_to_tensor(v) * float(group.rank == 0)))
    # tf.train.Checkpoint does not reach every Keras 3 variable through the model (layers
    # in a Python list, non-trainable weights, dropout seed states): the model's variables
    # are saved explicitly, in their (deterministic) creation order.
    weights = [v.value for v in model.variables]
    tracked = dict(weights=weights, optimizer=optimizer, generator=generator, state=state)
    average = None
    if config.weight_average > 0:
        average = averaging.WeightAverage(model, config.weight_average)
        tracked["average"] = average
    tables = model.tables()
    for i, table in enumerate(tables):  # "table", then "output_table" (not shared)
        tracked[("table", "output_table")[i]] = table
    checkpoint = tf.train.Checkpoint(**tracked)
    best = tf.train.Checkpoint(**{k: v for k, v in tracked.items() if k in ("weights",
                                                                           "table",
                                                                           "output_table")})
    manager = best_path = None
    if checkpoint_dir and world > 1:  # a shard per worker; resumed by as many workers
        workers_file = os.path.join(checkpoint_dir, "workers.json")
        if resume:
            saved = json.load(open(workers_file)) if os.path.exists(workers_file) else None
            if saved is None or saved["workers"] != world:
                raise ValueError(f"{checkpoint_dir}: its checkpoints are of "
                                 f"{saved['workers'] if saved else 1} worker(s); resume with "
                                 f"as many (--workers), not {world}")
        elif group.rank == 0:
            os.makedirs(checkpoint_dir, exist_ok=True)
            with open(workers_file, "w") as f:
                json.dump({"workers": world}, f)
        checkpoint_dir = os.path.join(checkpoint_dir, f"worker-{group.rank}")
    elif checkpoint_dir and resume and os.path.exists(os.path.join(checkpoint_dir,
                                                                   "workers.json")):
        raise ValueError(f"{checkpoint_dir}: its checkpoints are of several workers; resume "
                         "with as many (--workers)")
    if checkpoint_dir:
        manager = tf.train.CheckpointManager(checkpoint, os.path.join(checkpoint_dir, "last"),
                                             max_to_keep=2)
        best_path = os.path.join(checkpoint_dir, "best", "ckpt")
        if resume:
            path = manager.latest_checkpoint
            if world > 1:
                path = _common_checkpoint(manager, group)
            if path is None:
                raise FileNotFoundError(f"{checkpoint_dir}: no checkpoint to resume from")
            checkpoint.restore(path).assert_existing_objects_matched()
            log(f"resumed from {path}: epoch {int(state.epoch) + 1}, step {int(state.steps)}")
    elif resume:
        raise ValueError("resume needs a checkpoint_dir")
    best_weights = None  # without a checkpoint dir the best epoch is kept in memory

    def keep_best():
        nonlocal best_weights
        if best_path:
            best.write(best_path)
        else:
            best_weights = ([v.numpy() for v in model.variables],
                            [table.export() for table in tables])

    def restore_best():
        if best_path and os.path.exists(best_path + ".index"):
            best.read(best_path).assert_existing_objects_matched()
        elif best_weights is not None:
            for v, value in zip(model.variables, best_weights[0]):
                v.assign(value)
            for table, values in zip(tables, best_weights[1]):
                table.assign(*values)

    writer = tf.summary.create_file_writer(logdir) if logdir else None
    history = json.loads(state.history.numpy().decode())
    val_name = f"valid {config.validation_metric}"

    timing = {"first_step": None, "validation": 0.0}  # this call's, for estimates (tuning)

    def record_validation(epoch):
        """Validates the model's current weights, records the metric and keeps the best."""
        metrics = evaluate(model, split, "valid", config.exclude_seen, group=group)
        value, steps = metrics[config.validation_metric], int(state.steps)
        history.append(dict(epoch=epoch, step=steps, train_loss=float(state.last_loss),
                            **metrics))
        state.history.assign(json.dumps(history))
        if writer is not None:
            with writer.as_default(step=steps):
                for key, v in metrics.items():
                    _scalar(f"valid/{key}", v)
            writer.flush()
        if value > float(state.best):
            state.best.assign(value)
            state.best_epoch.assign(epoch)
            state.best_step.assign(steps)
            state.bad_validations.assign(0)
            keep_best()
        else:
            state.bad_validations.assign_add(1)
        return value

    def validate(epoch):
        """Validates at the current step (`epoch`: the 1-based epoch under way); returns the
        metric and whether patience has run out."""
        began = time.perf_counter()
        if average is None:
            value = record_validation(epoch)
        else:  # the average is what is validated and kept as the best weights
            average.update()
            with average.swapped():
                value = record_validation(epoch)
        timing["validation"] += time.perf_counter() - began
        steps = int(state.steps)
        if not progress:  # without a bar, a line per validation
            log(f"step {steps}: valid {config.validation_metric} {value:.4f} (best "
                f"{float(state.best):.4f} at step {int(state.best_step)})")
        out_of_patience = (config.patience > 0 and steps >= config.min_steps
                           and int(state.bad_validations) >= config.patience)
        if out_of_patience:
            log(f"early stop at step {steps}: no better validation {config.validation_metric} "
                f"for {config.patience} validations")
        elif on_validation is not None and on_validation(steps, value):
            log(f"stopped at step {steps} by on_validation")
            out_of_patience = True
        return value, out_of_patience

    stopped = False
    saved_at = None  # the step of this call's last checkpoint made after a validation
    while (int(state.steps) < total_steps and not stopped
           and (config.epochs == 0 or int(state.epoch) < config.epochs)):
        epoch, skip = int(state.epoch), int(state.step_in_epoch)
        bar = (keras.utils.Progbar(steps_per_epoch,
                                   stateful_metrics=["loss", "steps/s", val_name])
               if progress else None)
        if bar is not None:
            bound = f"/{config.epochs}" if config.epochs > 0 else ""
            log(f"epoch {epoch + 1}{bound} (step {int(state.steps)}"
                f"{'' if total_steps == math.inf else f' of at most {total_steps}'})")
        start = mark = time.perf_counter()
        done = 0
        for items, timestamps in epoch_data(epoch, skip):
            began = time.perf_counter()
            loss = float(step(items, timestamps))
            if timing["first_step"] is None:  # includes tracing the step
                timing["first_step"] = time.perf_counter() - began
            done += 1
            if world > 1:
                multiworker.beat()
            state.steps.assign_add(1)
            state.step_in_epoch.assign_add(1)
            if math.isnan(float(state.first_loss)):
                state.first_loss.assign(loss)
            state.last_loss.assign(loss)
            rate = done / max(time.perf_counter() - start, 1e-9)
            if writer is not None:
                with writer.as_default(step=int(state.steps)):
                    _scalar("train/loss", loss)
                    _scalar("train/steps_per_second", rate)
            if bar is not None:
                bar.update(skip + done, [("loss", loss), ("steps/s", rate)], finalize=False)
            steps = int(state.steps)
            at_limit = steps >= total_steps
            if config.eval_every > 0 and (steps % config.eval_every == 0 or at_limit):
                state.seconds.assign_add(time.perf_counter() - mark)
                value, stopped = validate(epoch + 1)
                if bar is not None:
                    bar.update(skip + done, [(val_name, value)], finalize=False)
                if manager:
                    manager.save(checkpoint_number=steps)
                    saved_at = steps
                mark = time.perf_counter()
            elif (manager and config.checkpoint_every > 0 and not at_limit
                    and steps % config.checkpoint_every == 0):
                state.seconds.assign_add(time.perf_counter() - mark)
                manager.save(checkpoint_number=steps)
                mark = time.perf_counter()
            if at_limit or stopped:
                break
        state.seconds.assign_add(time.perf_counter() - mark)
        finished_epoch = int(state.step_in_epoch) >= steps_per_epoch
        if config.eval_every == 0:
            value, stopped = validate(epoch + 1)
            if bar is not None:
                bar.update(skip + done, [(val_name, value)], finalize=False)
        if bar is not None:
            bar.update(skip + done, finalize=True)
            if int(state.best_step) >= 0:  # none yet while no validation has run
                log(f"  best {val_name} {float(state.best):.4f} at step "
                    f"{int(state.best_step)} (epoch {int(state.best_epoch)})")
        if finished_epoch:
            state.epoch.assign_add(1)
            state.step_in_epoch.assign(0)
        if manager and saved_at != int(state.steps):  # unless saved at this step's validation
            manager.save(checkpoint_number=int(state.steps))
            saved_at = int(state.steps)
    if writer is not None:
        writer.close()
    restore_best()
    prior = (choose_transition_prior(model, split, config, group) if model.transition_pairs
             else {})
    if model.transition_pairs:  # the test knows every event before its item
        prior["rules"] = dict(zip(("window", "depth", "decay"), prior_rules))
        model.set_transitions(prior_counts("test"))
    test_train_only, refit_seconds = None, 0.0
    if config.refit_epochs > 0:
        test_train_only = evaluate(model, split, "test", config.exclude_seen, group=group)
        refit_seconds = refit(model, split, config, num_items, group, log)
    if prior.get("value"):  # the encoder alone on the test split, for the record
        model.transition_weight.assign(0.0)
        prior["test_without"] = evaluate(model, split, "test", config.exclude_seen,
                                         group=group)
        model.transition_weight.assign(prior["value"])
    other = not config.exclude_seen
    test = evaluate(model, split, "test", config.exclude_seen, group=group)
    test_other = evaluate(model, split, "test", other, group=group)
    if model.transition_pairs:  # the model returned (and exported) counts every event
        model.set_transitions(prior_counts(None))
    return Result(
        model=model, config=config, test=test, test_other=test_other,
        baselines=evaluation.baselines(split, num_items, "test", config.exclude_seen),
        baselines_other=evaluation.baselines(split, num_items, "test", other),
        validation=history, best_epoch=int(state.best_epoch), best_step=int(state.best_step),
        epochs=math.ceil(int(state.steps) / steps_per_epoch), steps=int(state.steps),
        train_seconds=float(state.seconds), first_loss=float(state.first_loss),
        last_loss=float(state.last_loss), steps_per_epoch=steps_per_epoch,
        first_step_seconds=timing["first_step"] or 0.0,
        validation_seconds=timing["validation"], transition_prior=prior,
        test_train_only=test_train_only, refit_seconds=refit_seconds)
