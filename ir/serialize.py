"""JSON form of the layer graph (``megakernel.ir/1``) and of model cards.

The graph form is complete: loading it rebuilds and re-verifies every node, so
``model_from_json(model_to_json(m)) == m``. Identical layers are written once
under ``layer_defs`` and referenced by index from ``layers``.

Reading is strict (docs/validation.md): the document's shape is checked by a
schema first (known keys only, exact types, bounded lengths), each op by its
own record type, and the model's sizes (ir/sizes.py) before it is assembled.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from pydantic import ConfigDict, Field

from megakernel.errors import IRError, error_context, shown
from megakernel.ir import limits, sizes
from megakernel.ir.card import CARD_FORMAT  # noqa: F401 - re-exported
from megakernel.ir.graph import Layer, Model, OpNode
from megakernel.ir.jsonfile import parse_json
from megakernel.ir.ops import RMSNorm, op_from_dict
from megakernel.ir.schema import Bool, Identifier, Int, ModelName, Word, check
from megakernel.ir.types import DType, TensorSpec
from megakernel.ir.weight_kinds import Quantize

IR_FORMAT = "megakernel.ir/1"

_STRICT = ConfigDict(extra="forbid")


def _list(item, most: int, least: int = 0):
    return Annotated[list[item], Field(min_length=least, max_length=most)]


class _TensorDoc(TypedDict):
    __pydantic_config__ = _STRICT
    name: Identifier
    shape: _list(Int(1, limits.MAX_WIDTH), limits.MAX_TENSOR_RANK)
    dtype: Word


class _NodeDoc(TypedDict):
    __pydantic_config__ = _STRICT
    name: Identifier
    op: dict[str, Any]
    inputs: _list(Identifier, limits.MAX_TENSORS)
    outputs: _list(Identifier, limits.MAX_TENSORS)


class _LayerDoc(TypedDict):
    __pydantic_config__ = _STRICT
    kind: Identifier
    input: Identifier
    output: Identifier
    tensors: _list(_TensorDoc, limits.MAX_TENSORS)
    nodes: _list(_NodeDoc, limits.MAX_NODES)


class _ModelDoc(TypedDict):
    """The whole ``megakernel.ir/1`` document; ops are checked by their own types."""

    __pydantic_config__ = _STRICT
    format: Literal["megakernel.ir/1"]
    name: ModelName
    vocab_size: Int(1, limits.MAX_VOCAB)
    hidden_size: Int(1, limits.MAX_WIDTH)
    dtype: Word
    tie_embeddings: Bool
    max_seq_len: Int(1, limits.MAX_SEQ_LEN)
    final_norm: dict[str, Any]
    layer_defs: _list(_LayerDoc, limits.MAX_LAYER_DEFS, 1)
    layers: _list(Int(0, limits.MAX_LAYER_DEFS - 1), limits.MAX_LAYERS, 1)
    logit_ops: NotRequired[_list(dict[str, Any], 8)]
    embed_ops: NotRequired[_list(dict[str, Any], 8)]
    quantize: NotRequired[dict[Word, Word]]
    vocab_used: NotRequired[Int(1, limits.MAX_VOCAB)]


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
    """A layer from its JSON object (checked against the layer schema first)."""
    data = check(_LayerDoc, data)
    tensors = []
    for i, t in enumerate(data["tensors"]):
        with error_context(f"tensors.{i}"):
            tensors.append(TensorSpec(t["name"], tuple(t["shape"]),
                                      DType.parse(t["dtype"], path="dtype")))
    nodes = []
    for n in data["nodes"]:
        with error_context(n["name"]):
            nodes.append(OpNode(n["name"], op_from_dict(n["op"]), tuple(n["inputs"]),
                                tuple(n["outputs"])))
    return Layer(data["kind"], tuple(nodes), tuple(tensors), data["input"], data["output"])


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
        **({"logit_ops": [op.to_dict() for op in model.logit_ops]} if model.logit_ops else {}),
        **({"embed_ops": [op.to_dict() for op in model.embed_ops]} if model.embed_ops else {}),
        **({"quantize": model.quantize.chosen()} if model.quantize.chosen() else {}),
        **({"vocab_used": model.vocab_used} if model.vocab_used is not None else {}),
    }


def model_from_dict(data: dict[str, Any]) -> Model:
    if not isinstance(data, dict):
        raise IRError(f"expected a JSON object, found {shown(data)}")
    if data.get("format") != IR_FORMAT:
        raise IRError(f"format={shown(data.get('format'))}, expected {IR_FORMAT!r}",
                      path="format")
    data = check(_ModelDoc, data)
    defs = []
    for i, d in enumerate(data["layer_defs"]):
        with error_context(f"layer_defs.{i}"):
            defs.append(layer_from_dict(d))
    layers = []
    for i, ref in enumerate(data["layers"]):
        if ref >= len(defs):
            raise IRError(f"refers to layer_defs[{ref}], but there are {len(defs)}",
                          path=f"layers.{i}", hint=f"use an index below {len(defs)}")
        layers.append(defs[ref])
    with error_context("final_norm"):
        final_norm = op_from_dict(data["final_norm"])
    if final_norm.kind != RMSNorm.kind:
        raise IRError(f"kind={final_norm.kind!r}, expected 'rmsnorm'", path="final_norm")
    dtype = DType.parse(data["dtype"], path="dtype")
    sizes.check_fits(sizes.of_layers(data["name"], data["vocab_size"], data["hidden_size"],
                                     layers, data["tie_embeddings"], dtype,
                                     data["max_seq_len"]), path="model")
    extra = {}
    for key in ("logit_ops", "embed_ops"):
        ops = []
        for i, op in enumerate(data.get(key, ())):
            with error_context(f"{key}.{i}"):
                ops.append(op_from_dict(op))
        extra[key] = tuple(ops)
    if "quantize" in data:
        with error_context("quantize"):
            extra["quantize"] = Quantize(**data["quantize"])
    if "vocab_used" in data:
        extra["vocab_used"] = data["vocab_used"]
    return Model(data["name"], data["vocab_size"], data["hidden_size"], tuple(layers),
                 final_norm, data["tie_embeddings"], dtype, data["max_seq_len"], **extra)


def model_to_json(model: Model) -> str:
    return json.dumps(model_to_dict(model), indent=1)


def model_from_json(text: str) -> Model:
    return model_from_dict(parse_json(text))
