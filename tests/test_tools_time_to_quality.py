"""tools/bench_time_to_quality.py on two fake builds (checkouts whose `python -m recops_tf`
prints what train prints and writes its --json): each build's own package runs, the time to
the best validation is its line's, finished runs are not made again, a failed run stops the
benchmark without a record."""
import importlib.util
import json
import os
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAKE_MAIN = textwrap.dedent('''
    import argparse, json, os, sys, time
    HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.argv[1] == "info":
        print(f"recops_tf 0.1.0 ({HERE})")
        sys.exit(0)
    p = argparse.ArgumentParser()
    for flag in ("--data", "--format", "--seed", "--out", "--json", "--max-steps"):
        p.add_argument(flag)
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(sys.argv[2:])
    if os.environ.get("FAKE_FAIL") == HERE:
        sys.exit("boom")
    with open(os.path.join(HERE, "calls"), "a") as f:
        f.write(" ".join(sys.argv[1:]) + "\\n")
    print(f"data: {a.data}")
    print("optimizer: LazyAdam")
    history = []
    for step, value in ((10, 0.1), (20, 0.3), (30, 0.2)):
        time.sleep(DELAY)
        history.append({"epoch": 1, "step": step, "ndcg@10": value, "hr@10": 2 * value})
        print(f"step {step}: valid ndcg@10 {value:.4f} (best 0.3 at step 20)")
    print("trained 30 steps")
    test = {"hr@10": 0.5, "ndcg@10": 0.25}
    with open(a.json, "w") as f:
        json.dump({"exclude_seen": False, "test": test,
                   "test_other_protocol": {"hr@10": 0.6, "ndcg@10": 0.3},
                   "train_seconds": 30 * DELAY, "steps": 30, "steps_per_epoch": 10,
                   "best_step": 20, "validation": history, "transition_prior": {"value": 1.0},
                   "config": {"validation_metric": "ndcg@10"}, "seed": int(a.seed),
                   "here": HERE}, f)
''')


def _tool():
    spec = importlib.util.spec_from_file_location(
        "bench_time_to_quality", os.path.join(ROOT, "tools", "bench_time_to_quality.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(path, delay):
    package = path / "recops_tf"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(f"DELAY = {delay}\n" + FAKE_MAIN)
    return str(path)


def _calls(checkout):
    path = os.path.join(checkout, "recops_tf", "calls")
    return open(path).read().splitlines() if os.path.exists(path) else []


def test_two_builds_resumed_and_a_failure(tmp_path, capsys, monkeypatch):
    tool = _tool()
    old, new = _build(tmp_path / "old", 0.2), _build(tmp_path / "new", 0.05)
    data = tmp_path / "d.pairs"
    data.write_text("1 1\n1 2\n1 3\n")
    out = tmp_path / "out"
    argv = ["--data", f"tiny={data}:sasrec", "--seeds", "0", "1", "--builds",
            f"base={old},new={new}", "--out", str(out)]
    assert tool.main(argv) == 0
    assert len(_calls(old)) == 2 and len(_calls(new)) == 2  # each build ran its own package
    assert _calls(new)[0] == (f"train --data {data} --format sasrec --seed 0 --out "
                              f"{out}/runs/tiny_s0_new --json {out}/runs/tiny_s0_new.json "
                              "--no-progress")
    records = json.loads((out / "results.json").read_text())
    assert [(r["seed"], r["build"]) for r in records] == [(0, "base"), (0, "new"),
                                                          (1, "base"), (1, "new")]
    for r in records:
        delay = 0.2 if r["build"] == "base" else 0.05
        assert r["best_step"] == 20 and r["best_validation"] == 0.3
        assert 2 * delay <= r["to_best_seconds"] < r["wall_seconds"]  # step 20's line
        assert r["test_hr@10"] == 0.5 and r["test_ndcg@10_excluded"] == 0.3
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("| tiny | 0 | new |"))
    assert "| 30 | 20 | 0.3000 |" in row and "| 0.5000 | 0.2500 |" in row
    assert "geometric mean over 2 runs" in text and "the defaults;" in text

    assert tool.main(argv) == 0  # nothing made again
    assert len(_calls(old)) == 2 and len(_calls(new)) == 2

    monkeypatch.setenv("FAKE_FAIL", os.path.join(new, "recops_tf"))
    argv2 = argv[:-1] + [str(out)] + ["--extra-args", "--max-steps 30"]
    assert tool.main(argv2) == 1  # base ran seed 0, new failed: no record of it
    records = json.loads((out / "results.json").read_text())
    assert [(r["build"], r["extra_args"]) for r in records[4:]] == [("base", "--max-steps 30")]
    assert "failed (exit 1)" in capsys.readouterr().err
