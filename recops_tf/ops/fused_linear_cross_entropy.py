"""Softmax cross-entropy over a whole item matrix without the logits matrix (stem
fused_linear_cross_entropy)."""
import math

import numpy as np
import tensorflow as tf

from recops_tf.ops._common import (check_kernel, describe, index_tensor, lib, value_tensors,
                                   zeros_if_none)
from recops_tf.reference import fused_linear_cross_entropy as reference

_FN = "fused_linear_cross_entropy"
_DTYPES = (tf.float32, tf.bfloat16, tf.float64)
# The largest catalogue for which ``gradients_in_forward`` takes the one-pass op, by the
# states' dtype: the kernel's PanelMaxItems (kernels/fused_linear_cross_entropy.cc), past which
# its panels spill from the caches and the forward then the backward is the faster form.
PANEL_MAX_ITEMS = {tf.float32: 50_000, tf.float64: 50_000, tf.bfloat16: 30_000}


def _extra_parts(extra_logits, dtype):
    """(positions, items, values) of ``extra_logits``: a ``tf.SparseTensor`` ``[P, N]`` or a
    (positions, items, values) triple; None gives empty ones."""
    if extra_logits is None:
        return (tf.zeros([0], tf.int64), tf.zeros([0], tf.int64), tf.zeros([0], dtype))
    if isinstance(extra_logits, tf.SparseTensor):
        positions, items = extra_logits.indices[:, 0], extra_logits.indices[:, 1]
        values = extra_logits.values
    else:
        try:
            positions, items, values = extra_logits
        except (TypeError, ValueError):
            raise TypeError(f"{_FN}: extra_logits must be a tf.SparseTensor [P, N] or a "
                            "(positions, items, values) triple") from None
    positions = tf.cast(index_tensor(positions, "extra_logits positions"), tf.int64)
    items = tf.cast(index_tensor(items, "extra_logits items"), tf.int64)
    values, = value_tensors(_FN, dtypes=_DTYPES, dtype_hint=dtype, extra_values=values)
    if values.dtype != dtype:
        raise TypeError(f"{_FN}: extra_logits values are {values.dtype.name} but states are "
                        f"{dtype.name}; they must have the same dtype")
    for name, t in (("positions", positions), ("items", items), ("values", values)):
        if t.shape.rank is not None and t.shape.rank != 1:
            raise ValueError(f"{_FN}: extra_logits {name} must be a vector [K], got "
                             f"{describe(t)}")
    return positions, items, values


def fused_linear_cross_entropy(states, items, targets, *, temperature=1.0, normalize=False,
                               bias=None, extra_logits=None, label_smoothing=0.0,
                               weights=None, return_lse=False, name=None, kernel="fused",
                               gradients_in_forward=False):
    """Softmax cross-entropy of each position's target among all ``N`` items, fused with the
    ``states · itemsᵀ`` product: the ``[P, N]`` logits are never held in memory.

    Definition, per position p (row of ``states``) and item j (row of ``items``)::

        z_pj  = <s_p, e_j> / temperature + bias_j + extra_pj
        lse_p = log sum_j exp(z_pj)
        loss_p = weight_p * ((1 - label_smoothing) (lse_p - z_{p, targets_p})
                             + label_smoothing (lse_p - mean_j z_pj))

    with ``s``, ``e`` l2-normalised first when ``normalize``. With every option at its default,
    ``loss_p = logsumexp_j(<s_p, e_j>) - <s_p, e_{targets_p}>``, the same as
    ``tf.nn.sparse_softmax_cross_entropy_with_logits(targets, states @ items.T)``.

    The kernel walks tiles of 256 items x 64 positions: one GEMM per tile, an online
    logsumexp in the forward; the backward recomputes each tile, forms the softmax's gradient
    there and multiplies it straight into ``d states`` and ``d items`` (Cut Cross-Entropy's
    scheme). Memory is ``O((P + N) d)``, not ``O(P N)``: a million-item catalogue trains where
    the stock composite (``kernel="reference"``) runs out of memory. Threads take blocks of
    items. float32 runs on the register-blocked float GEMM; bfloat16 multiplies exactly on
    AMX tiles or AVX512-BF16 where the CPU has them (float32 sums; the softmax gradient is
    rounded to bfloat16 before its two GEMMs); float64 is the oracle.

    Args:
      states: ``[P, d]`` float32, bfloat16 or float64, or a ``tf.RaggedTensor [B, (L), d]``
        (its flat values are the positions; the results are then ragged ``[B, (L)]``).
      items: ``[N, d]`` (a tensor or variable of the same dtype; for a growing table, its rows
        by id).
      targets: ``[P]`` int32 / int64 rows of ``items`` (ragged ``[B, (L)]`` with ragged
        states), each in ``[0, N)``.
      temperature: positive float dividing ``<s, e>``.
      normalize: l2-normalise the states and items first (as ``tf.math.l2_normalize`` with
        epsilon 1e-12): the states by TensorFlow, the items inside the kernel, block by block
        (no normalised ``[N, d]`` copy, nor its gradient's; bfloat16 items are rounded to
        bfloat16 again after normalising).
      bias: optional ``[N]`` per-item logit bias.
      extra_logits: optional sparse logits added to ``z``: a ``tf.SparseTensor`` ``[P, N]`` or
        a ``(positions, items, values)`` triple of ``[K]`` vectors (duplicates are summed). A
        value of ``-inf`` removes the item from that position's softmax.
      label_smoothing: in ``[0, 1)``; the label is ``(1 - ls) onehot + ls / N``.
      weights: optional ``[P]`` per-position weights (a mask when 0 / 1). Positions of weight
        0 are skipped (loss and lse 0, no gradient). Not differentiated.
      return_lse: also return ``lse`` ``[P]``.
      kernel: ``"fused"`` or ``"reference"`` (the stock-TF composite with the ``[P, N]``
        logits, the same arguments and checks, differentiated by TensorFlow).
      gradients_in_forward: for a training step whose loss is the sum or the mean of ``loss``
        (``lse`` unused): the forward also makes the gradients for a unit upstream gradient,
        in one pass over the logits (``FusedLinearCrossEntropyWithGrad``: per block of 64
        positions the logits over the whole catalogue are made and exp'd once, three products
        instead of the four of forward + backward at 12,000 items: 10-20% less time for the
        float32 loss, about 25% for bfloat16 on bfloat16 dot products; bfloat16 without them
        runs forward then backward), and the backward scales them by the upstream
        gradient. Exact for any upstream: where ``dloss`` is not one value or ``lse`` has a
        gradient, the backward runs as without it. Costs ``threads x N x (4 x 64 + d)``
        values of memory in the forward (past ``RECOPS_FLCE_PANEL_MB``, default 256, it runs
        forward then backward; past ``PANEL_MAX_ITEMS`` items, 50,000 (30,000 for bfloat16),
        where the panels spill from the caches and one pass is no longer faster, the plain op
        is called) and the gradients' memory from the forward on: leave it off where no
        gradient is taken.
      name: optional op name.

    Returns:
      ``loss`` ``[P]`` (float32 for float32 / bfloat16 inputs, float64 for float64), or
      ``(loss, lse)`` with ``return_lse``; ragged ``[B, (L)]`` for ragged states.

    Gradient: w.r.t. ``states``, ``items``, ``bias`` and the extra logits' values
    (``FusedLinearCrossEntropyGrad``: the logits recomputed tile by tile, from the upstream
    gradients of ``loss`` and ``lse``). ``targets``, ``weights`` and the extra logits' indices
    get none. Second order: not implemented (raises).

    Raises:
      InvalidArgumentError: a target or an extra logit's position / item out of range, items
        with another ``d`` or no rows, ``bias`` not ``[N]``, ``weights`` not ``[P]``, the
        extra logits' vectors of different lengths.
      TypeError: states not float32 / bfloat16 / float64, the others of another dtype, index
        arguments not int32 / int64.
      ValueError: ``temperature <= 0``, ``label_smoothing`` outside ``[0, 1)``, wrong static
        ranks, ragged ``states`` with dense ``targets``.

    Example:

    >>> s = tf.constant([[1., 0.], [0., 1.]])
    >>> e = tf.constant([[1., 0.], [0., 1.], [1., 1.]])
    >>> loss = fused_linear_cross_entropy(s, e, [0, 2])
    >>> logits = tf.matmul(s, e, transpose_b=True)
    >>> ref = tf.nn.sparse_softmax_cross_entropy_with_logits([0, 2], logits)
    >>> bool(tf.reduce_max(tf.abs(loss - ref)) < 1e-6)
    True
    """
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
            and temperature > 0):
        raise ValueError(f"{_FN}: temperature must be a positive finite number, got "
                         f"{temperature!r}")
    if not (isinstance(label_smoothing, (int, float)) and 0.0 <= label_smoothing < 1.0):
        raise ValueError(f"{_FN}: label_smoothing must be in [0, 1), got {label_smoothing!r}")
    use_fused = check_kernel(kernel, _FN)
    with tf.name_scope(name or _FN):
        rebuild = lambda t: t
        if isinstance(states, tf.RaggedTensor):
            if not isinstance(targets, tf.RaggedTensor):
                raise ValueError(f"{_FN}: ragged states need ragged targets [B, (L)], got "
                                 f"{describe(targets)}")
            if states.ragged_rank != 1 or targets.ragged_rank != 1:
                raise ValueError(f"{_FN}: states must be [B, (L), d] and targets [B, (L)] with "
                                 f"one ragged axis, got {describe(states)} and "
                                 f"{describe(targets)}")
            splits = states.row_splits
            rebuild = lambda t: tf.RaggedTensor.from_row_splits(t, splits, validate=False)
            states, targets = states.flat_values, targets.flat_values
        elif isinstance(targets, tf.RaggedTensor):
            raise ValueError(f"{_FN}: ragged targets need ragged states [B, (L), d]")
        states, items, bias, weights = value_tensors(_FN, dtypes=_DTYPES, states=states,
                                                     items=items, bias=bias, weights=weights)
        targets = index_tensor(targets, "targets")
        for arg, t, rank in (("states", states, 2), ("items", items, 2), ("targets", targets, 1),
                             ("bias", bias, 1), ("weights", weights, 1)):
            if t is not None and t.shape.rank is not None and t.shape.rank != rank:
                raise ValueError(f"{_FN}: {arg} must have rank {rank}, got {describe(t)}")
        positions, extra_items, values = _extra_parts(extra_logits, states.dtype)
        if normalize:
            states = tf.math.l2_normalize(states, axis=-1, epsilon=1e-12)
            if not use_fused:  # the kernel normalises the items block by block
                items = tf.math.l2_normalize(items, axis=-1, epsilon=1e-12)
        if not use_fused:
            args = reference.checked(states, items, targets, bias, positions, extra_items,
                                     values, weights)
            # The op's attributes are float32: the reference uses the same rounded values.
            loss, lse = reference.fused_linear_cross_entropy(
                *args, temperature=float(np.float32(temperature)),
                label_smoothing=float(np.float32(label_smoothing)))
        else:
            positions = tf.cast(positions, targets.dtype)
            extra_items = tf.cast(extra_items, targets.dtype)
            empty = tf.zeros([0], states.dtype)
            # Past PANEL_MAX_ITEMS the kernel would run forward then backward anyway: the plain
            # op then spares the unit gradients (an [N, d] float tensor held to the backward)
            # and their scaling pass (14% of the step at 1,000,000 items).
            one_pass = gradients_in_forward and not (
                items.shape[0] is not None and items.shape[0] > PANEL_MAX_ITEMS[states.dtype])
            op = (lib().recops_fused_linear_cross_entropy_with_grad if one_pass
                  else lib().recops_fused_linear_cross_entropy)
            loss, lse = op(
                states, items, targets, empty if bias is None else bias, positions, extra_items,
                values, empty if weights is None else weights,
                Tout=tf.float64 if states.dtype == tf.float64 else tf.float32,
                temperature=float(temperature), label_smoothing=float(label_smoothing),
                normalize_items=bool(normalize))[:2]
        loss, lse = rebuild(loss), rebuild(lse)
        return (loss, lse) if return_lse else loss


@tf.RegisterGradient("Recops>FusedLinearCrossEntropy")
def _fused_linear_cross_entropy_grad(op, dloss, dlse):
    lse = op.outputs[1]
    dloss, dlse = zeros_if_none(dloss, lse), zeros_if_none(dlse, lse)
    dstates, ditems, dbias, dvalues = lib().recops_fused_linear_cross_entropy_grad(
        dloss, dlse, *op.inputs, lse, temperature=op.get_attr("temperature"),
        label_smoothing=op.get_attr("label_smoothing"),
        normalize_items=op.get_attr("normalize_items"))
    return [dstates, ditems, None, dbias, None, None, dvalues, None]


@tf.RegisterGradient("Recops>FusedLinearCrossEntropyWithGrad")
def _fused_linear_cross_entropy_with_grad_grad(op, dloss, dlse, *unused):
    lse = op.outputs[1]
    dloss, dlse = zeros_if_none(dloss, lse), zeros_if_none(dlse, lse)
    dstates, ditems, dbias, dvalues = lib().recops_fused_linear_cross_entropy_apply_grad(
        dloss, dlse, *op.outputs[2:], *op.inputs, lse, temperature=op.get_attr("temperature"),
        label_smoothing=op.get_attr("label_smoothing"),
        normalize_items=op.get_attr("normalize_items"))
    return [dstates, ditems, None, dbias, None, None, dvalues, None]


@tf.RegisterGradient("Recops>FusedLinearCrossEntropyGrad")
@tf.RegisterGradient("Recops>FusedLinearCrossEntropyApplyGrad")
def _fused_linear_cross_entropy_grad_grad(op, *grads):
    raise NotImplementedError("second-order gradients of fused_linear_cross_entropy are not "
                              "implemented")
