"""The evaluation protocol of the HSTU paper and SASRec: leave-one-out splits, full-catalogue
ranks, HR@K / NDCG@K / MRR, and the baselines every run is compared with (popularity, an
item-to-item Markov chain, sequential rules). NumPy only: no TensorFlow here.

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


def _unique(keys):
    """(sorted distinct keys, the index of each key among them): np.unique's, by sorting
    (numpy 2's hashing np.unique took seconds on these keys)."""
    keys = np.asarray(keys, np.int64).reshape(-1)
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    new = np.ones(len(keys), bool)
    new[1:] = ordered[1:] != ordered[:-1]
    inverse = np.empty(len(keys), np.int64)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], inverse


def _member(keys, distinct):
    """Whether each of `keys` is in `distinct` (sorted, distinct)."""
    if not len(distinct):
        return np.zeros(len(keys), bool)
    at = np.minimum(np.searchsorted(distinct, keys), len(distinct) - 1)
    return distinct[at] == keys


def _sparse_ranks(model, split, which, exclude_seen, num_items, batch_size=4096):
    """The ranks `_batched_ranks` gives `model.scores`, without the ``[users, num_items]``
    scores: `model` scores every item its `tiebreak` (``[num_items]``, >= 0) except the
    entries of ``model.sparse_batch(histories)``, each above every tiebreak value. So a
    target the model reaches ranks among the reached items only, and one it does not ranks
    behind all of them, among the rest by tiebreak (ties by id, as `ranks`)."""
    histories, _ = split.history(which)
    targets, _ = split.targets(which)
    tiebreak = np.asarray(model.tiebreak, np.float64)
    order = np.lexsort((np.arange(num_items), -tiebreak))  # item indices, best first
    place = np.empty(num_items, np.int64)
    place[order] = np.arange(num_items)
    width = num_items + 1
    out = []
    for first in range(0, len(targets), batch_size):
        hist = histories[first:first + batch_size]
        t = np.asarray(targets[first:first + batch_size], np.int64)
        n = len(t)
        rows, items, values = model.sparse_batch(hist)
        lengths = np.array([len(h) for h in hist], np.int64)
        seen_rows = np.repeat(np.arange(n), lengths)
        seen = (seen_rows * width + np.concatenate(
            [np.asarray(h, np.int64) for h in hist] or [np.zeros(0, np.int64)]))
        seen = _unique(seen[seen % width != t[seen // width]])[0]  # the target stays ranked
        if exclude_seen:
            keep = ~_member(rows * width + items, seen)
            rows, items, values = rows[keep], items[keep], values[keep]
        hit = items == t[rows]
        target_value = np.full(n, np.nan)
        target_value[rows[hit]] = values[hit]
        reached = ~np.isnan(target_value)
        v = target_value[rows]
        above = (values > v) | ((values == v) & (items < t[rows]))
        rank = np.bincount(rows, weights=above, minlength=n).astype(np.int64)
        # Not reached: behind every reached item; among the rest, the items ahead by
        # tiebreak that are neither reached nor excluded.
        count = np.bincount(rows, minlength=n)
        ahead = np.bincount(rows, weights=place[items - 1] < place[t[rows] - 1], minlength=n)
        if exclude_seen:
            others = seen[~_member(seen, rows * width + items)]  # rows ordered: sorted
            r, it = others // width, others % width
            ahead = ahead + np.bincount(r, weights=place[it - 1] < place[t[r] - 1], minlength=n)
        behind = count + place[t - 1] - ahead.astype(np.int64)
        out.append(np.where(reached, rank, behind))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


class _Popularity:
    """Popularity as a sparse scorer: every item its tiebreak, none reached."""

    def __init__(self, scores):
        self.tiebreak = scores

    def sparse_batch(self, histories):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)


def popularity_scores(split, num_items, which="train"):
    """Interaction count of every item (index j for item j + 1) in `which`: "train" (the
    training parts) or "valid" / "test" (every event before that target)."""
    seqs = split.train()[0] if which == "train" else split.history(which)[0]
    counts = np.bincount(np.concatenate(seqs) if seqs else np.zeros(0, np.int64),
                         minlength=num_items + 1)
    return counts[1:num_items + 1].astype(np.float64)


def transitions(histories, num_items, window=1):
    """``(starts [num_items + 2], items [P], counts [P])``: the distinct pairs (a, b) of
    `histories` (arrays of item ids in 1..num_items) where b came 1..`window` steps after a,
    grouped by a, as CSR: the items that followed item a are ``items[starts[a]:starts[a + 1]]``;
    ``counts`` sums 1 / gap over their occurrences (a count for window 1)."""
    keys, weights = [], []
    for gap in range(1, window + 1):
        pairs = [h[:-gap].astype(np.int64) * (num_items + 1) + h[gap:] for h in histories
                 if len(h) > gap]
        if pairs:
            keys.append(np.concatenate(pairs))
            weights.append(np.full(len(keys[-1]), 1.0 / gap))
    flat = [np.asarray(h) for h in histories if len(h)]
    if flat:
        every = np.concatenate(flat)
        if every.min() < 1 or every.max() > num_items:
            raise ValueError(f"histories: item ids must lie in 1..{num_items}")
    key = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    weight = np.concatenate(weights) if weights else np.zeros(0)
    keys, slot = _unique(key)
    counts = np.bincount(slot, weights=weight, minlength=len(keys))
    if window == 1:
        counts = counts.astype(np.int64)
    starts = np.searchsorted(keys // (num_items + 1), np.arange(num_items + 2))
    return starts.astype(np.int64), (keys % (num_items + 1)).astype(np.int64), counts


def recount(structure, counted, num_items):
    """`counted` (a ``transitions`` CSR) on the pairs of `structure` (one of a superset of its
    histories, the same window): ``(starts, items, counts)`` of `structure` with each pair's
    count in `counted` (0 for pairs `counted` lacks). A model's transition tables keep one
    shape (`structure`: every event of the data) while their counts cover the events a split
    may know (its training parts for validation, every event before the test item for the
    test)."""
    starts, items, _ = structure
    width = num_items + 1
    rows = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    keys = rows * width + items
    c_starts, c_items, c_counts = counted
    c_rows = np.repeat(np.arange(len(c_starts) - 1), np.diff(c_starts))
    c_keys = c_rows * width + c_items
    at = np.searchsorted(keys, c_keys)
    if len(c_keys) and (at.max() >= len(keys) or (keys[at] != c_keys).any()):
        raise ValueError("counted: pairs that structure lacks (not a subset's transitions)")
    counts = np.zeros(len(items), np.asarray(c_counts).dtype)
    counts[at] = c_counts
    return starts, items, counts


class MarkovChain:
    """Item-to-item Markov baseline: rank by how often each item followed the history's last
    item; ties (items never seen after it) by popularity. ``fit``: "train" counts the
    training parts only; "valid" / "test" every transition before that target (the chain a
    user would deploy: for the test target it knows the validation item's transition)."""

    def __init__(self, split, num_items, fit="train"):
        self.num_items = num_items
        seqs = split.train()[0] if fit == "train" else split.history(fit)[0]
        self._first, self._items, self._counts = transitions(seqs, num_items)
        pop = popularity_scores(split, num_items, fit)
        self._tiebreak = pop / (pop.max() + 1.0)  # < 1: never outranks a transition count

    @property
    def tiebreak(self):
        """``[num_items]`` the score of an item no rule reaches (below any rule's)."""
        return self._tiebreak

    depth, decay = 1, 1.0

    def scores(self, histories):
        """``[len(histories), num_items]`` scores (column j for item j + 1)."""
        out = np.tile(self._tiebreak, (len(histories), 1))
        rows, items, values = self.sparse_batch(histories)
        out[rows, items - 1] = values
        return out

    def sparse_batch(self, histories):
        """(rows, items, scores): the entries of `scores` that differ from `tiebreak` (the items
        the rules reach from each history), rows ordered, the same values: a reached item's
        score is its tiebreak plus ``decay**k`` times its rule from the history's k-th last
        item, summed k = 0, 1, ... in order."""
        width = self.num_items + 1
        keys, weights = [], []
        for k in range(self.depth):
            users = np.array([u for u, h in enumerate(histories) if len(h) > k], np.int64)
            if not len(users):
                break
            a = np.array([int(histories[u][-1 - k]) for u in users], np.int64)
            lo, hi = self._first[a], self._first[a + 1]
            n = hi - lo
            at = np.repeat(lo - np.cumsum(n) + n, n) + np.arange(n.sum())
            keys.append(np.repeat(users, n) * width + self._items[at])
            weights.append(self.decay ** k * self._counts[at].astype(np.float64))
        if not keys:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        key = np.concatenate(keys)
        weight = np.concatenate(weights)
        entries, slot = _unique(key)
        items = entries % width
        # The rules' sum (in k order: bincount adds in its input's order), then the tiebreak.
        values = np.bincount(slot, weights=weight, minlength=len(entries))
        return entries // width, items, values + self._tiebreak[items - 1]


class SequentialRules:
    """Sequential rules (Ludewig & Jannach, "Evaluation of session-based recommendation
    algorithms", 2018) over the last items of a history: item b gains ``1 / gap`` each time it
    came ``gap <= window`` steps after item a in the fitted sequences, and a history scores b
    by ``sum_k decay**k rule(h[-1 - k], b)`` over its last ``depth`` items; ties by
    popularity. With window 1, depth 1 it is the Markov chain. `fit` as MarkovChain's."""

    def __init__(self, split, num_items, fit="train", window=3, depth=3, decay=0.5, rules=None):
        self.num_items, self.depth, self.decay = num_items, depth, decay
        seqs = split.train()[0] if fit == "train" else split.history(fit)[0]
        # rules: transitions(seqs, num_items, window) when the caller has them
        self._first, self._items, self._counts = rules or transitions(seqs, num_items, window)
        pop = popularity_scores(split, num_items, fit)
        self._tiebreak = pop / (pop.max() + 1.0) * 1e-3  # below any rule's weight

    tiebreak = MarkovChain.tiebreak
    scores = MarkovChain.scores
    sparse_batch = MarkovChain.sparse_batch


# The sequential rules' settings tried on the validation target (HR@10 and NDCG@10 summed,
# seen items kept): a window of 1-10 steps, the last 1-10 items at decays 0.3-0.7; on at most
# SR_TUNE_USERS users (a fixed sample).
SR_GRID = tuple((w, depth, decay) for w in (1, 3, 5, 10) for depth, decay in
                ((1, 1.0), (3, 0.3), (5, 0.5), (10, 0.7)))
SR_TUNE_USERS = 10000


# Settings already chosen: {(the histories' list, its length, num_items, the grid): (the list,
# the settings)}, the last few (the list kept so that its id is not reused): a split made
# again from the same data (`tune`'s trials, train's report) chooses once.
_SR_CHOSEN = {}


def sequential_rules_settings(split, num_items, max_window=None):
    """(window, depth, decay) of SR_GRID (windows up to `max_window`) best on the validation
    target, fitted on every event before it (chosen once for the same histories)."""
    grid = tuple(g for g in SR_GRID if max_window is None or g[0] <= max_window) or SR_GRID[:1]
    key = (id(split.items), len(split.items), num_items, grid)
    if key in _SR_CHOSEN and _SR_CHOSEN[key][0] is split.items:
        return _SR_CHOSEN[key][1]
    best, best_value = grid[0], -1.0
    sample = split
    if split.num_users > SR_TUNE_USERS:
        users = np.sort(np.random.default_rng(0).choice(split.num_users, SR_TUNE_USERS,
                                                        replace=False))
        sample = Split([split.items[u] for u in users], [split.timestamps[u] for u in users])
    rules = {}
    for window, depth, decay in grid:
        # Fitted on every user's events before the validation target, ranked on the sample.
        if window not in rules:
            rules[window] = transitions(split.history("valid")[0], num_items, window)
        model = SequentialRules(split, num_items, "valid", window, depth, decay, rules[window])
        m = metrics(_sparse_ranks(model, sample, "valid", False, num_items), (10,))
        value = m["hr@10"] + m["ndcg@10"]
        if value > best_value:
            best, best_value = (window, depth, decay), value
    while len(_SR_CHOSEN) >= 4:
        _SR_CHOSEN.pop(next(iter(_SR_CHOSEN)))
    _SR_CHOSEN[key] = (split.items, best)
    return best


def baselines(split, num_items, which="test", exclude_seen=False, ks=KS, strong=True):
    """Baselines' metrics on the same split and protocol: 'popularity' and 'markov' fitted on
    every event before the `which` target (what a user would deploy), 'markov_train' on the
    training parts only, and with `strong` 'sequential_rules' (SequentialRules, settings
    chosen on the validation target, then fitted on every event before `which`)."""
    models = {"popularity": _Popularity(popularity_scores(split, num_items, which)),
              "markov": MarkovChain(split, num_items, which),
              "markov_train": MarkovChain(split, num_items)}
    if strong:
        models["sequential_rules"] = SequentialRules(
            split, num_items, which, *sequential_rules_settings(split, num_items))
    out = {name: metrics(_sparse_ranks(model, split, which, exclude_seen, num_items), ks)
           for name, model in models.items()}
    return out
