"""The data profile a run starts from, and the settings fitted to it.

``profile(dataset)`` measures what decides a sequential recommender's recipe: users, items,
interactions, the training histories' length percentiles, how often a user comes back to an
item (the repeat rate) and how much of the next item the previous one predicts (the Markov
chain's HR@10 on the validation targets, seen items kept). ``fit(profile, config, given)``
turns it into the settings of ``Config`` that the user did not set (`given`), each with its
reason; ``recops-tf train`` prints them and saves them in ``run.json``. NumPy only.

The rules (docs/quality.md has the measurements behind them):

- **loss**: on long histories (a median above `SPARSE_MEDIAN_HISTORY` items) the sampled
  softmax with its negatives drawn per position, generative-recommenders' recipe on
  MovieLens (better than the full softmax on MovieLens-100K over 6 seeds, docs/quality.md).
  On short ones a softmax over the whole catalogue (``full``) while its logits, ``[positions
  of a step, items]``, are at most `FULL_SOFTMAX_MAX_LOGITS`, where they cost little next to
  the encoder (measured with tools/bench_recommender.py on a 2-core Xeon, 12,900 positions a
  step: 2,000 items, 26 M logits, a full-softmax step 2.7x the sampled one; 12,000 items, 155
  M logits, 15x), better than the sampled softmax per sequence on Amazon Beauty and per
  position on Amazon Toys; above, a sampled softmax, its negatives per sequence.
- **history** (``max_seq_len``): the 99th percentile of the training histories' lengths,
  rounded up to a multiple of 8, at least 8 and at most `MAX_HISTORY` (the paper's 200).
- **weight average**: `SPARSE_WEIGHT_AVERAGE` (validation and test on an exponential
  average of the weights taken at each validation, ``recommender/averaging.py``) on short
  histories, where it raised NDCG@10 on all 6 Amazon runs; the raw weights on long ones,
  where MovieLens-100K was mixed over 3 seeds (docs/quality.md).
- **dropout**: `SPARSE_DROPOUT` where the median training history has at most
  `SPARSE_MEDIAN_HISTORY` items (short, sparse histories overfit), `DENSE_DROPOUT` (the
  paper's) above: SASRec's own recipe (0.5 on the Amazon and Steam sets, 0.2 on MovieLens-1M),
  measured again here on Amazon Beauty (docs/quality.md).
- **batch**: 128 histories, fewer for a small user base, so that an epoch is at least
  `MIN_STEPS_PER_EPOCH` steps (not below 32 histories).
- **schedule, in optimizer steps**: validation every `eval_every` steps (about an epoch, within
  [`MIN_EVAL_EVERY`, `MAX_EVAL_EVERY`]), early stopping after `PATIENCE` validations without a
  better metric but never before ``min_steps`` (`MIN_STEPS`, or `MIN_EPOCHS` epochs if that is
  more, capped at `MAX_MIN_STEPS`), and at most ``max_steps`` steps in all.
"""
import dataclasses
import math

import numpy as np

from recops_tf.recommender import evaluation

# The Config fields `fit` may set (the CLI's --help says "fitted to the data" for them).
FITTED = ("loss", "negatives_per", "max_seq_len", "batch_size", "eval_every", "patience",
          "min_steps", "max_steps", "epochs", "dropout_rate", "weight_average",
          "refit_epochs")
FULL_SOFTMAX_MAX_LOGITS = 30_000_000
SPARSE_MEDIAN_HISTORY = 20
SPARSE_DROPOUT, DENSE_DROPOUT = 0.5, 0.2
SPARSE_WEIGHT_AVERAGE = 0.8
SPARSE_REFIT_EPOCHS = 3
MAX_HISTORY = 200
MIN_STEPS_PER_EPOCH = 32
MIN_EVAL_EVERY, MAX_EVAL_EVERY = 50, 1000
PATIENCE = 10
MIN_STEPS, MIN_EPOCHS, MAX_MIN_STEPS = 2000, 10, 20_000
MAX_STEPS = 200_000


@dataclasses.dataclass
class Profile:
    users: int
    items: int
    interactions: int
    length: dict  # percentiles of the training histories' lengths: p10, p50, p90, p99, max
    repeat_rate: float  # share of interactions with an item already in the user's history
    markov_hr10: float  # Markov chain HR@10 on the validation targets, seen items kept
    popularity_hr10: float
    # The training histories' lengths (not printed, not saved): positions a step at a history
    # length (`positions`).
    train_lengths: np.ndarray = dataclasses.field(default=None, repr=False, compare=False)

    def positions(self, max_seq_len):
        """The mean number of predicted positions of a training history read at most
        `max_seq_len` items at a time."""
        lengths = self.train_lengths[self.train_lengths >= 2]
        return float(np.minimum(lengths - 1, max_seq_len).mean()) if len(lengths) else 0.0

    def to_json(self):
        """The profile as ``run.json`` saves it."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "train_lengths"}

    def lines(self):
        """The profile as printed by ``recops-tf train``."""
        q = self.length
        return [f"{self.users} users, {self.items} items, {self.interactions} interactions",
                f"training history length: p10 {q['p10']}, median {q['p50']}, p90 {q['p90']}, "
                f"p99 {q['p99']}, max {q['max']}",
                f"repeat rate {self.repeat_rate:.3f} (interactions with an item already in the "
                f"user's history)",
                f"validation HR@10 of the Markov chain {self.markov_hr10:.4f}, of popularity "
                f"{self.popularity_hr10:.4f} (seen items kept)"]


def profile(dataset, split=None):
    """The `Profile` of `dataset` (its leave-one-out `split` if already made)."""
    split = split or evaluation.Split.leave_one_out(dataset)
    train, _ = split.train()
    lengths = np.array([len(h) for h in train], np.int64)
    interactions = int(sum(len(h) for h in dataset.items))
    repeats = 0
    for h in dataset.items:
        repeats += len(h) - len(np.unique(h))
    base = evaluation.baselines(split, dataset.num_items, "valid", False, ks=(10,),
                                  strong=False)
    pct = {f"p{p}": int(np.ceil(np.percentile(lengths, p))) for p in (10, 50, 90, 99)}
    pct["max"] = int(lengths.max()) if len(lengths) else 0
    return Profile(users=dataset.num_users, items=dataset.num_items, interactions=interactions,
                   length=pct, repeat_rate=repeats / max(interactions, 1),
                   markov_hr10=base["markov"]["hr@10"],
                   popularity_hr10=base["popularity"]["hr@10"], train_lengths=lengths)


def fit(prof, config, given=()):
    """The settings of ``config`` fitted to the data `prof`: a new ``Config`` and ``{field:
    reason}`` of the fields set. Fields named in `given` (set by the user) are left as they
    are; so is a config whose preset is not ``"auto"`` (a preset is the paper's recipe)."""
    if config.preset != "auto":
        return config, {}
    chosen, reasons = {}, {}

    def choose(field, value, reason):
        if field not in given:
            chosen[field] = value
            reasons[field] = reason

    median = prof.length["p50"]
    if median <= SPARSE_MEDIAN_HISTORY:
        choose("dropout_rate", SPARSE_DROPOUT, f"the median history has {median} items <= "
               f"{SPARSE_MEDIAN_HISTORY}: short, sparse histories, more dropout")
        choose("weight_average", SPARSE_WEIGHT_AVERAGE, f"short, sparse histories: validated "
               f"and tested on an average of the weights (decay {SPARSE_WEIGHT_AVERAGE})")
        choose("refit_epochs", SPARSE_REFIT_EPOCHS, f"short histories: the transition into "
               f"the validation item is one in {max(median, 1)} of a median history's; once "
               f"the choices are made on validation, the model trains "
               f"{SPARSE_REFIT_EPOCHS} more epochs with it")
    else:
        choose("dropout_rate", DENSE_DROPOUT, f"the median history has {median} items > "
               f"{SPARSE_MEDIAN_HISTORY}: the paper's dropout")
        choose("weight_average", 0.0, f"the median history has {median} items > "
               f"{SPARSE_MEDIAN_HISTORY}: the raw weights")
        choose("refit_epochs", 0, f"the median history has {median} items > "
               f"{SPARSE_MEDIAN_HISTORY}: the validation item adds little (no refit)")
    history = min(MAX_HISTORY, max(8, 8 * math.ceil(prof.length["p99"] / 8)))
    choose("max_seq_len", history, f"99% of the training histories have at most "
           f"{prof.length['p99']} items (at most {MAX_HISTORY})")
    batch = 128
    while batch > 32 and math.ceil(prof.users / batch) < MIN_STEPS_PER_EPOCH:
        batch //= 2
    choose("batch_size", batch, f"{prof.users} users: {math.ceil(prof.users / batch)} steps an "
           f"epoch (128 histories a step, fewer below {MIN_STEPS_PER_EPOCH} steps an epoch)")
    batch = chosen.get("batch_size", config.batch_size)
    steps_per_epoch = math.ceil(prof.users / batch)
    history = chosen.get("max_seq_len", config.max_seq_len)
    positions = batch * prof.positions(history)
    logits = positions * prof.items
    size = (f"{positions:,.0f} positions a step x {prof.items:,} items = "
            f"{logits / 1e6:,.1f} M logits")
    if median > SPARSE_MEDIAN_HISTORY:
        choose("loss", "sampled", f"the median history has {median} items > "
               f"{SPARSE_MEDIAN_HISTORY}: long histories, generative-recommenders' sampled "
               f"softmax")
        choose("negatives_per", "position", f"{config.num_negatives} negatives drawn for each "
               f"position (generative-recommenders' sampler on MovieLens)")
    elif logits <= FULL_SOFTMAX_MAX_LOGITS:
        choose("loss", "full", f"{size} <= {FULL_SOFTMAX_MAX_LOGITS / 1e6:.0f} M: a softmax "
               f"over the whole catalogue costs little")
    else:
        choose("loss", "sampled", f"{size} > {FULL_SOFTMAX_MAX_LOGITS / 1e6:.0f} M: a sampled "
               f"softmax")
        choose("negatives_per", "sequence", f"{config.num_negatives} negatives shared by a "
               f"sequence's positions")
    every = min(MAX_EVAL_EVERY, max(MIN_EVAL_EVERY, steps_per_epoch))
    choose("eval_every", every, f"validation every {every} steps (an epoch is "
           f"{steps_per_epoch} steps; within [{MIN_EVAL_EVERY}, {MAX_EVAL_EVERY}])")
    choose("patience", PATIENCE, f"stop after {PATIENCE} validations without a better "
           f"{config.validation_metric}")
    floor = min(MAX_MIN_STEPS, max(MIN_STEPS, MIN_EPOCHS * steps_per_epoch))
    choose("min_steps", floor, f"but not before {floor} steps (at least {MIN_STEPS}, or "
           f"{MIN_EPOCHS} epochs)")
    choose("max_steps", MAX_STEPS, f"at most {MAX_STEPS} steps")
    choose("epochs", 0, "counted in steps, not epochs")
    return dataclasses.replace(config, **chosen), reasons
