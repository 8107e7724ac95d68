"""The features ``model_configs()`` draws, as a table, and ``model_graphs()`` for the
op kinds no card field writes.

A feature is one thing a card may use (MoE layers, a sliding/full layer
pattern, final-logit soft-capping, bf16 weights, ...). Each entry says whether
a card uses it, how to add it to a drawn card and how to take it out, so that
``model_configs(without=..., require=...)`` restricts the draw by name and
the coverage tests (tests/test_strategies.py) check that every feature and
every op kind is drawn.

Extending (a new mixer, a new weight format): register a Feature below; with
``base=False`` this table draws it (a coin per card), with ``base=True`` the
card draw in ``megakernel.testing.model_configs`` does and the table only
restricts it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

from megakernel.ir.config import ModelConfig


@dataclass(frozen=True)
class Feature:
    """``add(draw, card, cores) -> card`` using it; ``remove(card) -> card`` without it."""

    name: str
    uses: Callable[[ModelConfig], bool]
    add: Callable
    remove: Callable[[ModelConfig], ModelConfig]
    base: bool = True                  # drawn by the card draw itself, not by this table
    needs: tuple[str, ...] = ()        # features it cannot go without


FEATURES: dict[str, Feature] = {}


def register(feature: Feature) -> Feature:
    if feature.name in FEATURES:
        raise ValueError(f"feature {feature.name!r} registered twice")
    FEATURES[feature.name] = feature
    return feature


def _set(**fields):
    """A remove (or fixed add) rule: the card with ``fields`` replaced."""
    return lambda card: dataclasses.replace(card, **fields)


def _added(**fields):
    return lambda draw, card, cores: dataclasses.replace(card, **fields)


def _add_moe(draw, card, cores):
    from megakernel.testing import moe_configs

    return dataclasses.replace(card, moe=draw(moe_configs()),
                               first_k_dense=draw(st.integers(0, card.num_layers - 1)))


def _add_window(draw, card, cores):
    return dataclasses.replace(card, sliding_window=draw(st.sampled_from([4, 16])))


def _add_pattern(draw, card, cores):
    """Sliding layers then one full layer, that period repeated over the layers:
    (sliding, full) is Gemma 2's and gpt-oss's, a stack whose body is 2 layers."""
    window = card.sliding_window or draw(st.sampled_from([4, 16]))
    period = draw(st.integers(2, 3))
    pattern = ("sliding_attention",) * (period - 1) + ("full_attention",)
    layer_types = (pattern * card.num_layers)[:card.num_layers]
    return dataclasses.replace(card, sliding_window=window, layer_types=layer_types)


def _add_value(field: str, values):
    return lambda draw, card, cores: dataclasses.replace(card, **{field: draw(
        st.sampled_from(values))})


_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position": 64}

for _feature in (
    Feature("moe", lambda c: c.moe is not None, _add_moe, _set(moe=None, first_k_dense=0)),
    Feature("bfloat16", lambda c: c.dtype == "bfloat16", _added(dtype="bfloat16"),
            _set(dtype="float32")),
    Feature("sliding_window", lambda c: c.sliding_window is not None, _add_window,
            _set(sliding_window=None, layer_types=None)),
    Feature("qk_norm", lambda c: c.qk_norm, _added(qk_norm=True), _set(qk_norm=False)),
    Feature("qkv_bias", lambda c: c.qkv_bias, _added(qkv_bias=True), _set(qkv_bias=False)),
    Feature("rope_scaling", lambda c: c.rope_scaling is not None,
            _added(rope_scaling=_LLAMA3), _set(rope_scaling=None)),
    Feature("tied_embeddings", lambda c: c.tie_embeddings, _added(tie_embeddings=True),
            _set(tie_embeddings=False)),
    # Drawn here: fields the card draw leaves at their defaults.
    Feature("layer_pattern", lambda c: c.layer_types is not None, _add_pattern,
            _set(layer_types=None), base=False, needs=("sliding_window",)),
    Feature("final_logit_softcap", lambda c: c.final_logit_softcap is not None,
            _add_value("final_logit_softcap", [2.0, 30.0]), _set(final_logit_softcap=None),
            base=False),
    Feature("o_bias", lambda c: c.o_bias, _added(o_bias=True), _set(o_bias=False), base=False),
    Feature("softmax_scale", lambda c: c.softmax_scale != 0.0,
            _add_value("softmax_scale", [0.05, 0.25]), _set(softmax_scale=0.0), base=False),
):
    register(_feature)


def _names(names, option: str) -> frozenset[str]:
    names = frozenset([names] if isinstance(names, str) else names)
    unknown = sorted(names - FEATURES.keys())
    if unknown:
        raise ValueError(f"model_configs({option}=...): {unknown} are not features; "
                         f"known: {sorted(FEATURES)}")
    return names


@st.composite
def with_features(draw, card: ModelConfig, *, cores: int = 1, without=(),
                  require=()) -> ModelConfig:
    """``card`` with the table's own features drawn (a coin each), those named in
    ``without`` taken out, and those in ``require`` put in."""
    without, require = _names(without, "without"), _names(require, "require")
    for name in sorted(require):
        clash = sorted(set(FEATURES[name].needs) & without) or (
            [name] if name in without else [])
        if clash:
            raise ValueError(f"model_configs: require={name!r} needs {clash}, which "
                             "without= leaves out")
    for feature in FEATURES.values():
        off = feature.name in without or set(feature.needs) & without
        if off:
            card = feature.remove(card) if feature.uses(card) else card
        elif not feature.uses(card) and (feature.name in require
                                         or (not feature.base and draw(st.booleans()))):
            card = feature.add(draw, card, cores)
    return card


@st.composite
def model_graphs(draw, **card_options):
    """A built Model from ``model_configs(**card_options)``, whose FFN outputs may
    pass through the elementwise kinds no card field writes (an activation gate
    multiplied in, a learned channel scale, a constant scale, a soft-cap), so
    that, over its draws, every op kind the compiler has is drawn."""
    from megakernel.ir.config import build
    from megakernel.testing import model_configs

    model = build(draw(model_configs(**card_options)))
    chain = [op for op in ("gate", "channel_scale", "scale", "softcap") if draw(st.booleans())]
    if not chain:
        return model
    factor = draw(st.sampled_from([0.5, 2.0]))
    layers = tuple(_with_ffn_chain(layer, model.hidden_size, chain, factor)
                   for layer in model.layers)
    return dataclasses.replace(model, layers=layers)


def _with_ffn_chain(layer, hidden: int, chain: list[str], factor: float):
    """``layer`` rebuilt with ``chain`` applied to the FFN output before its residual add."""
    from megakernel.ir.config import LayerBuilder
    from megakernel.ir.kind_elementwise import Activate, ChannelScale, Mul, Scale, Softcap
    from megakernel.ir.ops import Activation

    b = LayerBuilder(hidden)
    for n in layer.nodes:
        inputs = n.inputs
        if n.name == "ffn_residual":
            x, f = inputs
            if "gate" in chain:
                g = b.add("ffn_gate_act", lambda: Activate(Activation.SIGMOID), (x,), "ffn_g")
                f = b.add("ffn_gate", Mul, (f, g), "ffn_gated")
            if "channel_scale" in chain:
                f = b.add("ffn_layer_scale", lambda: ChannelScale(hidden), (f,), "ffn_ls")
            if "scale" in chain:
                f = b.add("ffn_scale", lambda: Scale(factor), (f,), "ffn_scaled")
            if "softcap" in chain:
                f = b.add("ffn_softcap", lambda: Softcap(20.0), (f,), "ffn_capped")
            inputs = (x, f)
        b.add(n.name, lambda op=n.op: op, inputs, n.outputs[0])
    return b.layer(f"{layer.kind}_ew", layer.output)
