"""Ready-made properties over a user's model: drawn decode cases, and the AOT compile.

``decode_property(model, ...)`` is the one property that ``megakernel check
MODEL --examples N`` runs (through ``check_examples``) and that a pytest file
can collect as a test; with the same seed (``--seed`` / ``--mk-seed``) both
draw the same cases and shrink to the same counterexample.
``assert_compiles`` is the AOT property: the kernel of a plan compiles for a
TPU7x topology within the VMEM limit.
"""

from __future__ import annotations

import sys

from hypothesis import Phase, given, settings

from megakernel.testing import preflight
from megakernel.errors import CheckError
from megakernel.testing.cases import assert_case, decode_cases


def decode_property(model, *, devices: int = 1, examples: int = 10, max_batch: int = 4,
                    max_tokens: int = 2, max_context: int | None = None,
                    fault: str | None = None, shrink_budget: int = 25):
    """A hypothesis test (no arguments) that checks ``examples`` drawn decode cases of
    ``model`` on ``devices`` cores; assign it to a ``test_`` name in a pytest file,
    or call it. Its ``passed`` list names the cases that passed; under pytest it is
    marked ``mk_devices(devices)``.

    Each case is an interpret-mode kernel run, so shrinking gets a budget: after
    ``shrink_budget`` tries past the first failure, only the smallest failure
    found so far still fails, which ends the search there. The budget is counted
    from the function's creation: make one per run."""
    state = {"tries": 0, "best": None}
    context = min(max_context or model.max_seq_len, model.max_seq_len, 64)

    def key(case):
        return (case.batch, case.tokens.shape[1], case.start.tolist(), case.tokens.tolist())

    # Everything that steers the search is fixed here, not taken from the
    # current profile, so the CLI and a pytest run draw alike: no database (a
    # run depends on its seed alone, never on failures saved by earlier runs),
    # no explain phase (more runs after shrinking, which the budget ends anyway).
    @settings(max_examples=examples, deadline=None, database=None, print_blob=False,
              derandomize=False, backend="hypothesis", report_multiple_bugs=False,
              phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink))
    @given(decode_cases(model, max_batch=max_batch, max_tokens=max_tokens,
                        max_context=context))
    def decode_property_test(case):
        if state["best"] is not None:
            state["tries"] += 1
            if state["tries"] > shrink_budget and key(case) != state["best"]:
                return
        try:
            assert_case(model, case, devices=devices, fault=fault)
        except AssertionError:
            if state["best"] is None or key(case) < state["best"]:
                state["best"] = key(case)
            raise
        decode_property_test.passed.append(
            f"B={case.batch} T={case.tokens.shape[1]} start={case.start.tolist()}")

    decode_property_test.passed = []
    # In a pytest file, the plugin then makes the devices the test needs
    # (megakernel/testing/pytest_plugin.py); where pytest is not loaded, nothing would read it.
    pytest = sys.modules.get("pytest")
    if pytest is not None:
        pytest.mark.mk_devices(devices)(decode_property_test)
    return decode_property_test


def check_examples(model, *, examples: int = 10, devices: int = 1, max_batch: int = 4,
                   max_tokens: int = 2, fault: str | None = None, shrink_budget: int = 25,
                   seed: int = 0) -> str:
    """Run ``decode_property`` with hypothesis seeded by ``seed``; a failure raises
    CheckError with the shrunk counterexample in the message, a set-up problem
    SetupError before any case is drawn."""
    from hypothesis import seed as seeded

    preflight.require_devices(devices)
    preflight.require_plan(model, devices)
    test = decode_property(model, devices=devices, examples=examples, max_batch=max_batch,
                           max_tokens=max_tokens, fault=fault, shrink_budget=shrink_budget)
    try:
        seeded(seed)(test)()
    except AssertionError as err:
        raise CheckError(f"counterexample after shrinking: {err}", path=model.name) from None
    except preflight.SetupAbort as abort:
        raise abort.error from None
    return (f"{len(test.passed)} drawn case(s) agree with the reference:\n  "
            + "\n  ".join(test.passed))


def assert_compiles(model, *, devices: int = 1, batch: int = 1, tokens: int = 1,
                    topology: str = "tpu7x:2x2x1"):
    """The kernel of ``model`` for ``batch`` x ``tokens`` on ``devices`` cores compiles
    for ``topology`` with libtpu (no TPU needed) within its VMEM limit -> AotResult.
    No libtpu, a topology with too few cores, or a model that does not plan for
    ``devices`` is a SetupError, raised before anything compiles."""
    from megakernel.testing import kernel_cache
    from megakernel.backends.pallas_tpu.aot.tpu_compile import aot_compile

    preflight.require_libtpu()
    plan = preflight.require_plan(model, devices)
    preflight.require_topology(topology, plan.target.chip, devices)
    plan = kernel_cache.plan(model, devices, batch, tokens)
    result = aot_compile(kernel_cache.kernel_module(model, plan), plan, topology=topology)
    assert result.vmem_used_bytes is not None, f"no VMEM figure from libtpu: {result}"
    assert result.vmem_used_bytes <= result.vmem_limit_bytes, result.summary()
    return result
