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


def test_the_architecture_doc_lists_every_registry():
    """docs/architecture.md's registry table names each registry of the package
    and the module that defines it."""
    import re
    import sys
    from pathlib import Path

    import megakernel.kinds  # noqa: F401 - every registry created

    text = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| ([^|]+) \|", text, re.M)}
    found = {}
    for name, mod in list(sys.modules.items()):
        if name.startswith("megakernel.") and getattr(mod, "__file__", None):
            for var, value in vars(mod).items():
                if isinstance(value, Registry) and var.isupper():
                    found.setdefault(var, set()).add(Path(mod.__file__).name)   # and re-exports
    assert set(rows) == set(found), f"table vs package: {set(rows) ^ set(found)}"
    for var, files in found.items():
        assert any(f in rows[var] for f in files), f"{var} is in {files}, the table says {rows[var]}"


def test_every_zoo_op_declares_the_state_its_class_says():
    """``Op.STATE_ACCESS`` (what the start-up check reads) is what ``state``
    declares, for every op of every zoo model."""
    from megakernel.models import zoo

    for name in zoo.names():
        model = zoo.model(name)
        for st in model.stacks:
            for node in st.layer.nodes:
                found = {s.access for s in node.op.state(1, model.max_seq_len, model.dtype).values()}
                assert found == set(type(node.op).STATE_ACCESS), (name, node.name, found)


def test_the_start_up_check_names_a_state_table_a_kind_lacks(monkeypatch):
    import megakernel.kinds  # noqa: F401
    from megakernel.compiler.stepping import STEPPING

    kinds = dict(OP_KINDS.items())
    assert registry.gaps(kinds) == []
    monkeypatch.delitem(STEPPING._rules, "gated_deltanet")
    assert registry.gaps(kinds) == [
        "no multi-step rule for op kind 'gated_deltanet' (it owns state): register one in "
        + STEPPING.home]
    with pytest.raises(MissingRuleError, match="1 rule"):
        registry.check_complete(kinds)
