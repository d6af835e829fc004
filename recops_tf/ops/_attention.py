"""Argument helpers of the two attention stems (hstu_dense, hstu_dense_fuxi): mask types,
sequence-length attributes and the static checks of q, k, v layouts (kept out of ``_common``,
which every op module imports, so that it stays free of one family's rules)."""
import tensorflow as tf

from recops_tf.ops._common import describe, positive_int

MASK_TYPES = ("causal", "none", "custom")


def check_mask_type(mask_type):
    if mask_type in ("upper", "upper_triangular", "upper triangular", 1):
        raise ValueError("mask_type 'upper triangular' is not supported (as in Rec SDK); use "
                         "'causal', 'none' or 'custom'")
    if mask_type not in MASK_TYPES:
        raise ValueError(f"mask_type must be one of {MASK_TYPES}, got {mask_type!r}")


def mask_input(mask_type, mask, dtype, shape):
    """The op's mask input: the custom mask (required for 'custom', refused otherwise; already
    a tensor of the inputs' dtype), or an empty tensor."""
    if mask_type == "custom":
        if mask is None:
            raise ValueError(f"mask_type 'custom' needs a mask {shape}")
        return mask
    if mask is not None:
        raise ValueError(f"a mask was given but mask_type is {mask_type!r}; use 'custom'")
    return tf.zeros([0], dtype)


def static_dim(x, axis, what):
    dim = x.shape[axis]
    if dim is None:
        raise ValueError(f"{what} must be given when it cannot be read from a static shape")
    return max(int(dim), 1)


def seq_lens(fn, max_seq_len, max_seq_len_k=None):
    """``max_seq_len`` / ``max_seq_len_k`` checked (positive ints) where given."""
    return tuple(None if n is None else positive_int(n, what, fn)
                 for n, what in ((max_seq_len, "max_seq_len"),
                                 (max_seq_len_k, "max_seq_len_k")))


def ragged_heads(fn, **named):
    """(values, row_splits) of each ragged ``[B, (L), N, D]`` argument, in order: one ragged
    axis, then heads and head size (checked where the static shape shows them)."""
    out = []
    for name, x in named.items():
        if not isinstance(x, tf.RaggedTensor):
            raise TypeError(f"{fn}: with a ragged q, {name} must be a tf.RaggedTensor too, "
                            f"got {describe(x)}")
        rank = x.shape.rank
        if x.ragged_rank != 1 or rank not in (None, 4):
            hint = (f": add the heads axis, e.g. {name}.with_values(tf.reshape({name}.values, "
                    "[-1, num_heads, head_dim]))" if x.ragged_rank == 1 and rank == 3 else "")
            raise ValueError(f"{fn}: a ragged {name} must be [B, (L), N, D] (one ragged axis, "
                             f"then heads N and head size D), got {describe(x)}{hint}")
        out += [x.values, x.row_splits]
    return out


def check_layout(fn, jagged, **named):
    """Static ranks of dense arguments: ``[T, N, D]`` with offsets (jagged), else
    ``[B, S, N, D]``."""
    rank, layout = (3, "jagged [T, N, D] (with seq_offsets)") if jagged else (
        4, "dense [B, S, N, D] (or a tf.RaggedTensor [B, (L), N, D]) without seq_offsets")
    for name, x in named.items():
        if x.shape.rank not in (None, rank):
            raise ValueError(f"{fn}: {name} must be {layout}, got {describe(x)} (rank "
                             f"{x.shape.rank})")
