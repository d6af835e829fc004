"""The wheel: what puts the op library and its _build_info.json into it, the build's reuse of an
in-place library (tools/build_wheel.sh --reuse, as CI runs it), the source distribution's
build backend, CI's wheel leg, and a changelog entry for the version. Static checks and small
files only: nothing is compiled or packed here (CI builds and installs the wheel)."""
import importlib.util
import json
import os
import re

import pytest
import tensorflow as tf
from setuptools import Distribution, Extension

import recops_tf
from recops_tf import _loader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _read(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


@pytest.fixture
def setup_py():
    """setup.py as a module (setup() runs only as __main__), fresh for each test."""
    spec = importlib.util.spec_from_file_location("_recops_test_setup_packaging",
                                                  os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_the_library_is_built_into_the_package_where_the_loader_looks(setup_py, pyproject):
    # An extension module of the package: setuptools puts it into the wheel (platlib) with
    # no package_data, at recops_tf/_recops_ops.so, where the loader searches.
    assert setup_py.LIB_NAME.split(".")[0] == "recops_tf"
    path = setup_py.TFBuildExt.get_ext_filename(None, setup_py.LIB_NAME)
    assert path == os.path.join("recops_tf", _loader.LIBRARY_NAME)
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["include"] == ["recops_tf*"]
    assert "exclude-package-data" not in pyproject["tool"]["setuptools"]


def test_build_info_is_written_beside_the_library(setup_py, tmp_path):
    # A wheel's build (not in place) writes _build_info.json beside the .so in build/lib,
    # which setuptools packs whole; the checkout's copy is left alone.
    cmd = setup_py.TFBuildExt(Distribution())
    cmd._inplace_build = False
    out = tmp_path / "lib" / "recops_tf" / _loader.LIBRARY_NAME
    out.parent.mkdir(parents=True)
    info = {"tf_version": tf.__version__, "python": "3", "compiler": "g++", "compile_flags": ""}
    cmd._write_build_info(str(out), info)
    assert json.loads((out.parent / _loader.BUILD_INFO_NAME).read_text()) == info
    assert _loader.built_for_version(str(out)) == tf.__version__


def _tree(tmp_path, info):
    """A checkout with two sources, a header, an in-place library and its build info, the
    library newer than the sources and the info written after it."""
    for name in ("kernels/a.cc", "kernels/a.h", "op_defs/b.cc", "build_flags.bzl", "setup.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("// " + name)
        os.utime(tmp_path / name, (1_000_000, 1_000_000))
    lib = tmp_path / "recops_tf" / _loader.LIBRARY_NAME
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF in place")
    os.utime(lib, (1_000_100, 1_000_100))
    (lib.parent / _loader.BUILD_INFO_NAME).write_text(json.dumps(info))
    os.utime(lib.parent / _loader.BUILD_INFO_NAME, (1_000_101, 1_000_101))
    return lib


@pytest.mark.parametrize("change", [None, "flags", "tensorflow", "newer source", "newer header",
                                    "stale info", "in-place build", "sanitizer build"])
def test_a_wheel_reuses_the_in_place_library_only_when_it_is_what_it_would_build(
        setup_py, tmp_path, monkeypatch, capsys, change):
    info = {"tf_version": "2.21.0", "python": "3.11.7", "compiler": "g++",
            "compile_flags": "-O3 -g0 -Wall"}
    lib = _tree(tmp_path, info)
    monkeypatch.chdir(tmp_path)  # setup.py runs in its checkout
    monkeypatch.setattr(setup_py, "ROOT", str(tmp_path))
    monkeypatch.setattr(setup_py, "SANITIZE", "address" if change == "sanitizer build" else "")
    ext = Extension(setup_py.LIB_NAME, sources=["op_defs/b.cc", "kernels/a.cc"])
    cmd = setup_py.TFBuildExt(Distribution())
    cmd._inplace_build = change == "in-place build"
    out = tmp_path / "build" / "lib" / "recops_tf" / _loader.LIBRARY_NAME
    out.parent.mkdir(parents=True)
    wanted = dict(info)
    if change == "flags":
        wanted["compile_flags"] += " -O1"
    elif change == "tensorflow":
        wanted["tf_version"] = "2.22.0"
    elif change in ("newer source", "newer header"):
        os.utime(tmp_path / ("kernels/a.cc" if change == "newer source" else "kernels/a.h"),
                 (1_000_200, 1_000_200))
    elif change == "stale info":
        os.utime(lib.parent / _loader.BUILD_INFO_NAME, (1_000_050, 1_000_050))

    reused = cmd._reuse_inplace_library(ext, str(out), wanted)
    said = capsys.readouterr().out
    assert reused == (change is None), said
    if reused:
        assert out.read_bytes() == lib.read_bytes()
        assert json.loads((out.parent / _loader.BUILD_INFO_NAME).read_text()) == info
        assert "reusing recops_tf/_recops_ops.so" in said
    else:
        assert not out.exists()
        assert "compiling, the in-place library does not qualify" in said


def test_the_source_distribution_carries_the_build_backend(pyproject):
    # pyproject.toml's backend is a file of the checkout, which setuptools does not put into
    # an sdist by itself: without it no wheel builds from the sdist (python -m build).
    assert pyproject["build-system"]["build-backend"] == "_build_backend"
    manifest = [line.split() for line in _read("MANIFEST.in").splitlines()
                if line.strip() and not line.startswith("#")]
    assert ["include", "_build_backend.py"] in manifest
    assert ["include", "CHANGELOG.md"] in manifest


def test_the_wheel_scripts_follow_the_pins_and_tensorflow_s_libraries(pyproject):
    build = _read("tools", "build_wheel.sh")
    excluded = re.search(r"^EXCLUDE=\((.*)\)$", build, re.M).group(1).split()
    # Every library of TensorFlow's that the op library links (-l:libX.so.N, or -lX) is left
    # out of the repair.
    linked = [f[3:] if f.startswith("-l:") else f"lib{f[2:]}.so"
              for f in tf.sysconfig.get_link_flags() if f.startswith("-l")]
    assert linked and all(any(e == name or e.startswith(name + ".") for e in excluded)
                          for name in linked), (linked, excluded)
    smoke = _read("tools", "wheel_smoke.sh")
    pin = re.search(r"^TENSORFLOW=(\S+)$", smoke, re.M).group(1)
    assert [pin] == pyproject["project"]["optional-dependencies"]["cpu"]
    checked = re.search(r"^for compiler in (.*); do$", smoke, re.M).group(1).split()
    assert {"g++", "gcc", "cc", "c++", "clang"} <= set(checked)


def test_ci_builds_and_smoke_tests_the_wheel_after_the_tests():
    ci = _read(".ci", "run")
    steps = [line.strip() for line in ci.splitlines()]
    pytest_at = steps.index("python -m pytest")
    build_at = next(i for i, s in enumerate(steps) if s.startswith("bash tools/build_wheel.sh"))
    smoke_at = next(i for i, s in enumerate(steps) if s.startswith("bash tools/wheel_smoke.sh"))
    sanitize_at = steps.index("bash tools/sanitize.sh")
    assert pytest_at < build_at < smoke_at < sanitize_at
    assert "--reuse" in steps[build_at]  # the library pip install -e built, not a second compile


def test_the_changelog_has_an_entry_for_this_version(pyproject):
    version = recops_tf.__version__
    assert version == pyproject["project"]["version"]  # the wheel's version is pyproject's
    headers = re.findall(r"^## \[([^\]]+)\]", _read("CHANGELOG.md"), re.M)
    assert headers[0] == "Unreleased" and version in headers, headers
