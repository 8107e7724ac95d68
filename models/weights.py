"""Seeded random weights for any model, scaled so activations stay O(1).

Each weight draws from its own generator, seeded by (seed, weight name), so a
weight's values do not depend on which other weights exist: cutting a model to
fewer layers keeps the weights of the layers that remain.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from megakernel.ir.graph import Model
from megakernel.ir.types import DType
from megakernel.quantize import quantize_weights
from megakernel.registry import Registry

# Per op kind: param -> (rule, fan-in axis). Rules:
#   "matrix": normal with std 1/sqrt(fan_in)
#   "residual": like matrix, further divided by sqrt(2 * layers), since these
#               write into the residual stream once per block (GPT-2's scaling)
#   "writer": the matrix that makes the op's output: "residual" when a residual
#             add reads that output (e.g. o_proj), else "matrix"
#   "scale": 1 + 0.1 * normal (0.1 * normal when the norm has a +1 offset)
#   "bias": 0.02 * normal;  "route_bias": 0.1 * normal;  "sink": normal
#   "log_decay": -1 + 0.5 * normal;  "dt_bias": 0.5 * normal (Gated DeltaNet's
#               A_log and dt_bias: per-token decays mostly 0.4..0.95)
#   "gate": normal (a residual gate's logits times its temperature)
INIT: Registry[dict[str, tuple[str, int]]] = Registry(
    "init", "models/kind_*.py (linear, add: models/weights.py)")
INIT.register("linear")({"weight": ("writer", 0), "bias": ("bias", 0)})
INIT.register("add")({})


def _residual_writers(layer) -> set[str]:
    """Nodes whose output a residual add (or gate) reads directly (e.g. o_proj)."""
    adds = [n for n in layer.nodes if n.op.RESIDUAL]
    read = {t for n in adds for t in n.inputs}
    return {n.name for n in layer.nodes if set(n.outputs) & read}


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _draw(rule: str, shape, fan_in: int, depth_scale: float, offset: bool,
          rng: np.random.Generator) -> np.ndarray:
    z = rng.standard_normal(shape)
    if rule == "matrix":
        return z / math.sqrt(fan_in)
    if rule == "residual":
        return z / math.sqrt(fan_in) * depth_scale
    if rule == "scale":
        return 0.1 * z + (0.0 if offset else 1.0)
    if rule == "bias":
        return 0.02 * z
    if rule == "route_bias":
        return 0.1 * z
    if rule in ("sink", "gate"):
        return z
    if rule == "log_decay":
        return -1.0 + 0.5 * z
    if rule == "dt_bias":
        return 0.5 * z
    raise AssertionError(rule)


def init_weights(model: Model, seed: int = 0, dtype: DType | None = None) -> dict[str, np.ndarray]:
    """All weights of ``model`` (names as ``Model.params()``), as numpy arrays in
    ``dtype`` (default: the model's; f32-only params such as the router
    correction bias stay f32)."""
    depth_scale = 1.0 / math.sqrt(2 * len(model.layers))
    out: dict[str, np.ndarray] = {}

    def put(name, value, spec_dtype: DType):
        target = spec_dtype if spec_dtype == DType.F32 else (dtype or spec_dtype)
        out[name] = np.asarray(value, np.float32).astype(target.np)

    put("embed.weight", _rng(seed, "embed.weight").standard_normal(
        (model.vocab_size, model.hidden_size)), model.dtype)
    for i, layer in enumerate(model.layers):
        residual = _residual_writers(layer)
        for node in layer.nodes:
            rules = INIT(node.op.kind, f"layers[{i}].{node.name}")
            for pname, spec in node.op.params(model.dtype).items():
                name = f"layers.{i}.{node.name}.{pname}"
                rule, axis = rules[pname]
                if rule == "writer":
                    rule = "residual" if node.name in residual else "matrix"
                offset = getattr(node.op, "offset", False)
                put(name, _draw(rule, spec.shape, spec.shape[axis], depth_scale, offset,
                                _rng(seed, name)), spec.dtype)
    norm = model.final_norm
    put("final_norm.weight", _draw("scale", (model.hidden_size,), 1, 1.0, norm.offset,
                                   _rng(seed, "final_norm.weight")), model.dtype)
    if not model.tie_embeddings:
        put("lm_head.weight", _rng(seed, "lm_head.weight").standard_normal(
            (model.hidden_size, model.vocab_size)) / math.sqrt(model.hidden_size), model.dtype)
    return quantize_weights(model, out, dtype or model.dtype)
