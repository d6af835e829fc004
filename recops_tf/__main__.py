"""`python -m recops_tf ...` runs the `recops-tf` command line.

Python imports the package, and with it TensorFlow, before this file runs, so `--help` waits
for TensorFlow and TensorFlow's start-up log lines are printed (unless TF_CPP_MIN_LOG_LEVEL is
set). The `recops-tf` script (`_recops_tf_cli.py`) parses first and imports TensorFlow only
for the commands that need it."""
import sys

from recops_tf.cli import main

sys.exit(main())
