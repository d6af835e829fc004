"""The benchmark runs end to end on tiny shapes (so it cannot rot); no timing is asserted."""
import json

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
    assert module.main(["--batch", "2", "--max-len", "8", "--d-model", "8", "--heads", "2",
                        "--warmup", "0", "--reps", "1"]) == 0
    assert "HSTUBlock B=2" in capsys.readouterr().out
