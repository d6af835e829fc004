"""Full-catalogue scoring by item blocks: the targets' ranks among every catalogue item
(validation and test) and the top k items, for a batch of user states, computed over blocks of
``block`` item columns, so that memory is O(rows x block), never the ``[rows, num_items]``
score matrix (256 users x 1,000,000 items: 1 GB of float32 scores and, for the counts, 2 GB
of int64), and evaluation costs GEMM time, not memory.

The scores are ``GenerativeRecommender.scores``': column j (item j + 1) of row r is

    matmul(states / temperature, matrix, transpose_b=True)[r, j]

then, in turn, each stage of sparse ``extras``, ``(rows, items, values)`` triples added as
``tf.tensor_scatter_nd_add`` adds them (the model's seen-item bias, then its transition prior:
`model_extras`; the (row, item) pairs of one stage must be distinct, as the model's are).
``exclude`` (rows, items) pairs, or a ragged ``[rows, (L)]`` of item ids, leave the ranking
(score -inf), the target excepted, as ``evaluation.ranks`` defines it.

Exactness. Each block's scores are one ``tf.matmul`` of the states by the block's rows of the
matrix, and the extras are added to the block exactly as to the whole matrix. On TF 2.21's CPU
GEMM (oneDNN; measured on a Xeon with AVX-512) a score does not depend on the number of columns
of the product nor on the column's place in it, except in a product of one column (a
matrix-vector path, another summation order): blocks are never narrower than
``min(block, num_items)`` (the last block takes the remainder, up to ``2 x block - 1``
columns), so the blocked scores equal the full product's bit for bit and the ranks equal the
full matrix's. The targets' own scores, which every block compares with, come first from one
``[rows, rows]`` product of the states with the targets' rows (chunks of ``ROW_CHUNK`` rows);
each block also reads the targets' scores that fall in it, and if any differs from the first
reading (another GEMM path), the counts are taken again with the blocks' values: the ranks are
always those of the blocks' scores, whatever the GEMM does.

Measured (2 cores of a Xeon with AVX-512, shared: load about 5; 2,048 users in batches of 256,
d = 50, the seen-item bias and the seen items excluded; process RSS peak over the inputs'):
at 100,000 items the whole-matrix ranker took 2.2-2.5 s and +588 MB, the blocks 0.6-1.0 s and
+62 MB (their products alone 0.25 s); at 1,000,000 items 35.9 s and +5.7 GB against 8.2 s
and +46 MB (products alone 2.7 s). The rest of the blocks' time is TF's elementwise count
(compare, cast, sum: about 1 ns a score), which a fused kernel would remove.
"""
import tensorflow as tf

from recops_tf.recommender.exporting import BLOCKED_TOP_K_FROM, TOP_K_BLOCK, top_k_by_blocks

# Scores per block step when `block` is not given: rows x block ~ 2^21 floats (8 MB; 8,192
# columns for 256 users), within [MIN_BLOCK, MAX_BLOCK] columns.
BLOCK_ELEMENTS = 1 << 21
MIN_BLOCK = 1024
MAX_BLOCK = 1 << 17
ROW_CHUNK = 1024  # rows of each [chunk, chunk] product of the targets' first scores


def default_block(rows):
    """Block width (columns) for `rows` states (an int or a scalar tensor)."""
    rows = tf.maximum(tf.cast(rows, tf.int64), 1)
    return tf.clip_by_value(BLOCK_ELEMENTS // rows, MIN_BLOCK, MAX_BLOCK)


def model_extras(model, seen, training=None):
    """The sparse stages `model`'s ``scores(states, training, seen)`` adds to the product
    (``model.score_extras``: the seen-item bias, then the transition prior). A list of
    ``(rows, items, values)``."""
    return model.score_extras(seen, training)


def _pairs(exclude):
    """(rows, items) int64 of `exclude`: a ragged ``[rows, (L)]`` or a (rows, items) pair."""
    if isinstance(exclude, tf.RaggedTensor):
        return exclude.value_rowids(), tf.cast(exclude.flat_values, tf.int64)
    rows, items = exclude
    return tf.cast(rows, tf.int64), tf.cast(items, tf.int64)


def _spans(size, width):
    """How many spans of `width` cover `size`: ``max(1, size // width)``, the last one taking
    the remainder (so none is narrower than ``min(width, size)``)."""
    return tf.maximum(size // width, 1)


def _by_item(items, num_blocks, block, *others):
    """`items` and `others` sorted by item (stably) and ``[num_blocks + 1]`` edges: block i's
    triples are ``[edges[i], edges[i + 1])`` (items ``i * block + 1 ..``; the last block to
    the end)."""
    order = tf.argsort(items, stable=True)
    items = tf.gather(items, order)
    firsts = tf.range(num_blocks, dtype=tf.int64) * block + 1
    edges = tf.concat([tf.searchsorted(items, firsts, side="left", out_type=tf.int64),
                       tf.size(items, out_type=tf.int64)[None]], 0)
    return (items, *[tf.gather(o, order) for o in others]), edges


def _target_scores(q, matrix, cols, stages):
    """The targets' scores: diagonals of ``[chunk, chunk]`` products of the states with the
    targets' rows of the matrix, then the stages' values at (row, target) added."""
    rows = tf.shape(q, out_type=tf.int64)[0]
    chunks = _spans(rows, ROW_CHUNK)
    picked = tf.gather(matrix, cols)

    def body(c, out):
        lo = c * ROW_CHUNK
        hi = tf.where(c == chunks - 1, rows, lo + ROW_CHUNK)
        part = tf.linalg.diag_part(tf.matmul(q[lo:hi], picked[lo:hi], transpose_b=True))
        return c + 1, out.write(tf.cast(c, tf.int32), part)

    _, parts = tf.while_loop(lambda c, _: c < chunks, body,
                             (tf.constant(0, tf.int64),
                              tf.TensorArray(q.dtype, size=tf.cast(chunks, tf.int32),
                                             element_shape=[None], infer_shape=False)))
    t = parts.concat()
    for r, items, values in stages:
        hit = tf.where(tf.equal(items - 1, tf.gather(cols, r)))[:, 0]
        t = tf.tensor_scatter_nd_add(t, tf.gather(r, hit)[:, None], tf.gather(values, hit))
    return t


def _nan_free(q, matrix, stages):
    """Whether no score can be NaN: finite states, items and extras, and no product of the
    GEMM can overflow (max |q| x max |m| x d far below the float maximum), so that neither
    the product's sums nor an extra added to them meet an inf of the other sign. The largest
    and smallest elements, NaN if any is (TF's max and min propagate NaN): no temporary."""
    def extent(x):
        top, bottom = tf.reduce_max(x), tf.reduce_min(x)
        return (tf.math.is_finite(top) & tf.math.is_finite(bottom),
                tf.cast(tf.maximum(tf.abs(top), tf.abs(bottom)), tf.float32))

    (q_ok, q_top), (m_ok, m_top) = extent(q), extent(matrix)
    ok = [q_ok, m_ok] + [tf.reduce_all(tf.math.is_finite(v)) for _, _, v in stages]
    d = tf.cast(tf.shape(q)[1], tf.float32)
    return tf.reduce_all(tf.stack(ok)) & (q_top * m_top * d < 1e36)


def _prepare(states, matrix, targets, temperature, extras, exclude, block):
    q = states / temperature
    matrix = tf.convert_to_tensor(matrix, q.dtype)
    n = tf.shape(matrix, out_type=tf.int64)[0]
    block = default_block(tf.shape(q)[0]) if block is None else tf.cast(block, tf.int64)
    block = tf.maximum(block, 1)
    num_blocks = _spans(n, block)
    stages = [(tf.cast(r, tf.int64), tf.cast(i, tf.int64), tf.cast(v, q.dtype))
              for r, i, v in (extras or ())]
    gone = None
    if exclude is not None:
        r, i = _pairs(exclude)
        if targets is not None:  # the target is always ranked
            keep = tf.where(tf.not_equal(i, tf.gather(targets, r)))[:, 0]
            r, i = tf.gather(r, keep), tf.gather(i, keep)
        gone = _by_item(i, num_blocks, block, r)
    sorted_stages = [_by_item(i, num_blocks, block, r, v) for r, i, v in stages]
    return q, matrix, n, block, num_blocks, stages, sorted_stages, gone


def _block_scores(q, matrix, n, block, num_blocks, sorted_stages, i, sign=None):
    """Block i's ``[rows, w]`` scores, the extras added, and its columns ``[lo, hi)``. With
    ``sign`` (``[rows]`` of +-1), each row times its sign, exactly (IEEE arithmetic is
    symmetric: the states' row negated negates the product, then the negated extras)."""
    lo = i * block
    hi = tf.where(i == num_blocks - 1, n, lo + block)
    s = tf.matmul(q if sign is None else q * sign[:, None], matrix[lo:hi], transpose_b=True)
    for (items, rows, values), edges in sorted_stages:
        a, z = edges[i], edges[i + 1]
        values = values[a:z]
        if sign is not None:
            values *= tf.gather(sign, rows[a:z])
        s = tf.tensor_scatter_nd_add(s, tf.stack([rows[a:z], items[a:z] - 1 - lo], 1), values)
    return s, lo, hi


def _exclude(s, gone, i, lo, sign=None):
    """Block i's scores `s`, the excluded items -inf (times the rows' `sign`)."""
    if gone is None:
        return s
    (items, rows), edges = gone
    a, z = edges[i], edges[i + 1]
    values = tf.fill(tf.reshape(z - a, [1]), tf.constant(float("-inf"), s.dtype))
    if sign is not None:
        values *= tf.gather(sign, rows[a:z])
    return tf.tensor_scatter_nd_update(s, tf.stack([rows[a:z], items[a:z] - 1 - lo], 1), values)


def blocked_ranks(states, matrix, targets, *, temperature=1.0, extras=None, exclude=None,
                  block=None):
    """``[B]`` int64 0-based rank of each target among every catalogue item, as
    ``evaluation.ranks`` defines it on the scores of the module docstring (ties by item id,
    the lower first; `exclude`d items leave the ranking, the target stays), by blocks of
    `block` columns (default: `default_block`): memory O(B x block).

    Args:
      states: ``[B, d]`` float.
      matrix: ``[N, d]`` item rows (row j: item j + 1).
      targets: ``[B]`` int64 item ids in 1..N.
      temperature: the states are divided by it (as the model does).
      extras: None or a sequence of ``(rows, items, values)`` stages (see the module).
      exclude: None, a ragged ``[B, (L)]`` of item ids or ``(rows, items)``.
      block: columns per block (an int or scalar tensor).

    A block's items all rank ahead of a row's target when higher if the target comes before
    the block, when higher or tied if it comes after: one comparison of the block's scores
    with the target's serves both, the rows whose target comes after the block being negated
    (their count of lower items taken from the block's width). The few rows whose target lies
    in the block add their tied items of lower id. Scores that may be NaN (non-finite inputs,
    overflow) take a slower path of two comparisons (NaN ranks nothing ahead).
    """
    targets = tf.cast(targets, tf.int64)
    q, matrix, n, block, num_blocks, stages, sorted_stages, gone = _prepare(
        states, matrix, targets, temperature, extras, exclude, block)
    with tf.control_dependencies([tf.debugging.assert_greater_equal(
            targets, tf.constant(1, tf.int64), message="targets: item ids start at 1"),
            tf.debugging.assert_less_equal(targets, n, message="targets: an item id is past "
                                                               "the catalogue")]):
        cols = tf.identity(targets - 1)
    rows = tf.shape(q, out_type=tf.int64)[0]
    one = tf.ones([], q.dtype)

    def found_in(s, lo, hi, found):
        inside = tf.where((cols >= lo) & (cols < hi))[:, 0]
        at = tf.stack([inside, tf.gather(cols, inside) - lo], 1)
        return inside, tf.tensor_scatter_nd_update(found, inside[:, None], tf.gather_nd(s, at))

    def fast(t):
        def body(i, counts, found):
            hi = tf.where(i == num_blocks - 1, n, (i + 1) * block)
            after = cols >= hi  # the block's items all have lower ids: ties rank ahead
            sign = tf.where(after, -one, one)
            s, lo, hi = _block_scores(q, matrix, n, block, num_blocks, sorted_stages, i, sign)
            inside, found = found_in(s, lo, hi, found)  # their sign is +1
            s = _exclude(s, gone, i, lo, sign)
            # sign +1: s > t; sign -1: -s > -t, s < t, the block's width less s >= t.
            above = tf.cast(tf.reduce_sum(tf.cast(s > (sign * t)[:, None], tf.int32), 1),
                            tf.int64)
            counts += tf.where(after, hi - lo - above, above)
            # The rows whose target is in the block: the tied items of lower id.
            mine, col = tf.gather(s, inside), tf.gather(cols, inside)
            tied = (tf.equal(mine, tf.gather(t, inside)[:, None]) &
                    (tf.range(lo, hi)[None, :] < col[:, None]))
            counts = tf.tensor_scatter_nd_add(
                counts, inside[:, None],
                tf.cast(tf.reduce_sum(tf.cast(tied, tf.int32), 1), tf.int64))
            return i + 1, counts, found
        return body

    def plain(t):
        def body(i, counts, found):
            s, lo, hi = _block_scores(q, matrix, n, block, num_blocks, sorted_stages, i)
            _, found = found_in(s, lo, hi, found)
            s = _exclude(s, gone, i, lo)
            # Items before the target (lower id) rank ahead when tied, the others when higher.
            ahead = tf.where(tf.range(lo, hi)[None, :] < cols[:, None], s >= t[:, None],
                             s > t[:, None])
            counts += tf.cast(tf.reduce_sum(tf.cast(ahead, tf.int32), 1), tf.int64)
            return i + 1, counts, found
        return body

    def count(t, body):
        _, counts, found = tf.while_loop(
            lambda i, *_: i < num_blocks, body(t),
            (tf.constant(0, tf.int64), tf.zeros([rows], tf.int64), t),
            parallel_iterations=1)
        return counts, found

    safe = _nan_free(q, matrix, stages)

    def run(t):
        return tf.cond(safe, lambda: count(t, fast), lambda: count(t, plain))

    first = _target_scores(q, matrix, cols, stages)
    counts, found = run(first)
    same = tf.reduce_all(tf.equal(tf.bitcast(found, tf.int32), tf.bitcast(first, tf.int32)))
    return tf.cond(same, lambda: counts, lambda: run(found)[0])


def model_ranks(model, states, targets, seen=None, exclude=None, training=None, matrix=None,
                block=None):
    """`blocked_ranks` of `model`'s scores: ``model.scores(states, training, seen, matrix)``
    by blocks (the same temperature, seen-item bias and transition prior)."""
    if matrix is None:
        matrix = model.item_matrix(training)
    return blocked_ranks(states, matrix, targets, temperature=model.temperature,
                         extras=model_extras(model, seen, training), exclude=exclude,
                         block=block)


# Blocks of the top-k: wide (per-block overhead: a top-k and a merge), rows x block floats a
# step. The blocks' own top-k by TOP_K_BLOCK-item maxima where exporting.top_k_by_blocks pays.
# The export's serving functions keep their whole-row scores: a call's rows are bounded by the
# server's batch (32 rows x 1,000,000 items: +144 MB) and the blocks were not faster there (on
# the single-threaded executor, k = 100, 1,000,000 items, p10 of 40 calls on the shared
# machine: 1 row 26 ms whole vs 48 ms by blocks, 8 rows 104 vs 87, 32 rows 101 vs 141 and
# +144 vs +52 MB; 100,000 items: 1.5 vs 1.7, 5.4 vs 4.3, 13.4 vs 14.0 ms). For many rows at
# once (offline top-k of every user), the blocks bound the memory.
TOP_K_COLUMNS = 1 << 16


def blocked_top_k(states, matrix, k, *, temperature=1.0, extras=None, exclude=None,
                  block=TOP_K_COLUMNS, num_items=None):
    """``tf.math.top_k`` (values, int64 item ids) of the scores of the module docstring,
    ``[B, min(k, num_items)]`` best first, ties by lower item id, computed by blocks of `block`
    item columns with a running top-k (memory O(B x (k + block)), never ``[B, N]``). Excluded
    items score -inf (still rankable after every other item, as in ``tf.math.top_k``).

    ``matrix``'s rows and `block` must be static (the loop over blocks is unrolled: no
    branch or loop in the graph, so a serving function keeps TF's single-threaded executor);
    rows past `num_items` (default: all) are padding, never returned. `k`: int or scalar
    int32 tensor.
    """
    q = states / temperature
    matrix = tf.convert_to_tensor(matrix, q.dtype)
    n = matrix.shape[0]
    if n is None or not isinstance(block, int):
        raise ValueError("blocked_top_k needs a matrix of static rows and an int block")
    num = n if num_items is None else int(num_items)
    k = tf.minimum(tf.cast(k, tf.int32), num)
    stages = [(tf.cast(r, tf.int64), tf.cast(i, tf.int64), tf.cast(v, q.dtype))
              for r, i, v in (extras or ())]
    gone = None if exclude is None else _pairs(exclude)
    rows = tf.shape(q, out_type=tf.int64)[0]
    count = max(1, n // max(block, 1))
    values = indices = None
    for b in range(count):
        lo = b * block
        hi = n if b == count - 1 else lo + block
        deps = [] if values is None else [values]  # one block's scores at a time
        with tf.control_dependencies(deps):
            s = tf.matmul(q, matrix[lo:hi], transpose_b=True)
        for r, items, v in stages:
            keep = tf.where((items > lo) & (items <= hi))[:, 0]
            s = tf.tensor_scatter_nd_add(
                s, tf.stack([tf.gather(r, keep), tf.gather(items, keep) - 1 - lo], 1),
                tf.gather(v, keep))
        at = []
        if gone is not None:
            r, items = gone
            keep = tf.where((items > lo) & (items <= hi))[:, 0]
            at.append(tf.stack([tf.gather(r, keep), tf.gather(items, keep) - 1 - lo], 1))
        if hi > num:  # padding rows of the matrix
            pad = tf.range(max(num, lo) - lo, hi - lo, dtype=tf.int64)
            at.append(tf.reshape(tf.stack(tf.meshgrid(tf.range(rows), pad, indexing="ij"),
                                          -1), [-1, 2]))
        if at:
            at = tf.concat(at, 0)
            s = tf.tensor_scatter_nd_update(s, at, tf.fill(tf.shape(at)[:1],
                                                           tf.constant(-float("inf"), q.dtype)))
        width = hi - lo
        kb = tf.minimum(k, width)
        if width % TOP_K_BLOCK == 0 and width >= BLOCKED_TOP_K_FROM:
            v, i = top_k_by_blocks(s, kb)
        else:
            v, i = tf.math.top_k(s, kb)
        i = tf.cast(i, tf.int64) + lo
        if values is not None:  # earlier items first: ties keep the lower ids
            v, i = tf.concat([values, v], 1), tf.concat([indices, i], 1)
            best = tf.math.top_k(v, tf.minimum(k, tf.shape(v)[1]))
            v, i = best.values, tf.gather(i, best.indices, batch_dims=1)
        values, indices = v, i
        if hi >= num:
            break
    return values, indices + 1
