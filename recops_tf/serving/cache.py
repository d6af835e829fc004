"""Users' key/value caches between requests: a pool of fixed-size pages, LRU by user.

Each cached user holds the model's cache rows (``GenerativeRecommender.extend``: every HSTU
block's keys and values of each event) in pages of ``page_rows`` rows of one pool, plus the
events themselves (to score with the seen-item bias and to re-encode). A new event costs its own
rows against the cached ones, O(n x history), instead of re-encoding the history. When the pool
is full the least recently used users are evicted; an evicted or unknown user is encoded again
from the history its request carries.
"""
import collections
import threading

import numpy as np

# Bytes of alignment of the rows handed to TF without a copy (its CPU kernels' Eigen alignment
# on AVX-512 builds; a tensor sharing unaligned memory fails their checks).
ALIGN = 64


def aligned_empty(shape, dtype, align=ALIGN):
    """An uninitialised C-contiguous array whose data starts on an `align`-byte boundary."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.empty(count * dtype.itemsize + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


class _User:
    __slots__ = ("items", "timestamps", "pages", "length", "state", "lock", "busy")

    def __init__(self):
        self.items = self.timestamps = np.zeros(0, np.int64)  # the events kept, oldest first
        self.pages = []
        self.length, self.state = 0, None
        self.lock = threading.Lock()
        self.busy = 0  # requests holding the entry (from `user` to `release`): not evictable


class UserCache:
    """A page pool of ``budget_bytes`` for rows of ``width`` values of ``dtype`` (no pool with
    ``width`` or ``budget_bytes`` 0: then only the users' events are kept), and at most
    ``max_users`` users.

    ``user(id)`` gives a user's entry, held until ``release(entry)`` (its ``lock`` taken by the
    caller while it is read and updated; an entry held is never evicted); ``rows(entry)`` the
    cached rows; ``append(key, entry, rows)`` stores new rows, evicting the least recently
    used users not held as needed (False, the entry's rows freed, when one user alone does
    not fit)."""

    def __init__(self, budget_bytes, width, dtype, page_rows=64, max_users=1_000_000):
        self.width, self.page_rows, self.max_users = int(width), int(page_rows), int(max_users)
        self.dtype = np.dtype(dtype)
        page_bytes = self.page_rows * self.width * self.dtype.itemsize
        self.num_pages = int(budget_bytes) // page_bytes if page_bytes else 0
        self.pool = np.zeros([self.num_pages, self.page_rows, self.width], self.dtype)
        self.free = list(range(self.num_pages))[::-1]
        self.users = collections.OrderedDict()
        self.lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    @property
    def bytes_used(self):
        return (self.num_pages - len(self.free)) * self.pool[0].nbytes if self.num_pages else 0

    def user(self, key):
        """``(entry, hit)``: the cached entry of `key` (most recently used now), or a new
        empty one; held (not evictable) until ``release(entry)``."""
        with self.lock:
            entry = self.users.get(key)
            if entry is not None:
                self.users.move_to_end(key)
                self.hits += 1
                entry.busy += 1
                return entry, True
            while len(self.users) >= self.max_users and self._evict_one(key):
                pass
            entry = self.users[key] = _User()
            entry.busy += 1
            self.misses += 1
            return entry, False

    def release(self, entry):
        with self.lock:
            entry.busy -= 1

    def rows(self, entry):
        """The entry's cached rows, ``[length, width]``: a copy, aligned (`ALIGN`), that the
        caller may hand to TF without another copy."""
        if not entry.length:
            return np.zeros([0, self.width], self.dtype)
        out = aligned_empty([len(entry.pages), self.page_rows, self.width], self.dtype)
        np.take(self.pool, entry.pages, axis=0, out=out)
        return out.reshape(-1, self.width)[:entry.length]

    def _release(self, entry):
        self.free.extend(entry.pages)
        entry.pages, entry.length = [], 0

    def reset(self, entry):
        """Frees the entry's rows (it keeps its events)."""
        with self.lock:
            self._release(entry)

    def _evict_one(self, key):
        victim = next((k for k, e in self.users.items() if k != key and not e.busy), None)
        if victim is not None:
            self._release(self.users.pop(victim))
            self.evictions += 1
        return victim is not None

    def append(self, key, entry, rows):
        """Stores `rows` after the entry's; False (the entry emptied) if they cannot fit."""
        rows = np.asarray(rows, self.dtype)
        need = -(-(entry.length + len(rows)) // self.page_rows) - len(entry.pages)
        with self.lock:
            while len(self.free) < need:  # evict the least recently used idle users
                if not self._evict_one(key):
                    self._release(entry)
                    return False
            entry.pages += [self.free.pop() for _ in range(need)]
        at = np.arange(entry.length, entry.length + len(rows))
        self.pool[np.asarray(entry.pages)[at // self.page_rows], at % self.page_rows] = rows
        entry.length += len(rows)
        return True
