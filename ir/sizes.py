"""Size arithmetic from the numbers alone: weight bytes, KV-cache bytes, HBM per core.

Run before any graph, array or plan is built, so that a model that cannot fit
any supported topology (``chips.MAX_CORES`` TensorCores of the chip with the
most HBM per core, capacities from ``pltpu`` as ``megakernel/chips.py`` reads
them) is refused in milliseconds with the figures, instead of after
minutes of building and tiling. ``of_config`` works from a card,
``of_layers`` / ``of_model`` from built layers' param specs; both give the same
``Sizes`` (tests/ir/test_strict_files.py). A lower bound is all this claims: the
planner adds padding, outputs and replicated tensors on top.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megakernel import chips
from megakernel.errors import IRError, MegakernelError
from megakernel.ir.types import DType

if TYPE_CHECKING:
    from megakernel.ir.card import ModelConfig
    from megakernel.ir.graph import Layer, Model


@dataclass(frozen=True)
class Sizes:
    """``param_bytes`` of every weight; ``cache_bytes`` of the state one sequence
    keeps: KV and latent caches of ``max_seq_len`` positions and recurrent states."""

    name: str
    param_bytes: int
    cache_bytes: int
    max_seq_len: int

    def total(self, batch: int = 1) -> int:
        return self.param_bytes + batch * self.cache_bytes


def of_config(c: "ModelConfig") -> Sizes:
    """The sizes of the model ``build(c)`` would make, by arithmetic only."""
    item = DType.parse(c.dtype).itemsize
    h, d = c.hidden_size, c.head_dim
    q, kv = c.num_q_heads * d, c.num_kv_heads * d
    norms = 2 * h * (c.pre_norms + c.post_norms)          # the mixer's and the FFN's
    attn = norms + h * q + 2 * h * kv + q * h            # norms, q, k, v, o
    attn += (q + 2 * kv) * c.qkv_bias + h * c.o_bias + c.num_q_heads * c.attention_sinks
    attn += ((q + kv) if c.qk_norm_all_heads else 2 * d) * c.qk_norm
    attn += (h * q + q * c.qkv_bias) * c.attn_output_gate
    mixer = {"full_attention": attn * item, "sliding_attention": attn * item}
    state = {"full_attention": 2 * c.max_seq_len * kv * item}
    state["sliding_attention"] = state["full_attention"]
    if c.mla is not None:
        mla, state["mla"] = _mla_sizes(c)
        mixer["mla"] = (norms + mla) * item
    if c.linear_attention is not None:
        la = c.linear_attention
        kw, vw, hv = (la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim,
                      la.num_value_heads)
        # norms, the six projections, out_proj, conv taps, gated-norm weight;
        # A_log and dt_bias are float32 (ir/kind_gdn.py).
        gdn = norms + h * (2 * kw + 2 * vw + 2 * hv) + vw * h + la.conv_kernel * (2 * kw + vw)
        mixer["linear_attention"] = (gdn + la.value_head_dim) * item + 2 * hv * 4
        state["linear_attention"] = ((la.conv_kernel - 1) * (2 * kw + vw) * item
                                     + hv * la.key_head_dim * la.value_head_dim * 4)
    ffn = {"dense": 3 * h * c.intermediate_size * item}
    if c.moe is not None:
        m = c.moe
        i = m.expert_intermediate
        routed = m.num_experts * (h + 3 * h * i + m.router_logit_bias + (2 * i + h) * m.expert_bias)
        shared = 3 * h * m.num_shared_experts * m.shared_intermediate + h * m.shared_expert_gate
        # The router's correction bias is kept in float32 (MoE.params).
        ffn["moe"] = (routed + shared) * item + 4 * m.num_experts * m.correction_bias
    kinds = [(c.mixer(i), c.layer_kind(i)) for i in range(c.num_layers)]
    layers = sum(mixer[a] + ffn[f] for a, f in kinds)
    embed = c.vocab_size * h * (1 if c.tie_embeddings else 2) + h
    cache = sum(state[a] for a, _ in kinds)
    return Sizes(c.name, layers + embed * item, cache, c.max_seq_len)


def _mla_sizes(c: "ModelConfig") -> tuple[int, int]:
    """(weights, latent-cache bytes per sequence) of one MLA mixer besides its
    block norms (ir/kind_mla.py): q path, kv_a, optional gate, kv_norm, w_uk,
    w_uv, o."""
    m, h, heads = c.mla, c.hidden_size, c.num_q_heads
    item = DType.parse(c.dtype).itemsize
    dn, dr, dv, r = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
    qk = heads * (dn + dr)
    if m.q_lora_rank:
        query = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * qk
        query += m.q_lora_rank * c.qkv_bias
    else:
        query = h * qk + qk * c.qkv_bias
    params = (query + h * (r + dr) + (r + dr) * c.qkv_bias + r + heads * dn * r
              + r * heads * dv + heads * dv * h + h * c.o_bias)
    params += h * heads * dv * m.output_gate
    return params, c.max_seq_len * (r + dr) * item


def of_layers(name: str, vocab_size: int, hidden_size: int, layers: Sequence["Layer"],
              tie_embeddings: bool, dtype: DType, max_seq_len: int) -> Sizes:
    """The sizes of a model of these parts, from each distinct layer's param and
    state specs (appended state at ``max_seq_len`` rows, whole state as declared)."""
    per_layer: dict = {}
    for layer in layers:
        if layer not in per_layer:
            params = sum(s.nbytes for s in layer.params(dtype).values())
            cache = sum(spec.nbytes for n in layer.nodes       # one sequence's state
                        for spec in n.op.state(1, max_seq_len, dtype).values())
            per_layer[layer] = (params, cache)
    params = sum(per_layer[layer][0] for layer in layers)
    cache = sum(per_layer[layer][1] for layer in layers)
    embed = vocab_size * hidden_size * (1 if tie_embeddings else 2) + hidden_size
    return Sizes(name, params + embed * dtype.itemsize, cache, max_seq_len)


def of_model(model: "Model", *, formatted: bool = False) -> Sizes:
    """The sizes of ``model`` (as ``of_config`` of its card: weights in the
    model dtype); ``formatted``: its weights in their storage formats
    (megakernel/formats.py), what the planner holds in HBM."""
    sizes = of_layers(model.name, model.vocab_size, model.hidden_size, model.layers,
                      model.tie_embeddings, model.dtype, model.max_seq_len)
    if formatted and model.quantize.chosen():
        sizes = dataclasses.replace(sizes, param_bytes=sum(
            p.nbytes for p in model.params().values()))
    return sizes


@functools.lru_cache(maxsize=None)
def largest_topology() -> tuple[str, int, int]:
    """(chip, cores, HBM bytes per core) of the supported topology with the most HBM."""
    chip = max(chips.CHIPS, key=chips.hbm_bytes)
    return chip, chips.MAX_CORES, chips.hbm_bytes(chip)


def check_fits(sizes: Sizes, *, cores: int | None = None, hbm_per_core: int | None = None,
               chip: str | None = None, batch: int = 1, path: str = "sizes",
               error: type[MegakernelError] = IRError, quantize: str = "") -> None:
    """Refuse ``sizes`` when weights plus the KV caches of ``batch`` sequences,
    split evenly, exceed ``cores`` x ``hbm_per_core`` (default: the largest
    supported topology). ``quantize``: a ``--quantize KIND=FORMAT`` the hint
    offers (a weight kind the model stores plain)."""
    if cores is None or hbm_per_core is None:
        chip, cores, hbm_per_core = largest_topology()
    need = sizes.total(batch)
    if need <= cores * hbm_per_core:
        return
    raise error(
        f"{sizes.name} has {_gb(sizes.param_bytes)} of weights + {_gb(batch * sizes.cache_bytes)} "
        f"of KV caches ({batch} sequence(s) x {sizes.max_seq_len:,} positions) = {_gb(need)}: "
        f"at least {_gb(need / cores)} of HBM per core, capacity {_gb(hbm_per_core)} "
        f"({chip or 'target'}, {cores} TensorCore(s), split evenly)", path=path,
        hint="use smaller sizes, fewer layers, or a shorter max_seq_len or batch" + (
            f", or more TensorCores (at most {_max_cores()})" if cores < _max_cores() else "")
        + (f", or store weights in fewer bytes: --quantize {quantize} (docs/formats.md)"
           if quantize else ""))


def _max_cores() -> int:
    return largest_topology()[1]


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.1f} GB"

