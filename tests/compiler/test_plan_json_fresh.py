"""A plan.json stands alone: a fresh process rebuilds it (compiler/plan_json.py)."""

from megakernel.models import zoo


def test_plans_of_every_library_load_in_a_fresh_process(tmp_path):
    """A plan.json names each op library's geometry record; a new process (the
    `aot` or `check` of a compiled folder) must find every one, not only those
    whose library planning happened to import (an MLA folder failed so)."""
    import subprocess
    import sys

    from megakernel.compiler.pipeline import plan_model
    from tests.e2e.test_decode import mla

    for name, model in (("mla", mla()), ("moe", zoo.model("tiny-moe"))):
        path = tmp_path / f"{name}.json"
        plan = plan_model(model, devices=2, batch=1, tokens=1)
        # Each geometry is filed under its kind's Op.LIBRARY, the name the
        # start-up check holds GEOMETRIES and LIBRARIES to.
        assert plan.memory.geometries and all(
            og.library == type(model.stacks[og.stack].layer.node(og.node).op).LIBRARY
            for og in plan.memory.geometries)
        path.write_text(plan.to_json())
        code = ("import sys; from pathlib import Path; from megakernel.compiler.plan import Plan; "
                "Plan.from_json(Path(sys.argv[1]).read_text())")
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stderr[-800:]
