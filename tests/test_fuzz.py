"""The fuzz suite: every stem's raw ops fed RECOPS_FUZZ_CASES (default 4,000) seeded random
malformed and boundary inputs in a child process (recops_tf.testing.drivers.fuzz). Every case
must end in a TensorFlow error or a result; a crash (the child dies) or a hang (the timeout)
fails the test and names the last case started.

A stem's seed is the CRC-32 of its name, xor RECOPS_FUZZ_SALT (default 0): CI's sanitizer leg
(tools/sanitize.sh) sets another salt, so that its cases under ASan and UBSan are not the ones
this leg ran. A longer search: RECOPS_FUZZ_CASES=100000, or another salt."""
import json
import os
import subprocess
import sys
import zlib

import pytest

from recops_tf import _ops_table

CASES = int(os.environ.get("RECOPS_FUZZ_CASES", "4000"))
SALT = int(os.environ.get("RECOPS_FUZZ_SALT", "0"))


@pytest.mark.parametrize("stem", [row.stem for row in _ops_table.OPS])
def test_fuzz_stem(stem, tmp_path):
    seed = int(os.environ.get("RECOPS_FUZZ_SEED", zlib.crc32(stem.encode()) ^ SALT))
    log = tmp_path / "cases.log"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", RECOPS_FUZZ_LOG=str(log))
    try:
        done = subprocess.run([sys.executable, "-m", "recops_tf.testing.drivers.fuzz", stem,
                               str(CASES), str(seed)], capture_output=True, text=True, env=env,
                              timeout=float(os.environ.get("RECOPS_FUZZ_TIMEOUT", "900")))
    except subprocess.TimeoutExpired:
        last = log.read_text().splitlines()[-1:] if log.exists() else []
        pytest.fail(f"fuzzing {stem} (seed {seed}) hung; last case started: {last}")
    if done.returncode != 0:
        last = log.read_text().splitlines()[-1:] if log.exists() else []
        pytest.fail(f"fuzzing {stem} (seed {seed}) died with {done.returncode}; last case: "
                    f"{last}\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["cases"] == CASES
    assert sum(summary["outcomes"].values()) == CASES
    # The cases reached the kernels: most end in TensorFlow errors raised by them.
    assert sum(v for k, v in summary["outcomes"].items() if ":" not in k) > CASES // 2
    print(json.dumps(summary))
