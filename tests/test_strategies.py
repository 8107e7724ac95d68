"""The strategies users draw from: every op kind and every feature of the table is
drawn, ``without`` / ``require`` restrict the draw, and a restriction that
cannot hold is refused by name (IR only: no kernel runs here)."""

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings, strategies as st

from megakernel.ir.config import build
from megakernel.ir.ops import OP_KINDS
from megakernel.testing.strategies import FEATURES
from megakernel.testing import decode_cases, model_configs, model_graphs

FEW = settings(max_examples=25, deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
# Finding one example is the point: no shrinking of what is found.
SEARCH = settings(max_examples=300, deadline=None, database=None, phases=(Phase.generate,),
                  suppress_health_check=list(HealthCheck))


def kinds(model) -> set[str]:
    return {n.op.kind for layer in model.layers for n in layer.nodes} | {
        op.kind for op in model.logit_ops}


@pytest.mark.parametrize("kind", sorted(OP_KINDS.kinds()))
def test_every_op_kind_is_drawn(kind):
    find(model_graphs(), lambda m: kind in kinds(m), settings=SEARCH)


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_every_feature_is_drawn(name):
    find(model_configs(), FEATURES[name].uses, settings=SEARCH)


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_without_leaves_a_feature_out_and_require_puts_it_in(name):
    feature = FEATURES[name]

    @FEW
    @given(model_configs(without=name), model_configs(require=name, cores=2))
    def prop(left_out, put_in):
        assert not feature.uses(left_out)
        assert feature.uses(put_in)
        build(left_out), build(put_in)   # both are valid cards

    prop()


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_what_a_feature_needs_and_conflicts_with_holds_in_every_draw(name):
    feature = FEATURES[name]

    @FEW
    @given(model_configs(cores=4))
    def prop(card):
        if feature.uses(card):
            assert all(FEATURES[n].uses(card) for n in feature.needs)
            assert not any(FEATURES[n].uses(card) for n in feature.conflicts)

    prop()


def test_required_features_that_do_not_fit_make_the_card_fit():
    """Clamped SwiGLU is defined over silu; a norm over all heads wants every core
    to hold its own KV heads."""
    @FEW
    @given(model_configs(cores=4, require=("swiglu_limit", "qk_norm_all_heads")))
    def prop(card):
        assert card.activation == "silu" and card.num_kv_heads % 4 == 0
        build(card)

    prop()


def test_layer_pattern_draws_a_stack_whose_body_is_two_layers():
    card = find(model_configs(require="layer_pattern", max_layers=4),
                lambda c: build(c).stacks[0].period == 2, settings=SEARCH)
    assert card.layer_types[:2] == ("sliding_attention", "full_attention")


@pytest.mark.parametrize("options, message", [
    ({"without": "mla"}, "model_configs(without=...): ['mla'] are not features; known: "),
    ({"require": "layer_pattern", "without": "sliding_window"},
     "require='layer_pattern' needs ['sliding_window'], which without= leaves out"),
    ({"require": ("rope_yarn", "rope_llama3")},
     "require='rope_llama3' cannot go with ['rope_yarn']"),
    ({"require": ("scale_embeddings", "post_norms_only")},
     "require='post_norms_only' cannot go with ['scale_embeddings']"),
])
def test_impossible_restrictions_are_named(options, message):
    @given(st.data())
    def prop(data):
        data.draw(model_configs(**options))

    with pytest.raises(ValueError) as info:
        prop()
    assert message in str(info.value)


@FEW
@given(st.data())
def test_decode_cases_stay_inside_the_model(data):
    model = build(data.draw(model_configs(max_layers=1)))
    case = data.draw(decode_cases(model, max_batch=3, max_tokens=2, max_context=40))
    b, t = case.tokens.shape
    assert 1 <= b <= 3 and 1 <= t <= 2 and case.start.shape == (b,)
    assert (case.start + t <= 40).all() and (case.tokens < model.vocab_size).all()


@pytest.mark.parametrize("cores", [2, 8])
def test_quantized_latent_moe_cards_plan(cores):
    """A latent MoE's projections are row-split: a format is drawn only where a
    core's hidden and latent rows hold whole scale groups (planning only)."""
    from megakernel.compiler.pipeline import plan_model

    @settings(max_examples=15, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(model_configs(cores=cores, moe=True, max_layers=2,
                         require=("moe_latent", "quantized_dense")))
    def prop(card):
        plan_model(build(card), devices=cores, batch=1, tokens=1)

    prop()
