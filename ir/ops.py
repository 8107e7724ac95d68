"""Op kinds of the layer graph: frozen parameter records, checked when built.

An op knows its own weights (``params``), the state it keeps between steps
(``state``) and the per-token shapes it maps (``infer``); it knows nothing of
layers, sharding or code generation. ``OP_KINDS`` finds an op's class by its
kind; every later stage finds its rule for the kind in its own registry
(``megakernel.registry``). The core kinds live here; others in
``ir/kind_*.py`` (docs/architecture.md, "Adding an op kind").
"""

from __future__ import annotations

import enum
import math
from dataclasses import fields
from typing import Any, ClassVar, Literal

import numpy as np

from megakernel.errors import IRError, shown
from megakernel.ir import limits
from megakernel.ir.schema import Bool, Float, Int, node
from megakernel.ir.types import APPEND, DType, ParamSpec, StateSpec
from megakernel.registry import Registry

# Field types of ops (ranges in ir/limits.py, docs/validation.md).
Dim = Int(1, limits.MAX_WIDTH)
Heads = Int(1, limits.MAX_HEADS)
HeadDim = Int(1, limits.MAX_HEAD_DIM)
Positions = Int(1, limits.MAX_SEQ_LEN)
FreqFactor = Float(limits.ROPE_FREQ_FACTOR[0], limits.ROPE_FREQ_FACTOR[1], open_low=True)


class Activation(enum.Enum):
    SILU = "silu"
    GELU = "gelu"            # exact (erf) GELU
    GELU_TANH = "gelu_tanh"  # tanh approximation
    SIGMOID = "sigmoid"
    TANH = "tanh"


class Scoring(enum.Enum):
    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


def _fail(field_name: str, message: str) -> IRError:
    # The message already says `field=value`; the path stops at the op.
    del field_name
    return IRError(message)


def _expect_shapes(op: "Op", found: tuple[tuple[int, ...], ...],
                   expected: tuple[tuple[int, ...], ...]) -> None:
    if tuple(found) != tuple(expected):
        raise IRError(f"inputs have per-token shapes {list(found)}, expected "
                      f"{list(expected)}", path=op.kind)


@node
class Op:
    """Base of all op kinds. ``kind`` names the op in tables and JSON."""

    kind: ClassVar[str] = "op"
    # Errors name the op (``layers.0.attention``); the message names the field.
    FLAT_ERRORS: ClassVar[bool] = True

    def params(self, dtype: DType) -> dict[str, ParamSpec]:
        return {}

    def state(self, batch: int, max_seq_len: int, dtype: DType) -> dict[str, StateSpec]:
        """What this op keeps between decode steps (KV caches, recurrent state),
        by name; the planner, packer, kernel and reference all read this."""
        return {}

    def rows_read(self, valid: int, tokens: int) -> int:
        """Rows of an appended state one step reads per sequence, when ``valid``
        rows (the new ``tokens`` included) are in it."""
        return valid

    def infer(self, inputs: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        raise NotImplementedError

    def to_dict(self) -> dict:
        out = {"kind": self.kind}
        for f in fields(self):
            out[f.name] = _encode(getattr(self, f.name))
        return out


def _encode(value):
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, RopeScaling):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    return value


@node
class RMSNorm(Op):
    """y = x / rms(x) * w over groups of ``dim`` features (``dim`` = the whole
    vector, or a head for qk-norm). With ``offset`` the scale is (1 + w)."""

    kind: ClassVar[str] = "rmsnorm"
    dim: Dim
    eps: Float(*limits.NORM_EPS) = 1e-6
    offset: Bool = False

    def params(self, dtype):
        return {"weight": ParamSpec((self.dim,), dtype)}

    def infer(self, inputs):
        (shape,) = inputs
        if len(shape) != 1 or shape[0] % self.dim:
            raise IRError(f"input of {shape[0] if shape else shape} features is not "
                          f"a whole number of groups of dim={self.dim}", path=self.kind)
        return (shape,)


@node
class Linear(Op):
    """y = x @ W (+ b); W is stored [in_features, out_features]."""

    kind: ClassVar[str] = "linear"
    in_features: Dim
    out_features: Dim
    bias: Bool = False

    def params(self, dtype):
        p = {"weight": ParamSpec((self.in_features, self.out_features), dtype)}
        if self.bias:
            p["bias"] = ParamSpec((self.out_features,), dtype)
        return p

    def infer(self, inputs):
        _expect_shapes(self, inputs, ((self.in_features,),))
        return ((self.out_features,),)


@node
class RopeScaling:
    """Frequency scaling of rotary embeddings. ``llama3``: Llama 3.1+ smooth
    wavelength-dependent scaling; ``linear``: positions divided by ``factor``;
    ``yarn``: YaRN's ramp between interpolated and original frequencies
    (``beta_fast``/``beta_slow`` rotations, rounded outward when ``truncate``),
    with cos and sin multiplied by ``attention_factor`` (0: 0.1 ln(factor) + 1)."""

    rope_type: Literal["llama3", "linear", "yarn"]
    factor: Float(*limits.ROPE_FACTOR, open_low=True)
    low_freq_factor: FreqFactor = 1.0
    high_freq_factor: FreqFactor = 4.0
    original_max_position: Positions = 8192
    beta_fast: FreqFactor = 32.0
    beta_slow: FreqFactor = 1.0
    truncate: Bool = True
    attention_factor: Float(0.0, limits.ROPE_FACTOR[1]) = 0.0

    SUPPORTED: ClassVar[tuple[str, ...]] = ("llama3", "linear", "yarn")

    def __post_init__(self):
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise _fail("high_freq_factor",
                        f"high_freq_factor={self.high_freq_factor} must exceed "
                        f"low_freq_factor={self.low_freq_factor}")


@node
class Rope(Op):
    """Rotary position embedding (rotate-half layout) of the first ``rotary_dim``
    features of each of ``num_heads`` heads of ``head_dim``."""

    kind: ClassVar[str] = "rope"
    num_heads: Heads
    head_dim: HeadDim
    theta: Float(*limits.ROPE_THETA, open_low=True) = 10000.0
    rotary_dim: Int(0, limits.MAX_HEAD_DIM) = 0          # 0 means the full head
    scaling: RopeScaling | None = None

    def __post_init__(self):
        if self.rotary_dim == 0:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        rd = self.rotary_dim
        if not (rd <= self.head_dim and rd % 2 == 0):
            raise _fail("rotary_dim", f"rotary_dim={rd!r} must be even and in "
                        f"(0, head_dim={self.head_dim}]")

    def inv_freq(self) -> np.ndarray:
        """Per-pair inverse frequencies [rotary_dim // 2], float64, scaling applied."""
        rd = self.rotary_dim
        inv = 1.0 / (self.theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd))
        s = self.scaling
        if s is None:
            return inv
        if s.rope_type == "linear":
            return inv / s.factor
        if s.rope_type == "yarn":
            return _yarn_inv_freq(inv, s, rd, self.theta)
        # llama3: long wavelengths slowed by `factor`, short ones kept, a smooth
        # blend in between (Llama 3.1 reference implementation's equations).
        wavelen = 2 * math.pi / inv
        low_wl = s.original_max_position / s.low_freq_factor
        high_wl = s.original_max_position / s.high_freq_factor
        smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (
            s.high_freq_factor - s.low_freq_factor)
        blended = (1 - smooth) * inv / s.factor + smooth * inv
        return np.where(wavelen > low_wl, inv / s.factor,
                        np.where(wavelen < high_wl, inv, blended))

    def attention_factor(self) -> float:
        """What cos and sin are multiplied by (YaRN's attention scaling; else 1)."""
        s = self.scaling
        if s is None or s.rope_type != "yarn":
            return 1.0
        if s.attention_factor:
            return s.attention_factor
        return 0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0

    def infer(self, inputs):
        _expect_shapes(self, inputs, ((self.num_heads * self.head_dim,),))
        return inputs


def _yarn_inv_freq(inv: np.ndarray, s: RopeScaling, rd: int, theta: float) -> np.ndarray:
    """YaRN (transformers' _compute_yarn_parameters): pair i keeps its frequency
    below rotation count ``beta_fast``'s dimension, is divided by ``factor``
    above ``beta_slow``'s, and is blended linearly in between."""
    def dim_of(rotations: float) -> float:
        return rd * math.log(s.original_max_position / (rotations * 2 * math.pi)) / (
            2 * math.log(theta))

    lo, hi = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, rd - 1)
    if lo == hi:
        hi += 0.001         # as transformers does, so the ramp has a width
    ramp = np.clip((np.arange(rd // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
    keep = 1.0 - ramp       # 1: original frequency (extrapolation), 0: interpolated
    return inv / s.factor * (1.0 - keep) + inv * keep


@node
class Attention(Op):
    """Causal GQA attention of T new tokens per sequence over a KV cache.

    Inputs q [Hq*D], k [Hkv*D], v [Hkv*D] per token; the new k, v are written to
    the cache at positions p..p+T-1 first, then every query attends to cache
    positions j <= its own (and j > pos - sliding_window when set).
    ``logit_softcap`` c: scaled scores s become c * tanh(s / c) before the mask
    (Gemma 2). ``sinks``: a learned logit per query head joins the softmax's
    denominator only, ``p_j = e^s_j / (sum_k e^s_k + e^sink)`` (gpt-oss)."""

    kind: ClassVar[str] = "attention"
    num_q_heads: Heads
    num_kv_heads: Heads
    head_dim: HeadDim
    softmax_scale: Float(*limits.SOFTMAX_SCALE) = 0.0   # 0 means 1/sqrt(head_dim)
    sliding_window: Positions | None = None
    logit_softcap: Float(0.0, limits.MAX_SCALE, open_low=True) | None = None
    sinks: Bool = False

    def __post_init__(self):
        if self.num_q_heads % self.num_kv_heads:
            raise _fail("num_q_heads", f"num_q_heads={self.num_q_heads} is not a "
                        f"multiple of num_kv_heads={self.num_kv_heads}")
        if self.softmax_scale == 0:
            object.__setattr__(self, "softmax_scale", 1.0 / math.sqrt(self.head_dim))

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    def params(self, dtype):
        return {"sinks": ParamSpec((self.num_q_heads,), dtype)} if self.sinks else {}

    def state(self, batch, max_seq_len, dtype):
        rows = StateSpec((batch, max_seq_len, self.num_kv_heads, self.head_dim), dtype, APPEND)
        return {"k": rows, "v": rows}

    def rows_read(self, valid, tokens):
        if self.sliding_window is None:
            return valid
        return min(valid, self.sliding_window + tokens - 1)

    def infer(self, inputs):
        q = (self.num_q_heads * self.head_dim,)
        kv = (self.num_kv_heads * self.head_dim,)
        _expect_shapes(self, inputs, (q, kv, kv))
        return (q,)


@node
class MLP(Op):
    """Feed-forward block: down(act(gate(x)) * up(x)) when ``gated`` (SwiGLU,
    GeGLU), else down(act(up(x)))."""

    kind: ClassVar[str] = "mlp"
    hidden: Dim
    intermediate: Dim
    activation: Activation = Activation.SILU
    gated: Bool = True

    def params(self, dtype):
        h, i = self.hidden, self.intermediate
        p = {"up": ParamSpec((h, i), dtype), "down": ParamSpec((i, h), dtype)}
        if self.gated:
            p = {"gate": ParamSpec((h, i), dtype), **p}
        return p

    def infer(self, inputs):
        _expect_shapes(self, inputs, ((self.hidden,),))
        return ((self.hidden,),)


@node
class MoE(Op):
    """Mixture of experts: router, top-k selection, gated expert FFNs, shared experts.

    scores = softmax|sigmoid(x @ router); experts are *selected* by
    scores + correction_bias (when present) but *weighted* by scores; the k weights
    are renormalised to sum 1 when ``renormalize``, then multiplied by
    ``routed_scaling``. ``num_shared_experts`` always-on experts of
    ``shared_intermediate`` each are added (stored as one MLP of their total width).
    gpt-oss's variant: ``router_logit_bias`` adds a learned bias to the router
    logits (selection and weights alike); ``expert_bias`` gives each expert
    biases on gate, up and down; ``swiglu_limit`` L replaces act(g) * u by
    (clip(u, -L, L) + 1) * min(g, L) * sigmoid(swiglu_alpha * min(g, L)).
    """

    kind: ClassVar[str] = "moe"
    hidden: Dim
    num_experts: Int(1, limits.MAX_EXPERTS)
    top_k: Int(1, limits.MAX_EXPERTS)
    expert_intermediate: Dim
    scoring: Scoring = Scoring.SOFTMAX
    correction_bias: Bool = False
    renormalize: Bool = False
    routed_scaling: Float(*limits.ROUTED_SCALING, open_low=True) = 1.0
    num_shared_experts: Int(0, limits.MAX_SHARED_EXPERTS) = 0
    shared_intermediate: Int(0, limits.MAX_WIDTH) = 0
    activation: Activation = Activation.SILU
    router_logit_bias: Bool = False
    expert_bias: Bool = False
    swiglu_limit: Float(0.0, limits.MAX_SCALE, open_low=True) | None = None
    swiglu_alpha: Float(0.0, limits.MAX_SCALE, open_low=True) = 1.0

    def __post_init__(self):
        if self.top_k > self.num_experts:
            raise _fail("top_k", f"top_k={self.top_k} exceeds num_experts={self.num_experts}")
        if self.num_shared_experts and not self.shared_intermediate:
            raise _fail("shared_intermediate", f"shared_intermediate=0 with "
                        f"num_shared_experts={self.num_shared_experts}: expected >= 1")
        if self.swiglu_limit is not None and self.activation != Activation.SILU:
            raise _fail("swiglu_limit", f"swiglu_limit={self.swiglu_limit} needs activation="
                        f"'silu', found {self.activation.value!r}")
        if self.swiglu_limit is None and self.swiglu_alpha != 1.0:
            raise _fail("swiglu_alpha", f"swiglu_alpha={self.swiglu_alpha} is only used "
                        "with swiglu_limit (the clamped SwiGLU); set both or neither")

    @property
    def shared_width(self) -> int:
        return self.num_shared_experts * self.shared_intermediate

    def params(self, dtype):
        h, e, i = self.hidden, self.num_experts, self.expert_intermediate
        p = {"router": ParamSpec((h, e), dtype)}
        if self.correction_bias:
            p["router_bias"] = ParamSpec((e,), DType.F32)
        if self.router_logit_bias:
            p["router_logit_bias"] = ParamSpec((e,), dtype)
        p.update(experts_gate=ParamSpec((e, h, i), dtype),
                 experts_up=ParamSpec((e, h, i), dtype),
                 experts_down=ParamSpec((e, i, h), dtype))
        if self.expert_bias:
            p.update(experts_gate_bias=ParamSpec((e, i), dtype),
                     experts_up_bias=ParamSpec((e, i), dtype),
                     experts_down_bias=ParamSpec((e, h), dtype))
        if self.num_shared_experts:
            s = self.shared_width
            p.update(shared_gate=ParamSpec((h, s), dtype), shared_up=ParamSpec((h, s), dtype),
                     shared_down=ParamSpec((s, h), dtype))
        return p

    def infer(self, inputs):
        _expect_shapes(self, inputs, ((self.hidden,),))
        return ((self.hidden,),)


@node
class Add(Op):
    """Residual add of two tensors of the same shape."""

    kind: ClassVar[str] = "add"

    def infer(self, inputs):
        if len(inputs) != 2 or inputs[0] != inputs[1]:
            raise IRError(f"add needs two inputs of one shape, found {list(inputs)}",
                          path=self.kind)
        return (inputs[0],)


# The op class of every kind; kind modules register theirs (megakernel/kinds.py).
OP_KINDS: Registry[type[Op]] = Registry("op kind", "ir/ops.py or an ir/kind_*.py module")
for _cls in (RMSNorm, Linear, Rope, Attention, MLP, MoE, Add):
    OP_KINDS.register(_cls.kind)(_cls)


def op_from_dict(data: Any) -> Op:
    """Rebuild an op from ``Op.to_dict`` output; unknown kinds or fields, and
    values of the wrong type or range, are errors naming the field."""
    if not isinstance(data, dict):
        raise IRError(f"expected an object with a kind, found {shown(data)}",
                      hint=f'write {{"kind": ..., ...}} with a kind of {sorted(OP_KINDS)}')
    data = dict(data)
    kind = data.pop("kind", None)
    if not isinstance(kind, str) or kind not in OP_KINDS:
        raise IRError(f"unknown op kind {shown(kind)}; known: {sorted(OP_KINDS)}", path="kind")
    err: IRError | None = None
    try:
        return OP_KINDS(kind)(**data)
    except IRError as caught:
        err = caught
    raise err.prefixed(kind)
