"""The `recops-tf` command line: fast --help without TensorFlow, every option's default shown
(from the recommender's Config, not copied), one-line errors with exit status 2, TensorFlow's
logs off, op names as registered, the README's commands (and its pages') that leave nothing
untracked."""
import dataclasses
import inspect
import os
import re
import shlex
import subprocess
import sys

import pytest

from recops_tf import _loader, bench, cli
from recops_tf import recommender as rec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, **env):
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(environ, **env))


def test_help_answers_without_importing_tensorflow():
    out = _run(
        "import sys, _recops_tf_cli\n"
        "for argv in (['--help'], ['train', '--help']):\n"
        "    sys.argv = ['recops-tf'] + argv\n"
        "    try:\n"
        "        _recops_tf_cli.main()\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        "print('tensorflow imported:', 'tensorflow' in sys.modules)\n")
    assert out.returncode == 0, out.stderr
    assert "tensorflow imported: False" in out.stdout
    assert "encoder blocks (default: 2; --preset hstu-large: 8)" in " ".join(out.stdout.split())


def test_commands_keep_tensorflow_logs_quiet():
    out = _run("import sys, _recops_tf_cli\nsys.argv = ['recops-tf', 'info']\n"
               "sys.exit(_recops_tf_cli.main())\n")
    assert out.returncode == 0, out.stderr
    assert "Recops>ConcatJaggedTensor" in out.stdout
    assert "cpu_feature_guard" not in out.stderr and "oneDNN" not in out.stderr, out.stderr


def test_verbose_leaves_tensorflow_logs_alone(monkeypatch):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    cli._quiet_tensorflow(verbose=True)
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    cli._quiet_tensorflow(verbose=False)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"


def _subparsers():
    return cli._parser()._subparsers._group_actions[0].choices


@pytest.mark.parametrize("command", ["train", "export", "recommend", "info"])
def test_every_option_has_help_and_a_default(command):
    for action in _subparsers()[command]._actions:
        assert action.help, f"{command} {action.option_strings}: no help"
        if action.option_strings[0] not in ("-h", "--model", "--history") and not action.required:
            assert "default" in action.help, f"{command} {action.option_strings}: no default"


def test_shown_defaults_are_the_configs():
    presets = cli.preset_defaults()
    assert set(presets) == set(rec.PRESETS)
    for name in presets:
        config = rec.Config.from_preset(name)
        assert presets[name] == dataclasses.asdict(config), name
    assert set(f for f, _ in cli.CONFIG_OPTIONS.values()) <= {
        f.name for f in dataclasses.fields(rec.Config)}
    train = _subparsers()["train"]
    defaults = {a.dest: a.default for a in train._actions}
    synthetic = inspect.signature(rec.synthetic).parameters
    assert defaults["users"] == synthetic["num_users"].default
    assert defaults["items"] == synthetic["num_items"].default
    assert defaults["data_seed"] == synthetic["seed"].default
    assert defaults["min_interactions"] == inspect.signature(
        rec.load).parameters["min_interactions"].default
    help_text = {a.dest: a.help for a in train._actions}
    # Under the default preset (auto) a fitted field's default is the data's, each preset's
    # value named beside it; a field not fitted shows its value.
    assert "default: fitted to the data; --preset hstu: 100;" in help_text["epochs"]
    assert f"(default: {rec.Config().learning_rate})" in help_text["learning_rate"]
    assert "--preset sasrec: off" in help_text["no_relative_bias"]


def test_flags_override_the_preset():
    def config(*argv):
        return cli._config(cli._parser().parse_args(["train", *argv]))[0]

    assert config() == rec.Config.from_preset("auto")
    assert config("--no-seen-bias") == rec.Config.from_preset("auto", seen_bias=False)
    assert config("--preset", "hstu") == rec.Config.from_preset("hstu")
    assert config("--preset", "sasrec", "--seen-bias") == rec.Config.from_preset("sasrec")
    got = config("--preset", "sasrec", "--blocks", "3", "--no-l2-norm", "--exclude-seen",
                 "--no-fused", "--seed", "4")
    assert got == rec.Config.from_preset("sasrec", num_blocks=3, l2_norm=False,
                                         exclude_seen=True, use_fused=False, seed=4)


def _model_dir(tmp_path, items=("a", "b", "c")):
    (tmp_path / "saved_model").mkdir()
    (tmp_path / "items.txt").write_text("\n".join(items) + "\n")
    return str(tmp_path)


@pytest.mark.parametrize("argv,message", [
    (["--model", "{nope}", "--history", "a"], "not a model directory"),
    (["--model", "{model}", "--history", ""], "--history '': no item ids"),
    (["--model", "{model}", "--history", " , "], "no item ids"),
    (["--model", "{model}", "--history", "a,b", "--timestamps", "x,y"], "whole seconds"),
    (["--model", "{model}", "--history", "a,b", "--timestamps", "5"], "one timestamp per item"),
    (["--model", "{model}", "--history", "a", "--k", "0"], "--k: must be at least 1, got 0"),
    (["--model", "{model}", "--history", "a", "--k", "ten"], "expected a whole number"),
])
def test_recommend_rejects_bad_input_in_one_line(tmp_path, capsys, argv, message):
    paths = {"model": _model_dir(tmp_path), "nope": str(tmp_path / "nope")}
    argv = ["recommend"] + [a.format(**paths) for a in argv]
    try:
        status = cli.main(argv)
    except SystemExit as e:  # argparse's own errors
        status = e.code
    err = capsys.readouterr().err
    assert status == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_recommend_says_when_it_caps_k_and_keeps_columns_aligned(tmp_path, capsys,
                                                                 monkeypatch):
    names = ["1", "22", "333333333333", "4"]
    asked = {}

    def fake_recommend(model, history, timestamps, k):
        asked["k"] = k
        return names[:k], [3.5, 2.25, -1.0, 0.125][:k]

    monkeypatch.setattr(rec, "recommend", fake_recommend)
    assert cli.main(["recommend", "--model", _model_dir(tmp_path, names), "--history", "1",
                     "--k", "5000"]) == 0
    out, err = capsys.readouterr()
    assert asked["k"] == 4
    assert "--k 5000 is more than the catalogue's 4 items: showing all 4" in err
    lines = out.splitlines()
    assert len(lines) == 5 and len({len(line) for line in lines}) == 1, out
    assert [line.split()[1] for line in lines[1:]] == names


def test_export_rejects_a_missing_model(tmp_path, capsys):
    assert cli.main(["export", "--model", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "missing: model.keras, items.txt, info.json" in capsys.readouterr().err


def test_argument_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--epochs", "many"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--epochs: invalid int value" in err


def test_info_prints_the_registered_op_names(capsys):
    assert cli.main(["info"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("registered ops")]
    assert line[0].split(": ", 1)[1].split(", ") == _loader.op_names()


def test_tiny_benchmark_says_it_measures_nothing():
    report = {"size": "tiny", "reps": 1, "machine": {"tensorflow": "x"},
              "ceilings": {"copy_GBps": 1.0, "copy_threaded_GBps": 1.0, "matmul_GFLOPs": 8.0},
              "rows": []}
    for text in (bench.format_table(report), bench.markdown_table(report)):
        assert bench.TINY_NOTE in text
    report["size"] = "full"
    assert bench.TINY_NOTE not in bench.format_table(report)


# The README and the pages its commands moved to (docs/README.md is their index).
README_PAGES = ("README.md", "docs/building.md", "docs/trainer.md", "docs/layers.md",
                "docs/benchmarking.md", "docs/limits.md")


def test_readme_commands_write_nothing_untracked_into_the_checkout():
    text = ""
    for page in README_PAGES:
        with open(os.path.join(ROOT, page)) as f:
            text += f.read()
    commands = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S)
                for line in block.replace("\\\n", " ").splitlines()]  # continuations joined
    commands += re.findall(r"`((?:recops-tf|python) [^`]+)`", text)  # inline ones
    paths = []
    for command in commands:
        words = shlex.split(command, comments=True)
        paths += [words[i + 1] for i, w in enumerate(words[:-1])
                  if w in ("--out", "--json", "--chart", "--logdir")
                  and not words[i + 1].isupper()]  # not a placeholder (DIR)
    assert "~/recops-runs/ml-100k/1" in paths and "docs/speedups.png" in paths
    inside = [p for p in paths if not p.startswith(("~", "/"))]
    if not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    for path in inside:
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=ROOT,
                                 capture_output=True).returncode == 0
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0
        assert tracked or ignored, f"a README command writes {path}: neither tracked nor ignored"
