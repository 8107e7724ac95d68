"""What every layer of a card is made of, whatever its mixer and FFN.

``LayerBuilder`` appends ops to a layer in execution order (cards use it, and
so can a hand-written graph); ``norm`` is the card's block norm; ``layer``
makes one verified layer of a card (ir/config.py ``build`` calls it per
layer): the mixer's block, then the FFN's between its norms and the residual
add. Each mixer and FFN is the card table's record (ir/card.py ``MIXERS``,
``FFNS``) that its kind module registers: attention and sliding attention
ir/kind_attention.py, the dense MLP ir/kind_mlp.py, MoE ir/kind_moe.py, MLA
ir/kind_mla.py, Gated DeltaNet ir/kind_gdn.py.
"""

from __future__ import annotations

import functools

from megakernel.errors import IRError, error_context
from megakernel.ir.card import FFNS, MIXERS, ModelConfig
from megakernel.ir.graph import Layer, OpNode
from megakernel.ir.kind_elementwise import ChannelScale
from megakernel.ir.kind_residual_gate import ResidualGate
from megakernel.ir.kind_rmsnorm import RMSNorm
from megakernel.ir.op_base import Add, Op
from megakernel.ir.types import TensorSpec

# Op fields whose card field has another name: an op's error says which card
# field to change (``layers.0.q_rope: theta: ... (set by the card's rope_theta)``).
_CARD_FIELDS = {"eps": "norm_eps or post_norm_eps", "offset": "norm_offset",
                "temperature": "residual_gate_temperature",
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
                "conv_kernel": "linear_attention.conv_kernel",
                "norm_eps": "moe.expert_output_norm_eps, else norm_eps",
                "norm_input_scaled": "moe.expert_output_norm_input_scaled"}


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

    def add(self, name: str, make_op, inputs: tuple[str, ...], output):
        """Append op ``name``; ``output`` names its output tensor, or a tuple
        names each of an op with several (returned as given)."""
        outputs = output if isinstance(output, tuple) else (output,)
        with error_context(name):
            try:
                op: Op = make_op()
            except IRError as err:
                raise with_card_field(err) from None
            shapes = op.infer(tuple(self.tensors[t].shape for t in inputs))
            if len(shapes) != len(outputs):
                raise IRError(f"op makes {len(shapes)} outputs, {len(outputs)} named: "
                              f"{list(outputs)}", path="outputs")
        self.nodes.append(OpNode(name, op, inputs, outputs))
        for t, shape in zip(outputs, shapes):
            self.tensors[t] = TensorSpec(t, shape)
        return output

    def layer(self, kind: str, output: str) -> Layer:
        return Layer(kind, tuple(self.nodes), tuple(self.tensors.values()), "x", output)


def norm(c: ModelConfig, dim: int, *, weight: bool = True, eps: float | None = None):
    """The card's RMSNorm over ``dim`` features, as ``LayerBuilder.add`` takes
    it; ``weight=False``: parameter-free (no offset then), ``eps``: not norm_eps."""
    eps = c.norm_eps if eps is None else eps
    return lambda: RMSNorm(dim, eps, c.norm_offset and weight, weight)


def _post_eps(c: ModelConfig) -> float:
    return c.norm_eps if c.post_norm_eps is None else c.post_norm_eps


def residual(c: ModelConfig, b: LayerBuilder, x: str, o: str, where: str, out: str) -> str:
    """A block's end: ``where``'s post norm of its output ``o`` when the card
    has post norms (``attn``: post_attn_norm; ``ffn``: post_ffn_norm, or,
    input-scaled, post_ffn_norm's (1 + w) scale then post_ffn_rms), then
    the residual add ``{where}_residual`` of x and it, or the card's learned
    residual gate of the two (both tensors [hidden_size])."""
    h = c.hidden_size
    if c.post_norms and where == "ffn" and c.post_ffn_norm_input_scaled:
        o = b.add("post_ffn_norm", lambda: ChannelScale(h, c.norm_offset), (o,), "ffn_in_scaled")
        o = b.add("post_ffn_rms", norm(c, h, weight=False, eps=_post_eps(c)), (o,), "ffn_normed")
    elif c.post_norms:
        weight = c.post_attn_norm_weight or where != "attn"
        o = b.add(f"post_{where}_norm", norm(c, h, weight=weight, eps=_post_eps(c)), (o,),
                  f"{where}_normed")
    if c.residual_gate_temperature is None:
        return b.add(f"{where}_residual", Add, (x, o), out)
    return b.add(f"{where}_residual", lambda: ResidualGate(h, c.residual_gate_temperature),
                 (x, o), out)


def _ffn_block(c: ModelConfig, b: LayerBuilder, x: str, kind: str) -> str:
    # "post_norm" is the norm after the attention block, before the FFN (HF's
    # post_attention_layernorm in Llama); the FFN output's own is post_ffn_norm.
    hn = b.add("post_norm", norm(c, c.hidden_size), (x,), "h_ffn") if c.pre_norms else x
    return residual(c, b, x, FFNS(kind).block(c, b, hn), "ffn", "y")


@functools.lru_cache(maxsize=64)
def layer(c: ModelConfig, mixer: str, ffn: str) -> Layer:
    label, block = MIXERS(mixer)[:2]
    b = LayerBuilder(c.hidden_size)
    x = block(c, b, "x")
    return b.layer(f"{label}_{ffn}" if label else ffn, _ffn_block(c, b, x, ffn))
