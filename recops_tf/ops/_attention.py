"""Argument helpers of the two attention stems (hstu_dense, hstu_dense_fuxi): mask types,
sequence-length attributes and the static checks of q, k, v layouts (kept out of ``_common``,
which every op module imports, so that it stays free of one family's rules)."""
import collections
import numbers

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


class GRMask(collections.namedtuple(
        "GRMask", ("max_attn_len", "contextual_seq_len", "min_full_attn_seq_len"),
        defaults=(0, 0, 0))):
    """generative-recommenders' (GR's) mask rules for ``hstu_attention(gr_mask=...)``: the
    arguments of GR's ``hstu_mha`` of the same names (``mask_type`` "causal" / "none" is GR's
    ``causal``; ``num_target`` is GR's ``num_targets``).

    Per sequence of length ``n`` with ``c = contextual_seq_len`` and ``T`` targets, position
    ``p`` gets the id ``min(max(p - c + 1, 0) if c > 0 else p, M)`` with
    ``M = n - max(c - 1, 0) - T``: the context shares id 0 and every target gets id ``M``.
    With ``d = id(i) - id(j)`` (``|d|`` when not causal), query ``i`` sees key ``j`` if
    ``i == j`` or ``d > 0``; ``max_attn_len = m > 0`` keeps only ``d <= m``, except on rows
    with ``id(i) >= M - min_full_attn_seq_len`` (when that is positive); with ``c > 0``, rows
    of id 0 also see every key of id ``< M``.
    """
    __slots__ = ()

    @classmethod
    def of(cls, value, owner="gr_mask."):
        """A GRMask from a GRMask, a dict of its fields (a Keras config) or None (None);
        ``owner`` prefixes the field in error messages."""
        if value is None:
            return None
        if isinstance(value, dict):
            unknown = set(value) - set(cls._fields)
            if unknown:
                raise ValueError(f"gr_mask: unknown keys {sorted(unknown)}; expected some of "
                                 f"{list(cls._fields)}")
            value = cls(**value)
        elif not isinstance(value, cls):
            raise TypeError(f"gr_mask must be a GRMask, a dict or None, got {describe(value)}")
        for field in cls._fields:
            n = getattr(value, field)
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
                raise ValueError(f"{owner}{field} must be an int >= 0, got {n!r}")
        return cls(*(int(getattr(value, f)) for f in cls._fields))

    def attrs(self):
        """The op attributes of these rules."""
        return dict(mask_rules="gr", **self._asdict())


def gr_mask_args(fn, gr_mask, mask_type, num_context, target_group_size, window_size):
    """``gr_mask`` as a GRMask (or None), refusing the Rec SDK mask options it replaces."""
    gr_mask = GRMask.of(gr_mask)
    if gr_mask is None:
        return None
    if mask_type not in ("causal", "none"):
        raise ValueError(f"{fn}: gr_mask needs mask_type 'causal' or 'none', got {mask_type!r}")
    for given, what, instead in ((num_context is not None, "num_context",
                                  "gr_mask.contextual_seq_len"),
                                 (bool(target_group_size), "target_group_size", None),
                                 (window_size is not None, "window_size",
                                  "gr_mask.max_attn_len")):
        if given:
            hint = f" (use {instead})" if instead else ""
            raise ValueError(f"{fn}: {what} is a Rec SDK mask option and cannot be combined "
                             f"with gr_mask{hint}")
    return gr_mask
