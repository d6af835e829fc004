#!/usr/bin/env python3
"""Rewrites generated files: `python tools/regen.py docs` (docs/ops.md) or
`python tools/regen.py golden` (tests/golden/ops.pbtxt: do this only when an op's interface
changes on purpose, and say so in the commit)."""
import sys

from recops_tf.testing import regen

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("docs", "golden"):
        sys.exit(__doc__)
    print("wrote", regen.write(sys.argv[1]))
