"""Bazel smoke test of the recops_tf op library (`bazel test //:bazel_smoke_test`).

Points the package at the Bazel-built shared object (RECOPS_TF_LIBRARY),
imports `recops_tf` from this test's runfiles, runs every op once through
`recops_tf.testing.drivers.smoke.run_all()` (which compares each op with its
pure-TF reference and raises on mismatch), and checks that the ops exercised
are exactly the ops the loaded library registers.

Only meaningful inside Bazel's runfiles tree; collected by pytest it skips
(and changes nothing in the process).
"""

import os
import sys
import unittest

# The op library inside the workspace: the cc_binary's name in BUILD.
_LIBRARY = "recops_tf/_recops_ops.so"


def _workspace_root():
    """This workspace's directory in the runfiles tree (holds recops_tf/)."""
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:  # bazel test
        return os.path.join(srcdir, os.environ.get("TEST_WORKSPACE", "recops_tf"))
    # bazel run, or run by hand: <root>/tests/bazel/smoke_test.py
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_ROOT = os.path.abspath(_workspace_root())
_LIBRARY_PATH = os.path.join(_ROOT, _LIBRARY)


def setUpModule():
    if "TEST_SRCDIR" not in os.environ and __name__ != "__main__":
        raise unittest.SkipTest("run with: bazel test //:bazel_smoke_test")
    os.environ["RECOPS_TF_LIBRARY"] = _LIBRARY_PATH
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if _ROOT in sys.path:
        sys.path.remove(_ROOT)
    sys.path.insert(0, _ROOT)


def _registered_ops(library):
    """Names of the ops in the loaded library's OpList (attached by recops_tf._loader.load())."""
    return {op.name for op in library.OP_LIST.op}


class BazelSmokeTest(unittest.TestCase):

    def test_library_is_the_bazel_build(self):
        self.assertTrue(os.path.isfile(_LIBRARY_PATH), _LIBRARY_PATH)

    def test_package_comes_from_runfiles(self):
        import recops_tf

        package_dir = os.path.dirname(os.path.abspath(recops_tf.__file__))
        self.assertEqual(package_dir, os.path.join(_ROOT, "recops_tf"),
                         "recops_tf was imported from outside the Bazel runfiles")

    def test_every_registered_op_runs(self):
        import recops_tf
        from recops_tf.testing.drivers import smoke

        registered = _registered_ops(recops_tf._loader.load())
        self.assertTrue(registered, "the op library registers no ops")

        if os.path.exists("/proc/self/maps"):
            with open("/proc/self/maps") as maps:
                self.assertIn(os.path.realpath(_LIBRARY_PATH), maps.read(),
                              "the loaded op library is not the Bazel-built one")

        exercised = smoke.run_all()
        self.assertTrue(exercised, "run_all() exercised no ops")
        self.assertEqual(
            set(exercised), registered,
            "ops not exercised: %s; exercised but not registered: %s"
            % (sorted(registered - set(exercised)), sorted(set(exercised) - registered)))


if __name__ == "__main__":
    unittest.main(verbosity=2)
