"""Programs that run the library, or generate files from it, rather than helpers a test calls:

- ``smoke``: every op once on tiny inputs against its reference (the Bazel test, test_repo);
- ``fuzz``: malformed and boundary inputs to the raw ops, ``python -m
  recops_tf.testing.drivers.fuzz STEM CASES SEED`` (tests/test_fuzz.py);
- ``multiworker``: scenarios in worker processes joined by the collective runtime
  (tests/distributed, tools/bench_collectives.py);
- ``regen``: the generated docs and golden files (``python tools/regen.py``, test_repo).
"""
