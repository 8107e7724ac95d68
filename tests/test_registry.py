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


def test_the_start_up_check_names_a_library_kind_without_its_geometry_or_import(monkeypatch):
    """GEOMETRIES and LIBRARIES are needed by the kinds with a kernel library
    (``Op.LIBRARY``), keyed by the library's name, not the kind's."""
    import megakernel.kinds  # noqa: F401
    from megakernel.backends.pallas_tpu.codegen.declare import LIBRARIES
    from megakernel.compiler.plan_json import GEOMETRIES

    kinds = dict(OP_KINDS.items())
    libraries = {cls.LIBRARY for cls in kinds.values()} - {None}
    assert libraries == {"attention", "moe", "mla", "gdn"}
    assert libraries <= GEOMETRIES.kinds() and libraries <= LIBRARIES.kinds()
    monkeypatch.delitem(GEOMETRIES._rules, "gdn")
    monkeypatch.delitem(LIBRARIES._rules, "gdn")
    assert registry.gaps(kinds) == [
        "no geometry record rule for op kind 'gated_deltanet' (it has a kernel library) under "
        f"'gdn': register one in {GEOMETRIES.home}",
        "no library import rule for op kind 'gated_deltanet' (it has a kernel library) under "
        f"'gdn': register one in {LIBRARIES.home}"]


def test_adding_an_op_kind_names_every_registry():
    """docs/architecture.md's "Adding an op kind" says where each registry's
    rule of a new kind goes: every registry of the package is named there."""
    import re
    import sys
    from pathlib import Path

    import megakernel.kinds  # noqa: F401 - every registry created

    text = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    section = text.split("## Adding an op kind", 1)[1]
    named = set(re.findall(r"`([A-Z_]+)`", section))
    found = {var for name, mod in list(sys.modules.items()) if name.startswith("megakernel.")
             for var, value in vars(mod).items() if isinstance(value, Registry) and var.isupper()}
    assert found - named == set()


def test_an_override_a_kind_owns_takes_the_values_its_rule_registers(monkeypatch):
    from megakernel.compiler.kind_mla import FORMS
    from megakernel.compiler.request import KIND_OVERRIDES, Overrides
    from megakernel.errors import PlanningError

    assert Overrides(mla_form="expanded").mla_form == "expanded"
    with pytest.raises(PlanningError, match=r"mla_form='fused' is not one of \['absorbed', "
                                            r"'expanded'\]"):
        Overrides(mla_form="fused")
    assert KIND_OVERRIDES("mla_form") == FORMS
    monkeypatch.delitem(KIND_OVERRIDES._rules, "mla_form")
    with pytest.raises(MissingRuleError, match="no override rule for override field 'mla_form' "
                                               r"\(overrides.mla_form\)") as info:
        Overrides(mla_form="expanded")
    assert "override fields with one" in info.value.hint


def test_a_table_keyed_by_something_else_names_its_keys():
    """The card's tables are keyed by mixer and FFN names, the geometry and
    library tables by kernel library names, not op kinds."""
    from megakernel.backends.pallas_tpu.codegen.declare import LIBRARIES, library_alias
    from megakernel.compiler.plan_json import GEOMETRIES
    from megakernel.ir.card import FFNS, MIXERS

    with pytest.raises(MissingRuleError, match="no block rule for mixer 'retention'"):
        MIXERS("retention")
    with pytest.raises(MissingRuleError, match="no block rule for ffn 'sparse'"):
        FFNS("sparse")
    for table in (GEOMETRIES, LIBRARIES):
        with pytest.raises(MissingRuleError, match=f"no {table.rule} rule for kernel library "
                                                   "'ssm'"):
            table("ssm")
    with pytest.raises(MissingRuleError) as info:
        library_alias("ssm")
    assert info.value.message == "no library import rule for kernel library 'ssm'"


def test_each_card_mixer_and_ffn_is_its_op_kinds_module():
    """A card's mixer and FFN (block and size formula) are registered by the
    ir/kind_*.py of the op kind they build, so each kind is one module per layer."""
    from megakernel.ir.card import FFNS, MIXERS

    homes = {name: {rec.block.__module__, rec.sizes.__module__}
             for table in (MIXERS, FFNS) for name, rec in table.items()}
    ir = "megakernel.ir."
    assert homes == {"full_attention": {ir + "kind_attention"},
                     "sliding_attention": {ir + "kind_attention"},
                     "linear_attention": {ir + "kind_gdn"}, "mla": {ir + "kind_mla"},
                     "dense": {ir + "kind_mlp"}, "moe": {ir + "kind_moe"}}
