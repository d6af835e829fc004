"""The ``recops-tf`` console script (``[project.scripts]`` in pyproject.toml).

It runs ``recops_tf/cli.py`` without importing the ``recops_tf`` package first. Importing the
package loads TensorFlow and the op library (about 10 s), which ``recops-tf --help``, a bad
argument or TensorFlow's log settings must not wait for; each command imports what it uses.
``python -m recops_tf`` runs the same command line after the package import.
"""
import importlib.util
import os
import sys


def _cli():
    """The module ``recops_tf.cli``, loaded from its file if the package is not imported yet."""
    if "recops_tf.cli" in sys.modules:
        return sys.modules["recops_tf.cli"]
    if "recops_tf" in sys.modules:
        import recops_tf.cli

        return recops_tf.cli
    package = importlib.util.find_spec("recops_tf")  # finds the package, does not run it
    for directory in (package.submodule_search_locations or []) if package else []:
        path = os.path.join(directory, "cli.py")
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location("recops_tf.cli", path)
            module = importlib.util.module_from_spec(spec)
            # Registered under its own name: a later `from recops_tf import cli` (after a
            # command has imported the package) finds this module, not a second copy.
            sys.modules["recops_tf.cli"] = module
            spec.loader.exec_module(module)
            return module
    sys.exit("recops-tf: the recops_tf package is not installed in this Python "
             f"({sys.executable})")


def main():
    return _cli().main()


if __name__ == "__main__":
    sys.exit(main())
