"""tools/plots.py: every committed results file (docs/results/*.json) renders to PNGs, the same
bytes twice, each picture committed under docs/img/ and shown by its doc; a rerun's raw output
(bench_time_to_quality's results.json) renders too; a malformed file stops it with a message
naming the file, and nothing is written for it."""
import glob
import importlib.util
import json
import os
import subprocess

import pytest

pytest.importorskip("matplotlib")
from PIL import Image  # noqa: E402  (matplotlib's dependency)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = sorted(glob.glob(os.path.join(ROOT, "docs", "results", "*.json")))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DOCS = ("quality.md", "benchmarks.md", "serving.md")


def _plots():
    spec = importlib.util.spec_from_file_location("plots", os.path.join(ROOT, "tools",
                                                                        "plots.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _valid_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE, path
    with Image.open(path) as image:
        image.load()
        assert image.format == "PNG" and min(image.size) >= 300, (path, image.size)


def test_every_results_file_renders_the_same_bytes_twice(tmp_path, capsys):
    assert len(RESULTS) >= 4
    plots = _plots()
    assert plots.main(["--out-dir", str(tmp_path / "a")]) == 0
    assert plots.main(["--out-dir", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    written = sorted(os.listdir(tmp_path / "a"))
    stems = {os.path.splitext(os.path.basename(p))[0] for p in RESULTS}
    assert stems <= {os.path.splitext(n)[0] for n in written}
    kinds = {plots.kind_of(json.load(open(p))) for p in RESULTS}
    assert kinds == {"quality", "benchmarks", "serving", "time_to_quality"}
    for name in written:
        _valid_png(tmp_path / "a" / name)
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), \
            f"{name}: not the same bytes on a rerun"


def test_every_picture_is_committed_small_and_shown_by_its_doc(tmp_path, capsys):
    assert _plots().main(["--out-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    docs = "".join(open(os.path.join(ROOT, "docs", d)).read() for d in DOCS)
    for name in os.listdir(tmp_path):
        committed = os.path.join(ROOT, "docs", "img", name)
        assert os.path.exists(committed), f"docs/img/{name}: run python tools/plots.py"
        _valid_png(committed)
        assert os.path.getsize(committed) < 100_000, f"docs/img/{name}: over 100 KB"
        assert f"](img/{name})" in docs, f"docs/img/{name}: no doc shows it"


def test_every_results_file_names_its_source_and_is_not_ignored_by_git():
    for path in RESULTS:
        with open(path) as f:
            results = json.load(f)
        assert "docs/" in results["source"] and "`" in results["source"], path
    if not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    for path in RESULTS + glob.glob(os.path.join(ROOT, "docs", "img", "*.png")):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert ignored.returncode == 1, f"{path}: .gitignore keeps it out of the repository"


def test_a_rerun_of_bench_time_to_quality_drops_in(tmp_path, capsys):
    with open(os.path.join(ROOT, "docs", "results", "time_to_quality.json")) as f:
        records = json.load(f)["records"]
    for r in records:  # as the tool writes them: train_seconds, no ms_per_step
        r["train_seconds"] = r.pop("ms_per_step") * r["steps"] / 1000
    path = tmp_path / "results.json"
    path.write_text(json.dumps(records))
    assert _plots().main([str(path), "--out-dir", str(tmp_path / "img")]) == 0
    assert "results.png" in capsys.readouterr().out
    _valid_png(tmp_path / "img" / "results.png")


@pytest.mark.parametrize("text, message", [
    ('{"kind": "serving", "predict": [', "not valid JSON"),
    ('{"kind": "serving", "predict": [{"api": "rest", "concurrency": 1, "p50_ms": 1}]}',
     "serving predict row 0: missing 'batching'"),
    ('{"kind": "quality", "datasets": [{"name": "x", "rows": [{"hr@10": "high", '
     '"ndcg@10": 0.1}]}]}', "expected a number, got 'high'"),
    ('{"kind": "pie"}', "unknown kind 'pie'"),
    ('[1, 2]', "not of bench_time_to_quality.py records"),
])
def test_a_malformed_results_file_stops_with_a_message(tmp_path, capsys, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    out = tmp_path / "img"
    assert _plots().main([str(path), "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert str(path) in err and message in err, err
    assert not os.listdir(out)
