"""Collectives for model-parallel embeddings (the Rec SDK's lccl stem) on TensorFlow's
collective runtime, and a sharded embedding built on them.

Join the worker processes with ``connect(workers, rank)`` (or build a
``tf.distribute.MultiWorkerMirroredStrategy`` and take ``Group.from_strategy(strategy)``),
then call the functions in or out of ``tf.function``.
"""
from recops_tf.distributed.collectives import (Group, all_to_all, all_to_all_segment_sum,
                                               connect, count_matrix, default_group,
                                               gather_all_to_all, lccl_all_to_all,
                                               lccl_all_uss, lccl_gather_all)
from recops_tf.distributed.sharded_embedding import ShardedEmbedding

__all__ = [
    "Group",
    "connect",
    "default_group",
    "count_matrix",
    "all_to_all",
    "all_to_all_segment_sum",
    "gather_all_to_all",
    "lccl_all_to_all",
    "lccl_all_uss",
    "lccl_gather_all",
    "ShardedEmbedding",
]
