import pytest


@pytest.fixture(scope="session")
def aot_zoo(tmp_path_factory):
    """``aot_zoo(name, devices, layers=None, steps=1, topology)`` -> (plan,
    AotResult) of a zoo card compiled for TPU7x, once per session: a full-size
    compile takes minutes, and tests that ask about the same kernel share it
    (mark them with one ``xdist_group`` so they land on one worker)."""
    from megakernel.backends.pallas_tpu.aot.tpu_compile import aot_compile
    from megakernel.backends.pallas_tpu.codegen.load import compile_model
    from megakernel.compiler.pipeline import plan_model
    from megakernel.models import zoo

    done = {}

    def compiled(name, devices, layers=None, steps=1, topology="tpu7x:2x2x1"):
        key = (name, devices, layers, steps, topology)
        if key not in done:
            model = zoo.model(name)
            model = model.truncated(layers) if layers else model
            plan = plan_model(model, devices=devices, batch=1, tokens=1, steps=steps)
            out = tmp_path_factory.mktemp(f"{name}-{layers or 'all'}-n{steps}")
            compile_model(model, plan, out)
            done[key] = plan, aot_compile(out, plan, topology=topology)
        return done[key]

    return compiled
