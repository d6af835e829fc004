"""Case builders: for each stem, inputs of a given shape plus the fused and reference callables.

Used by the benchmark (``recops_tf.bench``), the Bazel smoke test and the repo-level tests. The
keyword arguments of each builder are the keys of the stem's ``bench`` shapes in the ops table.
"""
import dataclasses
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.ops._common import lib
from recops_tf.reference import concat_jagged_tensor as ref_concat
from recops_tf.reference import disentangle_attention as ref_disentangle
from recops_tf.reference import embedding_by_address as ref_by_address
from recops_tf.reference import fused_lazy_adam as ref_lazy_adam
from recops_tf.reference import fused_sgd as ref_sgd
from recops_tf.reference import gather_for_rank1 as ref_gather
from recops_tf.reference import hstu_dense as ref_hstu
from recops_tf.reference import hstu_dense_fuxi as ref_fuxi
from recops_tf.reference import in_linear_silu as ref_in_linear_silu
from recops_tf.reference import ln_mul as ref_ln_mul
from recops_tf.reference import multislice_concat as ref_multislice
from recops_tf.reference import norm_multiply_dropout as ref_nmd
from recops_tf.reference import pcie_through as ref_pcie
from recops_tf.reference import relative_attn_bias as ref_rab
from recops_tf.reference import reverse_sequence as ref_reverse
from recops_tf.reference import token_mixing as ref_token_mixing
from recops_tf.testing.inputs import random_values, zipf_ids


@dataclasses.dataclass
class Case:
    label: str
    fused: Callable
    reference: Callable
    args: Sequence
    diff: Sequence[int]  # indices of differentiable args
    bytes_forward: int  # bytes read + written by the forward (memory-bound ops)
    bytes_backward: int  # bytes read + written by the backward
    flops_forward: int = 0
    flops_backward: int = 0
    # The benchmark's baseline when it is not the reference (e.g. dropout: the natural stock-TF
    # composite draws its own mask, so it cannot be the oracle of the kernel's mask).
    baseline: Callable = None
    # Stateful stems (tables, optimizer steps): `state()` returns (fused state, reference state),
    # lists of tensors to compare after fused and reference ran once each (None: compare the
    # outputs); `auxiliary` is a no-argument function using the stem's remaining ops (the
    # smoke test traces and runs it).
    state: Callable = None
    auxiliary: Callable = None

    @property
    def benchmark_baseline(self):
        return self.baseline if self.baseline is not None else self.reference


def _offsets(lengths, dtype):
    return tf.constant(np.concatenate([[0], np.cumsum(lengths)]), dtype=dtype)


def _nbytes(*tensors):
    return sum(int(np.prod(t.shape)) * t.dtype.size for t in tensors)


def concat_jagged_tensor(fn="concat", batch=4, len_a=6, len_b=3, dim=8, prefix=0,
                         dtype=tf.float32, index_dtype=tf.int64, seed=0):
    """Lengths uniform in [0, 2*len) so rows are ragged; fn is "concat" or "split"."""
    rng = np.random.default_rng(seed)
    la = rng.integers(0, 2 * len_a + 1, size=batch)
    lb = rng.integers(0, 2 * len_b + 1, size=batch)
    oa, ob = _offsets(la, index_dtype), _offsets(lb, index_dtype)
    a = random_values([int(la.sum()), dim], dtype, seed + 1)
    b = random_values([int(lb.sum()), dim], dtype, seed + 2)
    label = f"{fn} B={batch} La~{len_a} Lb~{len_b} D={dim} p={prefix}"
    total = _nbytes(a, b)
    if fn == "concat":
        return Case(label,
                    lambda a, oa, b, ob: recops_tf.concat_jagged_tensor(
                        a, oa, b, ob, n_prefix_from_right=prefix),
                    lambda a, oa, b, ob: ref_concat.concat_jagged_tensor(
                        a, oa, b, ob, n_prefix_from_right=prefix),
                    [a, oa, b, ob], [0, 2], 2 * total, 2 * total)
    values = ref_concat.concat_jagged_tensor(a, oa, b, ob, n_prefix_from_right=prefix)
    return Case(label,
                lambda v, oa, ob: recops_tf.split_jagged_tensor(v, oa, ob, n_prefix_to_right=prefix),
                lambda v, oa, ob: ref_concat.split_jagged_tensor(v, oa, ob,
                                                                 n_prefix_to_right=prefix),
                [values, oa, ob], [0], 2 * total, 2 * total)


def gather_for_rank1(table=50, num_index=64, dtype=tf.float32, index_dtype=tf.int64, seed=0):
    rng = np.random.default_rng(seed)
    x = random_values([table], dtype, seed + 1)
    index = tf.constant(rng.integers(0, table, size=num_index), dtype=index_dtype)
    k = num_index
    return Case(f"E={table} K={num_index}", recops_tf.gather_for_rank1, ref_gather.gather_for_rank1,
                [x, index], [0],
                bytes_forward=k * (index.dtype.size + x.dtype.size) + table * x.dtype.size,
                bytes_backward=k * (index.dtype.size + x.dtype.size) + table * x.dtype.size)


def reverse_sequence(batch=3, steps=7, dim=4, dtype=tf.float32, index_dtype=tf.int64, seed=0):
    rng = np.random.default_rng(seed)
    x = random_values([batch, steps, dim], dtype, seed + 1)
    lens = tf.constant(rng.integers(0, steps + 1, size=batch), dtype=index_dtype)
    return Case(f"B={batch} T={steps} D={dim}", recops_tf.reverse_sequence,
                ref_reverse.reverse_sequence, [x, lens], [0], 2 * _nbytes(x), 2 * _nbytes(x))


def multislice_slices(cols, outputs, slices_per_output, seed=0):
    """Random (possibly overlapping) slices: begins, lengths (some -1) and concat sizes."""
    rng = np.random.default_rng(seed)
    width = max(1, cols // (outputs * slices_per_output))
    begins, lengths = [], []
    for _ in range(outputs * slices_per_output):
        b = int(rng.integers(0, cols))
        if b + width >= cols:
            begins.append(b)
            lengths.append(-1 if rng.integers(0, 2) else cols - b)
        else:
            begins.append(b)
            lengths.append(width)
    return [slices_per_output] * outputs, begins, lengths


def multislice_concat(rows=5, cols=12, outputs=3, slices_per_output=2, dtype=tf.float32,
                      index_dtype=None, seed=0):
    sizes, begins, lengths = multislice_slices(cols, outputs, slices_per_output, seed)
    x = random_values([rows, cols], dtype, seed + 1)
    out_cols = sum(cols - b if n == -1 else n for b, n in zip(begins, lengths))
    out_bytes = rows * out_cols * x.dtype.size
    return Case(f"R={rows} D={cols} C={outputs}x{slices_per_output}",
                lambda x: recops_tf.multislice_concat(x, sizes, begins, lengths),
                lambda x: ref_multislice.multislice_concat(x, sizes, begins, lengths),
                [x], [0], 2 * out_bytes, out_bytes + _nbytes(x))


def hstu_dense(batch=3, max_len=70, heads=2, dim=8, paged=False, page_size=16,
               rel_bias=False, dtype=tf.float32, index_dtype=tf.int64, seed=0):
    """Causal jagged HSTU attention, lengths uniform in [1, max_len], Nq = Nk, Dqk = Dv.

    With `paged`, the paged KV-cache forward: each sequence has a cache of up to max_len keys
    in pages and up to 4 new tokens, the last up to 2 of them targets (forward only).

    With `rel_bias`, the fused relative bias (129 time buckets of increasing timestamps, gaps
    up to a day, and 2 * max_len - 1 position weights) against the same attention given the
    dense bias built by the separate ops (relative_attn_bias_time + the Toeplitz position
    bias, broadcast over heads), which is how the bias is applied without the fusion."""
    rng = np.random.default_rng(seed)
    if paged:
        return _hstu_paged(rng, batch, max_len, heads, dim, page_size, dtype, index_dtype, seed)
    lengths = rng.integers(1, max_len + 1, size=batch)
    offsets = _offsets(lengths, index_dtype)
    rows = int(lengths.sum())
    q, k, v = (random_values([rows, heads, dim], dtype, seed + i) for i in (1, 2, 3))
    # Useful (causal, unpadded) work: two GEMMs over half of each L x L score matrix forward,
    # four backward.
    flops = int(2 * heads * (dim + dim) * np.sum(lengths.astype(np.float64) ** 2) / 2)
    if rel_bias:
        return _hstu_rel_bias(rng, lengths, offsets, max_len, heads, [q, k, v], flops, dtype,
                              seed)
    return Case(f"B={batch} L<={max_len} H={heads} D={dim}",
                lambda q, k, v: recops_tf.hstu_attention(q, k, v, seq_offsets=offsets,
                                                         max_seq_len=max_len),
                lambda q, k, v: ref_hstu.hstu_attention(q, k, v, offsets, offsets, max_len,
                                                        max_len),
                [q, k, v], [0, 1, 2], _nbytes(q, k, v, v), 2 * _nbytes(q, k, v, v),
                flops_forward=flops, flops_backward=2 * flops)


def _hstu_rel_bias(rng, lengths, offsets, max_len, heads, qkv, flops, dtype, seed):
    ts = np.concatenate([np.cumsum(rng.integers(0, 86400, size=n)) for n in lengths])
    ts = tf.constant(ts, tf.int64)
    dense_ts = tf.RaggedTensor.from_row_splits(ts, tf.cast(offsets, tf.int64)).to_tensor(
        shape=[len(lengths), max_len])
    time_w = random_values([129], dtype, seed + 4)
    pos_w = random_values([2 * max_len - 1], dtype, seed + 5)

    def fused(q, k, v, time_w, pos_w):
        return recops_tf.hstu_attention(q, k, v, seq_offsets=offsets, max_seq_len=max_len,
                                        timestamps=ts, time_bias_weights=time_w,
                                        position_bias_weights=pos_w)

    def separate(q, k, v, time_w, pos_w):
        time_bias, _ = recops_tf.relative_attn_bias_time(dense_ts, time_w[None],
                                                         duplicate=False)
        pos_bias, _ = recops_tf.toeplitz_position_bias(pos_w, duplicate=False)
        bias = time_bias[0] + pos_bias[None]
        bias = tf.broadcast_to(bias[:, None], [len(lengths), heads, max_len, max_len])
        return recops_tf.hstu_attention(q, k, v, seq_offsets=offsets, max_seq_len=max_len,
                                        attn_bias=bias)

    return Case(f"rel. bias B={len(lengths)} L<={max_len} H={heads} D={qkv[0].shape[2]}",
                fused, separate, [*qkv, time_w, pos_w], [0, 1, 2, 3, 4],
                _nbytes(*qkv, qkv[2]), 2 * _nbytes(*qkv, qkv[2]), flops_forward=flops,
                flops_backward=2 * flops)


def _hstu_paged(rng, batch, max_len, heads, dim, page_size, dtype, index_dtype, seed):
    cache_len = rng.integers(1, max_len + 1, size=batch)
    new = rng.integers(1, 5, size=batch)
    targets = np.minimum(rng.integers(0, 3, size=batch), new)
    pages_per = (cache_len + page_size - 1) // page_size
    num_pages = int(pages_per.sum()) + 1
    page_ids = rng.permutation(num_pages)[:int(pages_per.sum())]
    page_offsets = np.concatenate([[0], np.cumsum(pages_per)])
    last = cache_len - (pages_per - 1) * page_size
    offsets = np.concatenate([[0], np.cumsum(new)])
    q, k, v = (random_values([int(new.sum()), heads, dim], dtype, seed + i) for i in (1, 2, 3))
    cache = random_values([num_pages, 2, page_size, heads, dim], dtype, seed + 4)
    # Composite: gather the effective keys (flat cache rows, then the fresh target rows).
    src, k_lengths = [], []
    for b in range(batch):
        for j, page in enumerate(page_ids[page_offsets[b]:page_offsets[b + 1]]):
            rows = page_size if j + 1 < pages_per[b] else last[b]
            src += [page * page_size + r for r in range(rows)]
        src += [num_pages * page_size + r for r in range(offsets[b + 1] - targets[b],
                                                          offsets[b + 1])]
        k_lengths.append(cache_len[b] + targets[b])
    src = tf.constant(src, tf.int64)
    offsets_k = _offsets(np.array(k_lengths), tf.int64)
    ints = lambda x: tf.constant(x, index_dtype)  # noqa: E731
    max_k = int(max_len + 2)

    def fused(q, k, v, cache):
        return recops_tf.hstu_attention_paged(
            q, k, v, cache, seq_offsets=ints(offsets), page_offsets=ints(page_offsets),
            page_ids=ints(page_ids), last_page_len=ints(last), num_target=ints(targets),
            max_seq_len=4, max_seq_len_k=max_k)

    def reference(q, k, v, cache):
        flat = lambda part, x: tf.concat(  # noqa: E731
            [tf.reshape(cache[:, part], [-1, heads, dim]), x], axis=0)
        return ref_hstu.hstu_attention(q, tf.gather(flat(0, k), src), tf.gather(flat(1, v), src),
                                       ints(offsets), offsets_k, 4, max_k,
                                       num_target=ints(targets), target_group_size=1)

    flops = int(2 * heads * 2 * dim * np.sum(new * (cache_len + targets)))
    return Case(f"paged B={batch} cache<={max_len} H={heads} D={dim} page={page_size}", fused,
                reference, [q, k, v, cache], [], _nbytes(q, k, v), 0, flops_forward=flops)


def hstu_dense_fuxi(batch=3, max_len=70, heads=2, dim=8, dtype=tf.float32,
                    index_dtype=tf.int64, seed=0):
    """Causal jagged Fuxi attention with both biases, lengths uniform in [1, max_len]."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=batch)
    offsets = _offsets(lengths, index_dtype)
    rows = int(lengths.sum())
    q, k, v = (random_values([rows, heads, dim], dtype, seed + i) for i in range(3))
    ts = random_values([batch, max_len, max_len], dtype, seed + 4)
    pos = random_values([1, max_len, max_len], dtype, seed + 5)
    fused = lambda q, k, v, ts, pos: recops_tf.hstu_attention_fuxi(  # noqa: E731
        q, k, v, seq_offsets=offsets, max_seq_len=max_len, timestamp_bias=ts,
        position_bias=pos)
    reference = lambda q, k, v, ts, pos: ref_fuxi.hstu_attention_fuxi(  # noqa: E731
        q, k, v, offsets, max_len, ts, pos)
    # Useful causal FLOPs per visible pair and head: forward Q.K and three P.V products;
    # backward dO_s.V, dS.K, dS^T.Q, three dV products and two bias-gradient products.
    pairs = float(np.sum(lengths * (lengths + 1) / 2))
    return Case(f"B={batch} L<={max_len} H={heads} D={dim}", fused, reference,
                [q, k, v, ts, pos], [0, 1, 2, 3, 4], bytes_forward=0, bytes_backward=0,
                flops_forward=int(2 * heads * 4 * dim * pairs),
                flops_backward=int(2 * heads * 8 * dim * pairs))


def relative_attn_bias(fn="time", layers=2, batch=3, steps=5, num_buckets=129,
                       dtype=tf.float32, index_dtype=tf.int64, seed=0):
    """fn "time": increasing timestamps (gaps up to ~a day in seconds) and [L, NB] weights,
    the 2 x 2 duplicated bias; fn "pos": a Toeplitz [2s, 2s] position bias with its identity
    and random cached lengths."""
    rng = np.random.default_rng(seed)
    if fn == "time":
        gaps = rng.integers(0, 86400, size=(batch, steps))
        ts = tf.constant(np.cumsum(gaps, axis=1), dtype=index_dtype)
        w = random_values([layers, num_buckets], dtype, seed + 1)
        s2 = 2 * steps
        out = layers * batch * s2 * s2 * w.dtype.size
        return Case(f"time L={layers} B={batch} s={steps}",
                    lambda ts, w: recops_tf.relative_attn_bias_time(ts, w)[0],
                    lambda ts, w: ref_rab.relative_attn_bias_time(ts, w)[0],
                    [ts, w], [1],
                    bytes_forward=out + batch * steps * steps * 4 + _nbytes(ts, w),
                    bytes_backward=out + batch * steps * steps * 4 + _nbytes(w))
    pos_w = random_values([2 * steps - 1], dtype, seed + 1)
    p, ident = recops_tf.toeplitz_position_bias(pos_w)
    lens = tf.constant(rng.integers(0, 2 * steps + 1, size=batch), dtype=index_dtype)
    out = batch * 4 * steps * steps * p.dtype.size
    return Case(f"pos B={batch} S2={2 * steps}", recops_tf.relative_attn_bias_pos,
                ref_rab.relative_attn_bias_pos, [p, ident, lens], [0, 1],
                bytes_forward=out + 2 * _nbytes(p), bytes_backward=2 * out + 2 * _nbytes(p))


def _norm_mul_args(rows, cols, dtype, seed):
    x = random_values([rows, cols], dtype, seed, low=-2.0, high=3.0)
    return [x, random_values([rows, cols], dtype, seed + 1),
            random_values([cols], dtype, seed + 2), random_values([cols], dtype, seed + 3)]


def ln_mul(rows=64, cols=32, dtype=tf.float32, seed=0):
    """LayerNorm · u over [rows, cols]: memory-bound (x, u read, y written; backward: dy, x,
    u read, dx, du written)."""
    a = _norm_mul_args(rows, cols, dtype, seed)
    n = rows * cols * a[0].dtype.size
    return Case(f"R={rows} C={cols}", recops_tf.ln_mul, ref_ln_mul.ln_mul, a, [0, 1, 2, 3],
                bytes_forward=3 * n, bytes_backward=5 * n)


def norm_multiply_dropout(rows=64, cols=32, dropout_rate=0.1, dtype=tf.float32, seed=0):
    """As ln_mul, with dropout. The reference rebuilds the kernel's mask (with uint64 ops, slow);
    the benchmark's baseline is the natural composite: LayerNorm, multiply and
    tf.nn.experimental.stateless_dropout (its own mask)."""
    a = _norm_mul_args(rows, cols, dtype, seed)
    n = rows * cols * a[0].dtype.size
    seed_pair = tf.constant([seed, 1], tf.int64)

    def fused(x, u, w, b):
        return recops_tf.norm_multiply_dropout(x, u, w, b, dropout_rate=dropout_rate,
                                               seed=seed_pair)

    def reference(x, u, w, b):
        return ref_nmd.norm_multiply_dropout(x, u, w, b, dropout_rate=dropout_rate,
                                             seed=seed_pair)

    def composite(x, u, w, b):
        y = ref_ln_mul.ln_mul(x, u, w, b)
        if dropout_rate > 0.0:
            y = tf.nn.experimental.stateless_dropout(y, dropout_rate, seed=seed_pair)
        return y

    return Case(f"R={rows} C={cols} p={dropout_rate}", fused, reference, a, [0, 1, 2, 3],
                bytes_forward=3 * n, bytes_backward=5 * n, baseline=composite)


def token_mixing(batch=3, s=16, dtype=tf.float32, seed=0):
    """LayerNorm of x + xᵀ over [B, S, S] blocks (x read, y written; backward: dy, x read,
    dx written)."""
    a = [random_values([batch, s, s], dtype, seed), random_values([s], dtype, seed + 1),
         random_values([s], dtype, seed + 2)]
    n = batch * s * s * a[0].dtype.size
    return Case(f"B={batch} S={s}", recops_tf.token_mixing, ref_token_mixing.token_mixing, a,
                [0, 1, 2], bytes_forward=2 * n, bytes_backward=3 * n)


def in_linear_silu(m=64, k=16, split=8, dtype=tf.float32, seed=0):
    """The UVQK projection with four equal splits (Nw = 4 * split): "rate" counts the GEMM
    FLOPs (2·M·K·Nw forward, twice that backward)."""
    sizes = [split] * 4
    nw = 4 * split
    a = [random_values([m, k], dtype, seed), random_values([nw, k], dtype, seed + 1),
         random_values([nw], dtype, seed + 2)]
    flops = 2 * m * k * nw
    return Case(f"M={m} K={k} Nw={nw}",
                lambda x, w, b: recops_tf.in_linear_silu(x, w, b, sizes),
                lambda x, w, b: ref_in_linear_silu.in_linear_silu(x, w, b, sizes), a, [0, 1, 2],
                bytes_forward=0, bytes_backward=0, flops_forward=flops,
                flops_backward=2 * flops)


def disentangle_attention(batch=2, heads=2, s=16, d=8, dtype=tf.float32, seed=0):
    """c2p|p2c disentangled attention with relative positions i - j and no mask; "rate" counts
    the five s x s x d (or s x 2s x d) GEMMs of the forward and twice that backward."""
    rel = tf.constant(np.arange(s)[:, None] - np.arange(s)[None, :], tf.int64)
    a = ([random_values([batch, heads, s, d], dtype, seed + i) for i in range(3)]
         + [random_values([2 * s, heads, d], dtype, seed + 3 + i) for i in range(2)])
    flops = 2 * batch * heads * s * d * (s + 2 * s + 2 * s + s)
    return Case(f"b={batch} n={heads} s={s} d={d}",
                lambda q, k, v, pk, pq: recops_tf.disentangle_attention(q, k, v, pk, pq, rel),
                lambda q, k, v, pk, pq: ref_disentangle.disentangle_attention(q, k, v, pk, pq,
                                                                              rel),
                a, [0, 1, 2, 3, 4], bytes_forward=0, bytes_backward=0, flops_forward=flops,
                flops_backward=2 * flops)


def _mirrored_table(rng, num_rows, dim, num_slots):
    """A table whose key k is row k (so row ids index a dense mirror), full rows random."""
    table = recops_tf.DynamicEmbeddingTable(dim, initializer="zeros", num_slots=num_slots)
    rows = rng.standard_normal((num_rows, table.width)).astype(np.float32)
    if num_slots >= 2:  # v >= 0
        rows[:, 2 * dim:3 * dim] = np.abs(rows[:, 2 * dim:3 * dim])
    table.assign(np.arange(num_rows), rows)
    return table, rows


def _table_auxiliary(table):
    """Uses the table ops not in the timed case: create, lookup/insert, size, export, import."""
    def auxiliary():
        fresh = table._create_resource()
        addresses = lib().recops_dynamic_embedding_lookup_addresses(
            fresh, tf.constant([5, 6, 5], tf.int64), True)
        keys, rows = table.export()
        table.assign(keys, rows)
        tf.debugging.assert_equal(table.size(), tf.size(keys, out_type=tf.int64))
        tf.debugging.assert_equal(addresses[0], addresses[2])
    return auxiliary


def embedding_by_address(fn="lookup", table_rows=100, num_lookup=64, dim=8, dtype=tf.float32,
                         index_dtype=None, seed=0):
    """fn "lookup": by-address lookup of num_lookup uniform rows (some address 0) against
    tf.gather on a variable holding the same rows; fn "update": by-address add against a
    variable's scatter_add."""
    rng = np.random.default_rng(seed)
    table, rows = _mirrored_table(rng, table_rows, dim, 0)
    ids = rng.integers(0, table_rows, size=num_lookup)
    addresses = table.lookup_addresses(ids, training=False)
    ids = tf.constant(ids)
    var = tf.Variable(rows)
    label = f"{fn} V={table_rows} N={num_lookup} D={dim}"
    if fn == "lookup":
        return Case(label, lambda a, i: recops_tf.embedding_lookup_by_address(table, a),
                    lambda a, i: ref_by_address.embedding_lookup(var, i), [addresses, ids], [],
                    num_lookup * (8 + 2 * 4 * dim), 0, auxiliary=_table_auxiliary(table))
    values = tf.constant(rng.standard_normal((num_lookup, dim)), tf.float32)

    def reference(a, i, x):
        var.scatter_add(tf.IndexedSlices(x, i))
        return x

    return Case(label, lambda a, i, x: recops_tf.embedding_update_by_address(table, a, x),
                reference,
                [addresses, ids, values], [], num_lookup * (8 + 3 * 4 * dim), 0,
                state=lambda: ([table.export()[1]], [var]))


def _step(fn):
    """fn run for its effect: the case callable returns nothing (an op is not a tf.function
    output), and a tf.function still runs it (stateful ops always run)."""
    def run(*args):
        fn(*args)

    return run


def _touched_bytes(ids, dim, arrays):
    unique = len(np.unique(ids))
    return len(ids) * (8 + 4 * dim) + unique * arrays * 2 * 4 * dim


def fused_lazy_adam(target="variable", table_rows=100, touched=64, dim=8, baseline="composite",
                    dtype=tf.float32, index_dtype=tf.int64, seed=0):
    """One LazyAdam step of `touched` Zipf rows (duplicates) of a [table_rows, dim] variable
    (or, target "table", of a growing table by address) against the TF-Addons-style composite
    on copies; baseline "keras_adam" times Keras 3's stock Adam on the same IndexedSlices."""
    rng = np.random.default_rng(seed)
    ids = zipf_ids(rng, touched, table_rows)
    gradient = tf.constant(rng.standard_normal((touched, dim)), tf.float32)
    init = [rng.standard_normal((table_rows, dim)).astype(np.float32),
            rng.standard_normal((table_rows, dim)).astype(np.float32) * 0.1,
            rng.random((table_rows, dim)).astype(np.float32)]
    ref_vars = [tf.Variable(x) for x in init]
    lr = 0.01
    label = f"{target} V={table_rows} N={touched} D={dim}"

    def reference(g, i):
        return ref_lazy_adam.lazy_adam_update(*ref_vars, g, i, lr)

    nbytes = _touched_bytes(ids, dim, 3)
    if target == "table":
        table = recops_tf.DynamicEmbeddingTable(dim, initializer="zeros", num_slots=2)
        table.assign(np.arange(table_rows), np.concatenate(init, axis=1))
        addresses = table.lookup_addresses(ids, training=False)

        def table_state():
            rows = table.export()[1]
            return [rows[:, :dim], rows[:, dim:2 * dim], rows[:, 2 * dim:]], ref_vars

        return Case(label, _step(lambda a, i: recops_tf.lazy_adam_update(table, None, None,
                                                                         gradient, a, lr)),
                    _step(lambda a, i: reference(gradient, i)), [addresses, tf.constant(ids)], [],
                    nbytes, 0, state=table_state)
    fused_vars = [tf.Variable(x) for x in init]
    case = Case(label, _step(lambda g, i: recops_tf.lazy_adam_update(*fused_vars, g, i, lr)),
                _step(reference), [gradient, tf.constant(ids, index_dtype)], [], nbytes, 0,
                state=lambda: (fused_vars, ref_vars))
    if baseline == "keras_adam":
        import keras

        keras_var = tf.Variable(init[0])
        adam = keras.optimizers.Adam(lr)
        adam.build([keras_var])
        case.label += " vs Keras Adam"
        shape = tf.constant([table_rows, dim], tf.int64)
        case.baseline = _step(lambda g, i: adam.apply([tf.IndexedSlices(g, i, shape)],
                                                      [keras_var]))
    return case


def fused_sgd(target="variable", table_rows=100, touched=64, dim=8, weight_decay=0.01,
              dtype=tf.float32, index_dtype=tf.int64, seed=0):
    """One SGD step (weight decay) of `touched` Zipf rows of a variable (or a table by
    address) against the scatter_add composite on a copy."""
    rng = np.random.default_rng(seed)
    ids = zipf_ids(rng, touched, table_rows)
    gradient = tf.constant(rng.standard_normal((touched, dim)), tf.float32)
    init = rng.standard_normal((table_rows, dim)).astype(np.float32)
    ref_var = tf.Variable(init)
    lr = 0.1
    label = f"{target} V={table_rows} N={touched} D={dim} wd={weight_decay}"

    def reference(g, i):
        return ref_sgd.sgd_update(ref_var, g, i, lr, weight_decay)

    nbytes = _touched_bytes(ids, dim, 1)
    if target == "table":
        table = recops_tf.DynamicEmbeddingTable(dim, initializer="zeros")
        table.assign(np.arange(table_rows), init)
        addresses = table.lookup_addresses(ids, training=False)
        return Case(label, _step(lambda a, i: recops_tf.sgd_update(table, gradient, a, lr,
                                                                   weight_decay)),
                    _step(lambda a, i: reference(gradient, i)), [addresses, tf.constant(ids)], [],
                    nbytes, 0, state=lambda: ([table.export()[1]], [ref_var]))
    fused_var = tf.Variable(init)
    return Case(label, _step(lambda g, i: recops_tf.sgd_update(fused_var, g, i, lr,
                                                               weight_decay)),
                _step(reference), [gradient, tf.constant(ids, index_dtype)], [], nbytes, 0,
                state=lambda: ([fused_var], [ref_var]))


def pcie_through(tables=2, table_rows=100, swapped=16, dim=8, dtype=tf.float32, seed=0):
    """One host swap of `swapped` rows out and `swapped` rows in (some rows both: all reads
    come first) on `tables` [table_rows, dim] variables, through one channel that carries the
    swap-out item back in (push, then pop), against the FIFOQueue composite on copies."""
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal((table_rows, dim)).astype(np.float32) for _ in range(tables)]
    fused_tables = [tf.Variable(x) for x in init]
    ref_tables = [tf.Variable(x) for x in init]
    swap_out = tf.constant(rng.choice(table_rows, swapped, replace=False), tf.int64)
    swap_in = tf.constant(rng.choice(table_rows, swapped, replace=False), tf.int64)
    channel = recops_tf.HostChannel(capacity=2)
    queue = tf.queue.FIFOQueue(2, [tf.float32])

    def auxiliary():
        # The channel ops the step does not use: create, push, size, pop, close.
        fresh = lib().recops_host_channel(capacity=2)
        lib().recops_host_channel_push(fresh, tf.constant([1.0, 2.0]))
        tf.debugging.assert_equal(lib().recops_host_channel_size(fresh), tf.constant(1, tf.int64))
        tf.debugging.assert_equal(lib().recops_host_channel_pop(fresh, dtype=tf.float32),
                                  tf.constant([1.0, 2.0]))
        lib().recops_host_channel_close(fresh)

    return Case(f"T={tables} V={table_rows} N={swapped} D={dim}",
                lambda i, o: recops_tf.rma_swap_multi_tables(i, o, fused_tables, channel,
                                                             channel),
                lambda i, o: ref_pcie.rma_swap_multi_tables(i, o, ref_tables, queue, queue),
                [swap_in, swap_out], [], 2 * 2 * swapped * tables * dim * 4, 0,
                state=lambda: (fused_tables, ref_tables), auxiliary=auxiliary)


BUILDERS = {
    "pcie_through": pcie_through,
    "concat_jagged_tensor": concat_jagged_tensor,
    "gather_for_rank1": gather_for_rank1,
    "reverse_sequence": reverse_sequence,
    "multislice_concat": multislice_concat,
    "hstu_dense": hstu_dense,
    "relative_attn_bias": relative_attn_bias,
    "hstu_dense_fuxi": hstu_dense_fuxi,
    "ln_mul": ln_mul,
    "norm_multiply_dropout": norm_multiply_dropout,
    "token_mixing": token_mixing,
    "in_linear_silu": in_linear_silu,
    "disentangle_attention": disentangle_attention,
    "embedding_by_address": embedding_by_address,
    "fused_lazy_adam": fused_lazy_adam,
    "fused_sgd": fused_sgd,
}


def build(stem, shape, **kwargs):
    """The case of `stem` for one benchmark shape of the ops table."""
    return BUILDERS[stem](**dict(shape), **kwargs)
