"""The benchmark runs end to end on tiny shapes (so it cannot rot); no timing is asserted."""
import json
import os
import re
import subprocess
import sys

from recops_tf import _ops_table, bench, cli


def test_tiny_benchmark_covers_every_stem(tmp_path):
    path = tmp_path / "bench.json"
    report = bench.run(size="tiny", warmup=1, reps=1, json_path=str(path), progress=False)
    assert json.loads(path.read_text())["rows"] == report["rows"]
    assert all(v > 0 for v in report["ceilings"].values())
    seen = {(r["stem"], r["mode"]) for r in report["rows"]}
    for row in _ops_table.OPS:
        assert (row.stem, "step" if row.stateful else "forward") in seen
        assert ((row.stem, "forward+backward") in seen) == (not row.stateful)
    for r in report["rows"]:
        assert r["fused_ms"] > 0 and r["reference_ms"] > 0 and r["rate"] > 0
    table = bench.format_table(report)
    assert all(row.stem in table for row in _ops_table.OPS)


def test_bfloat16_rows_are_measured_against_the_bfloat16_matmul():
    report = bench.run(["in_linear_silu", "ln_mul"], size="tiny", warmup=0, reps=1,
                       progress=False, dtype="bfloat16")
    c = report["ceilings"]
    assert c["matmul_bf16_GFLOPs"] > 0 and "bfloat16" in bench.format_table(report)
    for r in report["rows"]:
        ceiling = c["matmul_bf16_GFLOPs"] if r["unit"] == "GFLOP/s" else c["copy_GBps"]
        assert abs(r["fraction_of_ceiling"] - r["rate"] / ceiling) < 1e-9 * r["rate"] / ceiling


def test_cli_runs_one_stem(tmp_path, capsys):
    path = tmp_path / "b.json"
    assert cli.main(["bench", "reverse_sequence", "--size", "tiny", "--reps", "1", "--warmup",
                     "0", "--no-progress", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert {r["stem"] for r in rows} == {"reverse_sequence"}
    assert "reverse_sequence" in capsys.readouterr().out


def test_layer_benchmark_runs_on_a_tiny_block(capsys):
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools", "bench_layers.py")
    spec = importlib.util.spec_from_file_location("bench_layers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for precision in ("f32", "bf16"):
        assert module.main(["--batch", "2", "--max-len", "8", "--d-model", "8", "--heads", "2",
                            "--warmup", "0", "--reps", "1", "--precision", precision]) == 0
        assert f"HSTUBlock {precision} B=2" in capsys.readouterr().out


def test_loop_mode_runs_the_step_once_per_iteration():
    import tensorflow as tf

    counter = tf.Variable(0)
    bench._looped(lambda x: counter.assign_add(x), 7)(tf.constant(2))
    assert int(counter.numpy()) == 14


def test_cli_loop_mode_times_stateful_steps_per_step(tmp_path):
    path = tmp_path / "b.json"
    assert cli.main(["bench", "fused_sgd", "reverse_sequence", "--size", "tiny", "--reps", "1",
                     "--warmup", "0", "--loop", "3", "--no-progress", "--json",
                     str(path)]) == 0
    modes = {(r["stem"], r["mode"]) for r in json.loads(path.read_text())["rows"]}
    assert ("fused_sgd", "step (loop of 3)") in modes
    assert ("reverse_sequence", "forward") in modes  # stateless stems: timed per call


def test_loop_mode_keeps_steps_that_return_values():
    import tensorflow as tf

    calls = tf.Variable(0)

    def lookup(x):
        calls.assign_add(1)
        return tf.gather(x, [1, 0])

    assert float(bench._looped(lookup, 4)(tf.constant([3.0, 5.0])).numpy()) == 20.0
    assert int(calls.numpy()) == 4


def test_collective_benchmark_runs_on_a_tiny_payload(capsys):
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools",
                        "bench_collectives.py")
    spec = importlib.util.spec_from_file_location("bench_collectives", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--mb", "0.05", "--reps", "1", "--split", "skewed"]) == 0
    out = capsys.readouterr().out
    assert "skewed split" in out and out.count("x ") >= 2  # one row per rank


def test_report_chart_and_readme_table(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\nbefore\n" + bench.README_START + "\nold table\n" + bench.README_END
                      + "\nafter\n")
    report, chart = tmp_path / "report.md", tmp_path / "speedups.png"
    assert cli.main(["bench", "--ops", "reverse_sequence", "ln_mul", "--size", "tiny",
                     "--reps", "1", "--warmup", "0", "--no-progress", "--out", str(report),
                     "--chart", str(chart), "--update-readme", str(readme)]) == 0
    table = report.read_text()
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| stem | case | mode")
    assert {line.split(" | ")[0][2:] for line in lines[1:]} == {"reverse_sequence", "ln_mul"}
    assert f"CPU: {bench.cpu_model()}, " in table  # the machine the figures belong to
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = readme.read_text()
    assert "old table" not in text and table in text
    assert text.startswith("# x\n\nbefore\n") and text.endswith("\nafter\n")


def test_readme_without_markers_is_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    import pytest

    with pytest.raises(ValueError, match="has no"):
        bench.update_readme({"rows": [], "ceilings": {}}, str(readme))


def test_lazy_adam_floor_tool_compiles_and_runs_a_tiny_step(tmp_path):
    # tools/lazy_adam_floor.cc: the memory floor docs/benchmarks.md compares the fused step to.
    source = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools",
                          "lazy_adam_floor.cc")
    binary = str(tmp_path / "floor")
    subprocess.run(["g++", "-O2", "-pthread", "-Wall", "-Werror", source, "-o", binary],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([binary, "4096", "8", "64", "256", "5"], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    assert "64 distinct rows, 256 gradient rows" in out
    timed = re.findall(r"^(gradient read|rows read-modify-write|both) +min +([\d.]+) us",
                       out, re.M)
    assert [name for name, _ in timed] == ["gradient read", "rows read-modify-write", "both"]
    assert all(float(us) > 0 for _, us in timed)
    bad = subprocess.run([binary, "10", "8", "11"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr
def test_paged_read_floor_tool_compiles_and_runs_a_tiny_step(tmp_path):
    # tools/paged_read_floor.cc: the read floor docs/benchmarks.md compares the paged decode to.
    source = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools",
                          "paged_read_floor.cc")
    binary = str(tmp_path / "floor")
    subprocess.run(["g++", "-O2", "-pthread", "-Wall", "-Wextra", "-Werror", source, "-o",
                    binary], check=True, capture_output=True, text=True)
    out = subprocess.run([binary, "8", "100", "2", "16", "32", "3"], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("B=8 cache<=100 H=2 D=16 page=32 float32: ")
    timed = re.findall(r"^1 thread , (plain read|look-ahead): +median +([\d.]+) ms", out, re.M)
    assert [name for name, _ in timed] == ["plain read", "look-ahead"]
    assert all(float(ms) > 0 for _, ms in timed)
    bad = subprocess.run([binary, "8", "100", "3", "5"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr




def test_hstu_forward_floor_tool_compiles_and_runs_a_tiny_forward(tmp_path):
    # tools/hstu_forward_floor.cc: the short-sequence floor docs/benchmarks.md compares the HSTU
    # forward to. It compiles against the kernels' headers with TensorFlow's flags.
    import tensorflow as tf

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    flags = []
    for flag in tf.sysconfig.get_compile_flags():
        flags += ["-isystem", flag[2:]] if flag.startswith("-I") else [flag]
    binary = str(tmp_path / "floor")
    subprocess.run(["g++", "-O2", "-pthread", "-Wall", "-Wextra", "-Wno-psabi", "-Werror",
                    f"-I{root}", *flags, os.path.join(root, "tools", "hstu_forward_floor.cc"),
                    os.path.join(root, "kernels", "common", "gemm.cc"), "-o", binary,
                    *tf.sysconfig.get_link_flags(), "-Wl,-rpath," + tf.sysconfig.get_lib()],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([binary, "6", "100", "2", "24", "3", "50"], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    assert re.match(r"B=6 L<=100 H=2 D=24 float32, \S.*, \d+ threads?: \d+ rows, ", out)
    assert "ceiling: 50.0 GFLOP/s (given)" in out
    timed = re.findall(r"^(peak|items|tiles|tile GEMMs only)\b.*median +([\d.]+) ms +([\d.]+) "
                       r"GFLOP/s +([\d.]+)% of the ceiling$", out, re.M)
    assert [t[0] for t in timed] == ["peak", "items", "tiles", "tile GEMMs only"]
    assert all(float(ms) > 0 and float(rate) > 0 for _, ms, rate, _ in timed)
    # Each stage does less than the one before it, so it cannot take much longer.
    items, tiles, gemms = (float(t[1]) for t in timed[1:])
    assert gemms < 2 * tiles and tiles < 2 * items
    bad = subprocess.run([binary, "6", "100", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_bench_bf16_tool_per_call_and_per_loop_step():
    # tools/bench_bf16.py: float32 and bfloat16 HSTU against the matmul ceilings, per
    # tf.function call or, with --loop, per step of a graph loop.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tool = os.path.join(root, "tools", "bench_bf16.py")
    tiny = ["--batch", "3", "--max-len", "8", "--heads", "1", "--dim", "8", "--reps", "1",
            "--warmup", "1", "--matmul-n", "64"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for extra, header in (([], "per tf.function call"),
                          (["--loop", "2"], "per step in graph loops of 2")):
        out = subprocess.run([sys.executable, tool, *tiny, *extra], check=True, env=env,
                             capture_output=True, text=True, timeout=300).stdout
        assert header in out.splitlines()[0]
        rows = re.findall(r"^\[best\] (forward|forward\+backward) +float32 +([\d.]+) ms .* "
                          r"bfloat16 +([\d.]+) ms", out, re.M)
        assert [r[0] for r in rows] == ["forward", "forward+backward"]
        assert all(float(a) > 0 and float(b) > 0 for _, a, b in rows)
    bad = subprocess.run([sys.executable, tool, "--loop", "-1"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert bad.returncode == 2 and "--loop must be >= 0" in bad.stderr
