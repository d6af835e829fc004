"""tools/check_figures.py: a figure inside its documented spread passes, one outside (or a
claimed comparison that no longer holds, or a command that fails) fails the tool with exit 1;
a missing data folder is a usage error. The commands themselves are replaced by records made
here (each real one trains for minutes)."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
    spec = importlib.util.spec_from_file_location(
        "check_figures", os.path.join(ROOT, "tools", "check_figures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(figure, shift=0.0, swap=False):
    """A --json record holding every path `figure` reads: its documented values (+ shift times
    each one's spread), each compared pair in the claimed order (reversed with swap)."""
    record = {}

    def put(path, value):
        node = record
        keys = path.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node.setdefault(keys[-1], value)

    for path, value, spread in figure.values:
        put(path, value + shift * spread)
    for high, low in figure.above:
        put(high, 0.9 if not swap else 0.1)
        put(low, 0.1 if not swap else 0.9)
    return record


@pytest.fixture
def data(tmp_path):
    (tmp_path / "u.data").write_text("1\t1\t5\t1\n")
    return str(tmp_path)


def test_figures_within_their_spread_pass_and_outside_fail(data, capsys):
    tool = _tool()
    ok = lambda figure, ml100k, workdir: _record(figure)  # noqa: E731
    assert tool.main(["--ml-100k", data], runner=ok) == 0
    assert "every figure within its spread" in capsys.readouterr().out
    for name in [f.name for f in tool.FIGURES]:
        inside = lambda f, m, w: _record(f, shift=0.9)  # noqa: E731
        assert tool.main(["--ml-100k", data, "--only", name], runner=inside) == 0
        outside = lambda f, m, w: _record(f, shift=-1.5)  # noqa: E731
        assert tool.main(["--ml-100k", data, "--only", name], runner=outside) == 1
        assert "FAIL" in capsys.readouterr().out
        swapped = lambda f, m, w: _record(f, swap=True)  # noqa: E731
        assert tool.main(["--ml-100k", data, "--only", name], runner=swapped) == 1


def test_a_failing_command_or_a_missing_value_fails(data, capsys):
    tool = _tool()

    def broken(figure, ml100k, workdir):
        raise RuntimeError("train exited 2: bad data")

    assert tool.main(["--ml-100k", data], runner=broken) == 1
    assert "bad data" in capsys.readouterr().out
    assert tool.main(["--ml-100k", data], runner=lambda f, m, w: {}) == 1
    assert "no 'test' in the record" in capsys.readouterr().out


def test_a_folder_without_the_data_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        _tool().main(["--ml-100k", str(tmp_path)])
    assert stop.value.code == 2 and "no u.data" in capsys.readouterr().err


def test_the_commands_are_the_documented_ones():
    tool = _tool()
    readme = open(os.path.join(ROOT, "README.md")).read()
    ranking = open(os.path.join(ROOT, "docs", "ranking.md")).read()
    retrieval = next(f for f in tool.FIGURES if f.name == "retrieval")
    assert f"{retrieval.values[0][1]:.4f} / {retrieval.values[1][1]:.4f}" in readme
    rank = next(f for f in tool.FIGURES if f.name == "ranking")
    assert f"{rank.values[0][1]:.4f}" in ranking
