"""No generated kernel multiplies by a weight stored [N, K]: a matmul whose
weight operand contracts over its last axis reaches the MXU as transposed
pushes, at half rate (compiler/calibration.json, ``.nk`` against ``.kn``).

The check walks the kernel's jaxpr (traced for TPU7x, not compiled) and
follows weight values from the weight operands: through DMAs into VMEM
buffers, loads, stores, bitcasts and any op whose other inputs are weights or
constants (dequantisation). A value that mixes in an activation is no longer
a weight, and a matmul's result never is. Any dot_general whose right operand
is a weight and contracts over the weight's last axis fails the test."""

from __future__ import annotations

import jax
import pytest
from jax.extend import core as jcore

from megakernel.backends.pallas_tpu.codegen.load import compile_model
from megakernel.backends.pallas_tpu.codegen import load
from megakernel.backends.pallas_tpu.aot.tpu_compile import abstract_args, topology_mesh
from megakernel.compiler.buffers import Kind
from megakernel.compiler.pipeline import plan_model
from megakernel.models import zoo

pytest.importorskip("libtpu")


def _subjaxprs(eqn):
    for value in eqn.params.values():
        for j in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(j, jcore.ClosedJaxpr):
                yield j.jaxpr
            elif isinstance(j, jcore.Jaxpr):
                yield j


def _where(eqn) -> str:
    """The innermost project (or test) source line that made ``eqn``."""
    tb = eqn.source_info.traceback
    frames = [f for f in (tb.frames if tb else []) if "site-packages" not in f.file_name]
    return f"{frames[0].file_name}:{frames[0].line_num}" if frames else "?"


def _tails(a, b) -> list:
    """Pairs of the last min(len(a), len(b)) items of ``a`` and ``b``."""
    k = min(len(a), len(b))
    return list(zip(a[len(a) - k:], b[len(b) - k:]))


def _ref(v) -> bool:
    return not isinstance(v, jcore.Literal) and hasattr(v.aval, "inner_aval")


class Weights:
    """Weight-derived values of a kernel jaxpr, to a fixed point."""

    def __init__(self, seeds):
        self.vars, self.constants, self.transposed = set(seeds), set(), set()

    def has(self, v) -> bool:
        return not isinstance(v, jcore.Literal) and v in self.vars

    def mark(self, v) -> bool:
        if isinstance(v, jcore.Literal) or v in self.vars:
            return False
        self.vars.add(v)
        return True

    def walk(self, jaxpr) -> bool:
        changed = False
        for eqn in jaxpr.eqns:
            subs = list(_subjaxprs(eqn))
            if subs:
                changed |= self._nested(eqn, subs)
            else:
                changed |= self._eqn(eqn)
        return changed

    def _nested(self, eqn, subs) -> bool:
        # Operands and results line up with a body's trailing inputs and
        # outputs (jit, scan, while, cond, run_scoped alike).
        changed = False
        for sub in subs:
            ins = _tails(eqn.invars, sub.invars)
            for outer, inner in ins:
                if self.has(outer):
                    changed |= self.mark(inner)
            changed |= self.walk(sub)
            for outer, inner in ins:            # a ref the body filled with weights
                if self.has(inner) and _ref(outer):
                    changed |= self.mark(outer)
            for outer, inner in _tails(eqn.outvars, sub.outvars):
                if self.has(inner):
                    changed |= self.mark(outer)
            if eqn.primitive.name == "while":   # a carry's next value feeds the body
                for inner_in, inner_out in _tails(sub.invars, sub.outvars):
                    if self.has(inner_out):
                        changed |= self.mark(inner_in)
        return changed

    def _eqn(self, eqn) -> bool:
        name, ins = eqn.primitive.name, eqn.invars
        if name == "dot_general":
            (_, rhs_contract), _ = eqn.params["dimension_numbers"]
            rhs = ins[1]
            if self.has(rhs) and tuple(rhs_contract) == (rhs.aval.ndim - 1,):
                self.transposed.add(f"{_where(eqn)}: {ins[0].aval.str_short(True)} x "
                                    f"{rhs.aval.str_short(True)} contracting {rhs_contract}")
            return False
        if name == "get":
            return any(self.mark(o) for o in eqn.outvars) if self.has(ins[0]) else False
        if name in ("swap", "addupdate"):
            changed = self.mark(ins[0]) if self.has(ins[1]) else False
            if self.has(ins[0]):
                changed |= any(self.mark(o) for o in eqn.outvars)
            return changed
        if name == "dma_start":
            src, dst, *_ = eqn.params["tree"].unflatten(ins)
            src, dst = getattr(src, "ref", src), getattr(dst, "ref", dst)
            return self.mark(dst) if self.has(src) else False
        live = [v for v in ins if not isinstance(v, jcore.Literal)]
        if all(v in self.constants for v in live):
            self.constants.update(eqn.outvars)       # iota, broadcast of a literal, ...
            return False
        if any(self.has(v) for v in live) and all(self.has(v) or v in self.constants
                                                  for v in live):
            return any([self.mark(o) for o in eqn.outvars])
        return False


def _kernel_jaxpr(model, devices, topology, overrides, tmp_path):
    plan = plan_model(model, devices=devices, batch=1, tokens=1, overrides=overrides)
    out = tmp_path / model.name
    compile_model(model, plan, out)
    module = load.import_module(out / "kernel.py")
    mesh = topology_mesh(topology, plan.shard.cores)
    args = abstract_args(module, mesh, plan.shard.cores)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        step = module.make_step(mesh, interpret=False, with_logits=False)
        traced = step.trace(*args).jaxpr
    calls = [e for e in _all_eqns(traced.jaxpr) if e.primitive.name == "pallas_call"]
    assert len(calls) == 1, [e.primitive.name for e in calls]
    mem = plan.memory
    weights = [mem.buffer(o.buffer).kind in (Kind.HBM_WEIGHTS, Kind.RESIDENT)
               and o.role != "constant" for o in mem.operands]
    kernel = calls[0].params["jaxpr"]
    assert sum(weights) > 0
    return kernel, [v for v, w in zip(kernel.invars, weights) if w]


def _all_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in _subjaxprs(eqn):
            yield from _all_eqns(sub)


def transposed_weight_dots(kernel, seeds) -> set[str]:
    found = Weights(seeds)
    while found.walk(kernel):
        pass
    return found.transposed


def test_the_walk_finds_a_transposed_weight_matmul():
    """Control: a weight DMAed into VMEM, dequantised (scaled by a weight) and
    used as x @ w.T is found; x @ w and a product of activations are not."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, w_hbm, s_ref, o_ref, w_vmem, sem):
        copy = pltpu.make_async_copy(w_hbm, w_vmem, sem)
        copy.start()
        copy.wait()
        x = x_ref[...]
        w = (w_vmem[...].astype(jnp.float32) * s_ref[...]).astype(jnp.bfloat16)
        nt = (((1,), (1,)), ((), ()))
        o_ref[...] = (jnp.dot(x, w, preferred_element_type=jnp.float32)
                      + jax.lax.dot_general(x, w, nt, preferred_element_type=jnp.float32)
                      + jax.lax.dot_general(x, x, nt, preferred_element_type=jnp.float32))

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pl.ANY),
                  pl.BlockSpec(memory_space=pltpu.VMEM)],
        scratch_shapes=[pltpu.VMEM((128, 128), jnp.bfloat16), pltpu.SemaphoreType.DMA(())])
    shapes = [jax.ShapeDtypeStruct((128, 128), jnp.bfloat16)] * 2 + [
        jax.ShapeDtypeStruct((1, 128), jnp.float32)]
    outer = jax.make_jaxpr(call)(*shapes).jaxpr
    [eqn] = [e for e in _all_eqns(outer) if e.primitive.name == "pallas_call"]
    kernel_jaxpr = eqn.params["jaxpr"]
    found = transposed_weight_dots(kernel_jaxpr, kernel_jaxpr.invars[1:3])
    assert len(found) == 1, found
    assert next(iter(found)).endswith("bf16[128,128] x bf16[128,128] contracting (1,)"), found
    assert "test_no_transposed_pushes.py" in next(iter(found))


CASES = [  # (zoo card, layers, cores, topology, plan overrides, --quantize pairs)
    ("llama-3.2-1b", 1, 4, "tpu7x:2x2x1", None, None),           # tied LM head
    ("qwen3-30b-a3b", 1, 4, "tpu7x:2x2x1", None, None),          # routed experts
    ("qwen3.5-27b", 4, 8, "tpu7x:2x2x1", None, None),            # Gated DeltaNet
    ("deepseek-v3", 1, 32, "tpu7x:4x4x1", {"mla_form": "absorbed"}, None),   # MLA
    ("deepseek-v3", 1, 32, "tpu7x:4x4x1", {"mla_form": "expanded"}, None),
    ("qwen3-8b", 1, 4, "tpu7x:2x2x1", None, ["dense=int4_g128"]),
    ("gpt-oss-20b", 1, 2, "tpu7x:2x2x1", None, ["experts=mxfp4"]),
]


@pytest.mark.aot
@pytest.mark.parametrize("name,layers,cores,topology,overrides,quantize", CASES,
                         ids=[f"{c[0]}-{(c[4] or {}).get('mla_form', '')}{'q' if c[5] else ''}"
                              for c in CASES])
def test_no_weight_reaches_the_mxu_transposed(name, layers, cores, topology, overrides,
                                              quantize, tmp_path):
    from megakernel.cli.args import with_quantize

    model = with_quantize(zoo.model(name).truncated(layers), quantize)
    kernel, seeds = _kernel_jaxpr(model, cores, topology, overrides, tmp_path)
    found = transposed_weight_dots(kernel, seeds)
    assert not found, found
