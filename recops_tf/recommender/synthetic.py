"""The built-in synthetic interaction set: structure that a sequence model can learn and that
neither popularity nor an item-to-item Markov chain captures.

Items fall into taste groups. A user's history is a run of sessions; each session has one
taste, and a new session (after a long gap in time) switches taste with probability 1/2, so
tastes drift over a history. Within a session the next item is

* with probability ``p_taste`` (0.5), any item of the session's taste (uniformly);
* with probability ``p_skip`` (0.1), the *partner of the item two steps back* (a fixed random
  pairing within each taste group): a pattern two steps deep;
* else noise: any item of the catalogue by a mild Zipf popularity (exponent ``zipf``), the
  last item of the history included.

So the session's taste is what its recent items share, and a Markov chain on the last item
alone is misled whenever that item is noise (about 40% of the time), while a sequence model
that reads the whole session is not. The suite shows the HSTU preset beating both baselines
on it (tests/test_recommender.py).

Timestamps advance by minutes within a session and by days between sessions. Deterministic in
``seed``.
"""
import numpy as np

from recops_tf.recommender.data import Dataset


def synthetic(num_users=3000, num_items=1000, num_tastes=10, min_len=20, max_len=60, seed=0,
              p_skip=0.1, p_taste=0.5, p_new_session=0.1, zipf=0.5):
    """A ``Dataset`` of ``num_users`` histories of ``min_len..max_len`` items."""
    if num_users < 1 or num_items < 4 or not 3 <= min_len <= max_len:
        raise ValueError("synthetic data needs num_users >= 1, num_items >= 4 and "
                         "3 <= min_len <= max_len")
    if not (0 <= p_skip and 0 <= p_taste and p_skip + p_taste <= 1):
        raise ValueError("p_skip and p_taste must be probabilities summing to at most 1")
    rng = np.random.default_rng(seed)
    num_tastes = max(1, min(num_tastes, num_items // 2))
    taste = rng.permutation(num_items) % num_tastes  # item -> group (every group non-empty)
    groups = [np.flatnonzero(taste == g) for g in range(num_tastes)]
    partner = np.zeros(num_items, np.int64)
    for members in groups:  # a random cycle through each group
        order = rng.permutation(members)
        partner[order] = np.roll(order, -1)
    global_p = rng.permutation(1.0 / np.arange(1, num_items + 1) ** zipf)
    global_p /= global_p.sum()
    items, stamps = [], []
    for _ in range(num_users):
        length = int(rng.integers(min_len, max_len + 1))
        current = int(rng.integers(num_tastes))
        seq = np.empty(length, np.int64)
        gaps = np.empty(length, np.int64)
        for t in range(length):
            new_session = t == 0 or rng.random() < p_new_session
            if new_session and t > 0 and rng.random() < 0.5:
                current = int(rng.integers(num_tastes))
            gaps[t] = (int(rng.lognormal(11.5, 0.5)) if new_session  # about a day
                       else int(rng.lognormal(5.5, 0.6)))  # a few minutes
            u = rng.random()
            if u < p_skip and t >= 2 and not new_session:
                seq[t] = partner[seq[t - 2]]
            elif u < p_skip + p_taste:
                seq[t] = rng.choice(groups[current])
            else:
                seq[t] = rng.choice(num_items, p=global_p)
        items.append(seq + 1)
        stamps.append(1_000_000_000 + np.cumsum(gaps))
    return Dataset(items, stamps, num_items,
                   f"synthetic(users={num_users}, items={num_items}, seed={seed})",
                   item_names=np.arange(1, num_items + 1).astype(str))
