"""Tests of recops_tf.distributed (stem lccl): real worker processes on 127.0.0.1 joined by
TensorFlow's collective runtime, compared with in-process numpy references."""
import numpy as np
import pytest
import tensorflow as tf

import recops_tf
from recops_tf import distributed as dist
from recops_tf.testing.drivers import multiworker as mw


def _run(scenario, workers, **env):
    outcomes = mw.launch(scenario, workers, env={k: str(v) for k, v in env.items()})
    return outcomes


def _run_aborting(scenario, workers, **env):
    """_run of a scenario whose collective is aborted (a dead or silent peer). TensorFlow's
    collective runtime itself sometimes crashes (SIGSEGV) while it aborts the op, after
    logging the abort; such a run is repeated once, and the second run's outcome stands."""
    outcomes = _run(scenario, workers, **env)
    if outcomes[0][0] < 0 and "Abort" in outcomes[0][2]:
        outcomes = _run(scenario, workers, **env)
    return outcomes


def _ok(outcomes):
    for rank, (code, results, tail) in enumerate(outcomes):
        assert code == 0 and results, f"rank {rank} exited {code}:\n{tail}"
    return [results for _, results, _ in outcomes]


@pytest.fixture(scope="module", params=[2, 3], ids=["2_workers", "3_workers"])
def collectives(request):
    return request.param, _ok(_run("collectives", request.param))


@pytest.mark.parametrize("case", mw.CASES, ids=["uneven", "rank0_sends_nothing", "all_empty",
                                                "even"])
@pytest.mark.parametrize("dtype", mw.DTYPES)
def test_all_to_all_matches_reference(collectives, case, dtype):
    world, results = collectives
    for me, result in enumerate(results):
        expected, expected_counts = mw.expected_all_to_all(world, me, case)
        np.testing.assert_array_equal(result[f"a2a_counts_{case}_{dtype}"], expected_counts)
        got = result[f"a2a_{case}_{dtype}"]
        assert got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)  # small integers: exact in every dtype
        if dtype == "float32":
            np.testing.assert_array_equal(result[f"a2a_eager_{case}"], expected)


@pytest.mark.parametrize("case", mw.CASES)
def test_all_to_all_segment_sum_matches_reference(collectives, case):
    world, results = collectives
    for me, result in enumerate(results):
        received, _ = mw.expected_all_to_all(world, me, case)
        restore = mw.restore_of(len(received), 70 + me)
        expected = np.zeros((4, 3))
        np.add.at(expected, restore, received)
        np.testing.assert_allclose(result[f"uss_{case}"], expected, rtol=1e-6)


@pytest.mark.parametrize("case", mw.CASES)
def test_all_to_all_gradient_is_the_reverse_all_to_all(collectives, case):
    world, results = collectives
    # d/d send_s of sum_me(received_me * w_me): rank s's rows for rank me get w_me's rows.
    weights = {me: mw.weights_of(len(mw.expected_all_to_all(world, me, case)[0]), 80 + me)
               for me in range(world)}
    for s, result in enumerate(results):
        send, counts = mw.send_case(world, s, case)
        expected = np.zeros_like(send)
        start = 0
        for me in range(world):
            offset = sum(int(mw.send_case(world, t, case)[1][me]) for t in range(s))
            expected[start:start + counts[me]] = weights[me][offset:offset + counts[me]]
            start += counts[me]
        np.testing.assert_allclose(result[f"grad_a2a_{case}"], expected, rtol=1e-12)


def test_gather_all_and_its_gradient_into_the_table(collectives):
    world, results = collectives
    received, weights = {}, {}
    for me in range(world):
        parts = []
        for s in range(world):
            lookup, counts = mw.lookup_case(world, s)
            start = int(counts[:me].sum())
            parts.append(mw.table_of(world, s)[lookup[start:start + counts[me]]])
        received[me] = np.concatenate(parts)
        weights[me] = mw.weights_of(len(received[me]), 90 + me)
        np.testing.assert_allclose(results[me]["gather_all"], received[me], rtol=1e-12)
    for s in range(world):  # AllUss of the weights back into the looked-up rows
        lookup, counts = mw.lookup_case(world, s)
        expected = np.zeros((6, 3))
        start = 0
        for me in range(world):
            offset = sum(int(mw.lookup_case(world, t)[1][me]) for t in range(s))
            np.add.at(expected, lookup[start:start + counts[me]],
                      weights[me][offset:offset + counts[me]])
            start += counts[me]
        np.testing.assert_allclose(results[s]["gather_all_grad"], expected, rtol=1e-12)


def test_seed_matrix_form(collectives):
    world, results = collectives
    for me, result in enumerate(results):
        np.testing.assert_array_equal(result["lccl_a2a"], mw.expected_all_to_all(world, me, 0)[0])


def test_a_dead_worker_is_a_clear_error_not_a_hang():
    outcomes = _run_aborting("dead_worker", 2, RECOPS_COLLECTIVE_TIMEOUT=20)
    code, result, tail = outcomes[0]
    assert code == 0, tail
    assert str(result["error"]).startswith("UnavailableError"), result["error"]
    assert float(result["seconds"]) < 20
    assert outcomes[1][0] == 3  # the worker that died


def test_a_worker_that_never_joins_times_out():
    outcomes = _run_aborting("silent_worker", 2, RECOPS_COLLECTIVE_TIMEOUT=3)
    code, result, tail = outcomes[0]
    assert code == 0, tail
    assert str(result["error"]).startswith("DeadlineExceededError"), result["error"]
    assert 2.5 < float(result["seconds"]) < 30


def test_sharded_embedding_matches_one_table():
    sharded = _ok(_run("sharded", 2))
    # The same model in this process with one unsharded table.
    embedding, dense = mw.parity_model(recops_tf.layers.DynamicEmbedding(
        4, seed=11, initializer="uniform"))
    optimizer = recops_tf.optimizers.LazyAdam(0.05)
    batches = mw.sharded_batches()

    @tf.function
    def step(keys, labels):
        with tf.GradientTape() as tape:
            loss = mw.parity_loss(embedding, dense, keys, labels, 1.0 / keys.shape[0])
        variables = [embedding.gradient_anchor] + dense.trainable_variables
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    losses = np.array([float(step(tf.constant(k), tf.constant(y))) for k, y in batches])
    for result in sharded:
        np.testing.assert_allclose(result["losses"], losses, rtol=2e-4, atol=2e-5)
    assert losses[-10:].mean() < losses[:10].mean()  # it learns
    # Every key lives on one rank only: the shards add up to the one table.
    assert sum(int(r["table_size"]) for r in sharded) == int(embedding.table.size())


def test_all_to_all_under_multi_worker_mirrored_strategy():
    results = _ok(_run("strategy", 2))
    total = sum(mw.expected_all_to_all(2, me, 0)[0].sum() for me in range(2))
    for me, result in enumerate(results):
        expected = mw.expected_all_to_all(2, me, 0)[0]
        np.testing.assert_array_equal(result["received"], expected)
        np.testing.assert_array_equal(result["plain"], expected)
        assert float(result["total"]) == total  # the strategy's own all_reduce still works


# --- in-process checks (one rank) --------------------------------------------------------------

def test_single_rank_group_is_the_identity():
    group = dist.Group(0, 1)
    x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    received, counts = dist.all_to_all(x, [2], group=group)
    np.testing.assert_array_equal(received.numpy(), x.numpy())
    assert counts.numpy().tolist() == [2]
    out = dist.all_to_all_segment_sum(x, [2], [1, 1], 3, group=group)
    np.testing.assert_array_equal(out.numpy(), [[0, 0], [4, 6], [0, 0]])


@pytest.mark.parametrize("counts,message", [
    ([1, 1], "one count per rank"),
    ([-1], "must be >= 0"),
    ([3], "sum\\(send_counts\\) rows"),
])
def test_counts_are_checked(counts, message):
    group = dist.Group(0, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        dist.all_to_all(tf.ones([2, 2]), counts, group=group)


def test_restore_is_checked():
    group = dist.Group(0, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="restore must be < num_rows"):
        dist.all_to_all_segment_sum(tf.ones([2, 2]), [2], [0, 5], 3, group=group)
    with pytest.raises(tf.errors.InvalidArgumentError, match="one entry per received row"):
        dist.all_to_all_segment_sum(tf.ones([2, 2]), [2], [0], 3, group=group)


def test_matrix_must_count_elements_of_whole_rows():
    group = dist.Group(0, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="multiples of dim"):
        dist.lccl_all_to_all(tf.ones([2, 3]), [[5]], 3, group=group)


@pytest.mark.parametrize("bad,message", [
    (dict(rank=2, world_size=2), "rank must be in"),
    (dict(rank=0, world_size=1, timeout=0), "timeout must be > 0"),
])
def test_group_arguments_are_checked(bad, message):
    with pytest.raises(ValueError, match=message):
        dist.Group(**bad)


def test_seed_forms_on_one_rank():
    group = dist.Group(0, 1)
    table = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    got = dist.lccl_gather_all(table, [2, 0], [[4]], 2, group=group)
    np.testing.assert_array_equal(got.numpy(), [[5, 6], [1, 2]])
    out = dist.lccl_all_uss(table, [[6]], [1, 1, 0], 2, 2, group=group)
    np.testing.assert_array_equal(out.numpy(), [[5, 6], [4, 6]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[rank_size, rank_size\]"):
        dist.lccl_all_to_all(table, [[6, 0]], 2, group=group)


def test_sharded_embedding_on_one_rank_is_a_dynamic_embedding():
    group = dist.Group(0, 1)
    sharded = dist.ShardedEmbedding(3, group=group, seed=5)
    plain = recops_tf.layers.DynamicEmbedding(3, seed=5)
    keys = tf.ragged.constant([[4, 9, 4], [], [7]], tf.int64)
    np.testing.assert_array_equal(sharded(keys, training=True).flat_values.numpy(),
                                  plain(keys, training=True).flat_values.numpy())
