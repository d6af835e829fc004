"""C++ unit tests of kernel building blocks (tests/cc/*_test.cc): each is compiled against the
kernels' headers with TensorFlow's flags and must exit 0; exit 77 skips (a unit that needs a
CPU feature this CPU lacks says which)."""
import glob
import os
import subprocess

import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = sorted(glob.glob(os.path.join(ROOT, "tests", "cc", "*_test.cc")))


@pytest.mark.parametrize("source", SOURCES, ids=os.path.basename)
def test_cc_unit(source, tmp_path):
    flags = []
    for flag in tf.sysconfig.get_compile_flags():
        flags += ["-isystem", flag[2:]] if flag.startswith("-I") else [flag]
    binary = str(tmp_path / "unit")
    subprocess.run(["g++", "-O2", "-g0", f"-I{ROOT}", *flags, source, "-o", binary,
                    *tf.sysconfig.get_link_flags()], check=True, capture_output=True, text=True)
    lib_dir = tf.sysconfig.get_lib()
    env = dict(os.environ, LD_LIBRARY_PATH=lib_dir + os.pathsep + os.environ.get(
        "LD_LIBRARY_PATH", ""))
    result = subprocess.run([binary], env=env, capture_output=True, text=True, timeout=300)
    if result.returncode == 77:
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0, result.stdout + result.stderr


def test_there_are_cc_units():
    assert SOURCES
