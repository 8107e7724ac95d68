"""Regenerate the golden emitted source: ``python -m tests.backends.regen_golden``.

The golden file pins the kernel emitted for the tiny dense zoo model on 2
TensorCores (batch 2, 1 token); review its diff like code whenever the emitter,
the template or the planner changes what it produces.
"""

from __future__ import annotations

from pathlib import Path

GOLDEN = Path(__file__).parent / "golden" / "tiny_dense_2core.py.golden"
CASE = dict(model="tiny-dense", devices=2, batch=2, tokens=1)


def render_case() -> str:
    from megakernel.backends.pallas_tpu.codegen import emit
    from megakernel.compiler.pipeline import plan_model
    from megakernel.models import zoo

    model = zoo.model(CASE["model"])
    plan = plan_model(model, devices=CASE["devices"], batch=CASE["batch"],
                      tokens=CASE["tokens"])
    return emit.render(model, plan)


def main() -> None:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(render_case())
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
