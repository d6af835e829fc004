"""Export of a trained recommender for serving, and ``recommend`` from an export.

``export`` writes ``out_dir/saved_model``, a SavedModel that needs only ``import recops_tf``
(for its ops) to load, with:

* the signature ``serving_default`` (TF Serving's, batchable): ``items`` and ``timestamps``
  ``[B, S]`` int64, each row a user's history, oldest first, padded at the end with 0 (item
  id 0 is never an item); outputs ``items`` ``[B, K]`` int64 and ``scores`` ``[B, K]`` float32,
  the top K = ``min(serve_k, num_items)`` items of each row, best first;
* the signature ``recommend``: one user, ``items`` / ``timestamps`` ``[L]``, ``k`` (scalar
  int32): ``items`` / ``scores`` ``[k]``;
* the functions (not signatures) of the user-state cache that ``recops-tf serve`` keeps
  (HSTU only): ``extend(items, timestamps, past, past_timestamps)`` (``GenerativeRecommender
  .extend``: the new events' cache rows and the user state), ``extend_in_place`` (the same
  with the new events always attending the cache where it is: no branch, the server's call
  for a few new events of a cached user), ``top_k(state, seen, k,
  exclude_seen)``, ``score_items(state, seen, candidates)`` and ``user_state(items,
  timestamps)`` (the state of a whole history: the full recompute, every encoder);

and beside it ``model.keras``, ``items.txt`` (the data's name of item id i on line i) and
``info.json`` (catalogue, history length, encoder, cache width, metrics).

Histories longer than the model's ``max_seq_len`` are read from their last ``max_seq_len``
events, as in training. Item ids outside ``1..num_items``, a history without items, padding
before an item, or timestamps of another shape are refused (``InvalidArgumentError``).
"""
import json
import os
import time

import tensorflow as tf

from recops_tf.recommender.model import last_states
from recops_tf.saving import tracked_root

SERVE_K = 100  # outputs of serving_default per row (or the catalogue, if smaller)


def _check(condition, message):
    """An ``Assert`` op that fails with `message` unless every element of `condition` holds.
    One op, where ``tf.debugging.assert_*`` add a ``tf.cond`` guard around theirs: a function
    without branches is cheaper to call, and the server can run it on TF's single-threaded
    executor (which refuses a lowered branch). The message reads as theirs: ``assertion
    failed: [message]``."""
    return tf.raw_ops.Assert(condition=tf.reduce_all(condition), data=[message])


def _one_row(values):
    """``[L]`` values as a ragged ``[1, (L)]`` (unchecked: one row of all of them is valid)."""
    return tf.RaggedTensor.from_row_lengths(values, tf.size(values, out_type=tf.int64)[None],
                                            validate=False)


def _check_ids(model, items, what="items"):
    return [_check(items > 0, f"{what}: item ids start at 1"),
            _check(items <= model.num_items,
                   f"{what}: an item id is past the catalogue (1..{model.num_items})")]


# Top-k over a large catalogue by blocks: the row's maximum of each block of TOP_K_BLOCK
# items, the k best blocks (taken in the catalogue's order), then tf.math.top_k over their
# k x TOP_K_BLOCK items. Exact, ties included (lower item first, as tf.math.top_k): the
# k-th best block maximum T is at most the k-th best score, so every item of the answer lies
# in a block whose maximum is at least T, and the best blocks tied at T are the first ones.
# It reads the scores once (the maxima) where tf.math.top_k's selection costs more per score:
# the top-k alone on 2 Xeon cores, k = 100, random scores, took 0.25 -> 0.22 ms a row at 32,768
# items, 0.58 -> 0.32 at 100,000 and 7.6 -> 0.73 at 1,000,000; the two cost the same at 16,384
# (docs/serving.md has the serving figures). A catalogue of BLOCKED_TOP_K_FROM items or more
# takes it; the export's matrix is then padded with zero rows to whole blocks (their scores
# set to -inf), so the blocks are a reshape of the scores, not a copy.
TOP_K_BLOCK = 64
BLOCKED_TOP_K_FROM = 32_768


def _matrix_rows(num_items):
    """Rows of the export's item matrix: the catalogue, padded to whole blocks if blocked."""
    if num_items < BLOCKED_TOP_K_FROM:
        return num_items
    return -(-num_items // TOP_K_BLOCK) * TOP_K_BLOCK


def top_k_by_blocks(scores, k, block=TOP_K_BLOCK):
    """``tf.math.top_k(scores, k)`` (values, int32 indices) of ``[N, M]`` scores whose M is a
    multiple of `block`, equal to it ties included, reading the scores once for the blocks'
    maxima (see ``TOP_K_BLOCK``)."""
    rows = tf.shape(scores)[0]
    blocks = tf.reshape(scores, [rows, -1, block])
    maxima = tf.reduce_max(blocks, -1)
    chosen = tf.sort(tf.math.top_k(maxima, tf.minimum(k, tf.shape(maxima)[1])).indices, -1)
    best = tf.math.top_k(tf.reshape(tf.gather(blocks, chosen, batch_dims=1), [rows, -1]), k)
    at = tf.gather(chosen, best.indices // block, batch_dims=1) * block + best.indices % block
    return best.values, at


def _top_k(model, states, seen, k, exclude_seen, matrix):
    """Top-k ``(items, scores)`` of ``[N, d]`` states, ``seen`` the ragged items they read,
    scored against ``matrix`` (the export's copy of the item matrix, `_matrix_rows` rows)."""
    num, rows = model.num_items, matrix.shape[0]
    scores = model.scores(states, seen=seen, matrix=matrix)
    # -inf, set sparsely: the padding rows past the catalogue and, if asked, the items seen.
    at, values = [], []
    if rows > num:
        n = tf.shape(scores, out_type=tf.int64)[0]
        pad = tf.range(num, rows, dtype=tf.int64)
        at.append(tf.reshape(tf.stack(tf.meshgrid(tf.range(n), pad, indexing="ij"), -1),
                             [-1, 2]))
        values.append(tf.fill([n * (rows - num)], -float("inf")))
    if exclude_seen is not None:
        idx = tf.stack([seen.value_rowids(), seen.flat_values - 1], 1)
        at.append(idx)
        values.append(tf.where(exclude_seen, -float("inf"), tf.gather_nd(scores, idx)))
    if at:
        scores = tf.tensor_scatter_nd_update(scores, tf.concat(at, 0),
                                             tf.cast(tf.concat(values, 0), scores.dtype))
    k = tf.minimum(k, num)
    if rows % TOP_K_BLOCK == 0 and rows >= BLOCKED_TOP_K_FROM:
        values, indices = top_k_by_blocks(scores, k)
    else:
        values, indices = tf.math.top_k(scores, k)
    return tf.cast(indices, tf.int64) + 1, values


def _functions(model, serve_k, matrix):
    """The SavedModel's signatures and functions, as tf.functions on `model`; ``matrix`` (a
    variable holding ``model.item_matrix()``) is what they score the catalogue against,
    rather than looking every item up in the table again at each call."""
    length = model.max_seq_len
    k_out = min(serve_k, model.num_items)
    vec = lambda name, dtype=tf.int64: tf.TensorSpec([None], dtype, name=name)  # noqa: E731

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64, name="items"),
                                  tf.TensorSpec([None, None], tf.int64, name="timestamps")])
    def serving_default(items, timestamps):
        present = items > 0
        lengths = tf.reduce_sum(tf.cast(present, tf.int64), 1)
        checks = _check_ids(model, tf.boolean_mask(items, present)) + [
            _check(items >= 0, "items: ids are >= 0 (0: padding)"),
            _check(tf.equal(tf.shape(timestamps), tf.shape(items)),
                   "timestamps must have the shape of items"),
            _check(lengths > 0, "every row needs at least one item"),
            _check(tf.equal(present, tf.sequence_mask(lengths, tf.shape(items)[1])),
                   "items: the padding (0) must follow a row's items")]
        with tf.control_dependencies(checks):
            seqs = tf.RaggedTensor.from_tensor(items, lengths=lengths)[:, -length:]
            ts = tf.RaggedTensor.from_tensor(timestamps, lengths=lengths)[:, -length:]
        states = last_states(model, seqs, ts)
        top, scores = _top_k(model, states, seqs, k_out, None, matrix)
        return {"items": top, "scores": scores}

    @tf.function(input_signature=[vec("items"), vec("timestamps"),
                                  tf.TensorSpec([], tf.int32, name="k")])
    def recommend(items, timestamps, k):
        checks = _check_ids(model, items) + [
            _check(tf.size(items) > 0, "the history has no items"),
            _check(tf.equal(tf.size(timestamps), tf.size(items)),
                   "history and timestamps differ in length"),
            _check(k > 0, "k must be positive")]
        with tf.control_dependencies(checks):
            items, timestamps = items[-length:], timestamps[-length:]
        seqs = _one_row(items)
        states = last_states(model, seqs, _one_row(timestamps))
        top, scores = _top_k(model, states, seqs, k, None, matrix)
        return {"items": top[0], "scores": scores[0]}

    functions = {"serving_default": serving_default, "recommend": recommend}
    seen_spec = vec("seen")
    state_spec = tf.TensorSpec([model.d_model], tf.float32, name="state")

    @tf.function(input_signature=[state_spec, seen_spec, tf.TensorSpec([], tf.int32, name="k"),
                                  tf.TensorSpec([], tf.bool, name="exclude_seen")])
    def top_k(state, seen, k, exclude_seen):
        with tf.control_dependencies(_check_ids(model, seen, "seen")):
            seen = _one_row(seen)
        top, scores = _top_k(model, state[None], seen, k, exclude_seen, matrix)
        return {"items": top[0], "scores": scores[0]}

    @tf.function(input_signature=[state_spec, seen_spec, vec("candidates")])
    def score_items(state, seen, candidates):
        with tf.control_dependencies(_check_ids(model, seen, "seen") +
                                     _check_ids(model, candidates, "candidates")):
            logits = tf.reduce_sum(tf.gather(matrix, candidates - 1) * state, -1)
        logits /= model.temperature
        if model.seen_bias:
            hit = tf.reduce_any(tf.equal(candidates[:, None], seen[None, :]), 1)
            logits += tf.cast(model.seen_logit, tf.float32) * tf.cast(hit, tf.float32)
        for k in range(model.transition_depth if model.transition_pairs else 0):
            # the prior of the items that followed the last item, the second last, ...
            _, after, values = model.transitions_after(_one_row(seen), k)
            hit = tf.equal(candidates[:, None], after[None, :])
            logits += model.transition_weight * model.transition_decay ** k * tf.reduce_sum(
                tf.where(hit, values[None, :], 0.0), 1)
        return {"scores": logits}

    @tf.function(input_signature=[vec("items"), vec("timestamps")])
    def user_state(items, timestamps):
        checks = _check_ids(model, items) + [
            _check(tf.size(items) > 0, "the history has no items"),
            _check(tf.equal(tf.size(timestamps), tf.size(items)),
                   "items and timestamps differ in length")]
        with tf.control_dependencies(checks):
            items, timestamps = items[-length:], timestamps[-length:]
        return {"state": last_states(model, _one_row(items), _one_row(timestamps))[0]}

    functions.update(top_k=top_k, score_items=score_items, user_state=user_state)
    if model.encoder == "hstu":
        extend_spec = [vec("items"), vec("timestamps"),
                       tf.TensorSpec([None, model.cache_width], model.compute_dtype,
                                     name="past"), vec("past_timestamps")]

        def extend_fn(in_place):
            def extend(items, timestamps, past, past_timestamps):
                checks = _check_ids(model, items) + [
                    _check(tf.size(items) > 0, "no new events"),
                    _check(tf.equal(tf.size(timestamps), tf.size(items)),
                           "items and timestamps differ in length"),
                    _check(tf.equal(tf.size(past_timestamps), tf.shape(past)[0]),
                           "past and past_timestamps differ in length"),
                    _check(tf.size(items) + tf.shape(past)[0] <= length,
                           f"a cached history holds at most {length} events")]
                with tf.control_dependencies(checks):
                    rows, state = model.extend(items, timestamps, past, past_timestamps,
                                               in_place=in_place)
                return {"rows": rows, "state": state}
            return tf.function(extend, input_signature=extend_spec)

        functions["extend"] = extend_fn(None)
        functions["extend_in_place"] = extend_fn(True)
    return functions


SIGNATURES = ("serving_default", "recommend")


def export(model, dataset, out_dir, metrics=None, serve_k=SERVE_K):
    """Writes ``out_dir/saved_model`` (see the module docstring), ``out_dir/model.keras``,
    ``out_dir/items.txt`` and ``out_dir/info.json``; returns the SavedModel's path."""
    os.makedirs(out_dir, exist_ok=True)
    root = tracked_root(model)
    # The catalogue's embeddings, frozen with the model: a request scores the catalogue
    # with one matmul instead of looking every item up in the growing table again.
    matrix = model.item_matrix(training=False)
    matrix = tf.pad(matrix, [[0, _matrix_rows(model.num_items) - model.num_items], [0, 0]])
    root.item_matrix = tf.Variable(matrix, trainable=False, name="serving_item_matrix")
    functions = _functions(model, serve_k, root.item_matrix)
    for name, fn in functions.items():
        setattr(root, name, fn)
    path = os.path.join(out_dir, "saved_model")
    tf.saved_model.save(root, path, signatures={
        name: functions[name].get_concrete_function() for name in SIGNATURES})
    model.save(os.path.join(out_dir, "model.keras"))
    with open(os.path.join(out_dir, "items.txt"), "w") as f:
        f.write("\n".join(str(n) for n in dataset.item_names) + "\n")
    with open(os.path.join(out_dir, "info.json"), "w") as f:
        json.dump({"source": dataset.source, "num_items": dataset.num_items,
                   "num_users": dataset.num_users, "max_seq_len": model.max_seq_len,
                   "use_fused": model.use_fused, "encoder": model.encoder,
                   "d_model": model.d_model, "serve_k": min(serve_k, model.num_items),
                   "cache_width": model.cache_width if "extend" in functions else 0,
                   "compute_dtype": model.compute_dtype, "metrics": metrics or {}},
                  f, indent=1)
    return path


def recommend(model_dir, history, timestamps=None, k=10):
    """Top-k (item names, scores) for a history of item names, from an exported model
    directory (a new process needs only ``import recops_tf``)."""
    with open(os.path.join(model_dir, "items.txt")) as f:
        names = [line.rstrip("\n") for line in f]
    index = {name: i + 1 for i, name in enumerate(names)}
    history = [str(h) for h in history]
    unknown = [h for h in history if h not in index]
    if unknown:
        raise ValueError(f"items not in the model's catalogue: {unknown[:5]}")
    if timestamps is None:  # one interaction a day, ending now
        now = int(time.time())
        timestamps = [now - 86400 * (len(history) - 1 - i) for i in range(len(history))]
    if len(timestamps) != len(history):
        raise ValueError("history and timestamps differ in length")
    module = tf.saved_model.load(os.path.join(model_dir, "saved_model"))
    out = module.recommend(tf.constant([index[h] for h in history], tf.int64),
                           tf.constant(timestamps, tf.int64), tf.constant(int(k), tf.int32))
    return [names[i - 1] for i in out["items"].numpy()], out["scores"].numpy()
