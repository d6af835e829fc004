import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hypothesis  # noqa: E402

# Kernel calls are cheap but tf.function tracing is not: keep examples few, no deadline.
hypothesis.settings.register_profile(
    "recops", max_examples=40, deadline=None, derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow])
hypothesis.settings.load_profile("recops")
