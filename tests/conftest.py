import os

# Tests run on the CPU; libtpu, when installed, is only used for AOT compiles.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Virtual CPU devices for the multi-core interpret-mode tests; must be set
# before jax is first imported.
# pytest-xdist runs two workers; each may load libtpu for AOT compiles, and
# libtpu otherwise refuses a second process holding its lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("default")


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_interpreter():
    """A failed interpret-mode kernel leaves simulator state behind: reset it
    after every test (the one definition; tests/*/ files do not repeat it)."""
    yield
    from jax.experimental.pallas import tpu as pltpu

    pltpu.reset_tpu_interpret_mode_state()
