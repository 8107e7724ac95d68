"""The model card: a flat record of the few numbers that define a model, and the
builder that turns it into the layer graph.

A card reads like a published config (MaxText keeps a model in ~20 flat keys);
``build`` makes the graph with one template per layer kind, no if-ladders over
model families. Identical layers come out equal, so the graph groups them into
stacks by itself.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, fields

from megakernel.errors import IRError, error_context
from megakernel.ir.graph import Layer, Model, OpNode
from megakernel.ir.ops import MLP, Add, Attention, Linear, MoE, Op, RMSNorm, Rope, RopeScaling
from megakernel.ir.types import DType, TensorSpec, check_positive


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    expert_intermediate: int
    scoring: str = "softmax"
    correction_bias: bool = False
    renormalize: bool = True
    routed_scaling: float = 1.0
    num_shared_experts: int = 0
    shared_intermediate: int = 0


@dataclass(frozen=True)
class ModelConfig:
    """Flat description of a decoder-only transformer (see docs/ir.md)."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    activation: str = "silu"
    norm_eps: float = 1e-6
    norm_offset: bool = False
    rope_theta: float = 10000.0
    rotary_dim: int = 0
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    softmax_scale: float = 0.0
    tie_embeddings: bool = False
    dtype: str = "bfloat16"
    max_seq_len: int = 4096
    moe: MoEConfig | None = None
    first_k_dense: int = 0

    def __post_init__(self):
        with error_context("config"):
            if isinstance(self.moe, dict):
                with error_context("moe"):
                    object.__setattr__(self, "moe", _from_dict(MoEConfig, self.moe, ""))
            if isinstance(self.rope_scaling, dict):
                with error_context("rope_scaling"):
                    object.__setattr__(self, "rope_scaling",
                                       _from_dict(RopeScaling, self.rope_scaling, ""))
            check_positive(self.num_layers, "num_layers")
            check_positive(self.first_k_dense, "first_k_dense", allow_zero=True)
            if self.moe is None and self.first_k_dense:
                raise IRError("first_k_dense is set but the model has no moe block",
                              path="first_k_dense")
            DType.parse(self.dtype, path="dtype")

    def layer_kind(self, index: int) -> str:
        return "moe" if self.moe is not None and index >= self.first_k_dense else "dense"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        return _from_dict(cls, data, "config")


def _from_dict(cls, data: dict, path: str):
    if not isinstance(data, dict):
        raise IRError(f"expected an object, found {type(data).__name__}", path=path)
    known = {f.name for f in fields(cls)}
    extra = sorted(set(data) - known)
    if extra:
        raise IRError(f"unknown fields {extra}; known: {sorted(known)}", path=path)
    required = [f.name for f in fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in data]
    if missing:
        raise IRError(f"missing required fields {missing}", path=path)
    return cls(**data)


class _LayerBuilder:
    """Appends ops and their output tensors in execution order."""

    def __init__(self, hidden: int):
        self.nodes: list[OpNode] = []
        self.tensors: dict[str, TensorSpec] = {"x": TensorSpec("x", (hidden,))}

    def add(self, name: str, make_op, inputs: tuple[str, ...], output: str) -> str:
        with error_context(name):
            op: Op = make_op()
            (shape,) = op.infer(tuple(self.tensors[t].shape for t in inputs))
        self.nodes.append(OpNode(name, op, inputs, (output,)))
        self.tensors[output] = TensorSpec(output, shape)
        return output


def _attention_block(c: ModelConfig, b: _LayerBuilder, x: str) -> str:
    h, d = c.hidden_size, c.head_dim
    q_dim, kv_dim = c.num_q_heads * d, c.num_kv_heads * d
    norm = lambda dim: lambda: RMSNorm(dim, c.norm_eps, c.norm_offset)  # noqa: E731
    rope = lambda heads: lambda: Rope(heads, d, c.rope_theta, c.rotary_dim, c.rope_scaling)  # noqa: E731

    hn = b.add("input_norm", norm(h), (x,), "h_attn")
    q = b.add("q_proj", lambda: Linear(h, q_dim, c.qkv_bias), (hn,), "q")
    k = b.add("k_proj", lambda: Linear(h, kv_dim, c.qkv_bias), (hn,), "k")
    v = b.add("v_proj", lambda: Linear(h, kv_dim, c.qkv_bias), (hn,), "v")
    if c.qk_norm:
        q = b.add("q_norm", norm(d), (q,), "q_normed")
        k = b.add("k_norm", norm(d), (k,), "k_normed")
    q = b.add("q_rope", rope(c.num_q_heads), (q,), "q_rot")
    k = b.add("k_rope", rope(c.num_kv_heads), (k,), "k_rot")
    o = b.add("attention", lambda: Attention(c.num_q_heads, c.num_kv_heads, d,
                                             c.softmax_scale, c.sliding_window),
              (q, k, v), "attn")
    o = b.add("o_proj", lambda: Linear(q_dim, h, c.o_bias), (o,), "attn_out")
    return b.add("attn_residual", Add, (x, o), "x_mid")


def _ffn_block(c: ModelConfig, b: _LayerBuilder, x: str, kind: str) -> str:
    h = c.hidden_size
    hn = b.add("post_norm", lambda: RMSNorm(h, c.norm_eps, c.norm_offset), (x,), "h_ffn")
    if kind == "moe":
        m = c.moe
        make = lambda: MoE(h, m.num_experts, m.top_k, m.expert_intermediate, m.scoring,  # noqa: E731
                           m.correction_bias, m.renormalize, m.routed_scaling,
                           m.num_shared_experts, m.shared_intermediate, c.activation)
        f = b.add("moe", make, (hn,), "ffn_out")
    else:
        f = b.add("mlp", lambda: MLP(h, c.intermediate_size, c.activation), (hn,), "ffn_out")
    return b.add("ffn_residual", Add, (x, f), "y")


@functools.lru_cache(maxsize=64)
def _layer(c: ModelConfig, kind: str) -> Layer:
    b = _LayerBuilder(c.hidden_size)
    x = _attention_block(c, b, "x")
    _ffn_block(c, b, x, kind)
    return Layer(kind, tuple(b.nodes), tuple(b.tensors.values()), "x", "y")


def build(config: ModelConfig) -> Model:
    """The layer graph of ``config``; errors name ``layers.{i}.{op}.{field}``."""
    layers = []
    for i in range(config.num_layers):
        with error_context(f"layers.{i}"):
            layers.append(_layer(config, config.layer_kind(i)))
    with error_context("final_norm"):
        final_norm = RMSNorm(config.hidden_size, config.norm_eps, config.norm_offset)
    return Model(config.name, config.vocab_size, config.hidden_size, tuple(layers),
                 final_norm, config.tie_embeddings, DType.parse(config.dtype),
                 config.max_seq_len)
