import os

# Tests run on the CPU; libtpu, when installed, is only used for AOT compiles.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Virtual CPU devices for the multi-core interpret-mode tests; must be set
# before jax is first imported.
# pytest-xdist runs two workers; each may load libtpu for AOT compiles, and
# libtpu otherwise refuses a second process holding its lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# XLA:CPU compiles each interpret-mode kernel (a large program of DMA and
# semaphore callbacks) and then runs it for a few steps: compile time dominates,
# so the suite asks LLVM for no optimisation. Measured 2026-12-04 (2-core CPU):
# a 2-device MoE property draw 40.4 -> 35.9 s (46.8 -> 37.9 s of CPU), three
# decode checks 23.2 -> 21.0 s; the whole suite 1,716 -> 1,074 s. It does not
# change the checks' error: 12 drawn cards (dense and MoE, bf16 and f32, 1-4
# devices, fixed seeds) at O2 and O0 gave identical bf16 errors (largest 0.34
# of the logit and 0.41 of the cache tolerance) and f32 errors equal to the
# last bits (largest 0.100 / 0.126 of the tolerances at O2, 0.093 / 0.138 at O0).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")

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


def pytest_collection_modifyitems(config, items):
    """Longest first: the full-size AOT compiles (``aot`` and ``slow``, 1-5
    minutes each), then the other AOT and slow tests, then the rest, each in
    collection order. pytest-xdist hands tests out in this order as workers
    free up, so the two workers end together instead of one finishing a
    full-size compile alone at the end. Every worker collects the same
    order (xdist checks), since the sort depends only on the marks."""
    def weight(item):
        marks = {m.name for m in item.iter_markers()}
        return ("aot" not in marks) + ("slow" not in marks)

    items.sort(key=weight)
