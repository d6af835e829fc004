"""Training, leave-one-out evaluation (HR@10, NDCG@10 against a popularity baseline), export
and serving of the generative recommender."""
import dataclasses
import json
import math
import os
import time

import keras
import numpy as np
import tensorflow as tf

from recops_tf.optimizers.lazy_adam import LazyAdam
from recops_tf.recommender.model import GenerativeRecommender, last_states, next_item_loss


@dataclasses.dataclass
class Config:
    epochs: int = 10
    batch_size: int = 128
    learning_rate: float = 2e-3
    d_model: int = 64
    num_blocks: int = 2
    num_heads: int = 2
    head_dim: int = 32
    max_seq_len: int = 64
    dropout_rate: float = 0.1
    use_fused: bool = True
    seed: int = 0
    max_steps: int = 0  # > 0: stop after this many steps (smoke runs)


def _ragged(seqs):
    lengths = np.array([len(s) for s in seqs], np.int64)
    return tf.RaggedTensor.from_row_lengths(np.concatenate(seqs).astype(np.int64), lengths)


def _tail(seqs, length):
    return [s[-length:] for s in seqs]


_SPEC = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)


def build_model(config, num_items):
    return GenerativeRecommender(num_items, d_model=config.d_model, num_blocks=config.num_blocks,
                                 num_heads=config.num_heads, head_dim=config.head_dim,
                                 max_seq_len=config.max_seq_len,
                                 dropout_rate=config.dropout_rate, use_fused=config.use_fused,
                                 seed=config.seed)


def train(dataset, config, progress=True, log=print):
    """Trains on every user's history but the last item; returns (model, history of losses,
    seconds)."""
    tf.keras.utils.set_random_seed(config.seed)
    histories, stamps, _, _ = dataset.split()
    # The model sees at most max_seq_len items: train on the most recent ones.
    histories = _tail(histories, config.max_seq_len)
    stamps = _tail(stamps, config.max_seq_len)
    model = build_model(config, dataset.num_items)
    optimizer = (LazyAdam(config.learning_rate) if config.use_fused
                 else keras.optimizers.Adam(config.learning_rate))

    @tf.function(input_signature=[_SPEC, _SPEC], jit_compile=False)
    def step(items, timestamps):
        with tf.GradientTape() as tape:
            loss = next_item_loss(model, items, timestamps, training=True)
        variables = model.trainable_variables
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    rng = np.random.default_rng(config.seed)
    steps_per_epoch = math.ceil(dataset.num_users / config.batch_size)
    total = config.epochs * steps_per_epoch
    if config.max_steps > 0:
        total = min(total, config.max_steps)
    bar = keras.utils.Progbar(total, stateful_metrics=["loss", "steps/s"]) if progress else None
    losses, start, done = [], time.perf_counter(), 0
    while done < total:
        order = rng.permutation(dataset.num_users)
        for first in range(0, len(order), config.batch_size):
            if done >= total:
                break
            batch = order[first:first + config.batch_size]
            loss = float(step(_ragged([histories[u] for u in batch]),
                              _ragged([stamps[u] for u in batch])))
            losses.append(loss)
            done += 1
            if bar is not None:
                bar.update(done, [("loss", loss),
                                  ("steps/s", done / (time.perf_counter() - start))])
    return model, losses, time.perf_counter() - start


def _metrics(ranked, targets, k=10):
    """(HR@k, NDCG@k) of [N, >=k] ranked item ids against [N] targets."""
    hits = ranked[:, :k] == targets[:, None]
    position = np.argmax(hits, axis=1)
    hit = hits.any(axis=1)
    ndcg = np.where(hit, 1.0 / np.log2(position + 2.0), 0.0)
    return float(hit.mean()), float(ndcg.mean())


def evaluate(model, dataset, batch_size=256, k=10):
    """HR@k and NDCG@k of the model on every user's held-out last item, ranking the whole
    catalogue from the state after the user's (truncated) training history."""
    histories, stamps, targets, _ = dataset.split()
    histories = _tail(histories, model.max_seq_len)
    stamps = _tail(stamps, model.max_seq_len)

    @tf.function(input_signature=[_SPEC, _SPEC], jit_compile=False)
    def top(items, timestamps):
        return tf.math.top_k(model.scores(last_states(model, items, timestamps)), k).indices + 1

    ranked = np.concatenate([
        top(_ragged(histories[i:i + batch_size]), _ragged(stamps[i:i + batch_size])).numpy()
        for i in range(0, dataset.num_users, batch_size)])
    return _metrics(ranked, targets, k)


def popularity_baseline(dataset, k=10):
    """HR@k and NDCG@k of recommending the k most popular training items to everyone."""
    _, _, targets, _ = dataset.split()
    popular = np.argsort(-dataset.popularity()[1:], kind="stable")[:k] + 1
    return _metrics(np.tile(popular, (len(targets), 1)), targets, k)


def export(model, dataset, out_dir, metrics=None):
    """Writes ``out_dir/saved_model`` (endpoint and serving signature ``recommend(items,
    timestamps, k)`` on item ids 1..num_items), ``out_dir/model.keras``, ``out_dir/items.txt``
    (the data's name of item id i on line i) and ``out_dir/info.json``."""
    os.makedirs(out_dir, exist_ok=True)

    def serve(items, timestamps, k):
        items = items[-model.max_seq_len:]
        timestamps = timestamps[-model.max_seq_len:]
        length = tf.size(items, out_type=tf.int64)[None]
        states = last_states(model, tf.RaggedTensor.from_row_lengths(items, length),
                             tf.RaggedTensor.from_row_lengths(timestamps, length))
        scores = model.scores(states)[0]
        best = tf.math.top_k(scores, tf.minimum(k, tf.size(scores)))
        return {"items": tf.cast(best.indices, tf.int64) + 1, "scores": best.values}

    archive = keras.export.ExportArchive()
    archive.track(model)
    if model.use_fused:  # the growing table is a TF resource, not a Keras variable
        archive.track(model.item_embedding.table)
    archive.add_endpoint("recommend", serve, input_signature=[
        tf.TensorSpec([None], tf.int64, name="items"),
        tf.TensorSpec([None], tf.int64, name="timestamps"),
        tf.TensorSpec([], tf.int32, name="k")])
    path = os.path.join(out_dir, "saved_model")
    archive.write_out(path, verbose=False)
    model.save(os.path.join(out_dir, "model.keras"))
    with open(os.path.join(out_dir, "items.txt"), "w") as f:
        f.write("\n".join(str(n) for n in dataset.item_names) + "\n")
    with open(os.path.join(out_dir, "info.json"), "w") as f:
        json.dump({"source": dataset.source, "num_items": dataset.num_items,
                   "num_users": dataset.num_users, "max_seq_len": model.max_seq_len,
                   "use_fused": model.use_fused, "metrics": metrics or {}}, f, indent=1)
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
