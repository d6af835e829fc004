"""Trace-time argument checks shared by every public op function (one helper in
``recops_tf.ops._common``): a value dtype the kernels are not registered for, or two inputs of
different dtypes, is a ``TypeError`` naming the argument, raised before any op is built (no
NodeDef dump, no tensor contents), the same eagerly and inside ``tf.function``."""
import pytest
import tensorflow as tf

import recops_tf

FLOATS = "float32, float16, bfloat16 or float64"


def t(dtype, shape=(2, 2)):
    return tf.ones(shape, dtype)


def idx(values=(0, 1)):
    return tf.constant(values, tf.int64)


# function name -> (first value argument, second one or None, call(first dtype, second dtype))
CASES = {
    "concat_jagged_tensor": ("values_a", "values_b", lambda a, b: recops_tf.concat_jagged_tensor(
        t(a), idx((0, 2)), t(b), idx((0, 2)))),
    "split_jagged_tensor": ("values", None, lambda a, b: recops_tf.split_jagged_tensor(
        t(a), idx((0, 1)), idx((0, 1)))),
    "gather_for_rank1": ("x", None, lambda a, b: recops_tf.gather_for_rank1(t(a, [3]), idx())),
    "index_select_for_rank1_backward": ("x", "grad_y", lambda a, b:
                                        recops_tf.index_select_for_rank1_backward(
                                            t(b, [2]), t(a, [3]), idx())),
    "reverse_sequence": ("x", None, lambda a, b: recops_tf.reverse_sequence(t(a, [2, 2, 1]),
                                                                             idx((1, 2)))),
    "multislice_concat": ("x", None, lambda a, b: recops_tf.multislice_concat(
        t(a), [1], [0], [1])),
    "hstu_attention": ("q", "k", lambda a, b: recops_tf.hstu_attention(
        t(a, [2, 1, 2]), t(b, [2, 1, 2]), t(b, [2, 1, 2]), seq_offsets=idx((0, 2)),
        max_seq_len=2)),
    "hstu_attention_paged": ("q", "k", lambda a, b: recops_tf.hstu_attention_paged(
        t(a, [1, 1, 2]), t(b, [1, 1, 2]), t(b, [1, 1, 2]), t(b, [1, 2, 2, 1, 2]),
        seq_offsets=[0, 1], page_offsets=[0, 1], page_ids=[0], last_page_len=[1],
        num_target=[1], max_seq_len=2, max_seq_len_k=2)),
    "hstu_attention_fuxi": ("q", "k", lambda a, b: recops_tf.hstu_attention_fuxi(
        t(a, [2, 1, 2]), t(b, [2, 1, 2]), t(b, [2, 1, 2]), seq_offsets=idx((0, 2)),
        max_seq_len=2)),
    "disentangle_attention": ("query", "key", lambda a, b: recops_tf.disentangle_attention(
        t(a, [1, 1, 2, 2]), t(b, [1, 1, 2, 2]), t(b, [1, 1, 2, 2]), t(b, [4, 1, 2]),
        t(b, [4, 1, 2]), tf.zeros([2, 2], tf.int64))),
    "in_linear_silu": ("x", "weight", lambda a, b: recops_tf.in_linear_silu(
        t(a), t(b, [4, 2]), t(b, [4]), [1, 1, 1, 1])),
    "ln_mul": ("x", "u", lambda a, b: recops_tf.ln_mul(t(a), t(b), [1., 1.], [0., 0.])),
    "norm_multiply_dropout": ("x", "u", lambda a, b: recops_tf.norm_multiply_dropout(
        t(a), t(b), [1., 1.], [0., 0.])),
    "token_mixing": ("x", "gamma", lambda a, b: recops_tf.token_mixing(
        t(a, [1, 2, 2]), t(b, [2]), [0., 0.])),
    "relative_attn_bias_time": ("weights", None, lambda a, b: recops_tf.relative_attn_bias_time(
        tf.zeros([1, 2], tf.int64), t(a, [1, 3]))),
    "relative_attn_bias_backward": ("grad", None, lambda a, b:
                                    recops_tf.relative_attn_bias_backward(
                                        t(a, [1, 1, 4, 4]), tf.zeros([1, 2, 2], tf.int32), 3)),
    "relative_attn_bias_pos": ("rel_pos_bias", "identity", lambda a, b:
                               recops_tf.relative_attn_bias_pos(t(a), t(b), idx((1, 1)))),
}
ALLOWS_INTS = {"concat_jagged_tensor": "float32, float16, bfloat16, float64, int32 or int64",
               "split_jagged_tensor": "float32, float16, bfloat16, float64, int32 or int64",
               "reverse_sequence": "float32, float16, bfloat16, float64 or int64"}
MODES = ("eager", "tf.function")


def run(fn, mode):
    return fn() if mode == "eager" else tf.function(fn)()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", CASES)
def test_unsupported_dtype_names_the_argument(name, mode):
    first, _, call = CASES[name]
    bad = tf.uint8 if name in ALLOWS_INTS else tf.int32
    with pytest.raises(TypeError, match=rf"{name}: {first} must be "
                       rf"{ALLOWS_INTS.get(name, FLOATS)}, got {bad.name}"):
        run(lambda: call(bad, bad), mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[1]])
def test_mixed_dtypes_name_both_arguments(name, mode):
    first, second, call = CASES[name]
    with pytest.raises(TypeError, match=rf"{name}: {second} is float32 but {first} is float64; "
                       "they must have the same dtype"):
        run(lambda: call(tf.float64, tf.float32), mode)


@pytest.mark.parametrize("name", CASES)
def test_the_cases_are_valid_calls(name):
    # The calls above differ from a working call only in the dtypes they are given.
    CASES[name][2](tf.float32, tf.float32)


def test_python_values_take_the_first_tensors_dtype():
    out = recops_tf.ln_mul(t(tf.float64), [[2., 2.], [2., 2.]], [1., 1.], [0., 0.])
    assert out.dtype == tf.float64
