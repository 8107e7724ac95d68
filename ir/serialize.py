"""JSON form of the layer graph (``megakernel.ir/1``) and of model cards.

The graph form is complete: loading it rebuilds and re-verifies every node, so
``model_from_json(model_to_json(m)) == m``. Identical layers are written once
under ``layer_defs`` and referenced by index from ``layers``.
"""

from __future__ import annotations

import json
from typing import Any

from megakernel.errors import IRError, error_context
from megakernel.ir.graph import Layer, Model, OpNode
from megakernel.ir.ops import RMSNorm, op_from_dict
from megakernel.ir.types import DType, TensorSpec

IR_FORMAT = "megakernel.ir/1"
CARD_FORMAT = "megakernel.card/1"


def layer_to_dict(layer: Layer) -> dict[str, Any]:
    return {
        "kind": layer.kind,
        "input": layer.input,
        "output": layer.output,
        "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype.value}
                    for t in layer.tensors],
        "nodes": [{"name": n.name, "op": n.op.to_dict(), "inputs": list(n.inputs),
                   "outputs": list(n.outputs)} for n in layer.nodes],
    }


def layer_from_dict(data: dict[str, Any]) -> Layer:
    try:
        tensors = tuple(TensorSpec(t["name"], tuple(t["shape"]), DType.parse(t["dtype"]))
                        for t in data["tensors"])
        nodes = []
        for n in data["nodes"]:
            with error_context(str(n.get("name", "?"))):
                nodes.append(OpNode(n["name"], op_from_dict(n["op"]), tuple(n["inputs"]),
                                    tuple(n["outputs"])))
        return Layer(data["kind"], tuple(nodes), tensors, data["input"], data["output"])
    except (KeyError, TypeError) as err:
        raise IRError(f"malformed layer: missing or wrong field {err}") from None


def model_to_dict(model: Model) -> dict[str, Any]:
    defs: list[Layer] = []
    refs: list[int] = []
    for layer in model.layers:
        if layer not in defs:
            defs.append(layer)
        refs.append(defs.index(layer))
    return {
        "format": IR_FORMAT,
        "name": model.name,
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "dtype": model.dtype.value,
        "tie_embeddings": model.tie_embeddings,
        "max_seq_len": model.max_seq_len,
        "final_norm": model.final_norm.to_dict(),
        "layer_defs": [layer_to_dict(layer) for layer in defs],
        "layers": refs,
    }


def model_from_dict(data: dict[str, Any]) -> Model:
    if data.get("format") != IR_FORMAT:
        raise IRError(f"format={data.get('format')!r}, expected {IR_FORMAT!r}", path="format")
    try:
        defs = []
        for i, d in enumerate(data["layer_defs"]):
            with error_context(f"layer_defs.{i}"):
                defs.append(layer_from_dict(d))
        layers = []
        for i, ref in enumerate(data["layers"]):
            if not (isinstance(ref, int) and 0 <= ref < len(defs)):
                raise IRError(f"refers to layer_defs[{ref!r}], but there are {len(defs)}",
                              path=f"layers.{i}")
            layers.append(defs[ref])
        with error_context("final_norm"):
            final_norm = op_from_dict(data["final_norm"])
        if not isinstance(final_norm, RMSNorm):
            raise IRError(f"kind={final_norm.kind!r}, expected 'rmsnorm'", path="final_norm")
        return Model(data["name"], data["vocab_size"], data["hidden_size"], tuple(layers),
                     final_norm, data["tie_embeddings"], DType.parse(data["dtype"]),
                     data["max_seq_len"])
    except KeyError as err:
        raise IRError(f"missing field {err}", path="model") from None


def model_to_json(model: Model) -> str:
    return json.dumps(model_to_dict(model), indent=1)


def model_from_json(text: str) -> Model:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise IRError(f"not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise IRError(f"expected a JSON object, found {type(data).__name__}")
    return model_from_dict(data)
