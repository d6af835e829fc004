"""Calls every op of the library once on tiny inputs (forward and gradient), checks each
against its reference and returns the names of the ops that ran.

Used by the Bazel build's test (on the Bazel-built .so) and by the test suite.
"""
import tensorflow as tf

from recops_tf import _loader, _ops_table
from recops_tf.testing import (assert_close, assert_gradients_match_reference,
                               assert_matches_reference, tape_gradients)
from recops_tf.testing.inputs import upstream_like
from recops_tf.testing import cases


def _ops_in(concrete_fn):
    return {op.type for op in concrete_fn.graph.get_operations()
            if op.type.startswith(_loader.OP_PREFIX)}


def _fwd_bwd(case, upstream):
    @tf.function
    def fwd_bwd(*args):
        return case.fused(*args), tape_gradients(case.fused, list(args), case.diff, upstream)

    return fwd_bwd


def _run_stateful(row, case):
    """One traced fused step and one reference step, then their states (or outputs) compared;
    returns the library ops the traced functions used."""
    concrete = tf.function(case.fused).get_concrete_function(*case.args)
    out = concrete(*case.args)
    expected = case.reference(*case.args)
    if case.state is None:
        assert_close(out, expected, tf.float32, what=row.stem)
    else:
        for fused, reference in zip(*case.state()):
            assert_close(tf.convert_to_tensor(fused), tf.convert_to_tensor(reference),
                         tf.float32, what=f"{row.stem} state")
    seen = _ops_in(concrete)
    if case.auxiliary is not None:
        auxiliary = tf.function(case.auxiliary).get_concrete_function()
        auxiliary()
        seen |= _ops_in(auxiliary)
    return seen


def run_all():
    seen = set()
    for row in _ops_table.OPS:
        for shape in row.bench["tiny"]:
            case = cases.build(row.stem, shape)
            if row.stateful:
                seen |= _run_stateful(row, case)
                continue
            assert_matches_reference(case.fused, case.reference, case.args, tf.float32)
            assert_gradients_match_reference(case.fused, case.reference, case.args, case.diff,
                                             tf.float32)
            upstream = upstream_like(case.fused(*case.args), tf.float32)

            concrete = _fwd_bwd(case, upstream).get_concrete_function(*case.args)
            out, _ = concrete(*case.args)
            assert_close(out, case.reference(*case.args), tf.float32, what=row.stem)
            seen |= _ops_in(concrete)
            if case.auxiliary is not None:  # the stem's other ops (another form of the op)
                auxiliary = tf.function(case.auxiliary).get_concrete_function()
                auxiliary()
                seen |= _ops_in(auxiliary)
    return sorted(seen)
