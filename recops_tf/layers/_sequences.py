"""Input handling shared by the sequence layers: a ``[B, (L), D]`` batch as jagged rows.

A layer accepts a ``tf.RaggedTensor`` ``[B, (L), D]`` (one ragged axis), a dense ``[B, S, D]``
whose rows all have length S, or a padded dense ``[B, S, D]`` with its ``lengths`` ``[B]``. A
dense input whose S is unknown while the layer is traced, given without lengths, is refused:
that is what a padded batch looks like, and what Keras' ``model.export()`` turns a ragged
``keras.Input`` into; read as full rows, its padding would be attended as tokens.
"""
import tensorflow as tf

from recops_tf.ops._common import describe, index_tensor

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


class Sequences:
    """A layer input as jagged ``rows`` ``[T, D]`` and ``splits`` ``[B + 1]``; ``output``
    turns result rows back into the input's kind (ragged, dense, or padded with zeros)."""

    def __init__(self, layer, inputs, lengths=None, feature="d_model"):
        name = type(layer).__name__
        if isinstance(inputs, tf.RaggedTensor) and lengths is not None:
            raise ValueError(f"{name}: lengths are for a padded dense input; a "
                             "tf.RaggedTensor carries its own")
        inputs = check_input(layer, inputs, padding_known=lengths is not None, feature=feature)
        self._lengths = None
        if isinstance(inputs, tf.RaggedTensor):
            self.rows, self.splits = inputs.values, inputs.row_splits
            self._shape = None
            return
        self._shape = tf.shape(inputs, out_type=tf.int64)
        self._static = inputs.shape[:2]
        if lengths is None:
            self.rows = tf.reshape(inputs, [-1, inputs.shape[-1]])
            self.splits = tf.range(self._shape[0] + 1) * self._shape[1]
            return
        lengths = tf.cast(index_tensor(lengths, "lengths"), tf.int64)
        checks = [
            tf.debugging.assert_equal(tf.size(lengths, out_type=tf.int64), self._shape[0],
                                      message=f"{name}: lengths must have one entry per row "
                                      "of the batch"),
            tf.debugging.assert_non_negative(lengths, message=f"{name}: lengths must be >= 0"),
            tf.debugging.assert_less_equal(lengths, self._shape[1],
                                           message=f"{name}: lengths must be <= S, the padded "
                                           "input's sequence axis")]
        with tf.control_dependencies(checks):
            self._lengths = tf.identity(lengths)
        ragged = tf.RaggedTensor.from_tensor(inputs, lengths=self._lengths)
        self.rows, self.splits = ragged.values, ragged.row_splits

    def rows_of(self, x):
        """A per-token companion (``[B, (L)]`` ragged or ``[B, S]`` dense, e.g. timestamps) as
        ``[T]``, in the rows' order."""
        if x is None:
            return None
        if isinstance(x, tf.RaggedTensor):
            return x.values
        if self._lengths is not None:
            return tf.RaggedTensor.from_tensor(x, lengths=self._lengths).values
        return tf.reshape(x, [-1])

    def output(self, rows):
        """Result rows ``[T, W]`` in the input's kind: ``[B, (L), W]`` or ``[B, S, W]``."""
        ragged = tf.RaggedTensor.from_row_splits(rows, self.splits, validate=False)
        if self._shape is None:
            return ragged
        shape = tf.concat([self._shape[:2], tf.shape(rows, out_type=tf.int64)[1:]], 0)
        out = (tf.reshape(rows, shape) if self._lengths is None
               else ragged.to_tensor(shape=shape))
        out.set_shape(self._static.concatenate(rows.shape[1:]))
        return out
