"""The users' key/value page pool: rows round-trip, LRU eviction of users not held, page
accounting (no page lost or shared), the user limit, one user larger than the pool."""
import threading

import numpy as np
import pytest

from recops_tf.serving import cache as cache_module
from recops_tf.serving.cache import UserCache

WIDTH = 3


@pytest.fixture(autouse=True)
def weightless_entries(monkeypatch):
    """The page pool alone: users' entries weigh nothing against the budget here (the budget
    counts them too: tests/serving/test_validation.py)."""
    monkeypatch.setattr(cache_module, "ENTRY_BYTES", 0)
    monkeypatch.setattr(cache_module, "key_bytes", lambda key: 0)


def _rows(n, start=0):
    return np.arange(start, start + n * WIDTH, dtype=np.float32).reshape(n, WIDTH)


def _pages_ok(cache):
    held = [p for e in cache.users.values() for p in e.pages]
    assert len(held) == len(set(held)), "a page is shared"
    assert sorted(held + cache.free) == list(range(cache.num_pages)), "a page is lost"


def test_rows_round_trip_across_pages():
    cache = UserCache(10 * 4 * WIDTH * 4, WIDTH, np.float32, page_rows=4)
    entry, hit = cache.user("a")
    assert not hit
    for start, n in ((0, 3), (9, 1), (12, 6)):
        assert cache.append("a", entry, _rows(n, start))
    np.testing.assert_array_equal(cache.rows(entry), np.concatenate(
        [_rows(3, 0), _rows(1, 9), _rows(6, 12)]))
    assert len(entry.pages) == 3 and cache.bytes_used == 3 * 4 * WIDTH * 4
    cache.release(entry)
    _pages_ok(cache)


def test_least_recently_used_idle_users_are_evicted_held_ones_never():
    cache = UserCache(4 * 2 * WIDTH * 4, WIDTH, np.float32, page_rows=2)  # 4 pages
    for key in ("a", "b"):
        entry, _ = cache.user(key)
        assert cache.append(key, entry, _rows(4))
        cache.release(entry)
    held, _ = cache.user("a")  # a is now the most recent, and held
    c, _ = cache.user("c")
    assert cache.append("c", c, _rows(4))  # evicts b (idle), not a
    assert set(cache.users) == {"a", "c"} and cache.evictions == 1
    cache.release(c)
    d, _ = cache.user("d")
    assert cache.append("d", d, _rows(2))  # c is idle: evicted; a is held: kept
    assert "a" in cache.users and "c" not in cache.users
    np.testing.assert_array_equal(cache.rows(held), _rows(4))
    _pages_ok(cache)
    # One user larger than the pool: its rows are dropped, nobody held is evicted.
    big, _ = cache.user("big")
    assert not cache.append("big", big, _rows(20))
    assert big.length == 0 and "a" in cache.users
    _pages_ok(cache)


def test_the_user_limit_evicts_idle_users_only():
    cache = UserCache(0, WIDTH, np.float32, max_users=2)
    a, _ = cache.user("a")
    b, _ = cache.user("b")
    cache.release(b)
    c, _ = cache.user("c")  # over the limit: b (idle) goes, a (held) stays
    assert set(cache.users) == {"a", "c"}
    assert cache.num_pages == 0 and not cache.append("a", a, _rows(1))


def test_concurrent_users_lose_no_page():
    cache = UserCache(16 * 2 * WIDTH * 4, WIDTH, np.float32, page_rows=2, max_users=5)
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(300):
                key = int(rng.integers(0, 12))
                entry, _ = cache.user(key)
                try:
                    with entry.lock:
                        cache.append(key, entry, _rows(int(rng.integers(1, 4))))
                finally:
                    cache.release(entry)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(e.busy == 0 for e in cache.users.values())
    _pages_ok(cache)


def test_rows_are_aligned_copies_that_tf_can_share():
    """``rows`` is a fresh copy aligned for TF's kernels, which the server hands to TF
    through DLPack without another copy; an unaligned array is copied instead (sharing it
    would fail TF's alignment check in the kernel: a crash, not an error)."""
    import tensorflow as tf

    from recops_tf.serving.cache import ALIGN, aligned_empty
    from recops_tf.serving.server import _shared
    width = 200
    cache = UserCache(4 << 20, width, np.float32, page_rows=64)
    entry, _ = cache.user("a")
    want = np.random.default_rng(0).random((300, width), np.float32)
    assert cache.append("a", entry, want)
    got = cache.rows(entry)
    assert got.ctypes.data % ALIGN == 0 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    got_tensor = _shared(got)
    cache.append("a", entry, want[:5])  # the pool changes: the copy handed out does not
    np.testing.assert_array_equal(got_tensor.numpy(), want)
    np.testing.assert_allclose(tf.reduce_sum(got_tensor, 0), want.sum(0), rtol=1e-5)
    buffer = aligned_empty([301 * width + 1], np.float32)
    unaligned = buffer[1:].reshape(301, width)[:300]
    unaligned[:] = want
    assert unaligned.ctypes.data % ALIGN != 0
    np.testing.assert_allclose(tf.reduce_sum(_shared(unaligned), 0), want.sum(0), rtol=1e-5)
