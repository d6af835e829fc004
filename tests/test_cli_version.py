"""`recops-tf --version` prints `recops_tf <version>` (the package's __version__) and exits 0,
without importing TensorFlow."""
import os
import subprocess
import sys

import recops_tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version_prints_the_package_version_without_tensorflow():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, _recops_tf_cli\n"
         "sys.argv = ['recops-tf', '--version']\n"
         "try:\n"
         "    _recops_tf_cli.main()\n"
         "except SystemExit as e:\n"
         "    assert e.code in (0, None), e.code\n"
         "print('tensorflow imported:', 'tensorflow' in sys.modules)\n"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"recops_tf {recops_tf.__version__}",
                                       "tensorflow imported: False"]
