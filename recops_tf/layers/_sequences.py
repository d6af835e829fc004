"""Input handling shared by the sequence layers: a ``[B, (L), D]`` batch as jagged rows.

A layer accepts a ``tf.RaggedTensor`` ``[B, (L), D]`` (one ragged axis), a dense ``[B, S, D]``
whose rows all have length S, or a padded dense ``[B, S, D]`` with its ``lengths`` ``[B]``. A
dense input whose S is unknown while the layer is traced, given without lengths, is refused:
that is what a padded batch looks like, and what Keras' ``model.export()`` turns a ragged
``keras.Input`` into; read as full rows, its padding would be attended as tokens.
"""
import tensorflow as tf

from recops_tf.ops._common import JaggedBatch, describe

try:  # Keras' shape inference (compute_output_spec) traces call() on dense placeholders
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope
except ImportError:  # pragma: no cover - another Keras layout: no exemption
    def in_symbolic_scope():
        return False


def check_input(layer, inputs, *, padding_known=False, feature="d_model",
                remedy="or the padded tensor with lengths=[B] row lengths"):
    """``inputs`` (converted to a tensor when dense) after the checks of this module.

    ``padding_known``: the caller was given the padding (lengths or a mask), so a dense
    input of unknown length is fine. Raises ``ValueError`` naming what was passed."""
    name = type(layer).__name__
    expected = (f"a tf.RaggedTensor [B, (L), {feature}] (one ragged axis) or a dense "
                f"[B, S, {feature}] tensor")
    if isinstance(inputs, tf.RaggedTensor):
        if inputs.ragged_rank != 1 or inputs.shape.rank != 3:
            raise ValueError(f"{name} expects {expected}, got {describe(inputs)}")
        return inputs
    inputs = tf.convert_to_tensor(inputs)
    if inputs.shape.rank != 3:
        hint = (": a batch of sequences needs its sequence axis (one sequence: x[None])"
                if inputs.shape.rank == 2 else "")
        raise ValueError(f"{name} expects {expected}, got {describe(inputs)}{hint}")
    if inputs.shape[1] is None and not padding_known and not in_symbolic_scope():
        raise ValueError(
            f"{name} got {describe(inputs)} whose sequence length is unknown while tracing: "
            "if its rows are padded, the padding would be attended as tokens. Pass a "
            f"tf.RaggedTensor [B, (L), {feature}], {remedy}. (Keras' model.export() gives a "
            "model on a ragged keras.Input dense inputs like this one: export it with "
            "recops_tf.saving.export.)")
    return inputs


def sequences(layer, inputs, lengths=None, feature="d_model"):
    """A layer input, after ``check_input``'s checks, as a ``JaggedBatch``: jagged ``rows``
    ``[T, D]``, ``offsets`` ``[B + 1]``, and ``output`` / ``rows_of`` for the input's kind. The
    layers hand ``rows`` and ``offsets`` to the ops (jagged): the batch is converted once."""
    inputs = check_input(layer, inputs, padding_known=lengths is not None, feature=feature)
    return JaggedBatch(inputs, lengths, fn=type(layer).__name__)
