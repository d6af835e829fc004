"""train_step's check that the ranks of a multi-worker run are at the same step: the step
number rides in the dense gradients' all-reduce, and ranks a step apart fail the step with an
InvalidArgumentError instead of summing two different steps' gradients. A fake group of two
ranks stands in for the peer (its all-reduce adds the peer's vector to this rank's)."""
import numpy as np
import pytest
import tensorflow as tf

from recops_tf import recommender as rec
from recops_tf.recommender import training


class _TwoRanks:
    """Rank 0 of 2 whose peer sends this rank's vector with its step number `lag` behind."""
    rank, world_size = 0, 2

    def __init__(self, lag):
        self.lag, self.sums = lag, 0

    def all_reduce_sum(self, x):
        self.sums += 1
        peer = tf.concat([x[:-1], x[-1:] - float(self.lag)], 0)
        return x + peer


def _step(lag):
    items = tf.ragged.constant([[1, 4, 2, 7], [3, 5, 6], [2, 8, 1], [6, 7]], tf.int64)
    stamps = tf.ragged.constant([[10, 20, 30, 40], [5, 6, 7], [1, 2, 3], [8, 9]], tf.int64)
    config = rec.Config.from_preset("auto", d_model=8, head_dim=8, max_seq_len=8, loss="full",
                                    dropout_rate=0.0, seed=1).check()
    model = training.build_model(config, 9)
    model({"items": items[:, :1], "timestamps": stamps[:, :1]}, training=False)
    optimizer = training.make_optimizer(config)
    group = _TwoRanks(lag)
    step = training.train_step(model, optimizer, tf.random.Generator.from_seed(0), config, 9,
                               group=group)
    return step, items, stamps, group, optimizer


def test_ranks_at_the_same_step_train():
    step, items, stamps, group, optimizer = _step(lag=0)
    for _ in range(3):
        assert np.isfinite(float(step(items, stamps)))
    assert int(optimizer.iterations) == 3
    assert group.sums >= 1  # the step all-reduces through the group (counted when traced)


@pytest.mark.parametrize("lag", [1, -1])
def test_ranks_a_step_apart_fail_the_step(lag):
    step, items, stamps, group, optimizer = _step(lag)
    with pytest.raises(tf.errors.InvalidArgumentError, match="ranks are out of step"):
        step(items, stamps)
    assert int(optimizer.iterations) == 0  # no update was applied
