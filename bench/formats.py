"""Weight formats in ``make bench``: each quantized variant of a zoo model
beside its bf16 row (issue 13). Every number here is modeled.

``format_record(name, devices, quantize)`` plans the zoo model with the weight
kinds of ``quantize`` in their formats, and the same model in bf16 on the same
cores, or, where bf16 does not fit them, on the cores its bench row uses
(``config.MODELS``). The rows are planned only (a plan takes seconds): the
full-size TPU7x compiles of the quantized models are in the test suite
(tests/quant/test_quantized_aot.py, tests/backends/test_aot_full.py) and
their VMEM in docs/formats.md. ``render`` prints one table.
"""

from __future__ import annotations

from bench.config import MODELS

# (zoo name, TensorCores, {weight kind: format}); kimi-k2 and deepseek-v3 do not
# fit 16 cores in bf16, so their quantized rows halve the chips.
FORMAT_ROWS = (
    ("qwen3-8b", 4, {"dense": "int8"}),
    ("qwen3-8b", 4, {"dense": "fp8_b128"}),
    ("qwen3-8b", 4, {"dense": "int4_g128"}),
    ("qwen3-8b", 4, {"dense": "mxfp4"}),
    ("qwen3-30b-a3b", 8, {"experts": "mxfp4"}),
    ("qwen3-30b-a3b", 8, {"experts": "int4_g32", "dense": "int8"}),
    # Muse Spark's fastest published configuration: NVFP4 experts, int8 dense
    ("qwen3-30b-a3b", 8, {"experts": "nvfp4", "dense": "int8"}),
    ("kimi-k2", 16, {"experts": "mxfp4"}),
    ("deepseek-v3", 16, {"dense": "fp8_b128", "experts": "fp8_b128"}),
)
COLUMNS = ("model", "cores", "formats", "HBM GB/core", "floors ms HBM/core", "binds",
           "step ms (modeled)", "bf16 row", "bf16 step ms (modeled)", "x bf16")


def label(quantize: dict) -> str:
    return ", ".join(f"{kind} {fmt}" for kind, fmt in sorted(quantize.items()))


def _plan(name, devices, quantize):
    import dataclasses

    from megakernel.compiler.pipeline import plan_model
    from megakernel.ir.config import build
    from megakernel.ir.weight_kinds import Quantize
    from megakernel.models import zoo

    model = build(dataclasses.replace(zoo.card(name), quantize=Quantize(**quantize)))
    return plan_model(model, devices=devices, batch=1, tokens=1)


def format_record(name: str, devices: int, quantize: dict) -> dict:
    from megakernel.compiler.floors import floors
    from megakernel.errors import MegakernelError

    rec = {"model": name, "cores": devices, "formats": label(quantize), "quantize": quantize}
    try:
        plan = _plan(name, devices, quantize)
    except MegakernelError as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
        return rec
    fl = floors(plan)
    rec.update(hbm_bytes_per_core=plan.memory.hbm_total, modeled_step_ms=plan.cost.step_ms,
               modeled_hbm_floor_ms=fl.hbm_ms, modeled_core_floor_ms=fl.core_ms,
               modeled_binding_floor=fl.binding, modeled_binding_efficiency=fl.efficiency)
    for cores in dict.fromkeys((devices, dict(MODELS).get(name, devices))):
        try:
            base = _plan(name, cores, {})
        except MegakernelError as exc:
            rec["bf16_note"] = f"bf16 on {cores} cores: {type(exc).__name__}"
            continue
        rec.update(bf16_cores=cores, bf16_modeled_step_ms=base.cost.step_ms,
                   modeled_step_over_bf16=plan.cost.step_ms / base.cost.step_ms)
        break
    return rec


def format_records() -> list[dict]:
    return [format_record(*row) for row in FORMAT_ROWS]


def render(records: list[dict]) -> list[str]:
    def cells(r):
        head = [r["model"], str(r["cores"]), r["formats"]]
        if "error" in r:
            return head + [f"ERR {r['error']}"] + [""] * (len(COLUMNS) - 4)
        bf16 = ([f"{r['model']}/{r['bf16_cores']}", f"{r['bf16_modeled_step_ms']:.3f}",
                 f"{r['modeled_step_over_bf16']:.2f}"] if "bf16_cores" in r
                else [r.get("bf16_note", "-"), "-", "-"])
        return head + [f"{r['hbm_bytes_per_core'] / 1e9:.1f}",
                       f"{r['modeled_hbm_floor_ms']:.3f}/{r['modeled_core_floor_ms']:.3f}",
                       f"{r['modeled_binding_floor']}: {r['modeled_binding_efficiency']:.0%}",
                       f"{r['modeled_step_ms']:.3f}"] + bf16

    rows = [cells(r) for r in records]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(COLUMNS)]
    line = lambda cs: "  ".join(c.ljust(w) for c, w in zip(cs, widths)).rstrip()  # noqa: E731
    return (["", "Weight formats (planned, batch 1; every step and floor MODELED, "
             "bench/formats.py):", line(COLUMNS), line(["-" * w for w in widths])]
            + [line(r) for r in rows]
            + ["  x bf16: modeled step / the bf16 row's modeled step (the bf16 row on more "
               "cores where bf16 does not fit); HBM GB/core: weights, caches and",
               "  state held per core; binds: the largest floor (compiler/floors.py) and "
               "floor / modeled step. TPU7x VMEM of the full-size quantized kernels: "
               "docs/formats.md."])
