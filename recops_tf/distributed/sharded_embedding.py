"""ShardedEmbedding: a model-parallel DynamicEmbedding whose keys live on their owner rank."""
import keras
import tensorflow as tf

from recops_tf.distributed import collectives
from recops_tf.layers.dynamic_embedding import DynamicEmbedding
from recops_tf.ops.embedding_by_address import anchored_lookup


@keras.saving.register_keras_serializable(package="recops_tf")
class ShardedEmbedding(DynamicEmbedding):
    """A growing embedding table sharded across the ranks of a ``Group``: key ``k`` lives on
    rank ``k mod R``, in that rank's ``DynamicEmbeddingTable``.

    A lookup (every rank calls it, each on its own batch) runs:

    1. the batch's keys deduplicated (``tf.unique``) and grouped by owner;
    2. ``all_to_all`` of the keys: each owner receives the keys it holds;
    3. the owner's local table lookup (new keys get rows in training, initialised from
       (seed, key) exactly as one unsharded table would);
    4. ``all_to_all`` of the rows back, un-grouped and expanded to the batch's keys.

    The backward is the reverse: each rank's row gradients travel to the owners, whose
    ``gradient_anchor`` receives them as a ``tf.IndexedSlices`` keyed by local row address,
    duplicates from several ranks included; ``recops_tf.optimizers.LazyAdam`` or
    ``SparseSGD`` then update the owner's rows (summing the duplicates, i.e. the seed's
    AllUss). Dense weights elsewhere in the model are data-parallel: reduce their gradients
    across ranks (``Group.all_reduce_sum``, or a ``tf.distribute`` strategy).

    With one rank it is a ``DynamicEmbedding``. Every rank must call the layer the same number
    of times in the same order (collectives). Checkpoints save each rank's shard.

    Args:
      dim, initializer, padding_key, num_slots, block_rows, seed: as ``DynamicEmbedding``
        (the same seed on every rank).
      group: ``recops_tf.distributed.Group`` (None: the process default at build time).
    """

    def __init__(self, dim, group=None, **kwargs):
        super().__init__(dim, **kwargs)
        self.group = collectives._group(group)

    def _embed(self, keys, training):
        group = self.group
        unique, position = tf.unique(tf.reshape(keys, [-1]))
        owner = tf.cast(tf.math.floormod(unique, group.world_size), tf.int32)
        by_owner = tf.argsort(owner, stable=True)
        send_counts = tf.math.bincount(owner, minlength=group.world_size,
                                       maxlength=group.world_size, dtype=tf.int32)
        matrix = collectives.count_matrix(send_counts, group)
        mine = collectives._all_to_all_matrix(tf.gather(unique, by_owner), matrix, group)
        addresses = self.table.lookup_addresses(mine, training=training)
        rows = anchored_lookup(self.table, addresses, self.gradient_anchor)
        back = collectives._all_to_all_matrix(rows, tf.transpose(matrix), group)
        # back[i] is the row of unique[by_owner[i]]: scatter to unique order, then expand.
        rows_unique = tf.scatter_nd(by_owner[:, None], back,
                                    tf.stack([tf.size(unique), self.dim]))
        out = tf.gather(rows_unique, position)
        return tf.reshape(out, tf.concat([tf.shape(keys), [self.dim]], 0))

    def covering_lookup(self, keys, positions, training=None):
        """The rows of `keys` and of `positions` into them, as two sharded lookups (the
        rows live on their owners, so the single-table covering lookup does not apply)."""
        keys = tf.convert_to_tensor(keys)
        rows = self(keys, training=training)
        return rows, self(tf.gather(keys, positions), training=training)

    def get_config(self):
        return super().get_config()  # the group is the process's, not part of the config
