"""The build backend of recops_tf (pyproject.toml's ``build-backend``): setuptools' own, with
TensorFlow as a build requirement only where the Python running the build has none.

The op library compiles against TensorFlow's headers and links against its
``libtensorflow_framework.so.2``, so the build needs TensorFlow 2.21. pip builds in an isolated
environment (PEP 517/518). A TensorFlow in ``[build-system] requires`` would be installed there
on every build: 32 distributions, 1.5 GB, beside the TensorFlow the user already has. This
backend asks for it from the ``get_requires_for_build_*`` hooks instead (PEP 517's dynamic
build requirements): ``tensorflow-cpu==2.21.0`` when the interpreter running pip has no
TensorFlow 2.21 installed (a fresh environment, as in CI), nothing when it has one. In that
case setup.py compiles against the installed TensorFlow, the one the library will load into.
"""
import subprocess
import sys

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (the hooks not redefined below)

# The TensorFlow a fresh build environment gets. Must match the `cpu` extra of pyproject.toml
# (tests/test_cli_install.py checks it).
BUILD_TENSORFLOW = "tensorflow-cpu==2.21.0"

_VERSION_CODE = """
import importlib.metadata as metadata, importlib.util as util
found = util.find_spec("tensorflow")
names = metadata.packages_distributions().get("tensorflow", []) if found else []
print(metadata.version(names[0]) if names else "")
"""


def installed_tensorflow_version(python=None):
    """The version of the TensorFlow that `python` (default: the interpreter running the build)
    imports outside pip's isolated build environment, or None. ``-I`` leaves out the
    environment's PYTHONPATH, through which pip puts the build environment in front. Reads
    the installed distribution's metadata only: TensorFlow is not imported."""
    try:
        out = subprocess.run([python or sys.executable, "-I", "-c", _VERSION_CODE],
                             capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def tensorflow_requirement(version="unknown"):
    """``[]`` if TensorFlow `version` (default: the installed one) has the minor version the
    library is built for, else ``[BUILD_TENSORFLOW]``."""
    if version == "unknown":
        version = installed_tensorflow_version()
    wanted = BUILD_TENSORFLOW.split("==")[1].split(".")[:2]
    if version and version.split(".")[:2] == wanted:
        return []
    return [BUILD_TENSORFLOW]


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + tensorflow_requirement()


def get_requires_for_build_editable(config_settings=None):
    return (_setuptools.get_requires_for_build_editable(config_settings) +
            tensorflow_requirement())
