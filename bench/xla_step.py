"""The baseline a user would pick instead: the decode step as XLA ops over the plan's cores.

After ``build(model, plan, mesh)``: an ``XlaStep`` whose ``fn`` is the plain-JAX
reference's decode step (``models/reference.py``) with two changes a decode step
would make: each MoE layer runs only its routed experts (``routed_moe``: the
oracle runs every expert on every row), and the step returns the greedy next
token, as the megakernel does, not the logits. Its operands are shapes only
(``jax.ShapeDtypeStruct``, no weights), each with the sharding of the plan's
cores, so full-size models compile: every weight split as the plan splits it,
experts over their intermediate axis (``_shard``), caches as the plan splits
its state, tokens replicated. XLA's SPMD partitioner inserts its own collectives.

The step donates the caches and writes the new rows in place, as a user's step
would. ``build(..., profiled=True)`` gives the program libtpu's profile pass can
read (bench/xla_baseline.py): the same ops with no cache written and each MoE
layer holding just the k experts it uses (``XlaStep.compile`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal
from jax.sharding import NamedSharding, PartitionSpec as P

from megakernel.compiler.shard import shard_model
from megakernel.ir.graph import body_local_name
from megakernel.models import reference
from megakernel.models.kind_moe import expert_ffn, route, with_shared


def routed_moe(op, p, x, *, static: bool = False):
    """``kind_moe.moe`` as a decode step runs it: only the k experts each row
    routes to, their weights gathered by expert id ([n, k, ...]), each applied
    to its row and summed with the router's weights; equal to ``moe`` up to f32
    rounding (tests/bench/test_xla_baseline.py). ``static``: the layer holds
    only k experts and every row uses all of them (the same bytes and matmuls
    with no data-dependent read; the profiled step's)."""
    ids, weights = route(op, p, x)                                          # [n, k]
    names = ["experts_gate", "experts_up", "experts_down"]
    if op.expert_bias:
        names += ["experts_gate_bias", "experts_up_bias", "experts_down_bias"]
    n, k = ids.shape
    picked = [jnp.broadcast_to(p[w][None], (n, *p[w].shape)) if static
              else jnp.take(p[w], ids, axis=0) for w in names]              # [n, k, ...]

    def row(xr, *w):          # one row through each of its k experts -> [k, H]
        return jax.vmap(lambda *we: expert_ffn(op, xr[None], *we)[0])(*w)

    per_choice = jax.vmap(row)(x, *picked)                                  # [n, k, H]
    if op.per_slot:      # the picks apart by ascending id and their weights (kind_moe.moe)
        order = jnp.argsort(ids, axis=-1)
        per_choice = jnp.take_along_axis(per_choice, order[:, :, None], axis=1)
        return per_choice.reshape(n, -1), jnp.take_along_axis(weights, order, axis=-1)
    out = jnp.einsum("nk,nkh->nh", weights, per_choice, precision=jax.lax.Precision.HIGHEST)
    return with_shared(op, p, x, out)


@dataclass(frozen=True)
class XlaStep:
    fn: Callable                 # (weights, tokens, start_pos, caches) -> (next [B], caches)
    weights: dict                # name -> ShapeDtypeStruct with its sharding
    tokens: jax.ShapeDtypeStruct
    start: jax.ShapeDtypeStruct
    caches: dict
    profiled: bool = False

    @property
    def args(self) -> tuple:
        return self.weights, self.tokens, self.start, self.caches

    def compile(self):
        """The step compiled by the backend the mesh's devices belong to. The
        profiled step writes no cache (``read_only``), as the megakernel's own
        profile reads its caches only (profile_kernel.py), and its MoE layers
        hold only the k experts they use (``routed_moe(static=True)``):
        libtpu's profile pass aborts on the strided DMA of a gather of the
        routed experts ("Unsupported DMA direction for latency modeling:
        dma-general", qwen3-30b-a3b/8), of a static slice of k of them fused
        into the matmul (mixtral-8x7b/8), and, written as one dynamic slice
        per expert, on its waits ("No DMA issue node found for sync flag");
        mixtral-8x7b/8's matmul over its k = 2 held experts still aborts it."""
        if not self.profiled:
            return jax.jit(self.fn, donate_argnums=3).trace(*self.args).lower().compile()
        flat, _ = jax.tree.flatten(self.args)
        return jax.jit(self.read_only()).trace(*flat).lower().compile()

    def read_only(self) -> Callable:
        """``fn`` on the flattened operands with its cache writes removed: each
        ``scatter`` into a cache input (the reference writes the new K/V or latent
        rows that way) yields the cache unchanged, and the caches that come back
        unchanged are not returned, so none is copied or written. Attention reads
        the same rows; only the step's own rows are stale, which no schedule sees.
        Whole-access state (Gated DeltaNet) is computed, not written into, and
        stays an output."""
        flat, tree = jax.tree.flatten(self.args)
        n = len(self.caches)
        closed = jax.make_jaxpr(lambda *xs: self.fn(*jax.tree.unflatten(tree, xs)))(*flat)
        cache_vars = set(closed.jaxpr.invars[len(flat) - n:])

        def run(*xs):
            env = dict(zip(closed.jaxpr.invars, xs))
            env.update(zip(closed.jaxpr.constvars, closed.consts))

            def read(v):
                return v.val if isinstance(v, Literal) else env[v]

            for eqn in closed.jaxpr.eqns:
                ins = [read(v) for v in eqn.invars]
                if eqn.primitive.name == "scatter" and eqn.invars[0] in cache_vars:
                    outs = [ins[0]]
                else:
                    outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
                    outs = outs if eqn.primitive.multiple_results else [outs]
                env.update(zip(eqn.outvars, outs))
            inputs = {id(x) for x in xs[len(xs) - n:]}
            return [y for y in map(read, closed.jaxpr.outvars) if id(y) not in inputs]

        return run


def factors(n: int) -> tuple[int, ...]:
    """Prime factors of ``n``, largest first ((2, 2, 2) for 8; (1,) for 1)."""
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return tuple(sorted(out, reverse=True)) or (1,)


def split_mesh(devices) -> jax.sharding.Mesh:
    """``devices`` (core c at index c) as a mesh with one axis per prime factor
    of their count, minor axis last: a plan ``Split`` whose ``div`` and ``parts``
    are products of neighbouring factors is then one PartitionSpec entry."""
    shape = factors(len(devices))
    return jax.sharding.Mesh(np.array(devices).reshape(shape),
                             tuple(f"c{i}" for i in range(len(shape))))


def spec(mesh: jax.sharding.Mesh, shape: tuple[int, ...], splits) -> P:
    """The PartitionSpec of an array the plan cuts by ``splits``: core c holds
    part (c // div) % parts of the split axis, i.e. the mesh axes above the
    minor ones that make up ``div``. A split XLA cannot take as one (parts not
    such a product, or not dividing the axis: the plan pads it) leaves the axis
    whole on every core, which costs XLA HBM bytes, never correctness."""
    sizes, names = mesh.devices.shape, mesh.axis_names
    axes: list = [None] * len(shape)
    for s in splits:
        i, acc = len(sizes), 1
        while acc < s.div and i > 0:
            i -= 1
            acc *= sizes[i]
        chosen, acc2 = [], 1
        while acc2 < s.parts and i > 0:
            i -= 1
            acc2 *= sizes[i]
            chosen.insert(0, names[i])
        if acc == s.div and acc2 == s.parts and shape[s.axis] % s.parts == 0 and chosen:
            axes[s.axis] = tuple(chosen) if len(chosen) > 1 else chosen[0]
    return P(*axes)


def _shard(plan):
    """The plan's sharding with MoE experts split over their intermediate axis on
    every core (``moe_parallel="tp"``): under expert parallelism a gather of the
    routed experts along the split expert axis makes XLA all-reduce the gathered
    weights themselves; split this way every core reads k experts' slices, the
    same bytes per core as the plan's expert parallelism, balanced."""
    s = plan.shard
    if s.ep == 1:
        return s
    return shard_model(plan.model, s.cores, moe_parallel="tp", embed=s.embed)


def _held(model, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape the profiled step holds weight ``name`` in: a MoE layer's
    routed experts cut to the k it uses."""
    if not name.startswith("layers."):
        return shape
    _, layer, node, rest = name.split(".", 3)
    op = next(n.op for n in model.layers[int(layer)].nodes if n.name == node)
    return (op.top_k, *shape[1:]) if op.kind == "moe" and rest.startswith("experts_") else shape


def build(model, plan, mesh: jax.sharding.Mesh, *, profiled: bool = False) -> XlaStep:
    """The XLA step of ``model`` (the plan's model, or a cut of it: layer
    indices are the plan's) over ``mesh`` (``split_mesh`` of the plan's cores)
    at the plan's batch and tokens; ``profiled``: the profile's variant."""
    shard, b = _shard(plan), plan.request.batch
    rules = {"moe": lambda n, p, xs, ctx: routed_moe(n.op, p, xs[0], static=profiled)}

    def shaped(shape, dtype, splits):
        return jax.ShapeDtypeStruct(shape, dtype.jnp,
                                    sharding=NamedSharding(mesh, spec(mesh, shape, splits)))

    weights = {k: shaped(_held(model, k, p.shape) if profiled else p.shape, p.dtype,
                         shard.param(k).splits) for k, p in model.params().items()}
    caches = {}
    for k, st in model.cache_specs(b).items():
        _, layer, rest = k.split(".", 2)
        ss = shard.stack_of(int(layer))
        local = body_local_name(ss.start, ss.period, int(layer), rest, ss.runs)[1]
        state = next(x for x in ss.states if f"{x.node}.{x.name}" == local)
        caches[k] = shaped(st.shape, st.dtype, state.splits)
    whole = NamedSharding(mesh, P())

    def step(w, tokens, start, c):
        logits, c = reference.decode_step(model, w, tokens, start, c, rules=rules)
        return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), c

    return XlaStep(step, weights,
                   jax.ShapeDtypeStruct((b, plan.request.tokens), jnp.int32, sharding=whole),
                   jax.ShapeDtypeStruct((b,), jnp.int32, sharding=whole), caches, profiled)
