"""``model_graphs()``: built models from ``model_configs()`` whose FFN outputs may
pass through the elementwise kinds no card field writes, so that over its draws
every op kind the compiler has is drawn (tests/test_strategies.py checks it)."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from megakernel.testing.hybrid_strategies import hybrid_configs
from megakernel.testing.strategies import model_configs

# Options of model_configs that hybrid_configs does not take: with any of them
# given, the card is model_configs'.
_CARD_ONLY = {"max_layers", "hidden_sizes", "moe", "without", "require", "mla"}


@st.composite
def model_graphs(draw, **card_options):
    """A built Model from ``model_configs(mla=None, **card_options)`` (GQA or
    latent attention) or, on a coin where no option is model_configs' own, from
    ``hybrid_configs`` (Gated DeltaNet layers), whose FFN outputs may pass
    through the elementwise kinds no card field writes (an activation gate
    multiplied in, a learned channel scale, a constant scale, a soft-cap), so
    that, over its draws, every op kind the compiler has is drawn."""
    from megakernel.ir.config import build

    if not set(card_options) & _CARD_ONLY and draw(st.integers(0, 3)) == 0:
        card = draw(hybrid_configs(**card_options))
    else:
        card = draw(model_configs(**{"mla": None, **card_options}))
    model = build(card)
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
        outs = n.outputs if len(n.outputs) > 1 else n.outputs[0]   # a per-slot MoE makes two
        b.add(n.name, lambda op=n.op: op, inputs, outs)
    return b.layer(f"{layer.kind}_ew", layer.output)
