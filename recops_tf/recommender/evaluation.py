"""The evaluation protocol of the HSTU paper and SASRec: leave-one-out splits, full-catalogue
ranks, HR@K / NDCG@K / MRR, and the two baselines every run is compared with (popularity and
an item-to-item Markov chain). NumPy only: no TensorFlow here.

Ranks are 0-based positions of the target in the ranking of every catalogue item (ids
``1..num_items``) by score. Ties are broken by item id (the lower id ranks first), so a
method that gives many items the same score (a baseline) gets a deterministic, not an
optimistic, rank. ``exclude`` lists, per query, items to remove from the ranking (the user's
history, for ``--exclude-seen``); the target itself is always ranked.
"""
import dataclasses
from typing import List

import numpy as np

KS = (5, 10, 20, 50, 200)  # 10, 50, 200: GR's table; 5, 20: the SASRec family's


@dataclasses.dataclass
class Split:
    """Leave-one-out split: per user, training items (all but the last two), a validation
    target (the second-to-last item) and a test target (the last item).

    ``history("valid")`` is what a model sees to predict the validation target (the training
    items); ``history("test")`` adds the validation item (as input, never as a training
    target). Training never sees either target.
    """
    items: List[np.ndarray]
    timestamps: List[np.ndarray]

    @classmethod
    def leave_one_out(cls, dataset):
        short = [i for i, h in enumerate(dataset.items) if len(h) < 3]
        if short:
            raise ValueError(f"leave-one-out needs 3 or more interactions per user; user "
                             f"{short[0]} has {len(dataset.items[short[0]])}")
        return cls(dataset.items, dataset.timestamps)

    @property
    def num_users(self):
        return len(self.items)

    def train(self):
        """(items, timestamps) of every user's training part."""
        return [h[:-2] for h in self.items], [t[:-2] for t in self.timestamps]

    def history(self, which):
        """(items, timestamps) a model sees before the `which` ('valid' or 'test') target."""
        cut = {"valid": -2, "test": -1}[which]
        return [h[:cut] for h in self.items], [t[:cut] for t in self.timestamps]

    def targets(self, which):
        """([U] target items, [U] their timestamps) of 'valid' or 'test'."""
        at = {"valid": -2, "test": -1}[which]
        return (np.array([h[at] for h in self.items], np.int64),
                np.array([t[at] for t in self.timestamps], np.int64))


def ranks(scores, targets, exclude=None):
    """0-based rank of each target among all items.

    Args:
      scores: ``[N, num_items]`` scores, column j for item j + 1.
      targets: ``[N]`` item ids in 1..num_items.
      exclude: None or N arrays of item ids to remove from the ranking (the target stays).
    """
    scores = np.array(scores, dtype=np.float64, copy=True)
    targets = np.asarray(targets, np.int64)
    n, num_items = scores.shape
    if targets.shape != (n,) or (n and (targets.min() < 1 or targets.max() > num_items)):
        raise ValueError(f"targets must be {n} item ids in 1..{num_items}")
    target_scores = scores[np.arange(n), targets - 1]
    if exclude is not None:
        rows = np.repeat(np.arange(n), [len(e) for e in exclude])
        cols = np.concatenate([np.asarray(e, np.int64) for e in exclude] or
                              [np.zeros(0, np.int64)]) - 1
        scores[rows, cols] = -np.inf
    if exclude is not None:  # the target is always ranked, even if seen before
        scores[np.arange(n), targets - 1] = target_scores
    higher = (scores > target_scores[:, None]).sum(axis=1)
    ids = np.arange(1, num_items + 1)
    tied_before = ((scores == target_scores[:, None]) & (ids[None, :] < targets[:, None])).sum(1)
    return higher + tied_before


def metrics(rank_values, ks=KS):
    """HR@k, NDCG@k for each k, and MRR (over the whole ranking) of 0-based ranks."""
    r = np.asarray(rank_values, np.float64)
    out = {}
    for k in ks:
        hit = r < k
        out[f"hr@{k}"] = float(hit.mean())
        out[f"ndcg@{k}"] = float(np.where(hit, 1.0 / np.log2(r + 2.0), 0.0).mean())
    out["mrr"] = float((1.0 / (r + 1.0)).mean())
    return out


def _batched_ranks(score_fn, split, which, exclude_seen, num_items, batch_size=512):
    histories, _ = split.history(which)
    targets, _ = split.targets(which)
    out = []
    for first in range(0, len(targets), batch_size):
        batch = slice(first, first + batch_size)
        scores = score_fn(histories[batch])
        out.append(ranks(scores, targets[batch], histories[batch] if exclude_seen else None))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def popularity_scores(split, num_items):
    """Training interaction count of every item (index j for item j + 1)."""
    train, _ = split.train()
    counts = np.bincount(np.concatenate(train) if train else np.zeros(0, np.int64),
                         minlength=num_items + 1)
    return counts[1:num_items + 1].astype(np.float64)


def transitions(histories, num_items):
    """``(starts [num_items + 2], items [P], counts [P])``: the distinct consecutive pairs
    (a, b) of `histories` (arrays of item ids in 1..num_items) grouped by a, as CSR: the items
    that followed item a are ``items[starts[a]:starts[a + 1]]``, ``counts`` times each."""
    pairs = [np.stack([h[:-1], h[1:]], 1) for h in histories if len(h) > 1]
    pairs = np.concatenate(pairs).astype(np.int64) if pairs else np.zeros((0, 2), np.int64)
    if len(pairs) and (pairs.min() < 1 or pairs.max() > num_items):
        raise ValueError(f"histories: item ids must lie in 1..{num_items}")
    keys, counts = np.unique(pairs[:, 0] * (num_items + 1) + pairs[:, 1], return_counts=True)
    starts = np.searchsorted(keys // (num_items + 1), np.arange(num_items + 2))
    return starts.astype(np.int64), (keys % (num_items + 1)).astype(np.int64), counts


class MarkovChain:
    """Item-to-item Markov baseline: rank by how often each item followed the history's last
    item in the training sequences; ties (items never seen after it) by popularity."""

    def __init__(self, split, num_items):
        self.num_items = num_items
        self._first, self._items, self._counts = transitions(split.train()[0], num_items)
        pop = popularity_scores(split, num_items)
        self._tiebreak = pop / (pop.max() + 1.0)  # < 1: never outranks a transition count

    def scores(self, histories):
        out = np.tile(self._tiebreak, (len(histories), 1))
        for row, h in enumerate(histories):
            last = int(h[-1])
            lo, hi = self._first[last], self._first[last + 1]
            out[row, self._items[lo:hi] - 1] += self._counts[lo:hi]
        return out


def baselines(split, num_items, which="test", exclude_seen=False, ks=KS):
    """{'popularity': metrics, 'markov': metrics} on the same split and protocol."""
    pop = popularity_scores(split, num_items)
    markov = MarkovChain(split, num_items)
    return {
        "popularity": metrics(_batched_ranks(lambda h: np.tile(pop, (len(h), 1)), split,
                                             which, exclude_seen, num_items), ks),
        "markov": metrics(_batched_ranks(markov.scores, split, which, exclude_seen,
                                         num_items), ks),
    }
