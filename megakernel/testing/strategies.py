"""The strategy users draw model cards from: ``model_configs()`` over one table of
features (``model_graphs()``, in graph_strategies.py, adds the op kinds no card
field writes).

A feature is one thing a card may use (MoE layers, a sliding/full layer
pattern, final-logit soft-capping, bf16 weights, ...): one ``Feature`` entry
saying whether a card uses it and how to add it to a drawn card. The card draw
(``model_configs``) draws only the shape and plain values (widths, heads,
activation, eps); every feature is then added on a coin, in table order, so
``without=`` / ``require=`` restrict the draw by name and the coverage tests
(tests/test_strategies.py) check that every feature and every op kind is drawn.

Extending (a new mixer, a new weight format): one ``register(Feature(...))``
below. ``needs`` names features it is drawn on top of (listed before it),
``conflicts`` ones it cannot go with, and ``fits`` the cards it is drawn for by
coin; when required, ``add`` must make any card fit. Two mixers are options of
the draw rather than features, since they replace the attention the table's
features describe: ``model_configs(mla=...)`` (latent attention, which turns off
the features MLA layers refuse) and ``hybrid_configs()`` (hybrid_strategies.py,
Gated DeltaNet layers, drawing this table's mixer-independent features).
``quantized_dense`` / ``quantized_experts`` draw a weight format for the
dense matrices / the routed experts (MLA and hybrid cards stay plain: their
drawn widths are not whole code tiles of the formats).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

from megakernel.ir.config import MoEConfig, ModelConfig
from megakernel.testing import moe_strategies as latent_moe
from megakernel.testing.mla_strategies import latent_blocks, mla_blocks, refused_by  # noqa: F401
from megakernel.testing.option_draws import add_nope, add_vocab_used, rotary_mixers


@dataclass(frozen=True)
class Feature:
    """``uses(card)``: the card has it; ``add(draw, card, cores) -> card`` with it."""

    name: str
    uses: Callable[[ModelConfig], bool]
    add: Callable
    needs: tuple[str, ...] = ()        # features it is drawn on top of
    conflicts: tuple[str, ...] = ()    # features it cannot go with
    fits: Callable[[ModelConfig, int], bool] = lambda card, cores: True


FEATURES: dict[str, Feature] = {}


def register(feature: Feature) -> Feature:
    if feature.name in FEATURES:
        raise ValueError(f"feature {feature.name!r} registered twice")
    unknown = sorted(set(feature.needs + feature.conflicts) - FEATURES.keys())
    if unknown:
        raise ValueError(f"feature {feature.name!r}: {unknown} are not registered before it")
    FEATURES[feature.name] = feature
    return feature


def _flag(name: str, field: str, **rules) -> Feature:
    """A boolean card field set to True."""
    return Feature(name, lambda c: getattr(c, field),
                   lambda draw, card, cores: dataclasses.replace(card, **{field: True}), **rules)


def _value(name: str, field: str, values, **rules) -> Feature:
    """A card field whose default is None (or 0.0), drawn from ``values``."""
    return Feature(name, lambda c: getattr(c, field) not in (None, 0.0),
                   lambda draw, card, cores: dataclasses.replace(
                       card, **{field: draw(st.sampled_from(values))}), **rules)


def _set(name: str, field: str, value, **rules) -> Feature:
    """A card field set to one value other than its default."""
    return Feature(name, lambda c: getattr(c, field) == value,
                   lambda draw, card, cores: dataclasses.replace(card, **{field: value}), **rules)


def _moe_flag(name: str, field: str) -> Feature:
    return Feature(name, lambda c: c.moe is not None and getattr(c.moe, field),
                   lambda draw, card, cores: dataclasses.replace(
                       card, moe=dataclasses.replace(card.moe, **{field: True})),
                   needs=("moe",))


@st.composite
def moe_configs(draw, max_experts: int = 16) -> MoEConfig:
    """An MoE block's sizes and routing; the table adds gpt-oss's options."""
    num_experts = draw(st.integers(4, max_experts))
    shared = draw(st.integers(0, 1))
    return MoEConfig(
        num_experts=num_experts,
        top_k=draw(st.integers(1, min(4, num_experts))),
        expert_intermediate=draw(st.sampled_from([128, 256])),
        scoring=draw(st.sampled_from(["softmax", "sigmoid"])),
        correction_bias=draw(st.booleans()),
        renormalize=draw(st.booleans()),
        routed_scaling=draw(st.sampled_from([1.0, 2.5])),
        num_shared_experts=shared,
        shared_intermediate=128 if shared else 0,
    )


def _add_moe(draw, card, cores):
    return dataclasses.replace(card, moe=draw(moe_configs()),
                               first_k_dense=draw(st.integers(0, card.num_layers - 1)))


def _add_groups(draw, card, cores):
    """DeepSeek's group-limited routing: the experts split into groups of >= 2
    (an odd count loses one expert to split), top_k bounded by the experts of
    the ``topk_group`` groups kept."""
    experts = card.moe.num_experts - card.moe.num_experts % 2
    n_group = draw(st.sampled_from([g for g in (2, 4) if experts % g == 0
                                    and experts // g >= 2]))
    topk_group = draw(st.integers(1, n_group))
    eligible = topk_group * experts // n_group
    moe = dataclasses.replace(card.moe, num_experts=experts, n_group=n_group,
                              topk_group=topk_group, top_k=min(card.moe.top_k, eligible))
    return dataclasses.replace(card, moe=moe)


def _add_swiglu_limit(draw, card, cores):
    """gpt-oss's clamped SwiGLU, defined over silu only."""
    moe = dataclasses.replace(card.moe, swiglu_limit=1.5, swiglu_alpha=1.702)
    return dataclasses.replace(card, moe=moe, activation="silu")


def _add_pattern(draw, card, cores):
    """Sliding layers then one full layer, that period repeated over the layers:
    (sliding, full) is Gemma 2's and gpt-oss's, a stack whose body is 2 layers."""
    period = draw(st.integers(2, 3))
    pattern = ("sliding_attention",) * (period - 1) + ("full_attention",)
    return dataclasses.replace(card, layer_types=(pattern * card.num_layers)[:card.num_layers])


def _add_all_heads(draw, card, cores):
    """OLMo 2's norm over all heads sums over cores, so no core may hold a copy of
    a KV head: with fewer KV heads than cores, every query head gets its own."""
    if card.num_kv_heads % cores:
        card = dataclasses.replace(card, num_kv_heads=card.num_q_heads)
    return dataclasses.replace(card, qk_norm_all_heads=True)


def _rope(name: str, scaling: dict, other: tuple[str, ...] = ()) -> Feature:
    """A rope scaling, told from the others by its type and whether it has
    DeepSeek's mscale_all_dim."""
    def uses(c):
        return (c.rope_scaling is not None and c.rope_scaling.rope_type == scaling["rope_type"]
                and bool(c.rope_scaling.mscale_all_dim) == bool(scaling.get("mscale_all_dim")))
    return Feature(name, uses,
                   lambda draw, card, cores: dataclasses.replace(card, rope_scaling=scaling),
                   conflicts=other)


for _feature in (
    Feature("moe", lambda c: c.moe is not None, _add_moe),
    _moe_flag("moe_router_bias", "router_logit_bias"),      # gpt-oss
    _moe_flag("moe_expert_bias", "expert_bias"),            # gpt-oss
    Feature("moe_group_routing", lambda c: c.moe is not None and c.moe.n_group > 1,
            _add_groups, needs=("moe",)),                   # DeepSeek-V3
    Feature("swiglu_limit", lambda c: c.moe is not None and c.moe.swiglu_limit is not None,
            _add_swiglu_limit, needs=("moe",), fits=lambda c, cores: c.activation == "silu"),
    # Muse Spark's and Kimi K3's latent MoE (testing/moe_strategies.py)
    Feature("moe_latent", lambda c: c.moe is not None and c.moe.latent_size > 0,
            latent_moe.add_latent, needs=("moe",)),
    Feature("moe_expert_norm", lambda c: c.moe is not None and c.moe.expert_output_norm != "none",
            latent_moe.add_expert_norm, needs=("moe",)),
    Feature("moe_muse_router", lambda c: c.moe is not None and c.moe.router_f32,
            latent_moe.add_muse_router, needs=("moe",)),
    Feature("bfloat16", lambda c: c.dtype == "bfloat16",
            lambda draw, card, cores: dataclasses.replace(card, dtype="bfloat16")),
    _value("sliding_window", "sliding_window", [4, 16]),
    Feature("layer_pattern", lambda c: c.layer_types is not None, _add_pattern,
            needs=("sliding_window",)),
    _value("sliding_rope_theta", "sliding_rope_theta", [1e4], needs=("layer_pattern",)),
    _flag("qk_norm", "qk_norm"),
    Feature("qk_norm_all_heads", lambda c: c.qk_norm_all_heads, _add_all_heads,
            needs=("qk_norm",), fits=lambda c, cores: c.num_kv_heads % cores == 0),
    _flag("qkv_bias", "qkv_bias"),
    _flag("o_bias", "o_bias"),
    _value("softmax_scale", "softmax_scale", [0.05, 0.25]),
    _value("attn_logit_softcap", "attn_logit_softcap", [20.0]),
    _flag("attention_sinks", "attention_sinks"),
    _flag("post_norms", "post_norms"),
    # No input norms only in float32: in bfloat16 the un-normed residual makes
    # logit errors of ~1e-2 (within tolerance), and greedy tokens of near-tied
    # logits flip (measured on the hybrids: a top-2 gap of 6.7e-4 under an error
    # of 8.6e-3).
    Feature("post_norms_only", lambda c: not c.pre_norms,
            lambda draw, card, cores: dataclasses.replace(card, pre_norms=False),
            needs=("post_norms",), conflicts=("bfloat16",)),
    # Gemma's embedding scale only beside pre-norms, as in Gemma: without them the
    # unnormalised x16 residual makes K/V entries of ~35, where the cache
    # comparisons' absolute 1e-5 is a few float32 ulps.
    _flag("scale_embeddings", "scale_embeddings", conflicts=("post_norms_only",)),
    _flag("norm_offset", "norm_offset"),
    # Muse Spark: a plain-w final norm under (1 + w) block norms.
    _set("plain_final_norm", "final_norm_offset", False, needs=("norm_offset",)),
    _value("final_logit_softcap", "final_logit_softcap", [30.0]),   # Gemma 2's value
    _rope("rope_llama3", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position": 64}),
    _rope("rope_yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position": 32,
                        "truncate": False}, ("rope_llama3",)),
    _rope("rope_linear", {"rope_type": "linear", "factor": 4.0},
          ("rope_llama3", "rope_yarn")),
    _rope("rope_yarn_mscale", {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                               "beta_slow": 1.0, "original_max_position": 16,
                               "mscale": 1.0, "mscale_all_dim": 0.5},  # DeepSeek-V3
          ("rope_llama3", "rope_yarn", "rope_linear")),
    _flag("tied_embeddings", "tie_embeddings"),
    # Muse Spark's options, each general (ir/card.py).
    _value("residual_gates", "residual_gate_temperature", [0.3, 1.0]),
    _value("post_norm_eps", "post_norm_eps", [1e-8], needs=("post_norms",)),
    _set("free_post_attn_norm", "post_attn_norm_weight", False, needs=("post_norms",)),
    _flag("post_ffn_input_scaled", "post_ffn_norm_input_scaled", needs=("post_norms",)),
    _set("free_qk_norms", "qk_norm_weight", False, needs=("qk_norm",),
         conflicts=("qk_norm_all_heads",)),
    _flag("attn_output_norm", "attn_output_norm"),
    _flag("attn_output_gate", "attn_output_gate"),
    _flag("embed_norm", "embed_norm"),
    Feature("nope", lambda c: bool(c.nope_layer_types), add_nope,
            fits=lambda c, cores: bool(rotary_mixers(c))),
    _set("final_logit_scale", "final_logit_scale", 2 ** -2.5),
    Feature("vocab_used", lambda c: c.vocab_used is not None, add_vocab_used),
):
    register(_feature)

# Quantized dense weights (megakernel/formats.py): a format whose code tiles
# and scale groups divide every per-core input width of the card.
QUANTIZED = ("int8", "int4_g32", "int4_g64", "mxfp4", "int4_g128", "fp8_b128", "nvfp4")


def _fitting_formats(card: ModelConfig, cores: int, kind: str) -> list[str]:
    """The formats whose row quantum (whole code tiles and scale groups)
    divides every per-core input width of the card's ``kind`` matrices (a
    core's rows before padding: its groups must not be cut), by arithmetic
    (drawn on every coin): the hidden size and a latent MoE's width; for
    dense weights the output projection's heads per core x head_dim, the
    MLP's and the shared experts' intermediate per core, a latent MoE's
    row-split projections' hidden and latent per core; for routed experts
    their intermediate per core at every tensor-parallel degree the planner
    may pick. MLA cards refuse the features (mla_strategies.py)."""
    from megakernel import formats

    if card.mla is not None:
        return []
    moe = card.moe
    # a latent MoE's width: the routed experts' and the up projection's rows
    latent = [moe.latent_size] if moe is not None and moe.latent_size else []
    widths = [card.hidden_size] + latent
    if kind == "dense":
        widths += [card.num_q_heads // cores * card.head_dim, -(-card.intermediate_size // cores)]
        if latent and cores > 1:
            # the latent projections are row-split (Linear.split_rows): a core
            # reads 1/cores of the hidden (pre) and of the latent (post) rows
            widths += [-(-card.hidden_size // cores), -(-moe.latent_size // cores)]
        if moe is not None and moe.num_shared_experts:
            widths.append(-(-moe.num_shared_experts * moe.shared_intermediate // cores))
    elif moe is not None:
        widths += [-(-moe.expert_intermediate // tp) for tp in range(1, cores + 1)
                   if cores % tp == 0]
    # Per-channel scales (int8) do not split with the rows: only the widths
    # that are not padded to 128 lanes (the first two, and the latent one)
    # must be whole code tiles.
    whole = widths[:2 + len(latent)]
    return [f for f in QUANTIZED
            if all(w % formats.get(f).row_quantum(w) == 0
                   for w in (widths if formats.get(f).group_rows else whole))]


def _quantized(card: ModelConfig, kind: str, fmt: str) -> ModelConfig:
    from megakernel.ir.weight_kinds import Quantize

    table = {**card.quantize.chosen(), kind: fmt}
    return dataclasses.replace(card, quantize=Quantize(**table))


def _quantize_feature(name: str, kind: str, **rules) -> Feature:
    """Weights of ``kind`` in a format drawn among those the card's widths take
    (int8 fits every GQA card drawn)."""
    def add(draw, card, cores):
        fitting = _fitting_formats(card, cores, kind) or ["int8"]
        return _quantized(card, kind, draw(st.sampled_from(fitting)))

    return Feature(name, lambda c: getattr(c.quantize, kind) != "plain", add,
                   fits=lambda c, cores: bool(_fitting_formats(c, cores, kind)), **rules)


register(_quantize_feature("quantized_dense", "dense"))
register(_quantize_feature("quantized_experts", "experts", needs=("moe",)))


def _names(names, option: str) -> frozenset[str]:
    names = frozenset([names] if isinstance(names, str) else names)
    unknown = sorted(names - FEATURES.keys())
    if unknown:
        raise ValueError(f"model_configs({option}=...): {unknown} are not features; "
                         f"known: {sorted(FEATURES)}")
    return names


def _conflicts(name: str) -> set[str]:
    return set(FEATURES[name].conflicts) | {
        f.name for f in FEATURES.values() if name in f.conflicts}


def _restrictions(without, require) -> tuple[set[str], set[str]]:
    """(features off, features on): ``require`` with what it needs, ``without``
    with what needs it and what conflicts with a required one."""
    off, on = set(_names(without, "without")), set(_names(require, "require"))
    for feature in reversed(FEATURES.values()):     # needs come first in the table
        if feature.name in on:
            clash = sorted(({feature.name} | set(feature.needs)) & off)
            if clash:
                raise ValueError(f"model_configs: require={feature.name!r} needs {clash}, "
                                 "which without= leaves out")
            on |= set(feature.needs)
    for name in sorted(on):
        clash = sorted(_conflicts(name) & on)
        if clash:
            raise ValueError(f"model_configs: require={name!r} cannot go with {clash}")
        off |= _conflicts(name)
    for feature in FEATURES.values():
        if off & set(feature.needs):
            off.add(feature.name)
    return off, on


def restrict(without, require, *, moe: bool | None = None,
             dtype: str | None = None) -> tuple[set[str], set[str]]:
    """(features off, features on) from ``without`` / ``require`` and the
    ``moe=`` / ``dtype=`` shorthands for them."""
    without, require = _names(without, "without"), _names(require, "require")
    if moe is not None:
        require, without = (require | {"moe"}, without) if moe else (require, without | {"moe"})
    if dtype is not None:
        require, without = ((require | {"bfloat16"}, without) if dtype == "bfloat16"
                            else (require, without | {"bfloat16"}))
    return _restrictions(without, require)


def add_features(draw, card: ModelConfig, cores: int, off, on) -> ModelConfig:
    """``card`` with every feature of the table not in ``off`` added on a coin
    (those in ``on`` always), in table order."""
    for feature in FEATURES.values():
        name = feature.name
        if name in off or feature.uses(card):
            continue
        drawn = (name in on or (all(FEATURES[n].uses(card) for n in feature.needs)
                                and not any(FEATURES[n].uses(card) for n in _conflicts(name))
                                and feature.fits(card, cores) and draw(st.booleans())))
        if drawn:
            card = feature.add(draw, card, cores)
    return card


@st.composite
def model_configs(draw, *, max_layers: int = 4, hidden_sizes=(128, 256, 384, 512),
                  moe: bool | None = None, dtype: str | None = None,
                  cores: int = 1, without=(), require=(),
                  mla: bool | None = False) -> ModelConfig:
    """A valid card: 1..max_layers layers, query heads that split evenly over
    ``cores`` TensorCores, and every feature of ``FEATURES`` on a coin;
    ``without`` / ``require`` name features never / always used
    (``without="moe"``, ``require=("layer_pattern",)``). ``moe=True/False`` is
    ``require``/``without`` "moe"; ``dtype=`` fixes the weights' dtype. With
    multi-head latent attention when ``mla`` (None draws either; never beside a
    required feature it refuses, ``MLA_REFUSES``)."""
    off, on = restrict(without, require, moe=moe, dtype=dtype)
    latent = draw(latent_blocks(mla, on))
    if latent is not None:
        off, on = _restrictions(off | refused_by(latent), on)
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    q_heads = draw(st.sampled_from([kv_heads * g for g in (1, 2, 4, 8)
                                    if (kv_heads * g) % cores == 0 and kv_heads * g <= 16]))
    head_dim = draw(st.sampled_from([64, 128]))
    card = ModelConfig(
        name="drawn",
        vocab_size=draw(st.sampled_from([256, 512])),
        hidden_size=draw(st.sampled_from(hidden_sizes)),
        num_layers=draw(st.integers(1, max_layers)),
        num_q_heads=q_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=draw(st.sampled_from([256, 512])),
        activation=draw(st.sampled_from(["silu", "gelu", "gelu_tanh"])),
        norm_eps=draw(st.sampled_from([1e-5, 1e-6])),
        rope_theta=draw(st.sampled_from([10000.0, 1e6])),
        rotary_dim=0 if latent else draw(st.sampled_from([0, head_dim // 2])),
        dtype=dtype if dtype is not None and dtype != "bfloat16" else "float32",
        max_seq_len=64,
        mla=latent,
    )
    return add_features(draw, card, cores, off, on)
