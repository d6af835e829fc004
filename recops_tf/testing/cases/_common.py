"""What the case builders share: the ``Case`` record, offsets and byte counts, the arguments
of ln_mul and norm_multiply_dropout, and stateful steps."""
import dataclasses
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from recops_tf.testing.inputs import random_values, upstream_like


@dataclasses.dataclass
class Case:
    label: str
    fused: Callable
    reference: Callable
    args: Sequence
    diff: Sequence[int]  # indices of differentiable args
    bytes_forward: int  # bytes read + written by the forward (memory-bound ops)
    bytes_backward: int  # bytes read + written by the backward
    flops_forward: int = 0
    flops_backward: int = 0
    # The benchmark's baseline when it is not the reference (e.g. dropout: the natural stock-TF
    # composite draws its own mask, so it cannot be the oracle of the kernel's mask).
    baseline: Callable = None
    # Stateful stems (tables, optimizer steps): `state()` returns (fused state, reference state),
    # lists of tensors to compare after fused and reference ran once each (None: compare the
    # outputs); `auxiliary` is a no-argument function using the stem's remaining ops (the
    # smoke test traces and runs it).
    state: Callable = None
    auxiliary: Callable = None
    # "memory" or "compute" where this case is bound otherwise than its stem's row says (the
    # paged KV-cache forward: a decode step reads the whole cache for a few queries).
    bound: str = None
    # The dtype of the outputs (and so of the upstream gradients) where it is not the first
    # differentiable argument's (fused_linear_cross_entropy: a float32 loss of bfloat16 inputs).
    upstream_dtype: object = None

    @property
    def benchmark_baseline(self):
        return self.baseline if self.baseline is not None else self.reference

    def upstream(self):
        """The fixed upstream gradients of a differentiable case's forward+backward: random,
        one per output of `fused`, in the dtype of the first differentiable argument (or
        `upstream_dtype`)."""
        dtype = self.upstream_dtype or self.args[self.diff[0]].dtype
        return upstream_like(self.fused(*self.args), dtype)


def row_offsets(lengths, dtype):
    return tf.constant(np.concatenate([[0], np.cumsum(lengths)]), dtype=dtype)


def tensor_bytes(*tensors):
    return sum(int(np.prod(t.shape)) * t.dtype.size for t in tensors)


def norm_mul_args(rows, cols, dtype, seed):
    x = random_values([rows, cols], dtype, seed, low=-2.0, high=3.0)
    return [x, random_values([rows, cols], dtype, seed + 1),
            random_values([cols], dtype, seed + 2), random_values([cols], dtype, seed + 3)]


def as_step(fn):
    """fn run for its effect: the case callable returns nothing (an op is not a tf.function
    output), and a tf.function still runs it (stateful ops always run)."""
    def run(*args):
        fn(*args)

    return run


def touched_bytes(ids, dim, arrays):
    unique = len(np.unique(ids))
    return len(ids) * (8 + 4 * dim) + unique * arrays * 2 * 4 * dim
