"""The install: TensorFlow is a build requirement only where none is installed
(_build_backend.py), setup.py then builds against the installed one, the console script is the
fast launcher, and the README (and docs/building.md) says how to see the silent compile."""
import importlib.util
import os
import sys

import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_recops_test_{name}",
                                                  os.path.join(ROOT, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_tensorflow_is_not_a_static_build_requirement(pyproject):
    system = pyproject["build-system"]
    assert not any("tensorflow" in r for r in system["requires"])
    assert system["build-backend"] == "_build_backend" and system["backend-path"] == ["."]
    backend = _load("_build_backend")
    assert [backend.BUILD_TENSORFLOW] == pyproject["project"]["optional-dependencies"]["cpu"]


def test_backend_asks_for_tensorflow_only_without_a_matching_one():
    backend = _load("_build_backend")
    assert backend.tensorflow_requirement("2.21.3") == []
    assert backend.tensorflow_requirement("2.20.0") == [backend.BUILD_TENSORFLOW]
    assert backend.tensorflow_requirement(None) == [backend.BUILD_TENSORFLOW]
    # Run by this interpreter, which has TensorFlow: found from its metadata, not imported.
    assert backend.installed_tensorflow_version() == tf.__version__
    assert backend.tensorflow_requirement() == []


def test_setup_builds_against_the_installed_tensorflow():
    setup = _load("setup")  # setup() runs only as __main__
    direct = setup.tensorflow_build_flags()
    assert direct == (tf.__version__, tf.sysconfig.get_compile_flags(),
                      tf.sysconfig.get_link_flags())
    # What the isolated build environment of pip does when it has no TensorFlow of its own.
    assert setup.installed_tensorflow_build_flags(sys.executable) == direct


def test_console_script_is_the_fast_launcher(pyproject):
    assert pyproject["project"]["scripts"]["recops-tf"] == "_recops_tf_cli:main"
    assert "_recops_tf_cli" in pyproject["tool"]["setuptools"]["py-modules"]
    launcher = _load("_recops_tf_cli")
    assert launcher._cli().main is sys.modules["recops_tf.cli"].main


def _section(path, heading):
    with open(os.path.join(ROOT, path)) as f:
        text = f.read().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return " ".join(text.split())  # line breaks as spaces


def test_readme_says_the_compile_is_silent_and_how_to_see_it():
    install = _section("README.md", "Install and test")
    assert "pip shows nothing" in install and "pip install -v" in install
    # The details moved to docs/building.md, with the install that builds against a
    # TensorFlow already there (no second one).
    source = _section(os.path.join("docs", "building.md"), "From source")
    assert "pip shows nothing during the compile" in source and "pip install -v" in source
    assert 'pip install -e ".[test]"' in source
