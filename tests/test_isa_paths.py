"""Every instruction-set path of the kernels on one machine: RECOPS_ISA forces a path (a lower
one, or AMX tiles, the default where the CPU has them; kernels/common/dispatch.h) in a child
process, and each path's outputs and gradients must match the float64 reference and the other
paths. A path this CPU lacks is skipped, naming the missing features."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

AVX512 = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd")
PATHS = {"baseline": (), "avx2": ("avx2", "fma"), "avx512": AVX512,
         "avx512bf16": AVX512 + ("avx512_bf16",),
         # The AMX path's code (GemmBf16's tile blocks) on tiles emulated in software.
         "amx_emulated": AVX512 + ("avx512_bf16",),
         "amx": AVX512 + ("avx512_bf16", "amx_tile", "amx_bf16")}

# A child process: the fused ops (float32 and bfloat16, forward and gradients) on fixed inputs,
# printed as JSON; the first line of stderr that names RECOPS_ISA tells the path taken.
CHILD = r"""
import json, sys
import numpy as np
import tensorflow as tf
import recops_tf as rt
from recops_tf.ops.ln_mul import ln_mul
from recops_tf.ops.norm_multiply_dropout import norm_multiply_dropout

# The same inputs for every dtype: random values rounded to bfloat16 (exact in all three).
rng, inputs = np.random.default_rng(5), {}
def draw(name, *shape):
    if name not in inputs:
        values = tf.constant(rng.uniform(-1, 1, shape))
        inputs[name] = tf.cast(tf.cast(values, tf.bfloat16), tf.float64).numpy()
    return inputs[name]
out = {}
for dtype in (tf.float32, tf.bfloat16, tf.float64):
    t = lambda name, *s: tf.constant(draw(name, *s), dtype)
    q = tf.RaggedTensor.from_row_lengths(t("q", 150, 2, 16), [70, 0, 80])
    # Head dimension 32: Q·Kᵀ and dO·Vᵀ then have 16 pairs of k, which the AMX tiles take; a
    # sequence of 140 has whole 64-row tiles off the diagonal (32 x 32 tile blocks).
    q32 = tf.RaggedTensor.from_row_lengths(t("q32", 150, 2, 32), [140, 10])
    ts = tf.RaggedTensor.from_row_lengths(tf.constant(np.arange(150) * 7, tf.int64), [70, 0, 80])
    x, u, w = t("x", 96, 40), t("u", 96, 40), t("w", 24, 40)
    tw, pw = t("tw", 16), t("pw", 2 * 80 - 1)
    flce_targets = tf.constant(np.arange(70) * 37 % 300, tf.int64)
    fns = {
        "hstu": lambda q: rt.hstu_attention(q, q, q, max_seq_len=80, timestamps=ts,
                                            time_bias_weights=tw,
                                            position_bias_weights=pw).flat_values,
        "fuxi": lambda q: rt.hstu_attention_fuxi(q, q, q, max_seq_len=80).flat_values,
        "hstu_d32": lambda q: rt.hstu_attention(q, q, q, max_seq_len=140).flat_values,
        "ln_mul": lambda x: ln_mul(x, u, tf.ones([40], dtype), tf.zeros([40], dtype)),
        "norm_multiply_dropout": lambda x: norm_multiply_dropout(
            x, u, tf.ones([40], dtype), tf.zeros([40], dtype), dropout_rate=0.2, seed=[3, 4]),
        "in_linear_silu": lambda x: tf.concat(rt.in_linear_silu(x, w, tf.zeros([24], dtype),
                                                                [6, 6, 6, 6]), 1),
        # s = 24, d = 40: GEMM tails on every path (2s = 48 position columns, k = 40).
        "disentangle": lambda x: rt.disentangle_attention(
            tf.reshape(x, [2, 2, 24, 40]), tf.reshape(u, [2, 2, 24, 40]),
            tf.reshape(x[::-1], [2, 2, 24, 40]), tf.reshape(u, [48, 2, 40]),
            tf.reshape(x, [48, 2, 40]), np.subtract.outer(np.arange(24), np.arange(24)) // 2)[0],
        "token_mixing": lambda x: rt.token_mixing(tf.reshape(x[:, :32], [12, 16, 16]),
                                                  tf.ones([16], dtype), tf.zeros([16], dtype)),
        # 70 positions x 300 items, d = 32 (16 pairs of k for the AMX tiles): a whole 256-item
        # x 64-position tile and tails of 44 items and 6 positions. se holds the states (rows
        # 0-69) then the items, so its gradient is dstates and ditems; loss and lse both
        # differentiated (dloss and dlse), with a bias and label smoothing.
        "flce": lambda se: tf.stack(rt.fused_linear_cross_entropy(
            se[:70], se[70:], flce_targets, bias=t("fb", 300), label_smoothing=0.1,
            return_lse=True)),
        # The one-pass gradients (gradients_in_forward): the loss's square root squared
        # gives every position the same upstream gradient, the case the forward's panels take.
        "flce_one_pass": lambda se: tf.sqrt(tf.reduce_sum(rt.fused_linear_cross_entropy(
            se[:70], se[70:], flce_targets, bias=t("fb", 300), label_smoothing=0.1,
            gradients_in_forward=True)))[None],
    }
    ragged = {"hstu": q, "fuxi": q, "hstu_d32": q32}
    # The inputs of the ops not fed x.
    dense = {"flce": t("se", 370, 32), "flce_one_pass": t("se", 370, 32)}
    for name, fn in fns.items():
        arg = ragged[name].flat_values if name in ragged else dense.get(name, x)
        with tf.GradientTape() as tape:
            tape.watch(arg)
            y = fn(ragged.get(name, dense.get(name, x)))
            loss = tf.reduce_sum(tf.cast(y, tf.float64) ** 2)
        g = tape.gradient(loss, arg)
        g = tf.convert_to_tensor(g)
        out[f"{name}/{dtype.name}"] = [tf.cast(y, tf.float64).numpy().tolist(),
                                       tf.cast(g, tf.float64).numpy().tolist()]
    # The paged KV-cache decode step (in place over the pages; forward only: no gradient).
    y = rt.hstu_attention_paged(
        t("pq", 4, 2, 16), t("pk", 4, 2, 16), t("pv", 4, 2, 16), t("cache", 5, 2, 32, 2, 16),
        seq_offsets=[0, 3, 4], page_offsets=[0, 3, 5], page_ids=[4, 0, 2, 1, 3],
        last_page_len=[10, 32], num_target=[1, 0], max_seq_len=4, max_seq_len_k=80)
    out[f"paged/{dtype.name}"] = [tf.cast(y, tf.float64).numpy().tolist(), []]
print(json.dumps(out))
"""


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _run(isa):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", RECOPS_ISA=isa)
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "RECOPS_ISA=" in line]
    return json.loads(proc.stdout.strip().splitlines()[-1]), said


@pytest.fixture(scope="module")
def results():
    flags, runs = _cpu_flags(), {}
    for path, needs in PATHS.items():
        missing = [f for f in needs if f not in flags]
        runs[path] = ("missing", missing) if missing else _run(path)
    return runs


@pytest.mark.parametrize("path", sorted(PATHS))
def test_forced_path_matches_the_float64_results(results, path):
    run = results[path]
    if run[0] == "missing":
        pytest.skip(f"the {path} path needs CPU features this CPU lacks: {', '.join(run[1])}")
    values, said = run
    if said and "did not grant" in said[0]:  # the CPU has AMX, the OS kernel refused its state
        pytest.skip(said[0])
    assert said and said[0].startswith(f"recops_tf: RECOPS_ISA={path}: {path} path"), said
    import tensorflow as tf

    from recops_tf import testing

    for key, (y, g) in values.items():
        name, dtype = key.split("/")
        if dtype == "float64":
            continue
        rtol, atol = testing.tolerance(tf.as_dtype(dtype), reduction=80)
        for mine, exact, what in ((y, values[f"{name}/float64"][0], "output"),
                                  (g, values[f"{name}/float64"][1], "gradient")):
            exact = np.array(exact)
            if exact.size == 0:  # a forward-only op's gradient
                continue
            scale = max(1.0, float(np.abs(exact).max()))
            np.testing.assert_allclose(np.array(mine), exact, rtol=rtol, atol=atol * scale,
                                       err_msg=f"{key} {what} on the {path} path")


def test_paths_agree_with_each_other(results):
    taken = {p: r[0] for p, r in results.items() if r[0] != "missing"}
    assert "baseline" in taken
    best = max((p for p in taken if p != "amx_emulated"), key=list(PATHS).index)
    for path, values in taken.items():
        for key, (y, g) in values.items():
            y_best, g_best = taken[best][key]
            scale = max(1.0, float(np.abs(np.array(y_best)).max()))
            np.testing.assert_allclose(np.array(y), np.array(y_best), rtol=2e-2,
                                       atol=2e-2 * scale, err_msg=f"{key}: {path} vs {best}")


def test_a_path_the_cpu_lacks_or_an_unknown_name_runs_the_best_path():
    flags = _cpu_flags()
    lacking = [p for p, needs in PATHS.items() if any(f not in flags for f in needs)]
    names = ["sse9"] + lacking[:1]
    for name in names:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", RECOPS_ISA=name)
        proc = subprocess.run(
            [sys.executable, "-c", "import recops_tf as rt; "
             "rt.hstu_attention(*[__import__('tensorflow').ones([1, 2, 1, 4])] * 3)"],
            capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        said = [line for line in proc.stderr.splitlines() if "RECOPS_ISA=" in line]
        reason = "unknown name" if name == "sse9" else "this CPU lacks it"
        assert said and reason in said[0] and "the CPU's best path runs" in said[0], said
