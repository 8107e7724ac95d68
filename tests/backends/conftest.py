import pytest


@pytest.fixture(autouse=True)
def _fresh_interpreter():
    # A failed interpret-mode kernel leaves simulator state behind.
    yield
    from jax.experimental.pallas import tpu as pltpu

    pltpu.reset_tpu_interpret_mode_state()
