"""Sequential (next-item) recommenders for the main job, in one harness:

* ``encoder="hstu"``: the HSTU paper's generative recommender from the library's layers:
  growing item embeddings (``DynamicEmbedding``), learned positions, a stack of
  ``HSTUBlock``s with a learned relative (time + position) bias, on ragged histories;
* ``encoder="sasrec"``: the SASRec baseline from stock Keras layers (learned positions,
  causal softmax ``MultiHeadAttention``, point-wise feed-forward, pre-LayerNorm), on the same
  data, loss and training loop.

Both end in the paper's retrieval head: l2-normalised user states and item embeddings, whose
dot product divided by a temperature is the logit of an item. The loss is a sampled softmax
over uniform negatives (``sampled``), over negatives drawn from the batch's own targets
(``in-batch``) or a softmax over the whole catalogue (``full``).
"""
import keras
import numpy as np
import tensorflow as tf

from recops_tf.layers.dynamic_embedding import DynamicEmbedding
from recops_tf.layers.hstu_block import HSTUBlock
from recops_tf.layers.relative_attention_bias import RelativeAttentionBias
from recops_tf.ops.fused_linear_cross_entropy import PANEL_MAX_ITEMS, fused_linear_cross_entropy

ENCODERS = ("hstu", "sasrec")
LOSSES = ("sampled", "in-batch", "full", "gbce")
_HIT = -1e9  # the logit of a sampled negative that is the positive itself (masked out)


@keras.saving.register_keras_serializable(package="recops_tf")
class GenerativeRecommender(keras.Model):
    """Next-item model: ``{"items", "timestamps"}`` ``[B, (L)]`` ragged int64 in, ``[B, (L),
    d_model]`` user states out (l2-normalised when ``l2_norm``); ``scores(states)`` rates
    every catalogue item (ids ``1..num_items``; column j is item j + 1).

    Args:
      num_items: catalogue size (item ids 1..num_items; 0 is never an item).
      encoder: ``"hstu"`` or ``"sasrec"``.
      d_model: item embedding and state width (the paper: 50).
      num_blocks, num_heads, head_dim: the encoder's depth, heads and per-head q/k/v width.
      max_seq_len: the longest history (longer ones must be cut to their last items).
      dropout_rate: input dropout, and the blocks' (HSTU: on ``norm(attention) * u``; SASRec:
        attention and feed-forward).
      l2_norm, temperature: the retrieval head (``logit = <s, e> / temperature``; without
        ``l2_norm`` the raw dot product).
      relative_bias: HSTU's learned time + position bias (HSTU only).
      use_fused: ``DynamicEmbedding`` items (train with ``recops_tf.optimizers.LazyAdam``)
        and the fused HSTU ops; ``False``: ``keras.layers.Embedding`` and the blocks' stock-TF
        reference paths (SASRec is stock Keras either way, only its embedding changes).
      share_embeddings: the retrieval head scores items with the input item table (SASRec's
        and HSTU's tying); ``False``: with a second table of its own.
      seen_bias: a learned scalar added to the logit of every item already in the history
        being scored (in training: the items read up to each position), a repeat-aware
        head; ``scores(states, seen=histories)`` applies it.
      transition_pairs: the number of (item, later item) pairs of the transition prior
        (0: none). With pairs, ``set_transitions(evaluation.transitions(histories, num_items,
        window))`` stores how often each item followed each other in those histories (within
        `window` steps, each 1 / gap), and at inference (not in training)
        ``scores(states, seen=histories)`` adds ``transition_weight x sum_k decay^k log(1 +
        n(h[-1 - k], j))`` to item j's logit over the history's last `transition_depth` items
        h[-1], h[-2], ... (``decay``: `transition_decay`): sequential rules' evidence
        (``evaluation.SequentialRules``) beside the encoder's; depth 1 and window 1 are a
        first-order Markov chain. The weight is 0 until set (the trainer chooses it on the
        validation split after training: ``Config.transition_prior``).
      transition_depth, transition_decay: see `transition_pairs` (1 and 1.0: the last item
        only).
      seed: of initializers and dropout.
      dropout_seed: of the dropout masks only, when it must differ from `seed` (multi-worker
        training: each rank draws its own masks over its slice of the batch, while the
        initial weights stay equal on every rank). Not part of the config.
      table_group: a ``recops_tf.distributed.Group`` of several ranks: the item tables are
        ``ShardedEmbedding``s over it (multi-worker training; fused build only).
    """

    def __init__(self, num_items, encoder="hstu", d_model=50, num_blocks=2, num_heads=1,
                 head_dim=50, max_seq_len=200, dropout_rate=0.2, l2_norm=True,
                 temperature=0.05, relative_bias=True, use_fused=True, seed=0, seen_bias=False,
                 share_embeddings=True, transition_pairs=0, transition_depth=1,
                 transition_decay=1.0, table_group=None, dropout_seed=None, **kwargs):
        super().__init__(**kwargs)
        # Multi-worker training: item tables sharded over the group's ranks (not a config
        # field: a model saved or exported is a whole, unsharded one).
        self.table_group = (table_group if table_group is not None and
                            table_group.world_size > 1 else None)
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
        if int(num_items) < 1 or int(max_seq_len) < 1 or int(d_model) < 1:
            raise ValueError("num_items, max_seq_len and d_model must be positive")
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.num_items, self.encoder, self.d_model = int(num_items), encoder, int(d_model)
        self.num_blocks, self.num_heads = int(num_blocks), int(num_heads)
        self.head_dim, self.max_seq_len = int(head_dim), int(max_seq_len)
        self.dropout_rate, self.l2_norm = float(dropout_rate), bool(l2_norm)
        self.temperature, self.relative_bias = float(temperature), bool(relative_bias)
        self.use_fused, self.seed = bool(use_fused), int(seed)
        self.seen_bias, self.share_embeddings = bool(seen_bias), bool(share_embeddings)
        self.item_embedding = self._table("items", seed)
        # Without sharing, the retrieval head has an item table of its own.
        self.output_embedding = (None if self.share_embeddings else
                                 self._table("output_items", seed + 3))
        self.positions = keras.layers.Embedding(
            self.max_seq_len, self.d_model, name="positions",
            embeddings_initializer=keras.initializers.TruncatedNormal(stddev=0.02,
                                                                      seed=seed + 1))
        masks = seed if dropout_seed is None else int(dropout_seed)
        self.input_dropout = keras.layers.Dropout(self.dropout_rate, seed=masks + 2,
                                                  name="input_dropout")
        if encoder == "hstu":
            self.blocks = [
                HSTUBlock(self.num_heads, self.head_dim, self.max_seq_len,
                          dropout_rate=self.dropout_rate,
                          relative_bias=(RelativeAttentionBias(self.max_seq_len,
                                                               name=f"bias_{i}")
                                         if self.relative_bias else None),
                          use_fused=self.use_fused, seed=masks + 10 + i, name=f"hstu_{i}")
                for i in range(self.num_blocks)]
        else:
            self.blocks = [_SASRecBlock(self.num_heads, self.head_dim, self.d_model,
                                        self.dropout_rate, masks + 10 + i, name=f"sasrec_{i}")
                           for i in range(self.num_blocks)]
        self.final_norm = (None if self.l2_norm else
                           keras.layers.LayerNormalization(name="final_norm"))
        self.catalogue = tf.constant(np.arange(1, self.num_items + 1), tf.int64)
        self.seen_logit = (self.add_weight(name="seen_bias", shape=(), initializer="zeros")
                           if self.seen_bias else None)
        self.transition_pairs = int(transition_pairs)
        if self.transition_pairs < 0:
            raise ValueError(f"transition_pairs must be >= 0, got {transition_pairs}")
        self.transition_depth, self.transition_decay = int(transition_depth), float(
            transition_decay)
        if self.transition_depth < 1 or not 0.0 < self.transition_decay <= 1.0:
            raise ValueError(f"transition_depth must be >= 1 and transition_decay in (0, 1], "
                             f"got {transition_depth} and {transition_decay}")
        if self.transition_pairs:
            # CSR by the preceding item: the pairs of item i are [starts[i], starts[i + 1]).
            fixed = dict(trainable=False, initializer="zeros")
            self.transition_starts = self.add_weight(
                name="transition_starts", shape=(self.num_items + 2,), dtype="int64", **fixed)
            self.transition_items = self.add_weight(
                name="transition_items", shape=(self.transition_pairs,), dtype="int64",
                **fixed)
            self.transition_values = self.add_weight(
                name="transition_values", shape=(self.transition_pairs,), dtype="float32",
                **fixed)
            self.transition_weight = self.add_weight(
                name="transition_weight", shape=(), dtype="float32", **fixed)

    # -- embeddings -------------------------------------------------------------------------
    def _table(self, name, seed):
        init = keras.initializers.TruncatedNormal(stddev=0.02, seed=seed)
        if self.use_fused and self.table_group is not None:
            from recops_tf.distributed import ShardedEmbedding
            return ShardedEmbedding(self.d_model, group=self.table_group, initializer=init,
                                    seed=seed, name=name)
        if self.use_fused:
            return DynamicEmbedding(self.d_model, initializer=init, seed=seed, name=name)
        return keras.layers.Embedding(self.num_items + 1, self.d_model,
                                      embeddings_initializer=init, name=name)

    def tables(self):
        """The growing item tables (``DynamicEmbedding.table``) of the fused build: the input
        table, and the head's own without ``share_embeddings``."""
        if not self.use_fused:
            return []
        layers = [self.item_embedding] + ([] if self.output_embedding is None else
                                          [self.output_embedding])
        return [layer.table for layer in layers]

    def _raw_embed(self, ids, training, layer=None):
        layer = layer or self.item_embedding
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(self._raw_embed(ids.flat_values, training, layer))
        if self.use_fused:
            return layer(ids, training=training)
        return layer(ids)

    def item_embeddings(self, ids, training=None):
        """Embeddings of item ids (any shape) as the retrieval head sees them."""
        e = self._raw_embed(ids, training, self.output_embedding)  # None: the input table
        # The head is float32 (module comment in `call`); a Keras Embedding under
        # mixed_bfloat16 (--no-fused --precision bf16) returns its compute dtype.
        e = tf.cast(e, tf.float32) if e.dtype != tf.float32 else e
        return tf.math.l2_normalize(e, axis=-1, epsilon=1e-12) if self.l2_norm else e

    # -- the encoder ------------------------------------------------------------------------
    def call(self, inputs, training=None):
        items, timestamps = inputs["items"], inputs["timestamps"]
        if not isinstance(items, tf.RaggedTensor):
            raise TypeError("GenerativeRecommender takes ragged [B, (L)] items and timestamps "
                            f"(tf.RaggedTensor), got {type(items).__name__}")
        # The encoder runs in the compute dtype (bfloat16 under Keras' mixed_bfloat16 policy:
        # the fused kernels' bf16 path), the retrieval head in float32 (the item table's).
        compute = self.compute_dtype
        rows = inputs.get("item_rows")  # next_item_loss's covering lookup (full softmax)
        if rows is None:
            rows = self._raw_embed(items, training).flat_values
        x = tf.cast(rows, compute) * (self.d_model ** 0.5)
        position = tf.ragged.range(items.row_lengths()).flat_values
        x = self.input_dropout(x + tf.cast(self.positions(position), compute), training=training)
        x = items.with_flat_values(x)
        if self.encoder == "hstu":
            for block in self.blocks:
                x = block(x, timestamps=timestamps if self.relative_bias else None,
                          training=training)
        else:
            lengths = items.row_lengths()
            dense = x.to_tensor()
            for block in self.blocks:
                dense = block(dense, training=training)
            x = tf.RaggedTensor.from_tensor(dense, lengths=lengths)
        states = tf.cast(x.flat_values, tf.float32)
        if self.l2_norm:  # the paper's head: no final LayerNorm, an l2 norm
            states = tf.math.l2_normalize(states, axis=-1, epsilon=1e-12)
        else:
            states = tf.cast(self.final_norm(states), tf.float32)
        return items.with_flat_values(states)

    # -- incremental inference (a user's key/value cache) ---------------------------------
    @property
    def cache_width(self):
        """Width of a token's cache row: every block's keys then values (HSTU only)."""
        if self.encoder != "hstu":
            raise ValueError("a key/value cache needs encoder='hstu' (SASRec's stock "
                             "MultiHeadAttention has no incremental path)")
        return self.num_blocks * self.num_heads * 2 * self.head_dim

    def extend(self, items, timestamps, past, past_timestamps, in_place=None):
        """Encodes one user's new events against the cache of the earlier ones.

        Args:
          items, timestamps: ``[n]`` int64, the new events (n >= 1).
          past: ``[P, cache_width]`` in the compute dtype: the cache rows of the P earlier
            events (``[0, cache_width]`` for none), as earlier calls returned them.
          past_timestamps: ``[P]`` int64.
          in_place: how the new events attend the cache (``HSTUBlock.extend``): None, by
            their number (a ``tf.cond``); True, the cache read in place (best for a few);
            False, concatenated after it (best for many).

        Returns:
          ``(rows, state)``: the new events' ``[n, cache_width]`` cache rows and the ``[d_model]``
          user state after the last one; ``state`` equals ``last_states`` of the whole history
          while ``P + n <= max_seq_len`` (positions are absolute: a longer history must be
          re-encoded from its last ``max_seq_len`` events, as the full model reads it).
        """
        width = self.cache_width
        compute = self.compute_dtype
        p = tf.shape(past)[0]
        x = tf.cast(self._raw_embed(items, False), compute) * (self.d_model ** 0.5)
        x += tf.cast(self.positions(p + tf.range(tf.size(items))), compute)
        ts = tf.concat([past_timestamps, timestamps], 0) if self.relative_bias else None
        hk = self.num_heads * self.head_dim
        past = tf.cast(past, compute)  # [P, blocks x (keys, values)], read in place
        rows = []
        for b, block in enumerate(self.blocks):
            x, k, v = block.extend(x, past, past, ts, key_column=2 * b * hk,
                                   value_column=(2 * b + 1) * hk, in_place=in_place)
            rows += [k, v]
        state = tf.cast(x[-1], tf.float32)
        state = tf.math.l2_normalize(state, epsilon=1e-12) if self.l2_norm else \
            tf.cast(self.final_norm(state[None])[0], tf.float32)
        return tf.reshape(tf.concat(rows, 1), [-1, width]), state

    # -- the transition prior ---------------------------------------------------------------
    def set_transitions(self, counted):
        """Stores transition counts, ``(starts, items, counts)`` as
        ``evaluation.transitions(histories, num_items, window)`` gives them
        (``transition_pairs`` must be ``len(items)``; ``evaluation.recount`` keeps a shape
        while the counts change); the prior reads log(1 + count)."""
        starts, items, counts = counted
        if len(items) != self.transition_pairs or len(starts) != self.num_items + 2:
            raise ValueError(f"{len(items)} transitions over {len(starts) - 2} items; the model "
                             f"was built for {self.transition_pairs} over {self.num_items}")
        if self.transition_pairs:
            self.transition_starts.assign(np.asarray(starts, np.int64))
            self.transition_items.assign(np.asarray(items, np.int64))
            self.transition_values.assign(np.log1p(counts).astype(np.float32))

    def transitions_after(self, seen, k=0):
        """``(rows [M], items [M], log(1 + count) [M])``: for each row of ragged `seen`
        (histories, oldest first), the items that followed its `k`-th last item (0: the last)
        in the stored transitions (a row of k items or fewer has none); no (row, item) pair
        twice."""
        limits = seen.row_limits()
        present = limits - k > seen.row_starts()
        flat = tf.concat([tf.zeros([1], tf.int64), seen.flat_values], 0)
        last = tf.where(present, tf.gather(flat, tf.where(present, limits - k, 0)),
                        tf.zeros_like(limits))
        starts = tf.convert_to_tensor(self.transition_starts)
        at = tf.ragged.range(tf.gather(starts, last), tf.gather(starts, last + 1))
        return (at.value_rowids(), tf.gather(self.transition_items, at.flat_values),
                tf.gather(self.transition_values, at.flat_values))

    # -- the retrieval head -----------------------------------------------------------------
    def item_matrix(self, training=None):
        """``[num_items, d_model]`` head embeddings of items 1..num_items."""
        return self.item_embeddings(self.catalogue, training)

    def scores(self, states, training=None, seen=None, matrix=None):
        """``[N, num_items]`` logits of every catalogue item for ``[N, d_model]`` states;
        with ``seen_bias``, ``seen`` (ragged ``[N, (L)]`` item ids: the histories the states
        read) adds the learned seen-item bias to the logits of those items and, with
        ``transition_pairs`` and not `training`, the transition prior. ``matrix``: the
        ``item_matrix()`` to score with, when the caller holds a copy (an export does)."""
        if matrix is None:
            matrix = self.item_matrix(training)
        # The temperature scales the [N, d] states, not the [N, num_items] logits, and the
        # seen-item bias is added at the (row, item) pairs read, each once: no pass over the
        # catalogue's logits besides the product, which a batch of rows shares (the serving
        # signature's batching saves the rest).
        logits = tf.matmul(states / self.temperature, matrix, transpose_b=True)
        for rows, items, values in self.score_extras(seen, training):
            idx = tf.stack([rows, items - 1], 1)
            logits = tf.tensor_scatter_nd_update(
                logits, idx, tf.gather_nd(logits, idx) + tf.cast(values, logits.dtype))
        return logits

    def score_extras(self, seen, training=None):
        """What `scores` adds to the product, as sparse stages applied in order: a list of
        ``(rows, items, values)`` (int64 rows of the states, item ids 1..num_items, float32
        values; no (row, item) pair twice within a stage). The seen-item bias at each distinct
        item of each row's ragged `seen` (with ``seen_bias``), then the transition prior of the
        items that followed each row's last item, second last, ... (with ``transition_pairs``,
        not `training`; a stage each, ``transition_depth`` of them).
        Every scorer of the model reads them here (``scoring.model_ranks`` too), so a new term
        reaches evaluation as it reaches ``scores``."""
        stages = []
        if seen is None:
            return stages
        if self.seen_bias:
            width = tf.constant(self.num_items + 1, tf.int64)
            keys, _ = tf.unique(seen.value_rowids() * width + seen.flat_values)
            stages.append((keys // width, keys % width,
                           tf.fill(tf.shape(keys), tf.cast(self.seen_logit, tf.float32))))
        if self.transition_pairs and not training:
            for k in range(self.transition_depth):
                rows, items, values = self.transitions_after(seen, k)
                weight = self.transition_weight * self.transition_decay ** k
                stages.append((rows, items, tf.cast(values * weight, tf.float32)))
        return stages

    def get_build_config(self):
        return {"built": bool(self.built)}

    def build_from_config(self, config):
        # Creates every weight (for .keras loading) with one call on a one-item history.
        if config.get("built"):
            one = tf.RaggedTensor.from_row_lengths(tf.constant([1], tf.int64),
                                                   tf.constant([1], tf.int64))
            self({"items": one, "timestamps": one}, training=False)
            self.item_matrix(training=False)

    def get_config(self):
        config = super().get_config()
        config.update(num_items=self.num_items, encoder=self.encoder, d_model=self.d_model,
                      num_blocks=self.num_blocks, num_heads=self.num_heads,
                      head_dim=self.head_dim, max_seq_len=self.max_seq_len,
                      dropout_rate=self.dropout_rate, l2_norm=self.l2_norm,
                      temperature=self.temperature, relative_bias=self.relative_bias,
                      use_fused=self.use_fused, seed=self.seed, seen_bias=self.seen_bias,
                      share_embeddings=self.share_embeddings,
                      transition_pairs=self.transition_pairs,
                      transition_depth=self.transition_depth,
                      transition_decay=self.transition_decay)
        return config


@keras.saving.register_keras_serializable(package="recops_tf")
class _SASRecBlock(keras.layers.Layer):
    """SASRec's block (Kang & McAuley, 2018, as generative-recommenders runs it) on dense
    ``[B, S, d]`` left-aligned sequences: ``q = LN(x)``, ``z = LN(q + MHA(q, x, x))`` with
    causal softmax attention, ``out = z + dropout(W2 dropout(relu(W1 z)))``. Padding rows are
    at the end, so a causal query never reads one."""

    def __init__(self, num_heads, head_dim, d_model, dropout_rate, seed, **kwargs):
        super().__init__(**kwargs)
        self.num_heads, self.head_dim, self.d_model = num_heads, head_dim, d_model
        self.dropout_rate, self.seed = dropout_rate, seed
        self.norm_1 = keras.layers.LayerNormalization(epsilon=1e-8, name="attention_norm")
        self.attention = keras.layers.MultiHeadAttention(num_heads, head_dim,
                                                         dropout=dropout_rate, seed=seed,
                                                         name="attention")
        self.norm_2 = keras.layers.LayerNormalization(epsilon=1e-8, name="ffn_norm")
        self.ffn_1 = keras.layers.Dense(d_model, activation="relu", name="ffn_1")
        self.ffn_2 = keras.layers.Dense(d_model, name="ffn_2")
        self.dropout_1 = keras.layers.Dropout(dropout_rate, seed=seed + 1000)
        self.dropout_2 = keras.layers.Dropout(dropout_rate, seed=seed + 2000)

    def call(self, x, training=None):
        q = self.norm_1(x)
        z = self.norm_2(q + self.attention(q, x, x, use_causal_mask=True, training=training))
        h = self.dropout_1(self.ffn_1(z), training=training)
        return z + self.dropout_2(self.ffn_2(h), training=training)

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, head_dim=self.head_dim, d_model=self.d_model,
                      dropout_rate=self.dropout_rate, seed=self.seed)
        return config


def _seen_bias(model, states, read, ids):
    """The seen-item bias of ``[P, N]`` candidate `ids` (one row per position of `states`):
    ``model.seen_logit`` where the id occurs in the items `read` up to that position.

    Looked up by (sequence, item) key in the sorted keys of `read`: the cost follows the
    batch's items and candidates, not the catalogue (which may hold millions of items)."""
    width = tf.constant(model.num_items + 1, tf.int64)
    keys, slot = tf.unique(read.value_rowids() * width + read.flat_values)
    first = tf.math.unsorted_segment_min(tf.ragged.range(read.row_lengths()).flat_values, slot,
                                         tf.size(keys))
    order = tf.argsort(keys)
    # A sentinel past every key keeps the lookups in range (also for an empty batch).
    keys = tf.concat([tf.gather(keys, order), [tf.int64.max]], 0)
    first = tf.concat([tf.gather(first, order), [tf.int64.max]], 0)
    rows = states.value_rowids()
    at = tf.ragged.range(states.row_lengths()).flat_values
    wanted = tf.reshape(rows[:, None] * width + ids, [-1])
    loc = tf.searchsorted(keys, wanted)
    seen = (tf.gather(keys, loc) == wanted) & (tf.gather(first, loc) <= tf.reshape(
        tf.broadcast_to(at[:, None], tf.shape(ids)), [-1]))
    seen = tf.reshape(seen, tf.shape(ids))
    return tf.cast(model.seen_logit, tf.float32) * tf.cast(seen, tf.float32)


def _seen_bias_full(model, states, read):
    """The seen-item bias of every catalogue item, ``[P, num_items]`` (column j: item j + 1),
    for the full softmax, whose logits are already ``[P, num_items]``. Built densely from each
    sequence's first position of every item, where a per-candidate key lookup would cost a
    search per logit. Equals `_seen_bias` of the whole catalogue."""
    first = tf.tensor_scatter_nd_min(
        tf.fill(tf.stack([read.nrows(), tf.constant(model.num_items, tf.int64)]), tf.int64.max),
        tf.stack([read.value_rowids(), read.flat_values - 1], 1),
        tf.ragged.range(read.row_lengths()).flat_values)
    at = tf.ragged.range(states.row_lengths()).flat_values
    seen = tf.gather(first, states.value_rowids()) <= at[:, None]
    return tf.cast(model.seen_logit, tf.float32) * tf.cast(seen, tf.float32)


# Per-position negatives take their logits from the whole catalogue's [P, num_items] logits
# (one matrix product, as the full softmax) instead of gathering P x N item embeddings and
# scattering their gradients back, while the catalogue has at most this many items per
# negative: the two are the same loss and gradients (the same uniform draws, up to float
# order; the product's table gradient has a row, maybe zero, for every item, which a step's
# P x N >= 24 x num_items draws nearly always touch anyway). On 2 Xeon cores at about 3,600
# positions a step, d = 50, N = 128, the product path took 0.55x the gather's time at 1,682
# items, 0.88x at 3,000 and 1.7x at 6,000.
DENSE_NEGATIVES_PER_ITEM = 24


def _dense_negatives(model, negatives):
    n = negatives.shape[-1]
    return n is not None and model.num_items <= DENSE_NEGATIVES_PER_ITEM * int(n)


def _catalogue_logits(model, states, targets, training, read):
    """``[P, num_items]`` logits of every catalogue item at each position (the seen-item bias
    added when `read`, the ragged items the states read, is given) and ``[P]`` those of the
    targets: the full softmax's, and the per-position negatives' source on small catalogues."""
    logits = model.scores(states.flat_values, training=training)
    if model.seen_bias and read is not None:
        logits += _seen_bias_full(model, states, read)
    return logits, tf.gather(logits, targets.flat_values - 1, batch_dims=1)


def _positives_and_negatives_from_logits(model, states, targets, negatives, training, read):
    """`_positives_and_negatives` with ``per_position``, gathered from the ``[P, num_items]``
    logits of the whole catalogue (see `DENSE_NEGATIVES_PER_ITEM`)."""
    logits, pos = _catalogue_logits(model, states, targets, training, read)
    neg = tf.gather(logits, negatives - 1, batch_dims=1)
    hit = tf.equal(targets.flat_values[:, None], negatives)
    return pos, tf.where(hit, tf.cast(_HIT, neg.dtype), neg)


def _positives_and_negatives(model, states, targets, negatives, training,
                             per_position=False, read=None):
    """Logits ``[P]`` of the positives and ``[P, N]`` of the negatives, accidental hits of
    the positive masked. ``negatives`` are ``[B, N]`` ids shared by a sequence's positions
    (one ``[B, S, d] x [B, N, d]`` product: B x N embeddings per step) or, with
    ``per_position``, ``[P, N]`` ids, a set per position (generative-recommenders' sampler:
    P x N embeddings per step). With ``model.seen_bias``, `read` (the ragged items the states
    read) adds the seen-item bias to candidates already read at that position."""
    if per_position and _dense_negatives(model, negatives):
        return _positives_and_negatives_from_logits(model, states, targets, negatives, training,
                                                    read)
    s = states.flat_values
    pos = tf.reduce_sum(s * model.item_embeddings(targets.flat_values, training), -1)
    neg_emb = model.item_embeddings(negatives, training)
    if per_position:
        neg = tf.einsum("pd,pnd->pn", s, neg_emb)
        neg = tf.where(tf.equal(targets.flat_values[:, None], negatives),
                       tf.cast(_HIT, neg.dtype), neg)
    else:
        neg = tf.einsum("bsd,bnd->bsn", states.to_tensor(), neg_emb)
        hit = tf.equal(targets.to_tensor()[:, :, None], negatives[:, None, :])
        neg = tf.where(hit, tf.cast(_HIT, neg.dtype), neg)
        neg = tf.RaggedTensor.from_tensor(neg, lengths=states.row_lengths()).flat_values
    pos, neg = pos / model.temperature, neg / model.temperature
    if model.seen_bias and read is not None:
        neg_ids = negatives if per_position else tf.gather(negatives, states.value_rowids())
        pos += _seen_bias(model, states, read, targets.flat_values[:, None])[:, 0]
        neg += _seen_bias(model, states, read, neg_ids)
    return pos, neg


def _seen_logits(model, states, read):
    """The seen-item bias as sparse logits ``(positions, items, values)``: one triple per
    position of `states` and distinct item `read` up to it (item id i is row i - 1 of the
    item matrix), each valued ``model.seen_logit``. ``B x L^2 / 2`` triples at most, against
    the ``P x num_items`` of `_seen_bias_full`."""
    width = tf.constant(model.num_items + 1, tf.int64)
    keys, slot = tf.unique(read.value_rowids() * width + read.flat_values)
    first = tf.math.unsorted_segment_min(tf.ragged.range(read.row_lengths()).flat_values, slot,
                                         tf.size(keys))
    rows = keys // width
    span = tf.ragged.range(first, tf.gather(states.row_lengths(), rows))
    positions = (tf.gather(states.row_starts(), rows)[:, None] + span).flat_values
    items = tf.repeat(keys % width - 1, span.row_lengths())
    values = tf.broadcast_to(tf.cast(model.seen_logit, tf.float32), tf.shape(items))
    return positions, items, values


def _fused_full_softmax(model, states, targets, training, read, label_smoothing, matrix=None):
    """``[P]`` cross-entropy of the targets over the whole catalogue through
    ``recops_tf.fused_linear_cross_entropy`` (the logits never built): the same loss and
    gradients as `_catalogue_logits` + `_cross_entropy`. `matrix`: the catalogue's raw rows
    when the caller looked them up (None: looked up here)."""
    extra = _seen_logits(model, states, read) if model.seen_bias and read is not None else None
    # With l2_norm the kernel normalises the raw rows block by block: no normalised [N, d]
    # copy of the catalogue nor its gradient (the states, already unit vectors, are
    # normalised again: the same values).
    if matrix is None:
        matrix = model._raw_embed(model.catalogue, training, model.output_embedding)
    matrix = tf.cast(matrix, tf.float32) if matrix.dtype != tf.float32 else matrix
    flat = states.flat_values
    if model.compute_dtype == "bfloat16":
        # --precision bf16: the loss's GEMMs on bfloat16 (AMX tiles / AVX512-BF16 where the CPU
        # has them); the loss comes back in float32, the gradients through the casts.
        flat, matrix = tf.cast(flat, tf.bfloat16), tf.cast(matrix, tf.bfloat16)
        if extra is not None:
            extra = extra[:2] + (tf.cast(extra[2], tf.bfloat16),)
    # A training step differentiates the mean (or sum) of the loss: its gradients are made in
    # the forward's pass over the logits (three products instead of four), up to the
    # catalogues where the kernel takes that path (past 50,000 items, 30,000 in bfloat16, it
    # runs forward then backward, being faster so); past them the two-pass form, whose backward
    # writes the item gradient over the gathered catalogue (one [N, d] tensor less at the peak).
    one_pass = bool(training) and model.num_items <= PANEL_MAX_ITEMS[flat.dtype]
    return fused_linear_cross_entropy(
        flat, matrix, targets.flat_values - 1, temperature=model.temperature,
        normalize=model.l2_norm, extra_logits=extra, label_smoothing=label_smoothing,
        gradients_in_forward=one_pass)



def _cross_entropy(logits, target_logit, label_smoothing, valid=None):
    """Softmax cross-entropy ``[P]`` of the target among `logits` ``[P, N]`` (the target's
    own column included) against the label ``(1 - label_smoothing) onehot + label_smoothing /
    n``, the uniform part over the n `valid` columns (all, if None)."""
    lse = tf.reduce_logsumexp(logits, axis=1)
    out = lse - target_logit
    if label_smoothing:
        if valid is None:
            mean = tf.reduce_mean(logits, axis=1)
        else:
            mean = (tf.reduce_sum(tf.where(valid, logits, 0.0), 1) /
                    tf.maximum(tf.reduce_sum(tf.cast(valid, logits.dtype), 1), 1.0))
        out = (1.0 - label_smoothing) * out + label_smoothing * (lse - mean)
    return out


def gbce_beta(num_negatives, num_items, t=0.75):
    """gSASRec's (Petrov & Macdonald, 2023) exponent of the positive's probability in gBCE:
    ``beta = alpha (t (1 - 1/alpha) + 1/alpha)`` with ``alpha = num_negatives / (num_items -
    1)``, the sampling rate; ``t = 0`` is plain binary cross-entropy, ``t = 1`` fully
    calibrated."""
    alpha = num_negatives / max(num_items - 1, 1)
    return alpha * (t * (1.0 - 1.0 / alpha) + 1.0 / alpha)


def next_item_loss(model, items, timestamps, loss="sampled", negatives=None, training=True,
                   per_position=False, label_smoothing=0.0, gbce_t=0.75, reduction="mean"):
    """Mean loss of predicting item t+1 from the state at t, over every position of every
    ragged history ``items`` (``[B, (L + 1)]``: the model reads the first L).

    ``loss``: ``"sampled"`` / ``"in-batch"``: softmax cross-entropy of the positive against
    ``negatives`` (``[B, N]`` item ids per sequence, or ``[P, N]`` per position with
    ``per_position``; a negative equal to the positive is masked); ``"full"``: against every
    catalogue item; ``"gbce"``: gSASRec's generalised binary cross-entropy on the positive and
    the sampled ``negatives`` (``gbce_t``: its calibration, `gbce_beta`). ``reduction="sum"``:
    the sum over positions instead of the mean (0 for a batch without positions: a worker's
    share of a small batch). ``label_smoothing``
    (softmax losses): the target's one-hot label mixed with the uniform one over the
    candidates, ``(1 - label_smoothing) onehot + label_smoothing / N`` (Keras' form).
    """
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    reduce = tf.reduce_sum if reduction == "sum" else tf.reduce_mean
    inputs = {"items": items[:, :-1], "timestamps": timestamps[:, :-1]}
    targets = items[:, 1:]
    matrix = None
    if loss == "full" and model.use_fused and model.output_embedding is None:
        # The catalogue's rows and the batch's items from one lookup of the shared table: its
        # gradient is then one [num_items, d] IndexedSlices, the items' rows added into it in
        # place, where two lookups' gradients would be concatenated (a second [num_items, d]
        # copy at the step's peak).
        matrix, inputs["item_rows"] = model.item_embedding.covering_lookup(
            model.catalogue, inputs["items"].flat_values - 1, training=training)
    states = model(inputs, training=training)
    if loss == "full":
        if model.use_fused:
            return reduce(_fused_full_softmax(model, states, targets, training, inputs["items"],
                                              label_smoothing, matrix))
        logits, target = _catalogue_logits(model, states, targets, training, inputs["items"])
        return reduce(_cross_entropy(logits, target, label_smoothing))
    pos, neg = _positives_and_negatives(model, states, targets, negatives, training,
                                        per_position, read=inputs["items"])
    if loss == "gbce":
        beta = gbce_beta(int(negatives.shape[-1]), model.num_items, gbce_t)
        # -log(sigmoid(pos) ** beta) - sum log(1 - sigmoid(neg)); a masked hit adds 0.
        return reduce(beta * tf.nn.softplus(-pos) + tf.reduce_sum(tf.nn.softplus(neg), axis=1))
    logits = tf.concat([pos[:, None], neg], axis=1)
    valid = logits > _HIT / 2 if label_smoothing else None
    return reduce(_cross_entropy(logits, pos, label_smoothing, valid))


def last_states(model, items, timestamps):
    """``[B, d_model]`` state after each history's last item (inference)."""
    states = model({"items": items, "timestamps": timestamps}, training=False)
    return tf.gather(states.flat_values, states.row_limits() - 1)
