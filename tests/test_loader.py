"""Tests of the library loader: one load, version check, clear errors."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

import recops_tf
from recops_tf import _loader


def test_loads_once():
    assert _loader.load() is _loader.load()
    assert os.path.exists(_loader.library_path())


def test_version_mismatch_names_both_versions_and_the_rebuild_command(tmp_path):
    (tmp_path / _loader.LIBRARY_NAME).write_bytes(b"")
    (tmp_path / _loader.BUILD_INFO_NAME).write_text(json.dumps({"tf_version": "2.20.0"}))
    with pytest.raises(_loader.LibraryVersionError) as info:
        _loader.check_version(str(tmp_path / _loader.LIBRARY_NAME))
    message = str(info.value)
    assert "built for TensorFlow 2.20.0" in message
    assert f"TensorFlow {tf.__version__} is installed" in message
    assert "pip install --no-build-isolation" in message


def test_same_minor_version_is_accepted(tmp_path):
    (tmp_path / _loader.LIBRARY_NAME).write_bytes(b"")
    major_minor = ".".join(tf.__version__.split(".")[:2])
    (tmp_path / _loader.BUILD_INFO_NAME).write_text(json.dumps({"tf_version": major_minor + ".9"}))
    _loader.check_version(str(tmp_path / _loader.LIBRARY_NAME))


def _import_in_subprocess(env_overrides):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env_overrides)
    return subprocess.run([sys.executable, "-c", "import recops_tf"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_import_fails_clearly_on_a_faked_recorded_version(tmp_path):
    shutil.copy(_loader.library_path(), tmp_path / _loader.LIBRARY_NAME)
    (tmp_path / _loader.BUILD_INFO_NAME).write_text(json.dumps({"tf_version": "2.20.0"}))
    result = _import_in_subprocess({"RECOPS_TF_LIBRARY": str(tmp_path / _loader.LIBRARY_NAME)})
    assert result.returncode != 0
    assert "LibraryVersionError" in result.stderr
    assert "built for TensorFlow 2.20.0" in result.stderr


def test_import_fails_clearly_when_the_library_is_missing(tmp_path):
    result = _import_in_subprocess({"RECOPS_TF_LIBRARY": str(tmp_path / "missing.so")})
    assert result.returncode != 0
    assert "missing.so" in result.stderr


def test_public_api_is_exported():
    for name in recops_tf.__all__:
        assert callable(getattr(recops_tf, name))
