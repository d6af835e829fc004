"""`python -m recops_tf ...` runs the `recops-tf` command line."""
import sys

from recops_tf.cli import main

sys.exit(main())
