"""Users' key/value caches between requests: a pool of fixed-size pages, LRU by user.

Each cached user holds the model's cache rows (``GenerativeRecommender.extend``: every HSTU
block's keys and values of each event) in pages of ``page_rows`` rows of one pool, plus the
events themselves (to score with the seen-item bias and to re-encode). A new event costs its own
rows against the cached ones, O(n x history), instead of re-encoding the history. When the pool
is full the least recently used users are evicted; an evicted or unknown user is encoded again
from the history its request carries.

The budget counts everything the cache keeps: the pages in use, and each user's id, events and
state with a fixed allowance for the Python objects around them (``ENTRY_BYTES``, measured:
about 650 bytes a user with tracemalloc). Without a page pool (``budget_bytes`` 0: keys and
values are not kept, histories re-encoded each request) the users' events still are, within
``NO_POOL_BYTES``. An entry that holds no events when its last request lets go of it (a new
user whose request was refused) is dropped by ``release(entry, drop_empty=True)``: a rejected
request leaves nothing behind.
"""
import collections
import sys
import threading

import numpy as np

# Bytes of alignment of the rows handed to TF without a copy (its CPU kernels' Eigen alignment
# on AVX-512 builds; a tensor sharing unaligned memory fails their checks).
ALIGN = 64
# The bytes of a user's entry besides its id, events and state (its object, lock, arrays'
# headers, its place in the LRU order): 650 measured, rounded up.
ENTRY_BYTES = 768
# The users' events, ids and states kept without a page pool (--cache-mb 0).
NO_POOL_BYTES = 64 << 20


def aligned_empty(shape, dtype, align=ALIGN):
    """An uninitialised C-contiguous array whose data starts on an `align`-byte boundary."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.empty(count * dtype.itemsize + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def key_bytes(key):
    """The memory of a cache key: a string, or a tuple such as ``("u", 123)``."""
    if isinstance(key, tuple):
        return sys.getsizeof(key) + sum(sys.getsizeof(k) for k in key)
    return sys.getsizeof(key)


class _User:
    __slots__ = ("key", "items", "timestamps", "pages", "length", "state", "lock", "busy",
                 "bytes")

    def __init__(self, key):
        self.key = key
        self.items = self.timestamps = np.zeros(0, np.int64)  # the events kept, oldest first
        self.pages = []
        self.length, self.state = 0, None
        self.lock = threading.Lock()
        self.busy = 0  # requests holding the entry (from `user` to `release`): not evictable
        self.bytes = ENTRY_BYTES + key_bytes(key)  # as last counted (``UserCache.account``)

    def size(self):
        """Bytes of the entry besides its pages."""
        return (ENTRY_BYTES + key_bytes(self.key) + self.items.nbytes + self.timestamps.nbytes
                + (self.state.nbytes if self.state is not None else 0))


class UserCache:
    """At most ``budget_bytes`` (``NO_POOL_BYTES`` when 0) of users' state: a page pool for
    rows of ``width`` values of ``dtype`` (none with ``width`` or ``budget_bytes`` 0: then
    only the users' events are kept), and at most ``max_users`` users. ``bytes_used``
    counts the pages in use and every entry's id, events and state (``ENTRY_BYTES`` each
    besides); ``on_evict()``, if given, is called once per user evicted (``evictions``
    counts them).

    ``user(id)`` gives a user's entry, held until ``release(entry)`` (its ``lock`` taken by the
    caller while it is read and updated; an entry held is never evicted); ``rows(entry)`` the
    cached rows; ``append(key, entry, rows)`` stores new rows, evicting the least recently
    used users not held as needed (False, the entry's rows freed, when one user alone does
    not fit); ``account(entry)`` counts the entry's events and state once the caller changed
    them (evicting others past the budget)."""

    def __init__(self, budget_bytes, width, dtype, page_rows=64, max_users=1_000_000,
                 on_evict=None):
        self.width, self.page_rows, self.max_users = int(width), int(page_rows), int(max_users)
        self.dtype = np.dtype(dtype)
        self.budget = int(budget_bytes) or NO_POOL_BYTES
        self.page_bytes = self.page_rows * self.width * self.dtype.itemsize
        self.num_pages = int(budget_bytes) // self.page_bytes if self.page_bytes else 0
        self.pool = np.zeros([self.num_pages, self.page_rows, self.width], self.dtype)
        self.free = list(range(self.num_pages))[::-1]
        self.users = collections.OrderedDict()
        self.lock = threading.Lock()
        self.entry_bytes = 0  # the users' entries besides their pages (``_User.bytes``)
        self.on_evict = on_evict
        self.hits = self.misses = self.evictions = 0

    @property
    def bytes_used(self):
        return (self.num_pages - len(self.free)) * self.page_bytes + self.entry_bytes

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
            entry = self.users[key] = _User(key)
            entry.busy += 1
            self.entry_bytes += entry.bytes
            self.misses += 1
            self._shrink(key)
            return entry, False

    def release(self, entry, drop_empty=False):
        """Lets go of `entry`; with `drop_empty`, once no request holds it, an entry without
        events (a new user whose request was refused) is dropped."""
        with self.lock:
            entry.busy -= 1
            if drop_empty and not entry.busy and not len(entry.items) and \
                    self.users.get(entry.key) is entry:
                self._drop(self.users.pop(entry.key))
            self._shrink(None)

    def account(self, entry):
        """Counts `entry`'s events and state as they are now (the caller changed them), then
        evicts the least recently used idle users while over the budget; if that is not
        enough, frees the entry's own rows (it keeps its events, as after an eviction of its
        rows)."""
        with self.lock:
            size = entry.size()
            self.entry_bytes += size - entry.bytes
            entry.bytes = size
            if not self._shrink(entry.key):
                self._release(entry)

    def _drop(self, entry):
        self._release(entry)
        self.entry_bytes -= entry.bytes
        entry.bytes = 0

    def _shrink(self, key, pages=0):
        """Evicts idle users other than `key` until `pages` more pages fit in the pool and the
        whole in the budget; False when it cannot."""
        while len(self.free) < pages or self.bytes_used + pages * self.page_bytes > \
                self.budget:
            if not self._evict_one(key):
                return False
        return True

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
        """Evicts the least recently used user not held (nor `key`): the one place an
        eviction happens, counted once."""
        victim = next((k for k, e in self.users.items() if k != key and not e.busy), None)
        if victim is not None:
            self._drop(self.users.pop(victim))
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict()
        return victim is not None

    def append(self, key, entry, rows):
        """Stores `rows` after the entry's; False (the entry emptied) if they cannot fit."""
        rows = np.asarray(rows, self.dtype)
        need = -(-(entry.length + len(rows)) // self.page_rows) - len(entry.pages)
        with self.lock:
            if not self._shrink(key, need):  # evicts the least recently used idle users
                self._release(entry)
                return False
            entry.pages += [self.free.pop() for _ in range(need)]
        at = np.arange(entry.length, entry.length + len(rows))
        self.pool[np.asarray(entry.pages)[at // self.page_rows], at % self.page_rows] = rows
        entry.length += len(rows)
        return True
