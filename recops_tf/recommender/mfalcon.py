"""M-FALCON (Zhai et al., "Actions Speak Louder than Words", §3.4): one user's m ranking
candidates scored against one history whose keys and values are computed once.

An HSTU ranker reads ``[history (L tokens)] + [m candidates]`` with ``num_targets=[m]``. With
``HSTUBlock(target_group_size=1, relative_bias=None)`` (positions and time go into the input
rows) the causal mask's target rule makes each candidate see the whole history and itself,
never another candidate, and no history token sees a candidate. Hence a candidate's final
output depends only on the history and on itself, and

* ``history_cache(blocks, history)`` runs the history once through the blocks and keeps, per
  block, its keys and values in a paged KV cache (``[P, 2, page_size, N, D]``);
* ``score_targets(blocks, cache, candidates)`` runs only the candidates: at each block their
  queries attend the cached history pages plus their own fresh key/value
  (``hstu_attention_paged``, ``target_group_size=1``), micro-batches of ``micro_batch``
  candidates being the sequences of ONE op call per block that share the history's page ids;
* ``rerun_targets(blocks, history, candidates)`` is the naive baseline: for each micro-batch,
  the whole ``[history + micro-batch]`` sequence through the blocks' ``call``.

All three give ``call([history + all m candidates], num_targets=[m])``'s candidate rows.

Cost per block (N heads of D, d_model rows; attention counted in visible score entries):

* M-FALCON: ``O(L^2 N D)`` once for the history (``L^2 / 2`` scores, ``L`` projected rows) +
  ``O(m L N D)`` for the candidates (``m (L + 1)`` scores, ``m`` projected rows); the paged
  op also gathers the history's ``L`` key/value rows once per micro-batch (``O(m/b_m L N D)``
  copies);
* rerun: ``O(m/b_m (L + b_m)^2 N D)``: every micro-batch recomputes the history
  (``(L + b_m)^2 / 2`` scores, ``L + b_m`` projected rows), i.e. about ``L / (2 b_m)`` times the
  candidates' own attention work (L = 1,000, b_m = 64: ~8x) and ``L / b_m`` times their
  projections.

Inference only: no dropout, no gradient (the paged op has none). Example, a SavedModel
signature with a dynamic history length and a dynamic number of candidates::

    @tf.function(input_signature=[tf.TensorSpec([None, d_model], tf.float32)] * 2)
    def rank(history, candidates):
        return score_targets(blocks, history_cache(blocks, history), candidates)
"""
import collections

import tensorflow as tf

from recops_tf.layers.hstu_block import HSTUBlock
from recops_tf.ops._common import positive_int
from recops_tf.ops.hstu_dense import hstu_attention, hstu_attention_paged

__all__ = ["HistoryCache", "history_cache", "score_targets", "rerun_targets"]


class HistoryCache(collections.namedtuple(
        "HistoryCache", ["kv_caches", "page_ids", "last_page_len", "length"])):
    """One history's keys and values at every block, paged (what ``history_cache`` returns;
    a nest of tensors: it can be a ``tf.function`` argument).

    Fields:
      kv_caches: per block, ``[P, 2, page_size, num_heads, head_dim]`` in the blocks' compute
        dtype (index 0: keys, 1: values of the history tokens at that block's attention, as
        a full forward of the history computes them); rows past ``length`` are zeros.
      page_ids: ``[P]`` int64, ``0 .. P-1``: the history's pages in order.
      last_page_len: int64 scalar in ``[1, page_size]``: rows used in the last page.
      length: int64 scalar ``L = (P - 1) * page_size + last_page_len``.
    """


def _check_blocks(blocks, fn):
    blocks = list(blocks)
    if not blocks:
        raise ValueError(f"{fn}: needs at least one HSTUBlock")
    for i, block in enumerate(blocks):
        if not isinstance(block, HSTUBlock):
            raise ValueError(f"{fn}: blocks[{i}] is a {type(block).__name__}, not an HSTUBlock")
        if (block.mask_type != "causal" or block.gr_mask is not None
                or block.relative_bias is not None or block.target_group_size != 1):
            raise ValueError(
                f"{fn}: blocks[{i}] must use the Rec SDK causal mask with target_group_size=1 "
                "and relative_bias=None (each target sees the history and itself only), got "
                f"mask_type={block.mask_type!r}, target_group_size={block.target_group_size}, "
                f"gr_mask={block.gr_mask}, relative_bias={block.relative_bias}")
        if block.value_dim != block.head_dim:
            raise ValueError(f"{fn}: blocks[{i}] has value_dim {block.value_dim} != head_dim "
                             f"{block.head_dim} (the paged KV cache holds both in one page)")
        dims = (block.num_heads, block.head_dim)
        if dims != (blocks[0].num_heads, blocks[0].head_dim):
            raise ValueError(f"{fn}: every block must have the same (num_heads, head_dim), "
                             f"got {(blocks[0].num_heads, blocks[0].head_dim)} and {dims}")
    return blocks


def _rows(blocks, x, what, fn):
    """``x`` as ``[n, d_model]`` rows, the blocks built; the width is checked statically (a
    ValueError) or, unknown when traced, when run (an InvalidArgumentError)."""
    x = tf.convert_to_tensor(x)
    if x.shape.rank != 2:
        raise ValueError(f"{fn}: {what} must be [n, d_model] rows, got shape {x.shape}")
    built = [b for b in blocks if b.built]
    d_model = built[0].uvqk_kernel.shape[0] if built else x.shape[1]
    if d_model is None:
        raise ValueError(f"{fn}: the blocks are not built and {what} has an unknown width")
    for block in blocks:
        if not block.built:
            block.build((None, d_model))
        if block.uvqk_kernel.shape[0] != d_model:
            raise ValueError(f"{fn}: the blocks have different d_model "
                             f"({d_model} and {block.uvqk_kernel.shape[0]})")
    if x.shape[1] is not None:
        if x.shape[1] != d_model:
            raise ValueError(f"{fn}: {what} must be [n, {d_model}] (d_model of the blocks), "
                             f"got shape {x.shape}")
        return x
    check = tf.debugging.assert_equal(tf.shape(x)[1], d_model, message=(
        f"{fn}: {what} must be [n, {d_model}] rows (d_model of the blocks)"))
    with tf.control_dependencies([check]):
        return tf.ensure_shape(tf.identity(x), [None, d_model])


def _nonempty(x, what, fn):
    if x.shape[0] == 0:
        raise ValueError(f"{fn}: {what} is empty (a history needs at least one token)")
    check = tf.debugging.assert_positive(tf.shape(x)[0], message=(
        f"{fn}: {what} is empty (a history needs at least one token)"))
    with tf.control_dependencies([check]):
        return tf.identity(x)


def _heads(block, x):
    return tf.reshape(x, [-1, block.num_heads, block.head_dim])


def _silu_scale(block):
    """The block's SiLU scale, explicit: the paged op's default would be 1 / its own
    (micro-batch) max_seq_len, the block's is 1 / the block's max_seq_len."""
    return block.silu_scale if block.silu_scale else 1.0 / block.max_seq_len


def history_cache(blocks, history_rows, page_size=32):
    """Runs one user's history through ``blocks`` and pages each block's keys and values.

    Args:
      blocks: the ranker's ``HSTUBlock`` s in order (causal, ``target_group_size=1``, no
        relative bias, ``value_dim == head_dim``, equal heads and dims; built on first use).
      history_rows: ``[L, d_model]`` the history tokens' input rows (L >= 1, at most the
        blocks' ``max_seq_len``).
      page_size: rows per page (the last page holds ``L - (P - 1) * page_size``).

    Returns:
      A ``HistoryCache``. Cost: the history's forward, ``O(L^2)`` attention per block.

    Raises:
      ValueError: blocks not as above, rows not ``[n, d_model]`` (when traced: an
        InvalidArgumentError when run), an empty history (likewise).
      InvalidArgumentError: a history longer than a block's ``max_seq_len``.
    """
    fn = "history_cache"
    blocks = _check_blocks(blocks, fn)
    page_size = positive_int(page_size, "page_size", fn)
    rows = _nonempty(_rows(blocks, history_rows, "history_rows", fn), "history_rows", fn)
    length = tf.shape(rows, out_type=tf.int64)[0]
    pages = (length + page_size - 1) // page_size
    pad = pages * page_size - length
    offsets = tf.stack([tf.zeros([], tf.int64), length])
    caches = []
    for block in blocks:
        u, v, q, k = block.project(rows)
        rows = tf.cast(rows, block.compute_dtype)
        attn = hstu_attention(_heads(block, q), _heads(block, k), _heads(block, v),
                              seq_offsets=offsets, max_seq_len=block.max_seq_len,
                              alpha=block.alpha, silu_scale=block.silu_scale,
                              mask_type="causal", kernel=block._kernel)
        kv = tf.pad(tf.stack([k, v]), [[0, 0], [0, pad], [0, 0]])
        kv = tf.reshape(kv, [2, -1, page_size, block.num_heads, block.head_dim])
        caches.append(tf.transpose(kv, [1, 0, 2, 3, 4]))
        rows = block.finish(rows, attn, u)
    return HistoryCache(tuple(caches), tf.range(pages), length - (pages - 1) * page_size,
                        length)


def _score(blocks, cache, rows, micro_batch):
    """``rows`` through the blocks, one paged call per block: micro-batches of
    ``micro_batch`` rows are its sequences, all with the history's pages."""
    m = tf.shape(rows, out_type=tf.int64)[0]
    sequences = (m + micro_batch - 1) // micro_batch
    seq_offsets = tf.minimum(tf.range(sequences + 1) * micro_batch, m)
    pages = tf.size(cache.page_ids, out_type=tf.int64)
    paging = dict(seq_offsets=seq_offsets, page_offsets=tf.range(sequences + 1) * pages,
                  page_ids=tf.tile(tf.cast(cache.page_ids, tf.int64), [sequences]),
                  last_page_len=tf.fill([sequences], tf.cast(cache.last_page_len, tf.int64)),
                  num_target=seq_offsets[1:] - seq_offsets[:-1])
    for block, kv in zip(blocks, cache.kv_caches):
        u, v, q, k = block.project(rows)
        rows = tf.cast(rows, block.compute_dtype)
        attn = hstu_attention_paged(
            _heads(block, q), _heads(block, k), _heads(block, v), tf.cast(kv, q.dtype),
            # The op wants num_target < max_seq_len (the causal mask's count rule).
            max_seq_len=micro_batch + 1, max_seq_len_k=block.max_seq_len + micro_batch,
            alpha=block.alpha, silu_scale=_silu_scale(block), target_group_size=1, **paging)
        rows = block.finish(rows, attn, u)
    return rows


def score_targets(blocks, cache, target_rows, micro_batch=64, micro_batches_per_call=None):
    """The final-block outputs of m target (candidate) tokens against a cached history.

    Equals the target rows of ``call`` on ``[history + targets]`` with ``num_targets=[m]``
    (every block in turn), and ``rerun_targets``, at ``O(m L)`` attention cost per block
    instead of ``O(m/b_m (L + b_m)^2)`` (module docstring): the history is not recomputed.
    Only ``L <= max_seq_len`` is needed (not ``L + m``: that call would be refused).

    Args:
      blocks: the blocks ``cache`` was built with.
      cache: a ``HistoryCache`` from ``history_cache``.
      target_rows: ``[m, d_model]`` input rows of the targets (m >= 0, dynamic when traced:
        no retrace per m under an ``input_signature`` ``[None, d_model]``).
      micro_batch: b_m, targets per sequence of the paged op (a sequence of b_m queries
        attending the cached pages + its own b_m targets; the last one may be shorter).
      micro_batches_per_call: None (default): all micro-batches are the sequences of one
        paged call per block (fastest). An int k: a ``tf.while_loop`` over chunks of k
        micro-batches, each chunk through all blocks (bounds the working set to
        ``k * b_m`` rows).

    Returns:
      ``[m, d_model]`` in the blocks' compute dtype.

    Raises:
      ValueError: blocks not as for ``history_cache`` or not those of the cache, rows not
        ``[n, d_model]`` (when traced: an InvalidArgumentError when run), a non-positive
        micro_batch.
    """
    fn = "score_targets"
    blocks = _check_blocks(blocks, fn)
    micro_batch = positive_int(micro_batch, "micro_batch", fn)
    if len(cache.kv_caches) != len(blocks):
        raise ValueError(f"{fn}: the cache has {len(cache.kv_caches)} blocks' keys and values, "
                         f"got {len(blocks)} blocks")
    rows = _rows(blocks, target_rows, "target_rows", fn)
    if micro_batches_per_call is None:
        return _score(blocks, cache, rows, micro_batch)
    chunk = micro_batch * positive_int(micro_batches_per_call, "micro_batches_per_call", fn)
    return _loop(rows, chunk, lambda part: _score(blocks, cache, part, micro_batch),
                 blocks[-1].compute_dtype)


def _loop(rows, chunk, step, dtype):
    """``concat([step(rows[i:i + chunk]) for i in range(0, m, chunk)])`` as a
    ``tf.while_loop`` (dynamic m; the last chunk may be shorter; m = 0 gives no rows)."""
    m = tf.shape(rows, out_type=tf.int64)[0]
    count = (m + chunk - 1) // chunk
    width = rows.shape[1]

    def body(i, out):
        start = i * chunk
        return i + 1, out.write(tf.cast(i, tf.int32) + 1,
                                step(rows[start:tf.minimum(start + chunk, m)]))

    # Element 0 is empty: concat needs one element (eager TensorArrays refuse zero).
    out = tf.TensorArray(dtype, size=tf.cast(count, tf.int32) + 1, infer_shape=False,
                         element_shape=tf.TensorShape([None, width]))
    out = out.write(0, tf.zeros([0, width], dtype))
    _, out = tf.while_loop(lambda i, _: i < count, body, [tf.zeros([], tf.int64), out])
    return tf.ensure_shape(out.concat(), [None, width])


def rerun_targets(blocks, history_rows, target_rows, micro_batch=64):
    """The naive M-FALCON baseline: for each micro-batch of b_m targets, the whole
    ``[history + micro-batch]`` sequence through every block's ``call`` with
    ``num_targets=[b_m]``; the targets' final rows concatenated (``[m, d_model]``, the
    blocks' compute dtype; a ``tf.while_loop``, traceable with a dynamic m).

    Cost per block: ``O(m/b_m (L + b_m)^2)`` attention and ``m/b_m (L + b_m)`` projected rows
    (the history recomputed per micro-batch). Needs ``L + b_m <= max_seq_len``; errors as
    ``history_cache`` / ``score_targets``.
    """
    fn = "rerun_targets"
    blocks = _check_blocks(blocks, fn)
    micro_batch = positive_int(micro_batch, "micro_batch", fn)
    history = _nonempty(_rows(blocks, history_rows, "history_rows", fn), "history_rows", fn)
    rows = _rows(blocks, target_rows, "target_rows", fn)
    length = tf.shape(history, out_type=tf.int64)[0]

    def step(part):
        x = tf.concat([history, tf.cast(part, history.dtype)], 0)
        seq = tf.RaggedTensor.from_row_splits(
            x, tf.stack([tf.zeros([], tf.int64), tf.shape(x, out_type=tf.int64)[0]]),
            validate=False)
        count = tf.shape(part, out_type=tf.int64)[:1]
        for block in blocks:
            seq = block(seq, num_targets=count)
        return seq.flat_values[length:]

    return _loop(rows, micro_batch, step, blocks[-1].compute_dtype)
