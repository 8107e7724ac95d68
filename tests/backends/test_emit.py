"""Emission and loading: golden source, node comments, errors that name the place."""

import ast

import pytest

from megakernel.backends.pallas_tpu import emit, load
from megakernel.compiler.pipeline import plan_model
from megakernel.errors import EmitError
from megakernel.models import zoo
from tests.backends import regen_golden


def test_golden_source_of_tiny_dense():
    got = regen_golden.render_case()
    want = regen_golden.GOLDEN.read_text()
    assert got == want, "emitted source changed: review, then `make golden`"


@pytest.mark.parametrize("name,devices", [("tiny-dense", 1), ("tiny-moe", 2)])
def test_every_node_is_commented_and_the_module_parses(name, devices):
    model = zoo.model(name)
    src = emit.render(model, plan_model(model, devices=devices, batch=2, tokens=1))
    ast.parse(src)
    assert "jax.lax.fori_loop" in src and src.count("pl.pallas_call(") == 1
    for s, st in enumerate(model.stacks):
        for node in st.layer.nodes:
            assert f"# node: layers[{s}].{node.name}\n" in src
    # one fori_loop per stack, never one body per layer
    assert src.count("def layer_s") == len(model.stacks)


def test_header_names_model_target_mesh_and_plan():
    model = zoo.model("tiny-dense")
    plan = plan_model(model, devices=2, batch=1, tokens=1)
    head = emit.render(model, plan).split('"""')[1]
    for text in ("tiny-dense", "tpu7x", "2 TensorCore", plan.digest()):
        assert text in head


def test_errors_point_at_generated_line_and_node(tmp_path):
    model = zoo.model("tiny-dense")
    src = emit.render(model, plan_model(model, devices=1, batch=1, tokens=1))
    bad = src.replace("t_q = rt.ring_linear(", "t_q = rt.no_such_helper(", 1)
    module = load.load(bad, tmp_path)
    from megakernel.backends.pallas_tpu import run
    from megakernel.models import reference

    plan = plan_model(model, devices=1, batch=1, tokens=1)
    runner = run.KernelRunner(module, model, plan, _weights(model), run.make_mesh(1), True)
    runner.set_caches(reference.init_caches(model, 1))
    with pytest.raises(EmitError) as info:
        runner.step([[1]], [0])
    assert info.value.path == "layers[0].q_proj"
    assert "kernel.py:" in str(info.value) and "no_such_helper" in str(info.value)


def test_syntax_errors_name_the_file(tmp_path):
    with pytest.raises(EmitError, match="kernel.py:"):
        load.load("def broken(:\n", tmp_path)


def _weights(model):
    from megakernel.models.weights import init_weights

    return init_weights(model)


@pytest.mark.parametrize("name,devices,loop", [("qwen3-32b", 8, 37), ("llama-3.2-1b", 1, 234)])
def test_lm_head_loops_over_its_even_tiles(name, devices, loop, tmp_path):
    """The head's evenly stepped tiles are one fori_loop, not unrolled code: the
    AOT compile time of a big-vocabulary model depends on it."""
    from megakernel.backends import pallas_tpu as backend
    from megakernel.backends.pallas_tpu import runtime

    model = zoo.model(name)
    plan = plan_model(model, devices=devices, batch=1, tokens=1)
    module = load.import_module(backend.compile_model(model, plan, tmp_path))
    head = module.SEGMENTS[-1]
    n, _ = runtime.head_loop(head.tiles, plan.shard.tied, module.BANK_SHAPE[2], module.NUM_BANKS)
    assert n == loop and len(head.tiles) - n == module.NUM_BANKS + 1
