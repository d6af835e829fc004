#!/usr/bin/env python3
"""Fused vs reference benchmark of every op stem (see recops_tf/bench.py); e.g.
`python tools/bench.py --json bench.json` or `python tools/bench.py concat_jagged_tensor`."""
import sys

from recops_tf.bench import main

if __name__ == "__main__":
    sys.exit(main())
