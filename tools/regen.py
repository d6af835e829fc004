#!/usr/bin/env python3
"""Rewrites generated files: `python tools/regen.py docs` (docs/ops.md and docs/api.md, from the
docstrings), `python tools/regen.py golden` (tests/golden/ops.pbtxt),
`python tools/regen.py api` (tests/golden/api.txt, the public Python signatures) or
`python tools/regen.py robustness` (the validation rules section of docs/robustness.md, from
the tests). Regenerate golden and api only when an interface changes on purpose, and say so in
the commit."""
import sys

from recops_tf.testing import regen

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in regen.TARGETS:
        sys.exit(__doc__)
    print("wrote", ", ".join(regen.write(sys.argv[1])))
