"""The layer templates of a card: the mixer table's attention and sliding
attention and the FFN table (dense MLP, MoE), each a block builder appending
ops to a ``LayerBuilder`` with its size formula, registered in the card's
tables (ir/card.py; other mixers in their ir/kind_*.py module); ``layer``
makes one verified layer of a card (ir/config.py ``build`` calls it per
layer).
"""

from __future__ import annotations

import functools

from megakernel.errors import IRError, error_context
from megakernel.ir import sizes
from megakernel.ir.card import FFN, FFNS, MIXERS, Mixer, ModelConfig
from megakernel.ir.graph import Layer, OpNode
from megakernel.ir.kind_elementwise import Activate, Mul
from megakernel.ir.kind_norm_parts import MeanSquare, RMSScale
from megakernel.ir.ops import MLP, Activation, Add, Attention, Linear, MoE, Op, RMSNorm, Rope
from megakernel.ir.types import TensorSpec

# Op fields whose card field has another name: an op's error says which card
# field to change (``layers.0.q_rope: theta: ... (set by the card's rope_theta)``).
_CARD_FIELDS = {"eps": "norm_eps", "offset": "norm_offset",
                "theta": "rope_theta or sliding_rope_theta", "logit_softcap": "attn_logit_softcap",
                "scaling": "rope_scaling", "bias": "qkv_bias or o_bias",
                "hidden": "hidden_size", "intermediate": "intermediate_size",
                "dim": "hidden_size or head_dim", "num_heads": "num_q_heads or num_kv_heads",
                "in_features": "hidden_size or num_q_heads x head_dim",
                "out_features": "hidden_size or the head counts x head_dim",
                "num_key_heads": "linear_attention.num_key_heads",
                "num_value_heads": "linear_attention.num_value_heads",
                "key_dim": "linear_attention.key_head_dim",
                "value_dim": "linear_attention.value_head_dim",
                "conv_kernel": "linear_attention.conv_kernel"}


def with_card_field(err: IRError) -> IRError:
    field = err.message.split(":", 1)[0]
    if field not in _CARD_FIELDS:
        return err
    hint = f"set by the card's {_CARD_FIELDS[field]}" + (f"; {err.hint}" if err.hint else "")
    return type(err)(err.message, path=err.path, hint=hint)


class LayerBuilder:
    """Appends ops and their output tensors in execution order; ``layer()``
    makes the verified Layer. Cards use it, and so can a hand-written graph
    (docs/new-model.md)."""

    def __init__(self, hidden: int):
        self.nodes: list[OpNode] = []
        self.tensors: dict[str, TensorSpec] = {"x": TensorSpec("x", (hidden,))}

    def add(self, name: str, make_op, inputs: tuple[str, ...], output: str) -> str:
        with error_context(name):
            try:
                op: Op = make_op()
            except IRError as err:
                raise with_card_field(err) from None
            (shape,) = op.infer(tuple(self.tensors[t].shape for t in inputs))
        self.nodes.append(OpNode(name, op, inputs, (output,)))
        self.tensors[output] = TensorSpec(output, shape)
        return output

    def layer(self, kind: str, output: str) -> Layer:
        return Layer(kind, tuple(self.nodes), tuple(self.tensors.values()), "x", output)


def _norm(c: ModelConfig, dim: int):
    return lambda: RMSNorm(dim, c.norm_eps, c.norm_offset)


def _qk_norm(c: ModelConfig, b: LayerBuilder, t: str, which: str) -> str:
    """Per-head norm, or (``qk_norm_all_heads``) one over the whole projection,
    in two parts so that its mean of squares can be summed over cores."""
    if not c.qk_norm_all_heads:
        return b.add(f"{which}_norm", _norm(c, c.head_dim), (t,), f"{which}_normed")
    width = b.tensors[t].shape[0]
    ms = b.add(f"{which}_ms", lambda: MeanSquare(width), (t,), f"{which}_ms")
    return b.add(f"{which}_norm", lambda: RMSScale(width, c.norm_eps, c.norm_offset), (t, ms),
                 f"{which}_normed")


def _attention_block(c: ModelConfig, b: LayerBuilder, x: str, window, local: bool) -> str:
    h, d = c.hidden_size, c.head_dim
    q_dim, kv_dim = c.num_q_heads * d, c.num_kv_heads * d
    theta, scaling = c.rope_theta, c.rope_scaling
    if local and c.sliding_rope_theta is not None:
        theta, scaling = c.sliding_rope_theta, None
    rope = lambda heads: lambda: Rope(heads, d, theta, c.rotary_dim, scaling)  # noqa: E731

    hn = b.add("input_norm", _norm(c, h), (x,), "h_attn") if c.pre_norms else x
    q = b.add("q_proj", lambda: Linear(h, q_dim, c.qkv_bias), (hn,), "q")
    if c.attn_output_gate:    # Hugging Face interleaves it with q_proj's rows per head
        gate = b.add("gate_proj", lambda: Linear(h, q_dim, c.qkv_bias), (hn,), "gate")
    k = b.add("k_proj", lambda: Linear(h, kv_dim, c.qkv_bias), (hn,), "k")
    v = b.add("v_proj", lambda: Linear(h, kv_dim, c.qkv_bias), (hn,), "v")
    if c.qk_norm:
        q, k = _qk_norm(c, b, q, "q"), _qk_norm(c, b, k, "k")
    q = b.add("q_rope", rope(c.num_q_heads), (q,), "q_rot")
    k = b.add("k_rope", rope(c.num_kv_heads), (k,), "k_rot")
    o = b.add("attention", lambda: Attention(c.num_q_heads, c.num_kv_heads, d,
                                             c.softmax_scale, window, c.attn_logit_softcap,
                                             c.attention_sinks),
              (q, k, v), "attn")
    if c.attn_output_gate:
        gate = b.add("gate_act", lambda: Activate(Activation.SIGMOID), (gate,), "gate_sig")
        o = b.add("attn_gate", Mul, (o, gate), "attn_gated")
    o = b.add("o_proj", lambda: Linear(q_dim, h, c.o_bias), (o,), "attn_out")
    if c.post_norms:
        o = b.add("post_attn_norm", _norm(c, h), (o,), "attn_normed")
    return b.add("attn_residual", Add, (x, o), "x_mid")


def _attention_sizes(c: ModelConfig) -> tuple[int, int]:
    """(weights, K/V-cache bytes of one sequence) of one attention mixer: its
    block norms, q, k, v, o, biases, sinks, q/k norms and output gate."""
    item, h, d = sizes.item_size(c), c.hidden_size, c.head_dim
    q, kv = c.num_q_heads * d, c.num_kv_heads * d
    attn = sizes.block_norms(c) + h * q + 2 * h * kv + q * h
    attn += (q + 2 * kv) * c.qkv_bias + h * c.o_bias + c.num_q_heads * c.attention_sinks
    attn += ((q + kv) if c.qk_norm_all_heads else 2 * d) * c.qk_norm
    attn += (h * q + q * c.qkv_bias) * c.attn_output_gate
    return attn * item, 2 * c.max_seq_len * kv * item


# The mixer table (ir/card.py): a layer_types name -> its Mixer (Gated
# DeltaNet's, "linear_attention", is ir/kind_gdn.py's, "mla" ir/kind_mla.py's).
MIXERS.register("full_attention")(Mixer(
    "", lambda c, b, x: _attention_block(c, b, x, c.sliding_window if c.layer_types is None
                                         else None, False), _attention_sizes))
MIXERS.register("sliding_attention")(Mixer(
    "sliding", lambda c, b, x: _attention_block(c, b, x, c.sliding_window, True),
    _attention_sizes))


def _mlp(c: ModelConfig, b: LayerBuilder, hn: str) -> str:
    return b.add("mlp", lambda: MLP(c.hidden_size, c.intermediate_size, c.activation), (hn,),
                 "ffn_out")


def _moe(c: ModelConfig, b: LayerBuilder, hn: str) -> str:
    m = c.moe
    return b.add("moe", lambda: MoE(c.hidden_size, m.num_experts, m.top_k,
                                    m.expert_intermediate, m.scoring, m.correction_bias,
                                    m.renormalize, m.routed_scaling, m.num_shared_experts,
                                    m.shared_intermediate, c.activation, m.router_logit_bias,
                                    m.expert_bias, m.swiglu_limit, m.swiglu_alpha,
                                    n_group=m.n_group, topk_group=m.topk_group,
                                    shared_expert_gate=m.shared_expert_gate), (hn,), "ffn_out")


def _mlp_sizes(c: ModelConfig) -> int:
    return 3 * c.hidden_size * c.intermediate_size * sizes.item_size(c)


def _moe_sizes(c: ModelConfig) -> int:
    """Routed experts (router, gate/up/down, biases), shared experts and their
    gate; the router's correction bias is kept in float32 (MoE.params)."""
    m, h, item = c.moe, c.hidden_size, sizes.item_size(c)
    i = m.expert_intermediate
    routed = m.num_experts * (h + 3 * h * i + m.router_logit_bias + (2 * i + h) * m.expert_bias)
    shared = 3 * h * m.num_shared_experts * m.shared_intermediate + h * m.shared_expert_gate
    return (routed + shared) * item + 4 * m.num_experts * m.correction_bias


# The FFN table (ir/card.py): a layer kind -> its FFN.
FFNS.register("dense")(FFN(_mlp, _mlp_sizes))
FFNS.register("moe")(FFN(_moe, _moe_sizes))


def _ffn_block(c: ModelConfig, b: LayerBuilder, x: str, kind: str) -> str:
    # "post_norm" is the norm after the attention block, before the FFN (HF's
    # post_attention_layernorm in Llama); the FFN output's own is post_ffn_norm.
    hn = b.add("post_norm", _norm(c, c.hidden_size), (x,), "h_ffn") if c.pre_norms else x
    f = FFNS(kind, "ffn").block(c, b, hn)
    if c.post_norms:
        f = b.add("post_ffn_norm", _norm(c, c.hidden_size), (f,), "ffn_normed")
    return b.add("ffn_residual", Add, (x, f), "y")


@functools.lru_cache(maxsize=64)
def layer(c: ModelConfig, mixer: str, ffn: str) -> Layer:
    label, block, _ = MIXERS(mixer, "mixer")
    b = LayerBuilder(c.hidden_size)
    x = block(c, b, "x")
    return b.layer(f"{label}_{ffn}" if label else ffn, _ffn_block(c, b, x, ffn))
