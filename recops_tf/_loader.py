"""Loads the recops_tf op library (`_recops_ops.so`) once per process.

The .so is found next to the package (every entry of the package ``__path__`` is searched, so
editable and regular installs both work), or at the path in the environment variable
``RECOPS_TF_LIBRARY`` (used by the Bazel build's tests). Before loading, the TensorFlow version
the .so was built for (recorded by the build in ``_build_info.json`` beside it) is compared with
the installed one: a .so built for another TensorFlow minor version fails to load with an
undefined-symbol error, so we say plainly what to do instead.
"""
import json
import os
import threading

import tensorflow as tf
from tensorflow.core.framework import op_def_pb2
from tensorflow.python.framework import op_def_registry

LIBRARY_NAME = "_recops_ops.so"
BUILD_INFO_NAME = "_build_info.json"
OP_PREFIX = "Recops>"
REBUILD_COMMAND = ('pip install --no-build-isolation -e ".[test]"   '
                   '(or: python setup.py build_ext --inplace)')

_lock = threading.Lock()
_library = None


class LibraryVersionError(ImportError):
    """The op library was built for a different TensorFlow version than the installed one."""


def library_path():
    """Returns the path of the op library this process uses."""
    override = os.environ.get("RECOPS_TF_LIBRARY")
    if override:
        return override
    import recops_tf

    searched = []
    for entry in recops_tf.__path__:
        candidate = os.path.join(entry, LIBRARY_NAME)
        searched.append(candidate)
        if os.path.exists(candidate):
            return candidate
    raise ImportError(
        f"recops_tf: the op library {LIBRARY_NAME} was not found (searched {searched}). "
        f"Build it with: {REBUILD_COMMAND}")


def built_for_version(so_path):
    """The TensorFlow version recorded next to `so_path` by the build, or None."""
    info = os.path.join(os.path.dirname(so_path), BUILD_INFO_NAME)
    if not os.path.exists(info):
        return None
    with open(info) as f:
        return json.load(f).get("tf_version")


def _minor(version):
    return tuple(version.split(".")[:2])


def check_version(so_path, installed=None):
    """Raises LibraryVersionError if `so_path` was built for another TF minor version."""
    installed = installed or tf.__version__
    built = built_for_version(so_path)
    if built is not None and _minor(built) != _minor(installed):
        raise LibraryVersionError(
            f"recops_tf: {so_path} was built for TensorFlow {built}, but TensorFlow {installed} "
            f"is installed. Rebuild the op library against the installed TensorFlow: "
            f"{REBUILD_COMMAND}")


def load():
    """Loads the op library once and returns its module of generated wrappers.

    The module also carries ``OP_LIST`` (an ``OpList`` proto of the library's ops)."""
    global _library
    with _lock:
        if _library is None:
            path = library_path()
            check_version(path)
            try:
                module = tf.load_op_library(path)
            except tf.errors.NotFoundError as e:
                built = built_for_version(path) or "an unknown version"
                raise LibraryVersionError(
                    f"recops_tf: loading {path} failed ({e}). It was built for TensorFlow "
                    f"{built}; TensorFlow {tf.__version__} is installed. Rebuild with: "
                    f"{REBUILD_COMMAND}") from e
            module.OP_LIST = op_def_pb2.OpList(
                op=[op_def_registry.get(name) for name in _op_names(module)])
            _library = module
        return _library


def _op_names(module):
    # The generated module exposes each op under its name with ">" replaced by "_".
    prefix = OP_PREFIX.replace(">", "_")
    return sorted(OP_PREFIX + n[len(prefix):] for n in dir(module)
                  if n.startswith(prefix) and callable(getattr(module, n)))


def op_names():
    """Sorted names of every op in the library ("Recops>...")."""
    return [op.name for op in load().OP_LIST.op]
