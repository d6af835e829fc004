"""Interaction data for the generative recommender: a built-in synthetic set with structure to
learn, MovieLens-1M ``ratings.dat`` and ``user,item,timestamp`` CSV files.

A data set is per-user histories ordered by time: item ids are mapped to ``1..num_items``
(0 is never an item), timestamps are int64 seconds. The last item of every user is held out
for evaluation (leave-one-out); users with fewer than 3 interactions are dropped.
"""
import csv
import dataclasses
import os
from typing import List

import numpy as np


@dataclasses.dataclass
class Dataset:
    items: List[np.ndarray]  # per user, int64 item ids in 1..num_items, time order
    timestamps: List[np.ndarray]  # per user, int64 seconds, non-decreasing
    num_items: int
    source: str
    item_names: np.ndarray = None  # original ids of items 1..num_items (index i - 1)

    @property
    def num_users(self):
        return len(self.items)

    def split(self):
        """(train histories, train timestamps, held-out items, held-out timestamps): the last
        interaction of each user is the target of evaluation."""
        return ([h[:-1] for h in self.items], [t[:-1] for t in self.timestamps],
                np.array([h[-1] for h in self.items], np.int64),
                np.array([t[-1] for t in self.timestamps], np.int64))

    def popularity(self):
        """Interaction count of every item (index = item id) in the training part."""
        counts = np.zeros(self.num_items + 1, np.int64)
        for h in self.items:
            np.add.at(counts, h[:-1], 1)
        return counts


def synthetic(num_users=2000, num_items=1000, num_tastes=10, min_len=20, max_len=60, seed=0):
    """Users with latent tastes, Zipf item popularity and sequential habits.

    Items belong to taste groups; within a group they form a chain (item -> its successor).
    Each user has one main taste and a side taste. A user's next item is, with probability
    0.6, the successor of the current item; with 0.25, a popular item of the main taste
    (Zipf within the group); with 0.1, one of the side taste; else any item by global
    popularity. Timestamps advance by log-normal gaps. Deterministic in `seed`.
    """
    if num_users < 1 or num_items < 2 or not 3 <= min_len <= max_len:
        raise ValueError("synthetic data needs num_users >= 1, num_items >= 2 and "
                         "3 <= min_len <= max_len")
    rng = np.random.default_rng(seed)
    num_tastes = max(1, min(num_tastes, num_items // 2))
    taste = rng.permutation(num_items) % num_tastes  # item -> group (every group non-empty)
    groups = [np.flatnonzero(taste == g) for g in range(num_tastes)]
    successor = np.zeros(num_items, np.int64)
    for members in groups:
        order = rng.permutation(members)
        successor[order] = np.roll(order, -1)
    zipf = 1.0 / np.arange(1, num_items + 1) ** 1.1
    global_p = rng.permutation(zipf)
    global_p /= global_p.sum()
    group_p = []
    for members in groups:
        p = global_p[members]
        group_p.append(p / p.sum())
    items, stamps = [], []
    for _ in range(num_users):
        main, side = rng.integers(0, num_tastes, size=2)
        length = int(rng.integers(min_len, max_len + 1))
        seq = np.empty(length, np.int64)
        seq[0] = rng.choice(groups[main], p=group_p[main])
        for t in range(1, length):
            u = rng.random()
            if u < 0.6:
                seq[t] = successor[seq[t - 1]]
            elif u < 0.85:
                seq[t] = rng.choice(groups[main], p=group_p[main])
            elif u < 0.95:
                seq[t] = rng.choice(groups[side], p=group_p[side])
            else:
                seq[t] = rng.choice(num_items, p=global_p)
        gaps = rng.lognormal(mean=8.0, sigma=1.5, size=length).astype(np.int64)
        items.append(seq + 1)
        stamps.append(1_000_000_000 + np.cumsum(gaps))
    return Dataset(items, stamps, num_items, f"synthetic(users={num_users}, items={num_items}, "
                   f"seed={seed})", item_names=np.arange(1, num_items + 1))


class DataError(ValueError):
    """A data file that cannot be read; the message names the file and line."""


def _rows_movielens(path):
    with open(path, encoding="latin-1") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            parts = line.split("::")
            if len(parts) != 4:
                raise DataError(f"{path}:{number}: expected UserID::MovieID::Rating::Timestamp, "
                                f"got {line[:80]!r}")
            yield number, parts[0], parts[1], parts[3]


def _rows_csv(path):
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: the file is empty")
        names = [h.strip().lower() for h in header]
        try:
            columns = [names.index(c) for c in ("user", "item", "timestamp")]
        except ValueError:
            raise DataError(f"{path}:1: the header must name the columns user, item and "
                            f"timestamp, got {header}") from None
        for number, row in enumerate(reader, 2):
            if not row:
                continue
            if len(row) < len(names):
                raise DataError(f"{path}:{number}: expected {len(names)} columns, got {row}")
            yield (number,) + tuple(row[c].strip() for c in columns)


def load(path, min_interactions=3):
    """Reads MovieLens-1M ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``) or a CSV
    with a header naming ``user``, ``item`` and ``timestamp`` columns (any others ignored)."""
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    rows = _rows_movielens(path) if path.endswith(".dat") else _rows_csv(path)
    per_user, item_index = {}, {}
    for number, user, item, stamp in rows:
        try:
            stamp = int(float(stamp))
        except ValueError:
            raise DataError(f"{path}:{number}: timestamp {stamp!r} is not a number") from None
        if not user or not item:
            raise DataError(f"{path}:{number}: empty user or item")
        index = item_index.setdefault(item, len(item_index) + 1)
        per_user.setdefault(user, []).append((stamp, number, index))
    items, stamps = [], []
    for events in per_user.values():
        if len(events) < min_interactions:
            continue
        events.sort()
        stamps.append(np.array([e[0] for e in events], np.int64))
        items.append(np.array([e[2] for e in events], np.int64))
    if not items:
        raise DataError(f"{path}: no user has {min_interactions} or more interactions")
    names = np.empty(len(item_index), dtype=object)
    for name, index in item_index.items():
        names[index - 1] = name
    return Dataset(items, stamps, len(item_index), path, item_names=names.astype(str))
