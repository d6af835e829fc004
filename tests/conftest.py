import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hypothesis  # noqa: E402
import pytest  # noqa: E402

# Kernel calls are cheap but tf.function tracing is not: keep examples few, no deadline.
hypothesis.settings.register_profile(
    "recops", max_examples=40, deadline=None, derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow])
hypothesis.settings.load_profile("recops")


@pytest.fixture
def mixed_bfloat16():
    """Keras' mixed_bfloat16 policy for one test (the previous policy restored)."""
    import keras

    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_dtype_policy(previous)
