"""Every op kind has every rule; a missing one is a named error, not a default."""

import pytest

from megakernel import registry
from megakernel.ir.ops import OP_KINDS
from megakernel.registry import MissingRuleError, Registry


def test_every_op_kind_has_every_rule():
    import megakernel.backends.pallas_tpu.codegen.emit  # noqa: F401 - every stage's registry
    import megakernel.compiler.pipeline  # noqa: F401
    import megakernel.models.reference  # noqa: F401
    import megakernel.models.weights  # noqa: F401

    rules = {r.rule for r in registry.registries() if r.per_op_kind}
    assert {"op kind", "reference", "init", "sharding", "buffer", "cost",
            "constant operand", "emitter"} <= rules
    assert {kind: registry.missing(kind) for kind in OP_KINDS} == {k: [] for k in OP_KINDS}


def test_a_missing_rule_names_the_rule_the_kind_and_the_node():
    # (kept out of the per-op-kind check above: it is empty on purpose)
    table = Registry("cost", "compiler/cost.py", per_op_kind=False)
    with pytest.raises(MissingRuleError) as info:
        table("gated_deltanet", "layers[3].mixer")
    assert str(info.value).startswith(
        "no cost rule for op kind 'gated_deltanet' (layers[3].mixer)")
    assert "compiler/cost.py" in str(info.value)
