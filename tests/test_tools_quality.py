"""tools/bench_quality.py: its table from runs already made (their JSON), mean ± std over
seeds, the baselines of the split, both protocols."""
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
    spec = importlib.util.spec_from_file_location(
        "bench_quality", os.path.join(ROOT, "tools", "bench_quality.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _metrics(hr10, ndcg10):
    out = {f"{m}@{k}": 0.0 for m in ("hr", "ndcg") for k in (5, 10, 20, 50, 200)}
    out.update({"hr@10": hr10, "ndcg@10": ndcg10, "hr@5": hr10 / 2, "mrr": 0.0})
    return out


def _result(hr10):
    base = {"markov": _metrics(0.1, 0.05), "popularity": _metrics(0.05, 0.02)}
    base_excl = {"markov": _metrics(0.2, 0.1), "popularity": _metrics(0.1, 0.04)}
    return {"exclude_seen": False, "test": _metrics(hr10, hr10 / 2),
            "test_other_protocol": _metrics(hr10 + 0.1, hr10 / 2 + 0.05), "baselines": base,
            "baselines_other_protocol": base_excl, "train_seconds": 30.0, "steps": 300,
            "steps_per_epoch": 10, "epochs": 30}


def test_table_from_runs_already_made(tmp_path, capsys):
    tool = _tool()
    runs = tmp_path / "runs"
    runs.mkdir()
    for seed, hr in ((0, 0.2), (1, 0.3)):
        (runs / f"u.data_defaults_s{seed}.json").write_text(json.dumps(_result(hr)))
    out = tmp_path / "table.md"
    assert tool.main(["--data", "somewhere/u.data", "--seeds", "0", "1", "--runs", str(runs),
                      "--out", str(out)]) == 0
    text = out.read_text()
    row = next(line for line in text.splitlines() if "defaults (2 seeds)" in line)
    assert "0.2500 ± 0.0707" in row  # HR@10 kept, mean ± std of 0.2 and 0.3
    assert "0.3500 ± 0.0707" in row  # HR@10 excluded
    assert "2.50x / 2.50x; 1.75x / 1.75x" in row  # x the Markov chain, kept; excluded
    assert row.rstrip().endswith("| 1.0 |")  # 30 s / 300 steps x 10 steps an epoch
    markov = next(line for line in text.splitlines() if "| markov |" in line)
    assert "| 0.1000 | 0.0500 | 0.2000 | 0.1000 |" in markov
    assert "running:" not in capsys.readouterr().out  # nothing run again
