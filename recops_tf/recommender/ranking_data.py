"""Data of the ranking task (``recops-tf train --task ranking``): events with actions, the
users' contextual features, the leave-last-out split and the batches of candidates.

A user's history is a sequence of events (item, action, time); the action is the event's
rating (or any numeric action value of the file): each distinct value is an action id
``1..num_actions`` in ascending order of value (0 is "no action": a candidate). A candidate
is *liked* when its rating is ``>= like_threshold`` (MovieLens: 4 of 5 stars).

Split (leave-last-out, as the retrieval task's, with a block of events instead of one): per
user of n events, ``h = max(1, min(holdout, (n - 1) // 3))``; the last h events are the test
targets, the h before them the validation targets, the rest the training events. A model
never trains on a validation or test event; the test history includes the validation events
as input (as the retrieval split's).

Tasks, per candidate (``TASKS``):

* ``watch``: the candidate is one of the user's real next events (1) or a sampled item (0);
* ``like``: rating >= like_threshold (real events only);
* ``rating``: the rating itself, a regression (real events only).

Training candidates: at a cut point drawn uniformly per user and epoch, the next up to
``targets`` training events (labels known) mixed with ``negative_ratio`` sampled items per
real one (uniform over the catalogue). Evaluation candidates: the validation (test) block's
events mixed with as many sampled items per real one, drawn once from a fixed seed.
"""
import dataclasses
import os
from typing import List

import numpy as np

TASKS = ("watch", "like", "rating")
MAX_ACTIONS = 32  # more distinct rating values than this are bucketed into 10 quantiles
TIME_BUCKETS = 64  # log2 buckets of the seconds between an event and the query time


@dataclasses.dataclass
class RankingData:
    """Events and contextual features of every user (internal ids; see the module doc)."""
    items: List[np.ndarray]  # per user, item ids 1..num_items, time order
    ratings: List[np.ndarray]  # per user, float32
    timestamps: List[np.ndarray]  # per user, int64
    actions: List[np.ndarray]  # per user, int64 action ids 1..num_actions
    context: np.ndarray  # [num_users, C] int64 feature codes (0: unknown); column 0: the user
    context_names: List[str]
    context_sizes: List[int]  # each feature's vocabulary size (codes 0..size-1)
    num_items: int
    action_values: np.ndarray  # the rating value of action id a at a - 1
    like_threshold: float
    holdout: int
    source: str = ""
    item_names: np.ndarray = None
    user_names: np.ndarray = None
    context_vocab: List[List[str]] = None  # per feature, the value of code c at c - 1

    @property
    def num_users(self):
        return len(self.items)

    @property
    def num_actions(self):
        return len(self.action_values)

    def bounds(self, user):
        """(start of the validation block, start of the test block) of `user`."""
        n = len(self.items[user])
        h = max(1, min(self.holdout, (n - 1) // 3))
        return n - 2 * h, n - h

    def block(self, user, which):
        """(history end, block start, block end) for 'valid' or 'test'."""
        valid, test = self.bounds(user)
        return (valid, valid, test) if which == "valid" else (test, test, len(self.items[user]))

    def train_mean(self):
        """The training events' mean rating and like rate."""
        r = np.concatenate([self.ratings[u][:self.bounds(u)[0]] for u in range(self.num_users)])
        return float(r.mean()), float((r >= self.like_threshold).mean())


def actions_of(ratings):
    """(per-event action ids, the value of each action): distinct values in ascending order;
    more than ``MAX_ACTIONS`` distinct values are bucketed into 10 quantile ranges."""
    flat = np.concatenate(ratings) if ratings else np.zeros(0, np.float32)
    values = np.unique(flat)
    if len(values) <= MAX_ACTIONS:
        return [np.searchsorted(values, r).astype(np.int64) + 1 for r in ratings], values
    edges = np.unique(np.quantile(flat, np.linspace(0, 1, 11)[1:-1]))
    centres = np.array([flat[np.searchsorted(edges, flat, side="right") == b].mean()
                        for b in range(len(edges) + 1)], np.float32)
    return [np.searchsorted(edges, r, side="right").astype(np.int64) + 1
            for r in ratings], centres


# MovieLens users: ML-100K `u.user` "id|age|gender|occupation|zip", ML-1M `users.dat`
# "UserID::Gender::Age::Occupation::Zip-code" (its age already grouped).
_AGE_GROUPS = (18, 25, 35, 45, 50, 56)  # ML-1M's groups, applied to ML-100K's ages


def _movielens_users(path):
    rows = {}
    with open(path, encoding="latin-1") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if "::" in line:
                parts = line.split("::")
                if len(parts) != 5:
                    raise ValueError(f"{path}:{number}: expected UserID::Gender::Age::"
                                     f"Occupation::Zip-code, got {line[:80]!r}")
                user, gender, age, occupation, zipcode = parts
            else:
                parts = line.split("|")
                if len(parts) != 5:
                    raise ValueError(f"{path}:{number}: expected id|age|gender|occupation|zip, "
                                     f"got {line[:80]!r}")
                user, age, gender, occupation, zipcode = parts
                try:
                    age = str(int(np.searchsorted(_AGE_GROUPS, int(age), side="right")))
                except ValueError:
                    raise ValueError(f"{path}:{number}: age {age!r} is not a number") from None
            rows[user.strip()] = {"gender": gender.strip(), "age": age.strip(),
                                  "occupation": occupation.strip(),
                                  "zip3": zipcode.strip()[:3]}
    return rows


def _csv_users(path, user_col):
    import csv

    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        lower = [h.lower() for h in header]
        if (user_col or "user").lower() not in lower:
            raise ValueError(f"{path}:1: the header has no user column "
                             f"{user_col or 'user'!r}; its columns are {header}")
        at = lower.index((user_col or "user").lower())
        rows = {}
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise ValueError(f"{path}:{reader.line_num}: expected {len(header)} columns "
                                 f"as in the header, got {len(row)}")
            rows[row[at].strip()] = {h: v.strip() for j, (h, v) in enumerate(zip(header, row))
                                     if j != at}
    return rows


def user_features_file(data_path):
    """The MovieLens users file beside a ratings file (``u.user`` beside ``u.data``,
    ``users.dat`` beside ``ratings.dat``), or None."""
    folder = os.path.dirname(os.path.abspath(data_path))
    for name in ("u.user", "users.dat"):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def context_features(user_names, path=None, user_col=None):
    """``([U, C] codes, names, sizes, vocabularies)``: column 0 is the user itself (code =
    index + 1), then each feature of the users file (MovieLens' or a CSV with a user column),
    its values coded 1.. in order of first appearance (0: a user missing from the file); a
    feature's vocabulary lists the value of code c at c - 1."""
    codes = [np.arange(1, len(user_names) + 1, dtype=np.int64)]
    names, sizes = ["user"], [len(user_names) + 1]
    vocabs = [[str(u) for u in user_names]]
    if path:
        if not os.path.exists(path):
            raise ValueError(f"{path}: no such users file")
        with open(path, encoding="latin-1") as f:
            first = f.readline()
        rows = (_movielens_users(path) if "::" in first or "|" in first
                else _csv_users(path, user_col))
        features = sorted({k for r in rows.values() for k in r})
        if not set(map(str, user_names)) & set(rows):
            raise ValueError(f"{path}: none of its users is in the interaction data")
        for feature in features:
            vocab = {}
            column = np.zeros(len(user_names), np.int64)
            for u, name in enumerate(user_names):
                value = rows.get(str(name), {}).get(feature)
                if value is not None:
                    column[u] = vocab.setdefault(value, len(vocab) + 1)
            codes.append(column)
            names.append(feature)
            sizes.append(len(vocab) + 1)
            vocabs.append(list(vocab))
    return np.stack(codes, 1), names, sizes, vocabs


def from_dataset(dataset, like_threshold=4.0, holdout=5, features=None, user_col=None):
    """A `RankingData` of a ``recommender.load(..., ratings=True)`` data set; `features`: a
    users file (see `context_features`)."""
    if dataset.ratings is None:
        raise ValueError(f"{dataset.source}: the ranking task needs a rating (action) per "
                         f"event: MovieLens files, or a CSV with a rating column (--rating-col)")
    if int(holdout) < 1:
        raise ValueError(f"holdout must be at least 1, got {holdout}")
    actions, values = actions_of(dataset.ratings)
    context, names, sizes, vocabs = context_features(dataset.user_names, features, user_col)
    return RankingData(dataset.items, dataset.ratings, dataset.timestamps, actions, context,
                       names, sizes, dataset.num_items, values, float(like_threshold),
                       int(holdout), dataset.source, dataset.item_names, dataset.user_names,
                       vocabs)


@dataclasses.dataclass
class Batch:
    """Model inputs (NumPy; ``ragged`` pairs are (values, row lengths)) and labels."""
    context: np.ndarray  # [B, C]
    items: tuple  # ragged [B, (L)]
    actions: tuple
    timestamps: tuple
    candidates: tuple  # ragged [B, (T)]
    query_time: np.ndarray  # [B]
    users: np.ndarray  # [B]
    labels: dict  # task -> [sum T] float32
    masks: dict  # task -> [sum T] float32 (1: the label counts)


def _ragged(seqs, dtype=np.int64):
    lengths = np.array([len(s) for s in seqs], np.int64)
    values = np.concatenate(seqs).astype(dtype) if seqs else np.zeros(0, dtype)
    return values, lengths


def make_batch(data, rows, max_len):
    """`rows`: per user ``(user, history end, real target positions, negative items)``."""
    context, hist, act, ts, cands, qt, labels = [], [], [], [], [], [], {t: [] for t in TASKS}
    masks = {t: [] for t in TASKS}
    for user, end, real, negatives in rows:
        start = max(0, end - max_len)
        hist.append(data.items[user][start:end])
        act.append(data.actions[user][start:end])
        ts.append(data.timestamps[user][start:end])
        context.append(data.context[user])
        cands.append(np.concatenate([data.items[user][real], negatives]))
        qt.append(data.timestamps[user][real[0]] if len(real) else data.timestamps[user][end - 1])
        r = data.ratings[user][real]
        n_neg = len(negatives)
        labels["watch"].append(np.r_[np.ones(len(real)), np.zeros(n_neg)])
        labels["like"].append(np.r_[(r >= data.like_threshold), np.zeros(n_neg)])
        labels["rating"].append(np.r_[r, np.zeros(n_neg)])
        masks["watch"].append(np.ones(len(real) + n_neg))
        for t in ("like", "rating"):
            masks[t].append(np.r_[np.ones(len(real)), np.zeros(n_neg)])
    return Batch(np.stack(context), _ragged(hist), _ragged(act), _ragged(ts), _ragged(cands),
                 np.array(qt, np.int64), np.array([r[0] for r in rows], np.int64),
                 {t: np.concatenate(v).astype(np.float32) for t, v in labels.items()},
                 {t: np.concatenate(v).astype(np.float32) for t, v in masks.items()})


def training_batches(data, epoch, seed, batch_size, max_len, targets=10, negative_ratio=1):
    """One epoch's batches (a generator): users shuffled by (seed, epoch), each at a cut
    point drawn uniformly among its training events."""
    rng = np.random.default_rng([seed, epoch, 7])
    users = [u for u in range(data.num_users) if data.bounds(u)[0] >= 2]
    if not users:
        raise ValueError("no user has 2 or more training events")
    order = rng.permutation(users)
    for first in range(0, len(order), batch_size):
        rows = []
        for u in order[first:first + batch_size]:
            n = data.bounds(u)[0]
            cut = int(rng.integers(1, n))
            real = np.arange(cut, min(n, cut + targets))
            rows.append((u, cut, real, rng.integers(1, data.num_items + 1,
                                                    len(real) * negative_ratio)))
        yield make_batch(data, rows, max_len)


def steps_per_epoch(data, batch_size):
    users = sum(1 for u in range(data.num_users) if data.bounds(u)[0] >= 2)
    return -(-users // batch_size)


def evaluation_batches(data, which, batch_size, max_len, negative_ratio=1, seed=0):
    """The `which` ('valid' / 'test') blocks of every user as batches (a list; the same
    sampled negatives on every call)."""
    rng = np.random.default_rng([seed, {"valid": 1, "test": 2}[which], 11])
    rows = []
    for u in range(data.num_users):
        end, a, b = data.block(u, which)
        real = np.arange(a, b)
        rows.append((u, end, real, rng.integers(1, data.num_items + 1,
                                                len(real) * negative_ratio)))
    return [make_batch(data, rows[i:i + batch_size], max_len)
            for i in range(0, len(rows), batch_size)]
