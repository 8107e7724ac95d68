"""Check: run the generated kernel in TPU interpret mode against the reference.

The reference prefills the caches from a random prompt; they are converted to
the kernel's layout; then ``steps`` decode steps run at advancing positions
(row b of the batch starts ``b`` positions later, so rows differ), comparing
each step's greedy tokens, logits (per-dtype tolerance) and caches. Both sides
are fed the reference's tokens, so one disagreement does not cascade. A
sequence the reference routes to its experts by a near-tie is left out of the
comparison from that step on (``ROUTE_TIE``) and counted in the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

from megakernel.backends.pallas_tpu.codegen import operands as pack
from megakernel.errors import CheckError
from megakernel.models import reference

# Logits pass when max|kernel - reference| <= TOL * (1 + max|reference logits|),
# per weight dtype (``CheckResult.tolerance`` holds the absolute bound); state
# (KV caches, recurrent state) when max|kernel - reference| <= CACHE_TOL *
# (1 + max|reference state|). Measured over property draws (dense and MoE
# cards from megakernel.testing.model_configs, 1-2 layers, 1-2 cores, batch
# 1-4, 1-3 tokens, 2 steps; /tmp-run of 2026-12-03): bf16, 40 draws, largest
# logit error 1.7e-3 of the scale and largest state error 0.0156 = one bf16
# ulp at |x| in [2, 4) (a rounding flip of a value both sides compute in f32);
# f32, 25 draws, 5.3e-7 and 2.6e-6. The bounds are about 3x those. Re-measured
# in f32 once the strategy table drew every family option (soft-capped logits,
# sinks, softmax_scale up to 0.25, post-norm-only blocks; 26 draws on 1-2 cores,
# 2026-12-03): largest logit error 3.1e-6 of the scale (a cap-30, scale-0.25
# draw; sharper softmax and the caps' tanh reorder f32 rounding), hence 1e-5.
# Re-measured in bf16 with the same family options (40 draws of model_configs,
# 27 of them with layer patterns, caps, o_bias and softmax_scale required, 1-2
# cores, batch 1-3, 1-2 tokens, 2 steps; 2026-12-03): largest logit error 6.8e-3
# of the scale, 3 draws above the old 5e-3, all with sinks, 2-4 layers and a
# one-ulp flip in a bf16 cache (the same draws in f32: <= 8e-7), hence 2e-2.
# Re-measured with the bf16 all-reduce wire (partials rounded to bf16 once,
# f32 sums; 2026-12-04, tools/measure_wire.py): 40 draws of model_configs, bf16,
# 20 on 2 cores (1-4 layers) and 20 on 4 (1-2 layers), batch 1-3, 1-2 tokens,
# 2 steps, plus the post-norm graph of tests/e2e/test_generic_ops.py on 2 and 4
# cores at batch 1-3; each also on an f32 wire. Largest logit error 9.6e-3 of
# the scale (2 cores, MoE, 2 tokens; f32 wire 4e-7), post-norm graph 5.4e-3
# (f32 wire 4e-4), so the bf16 wire is most of a multi-core bf16 model's
# error, within 2e-2 at about 2x; largest state error 0.031 = one bf16 ulp
# at |x| in [4, 8) (0.72 of CACHE_TOL's bound; one ulp is always inside it).
# One more 4-core draw (MoE, sigmoid routing with correction bias, top-4 of 10)
# is off by 6.7e-2 on both wires alike: its router's 4th and 5th selection
# scores are 1.35e-5 apart at ~1.0, so rounding picks a different expert; a
# near-tie, not the wire, and no tolerance on logits is meant to cover it:
# such a sequence is left out of the comparison instead (ROUTE_TIE).
TOL = {"float32": 1e-5, "bfloat16": 2e-2}
CACHE_TOL = {"float32": 4e-6, "bfloat16": 2 ** -7}

# A sequence is a routing near-tie, and is not compared from that step on,
# when some MoE op of the reference chooses its experts by a margin below
# ROUTE_TIE (reference.decode_step_margins: last chosen minus first unchosen
# selection score): rounding the kernel may differ by then picks other
# experts, and the sequence's logits and state legitimately part ways.
# Measured (2026-12-04, by a one-off script: 24 MoE draws of
# model_configs on 2 and 4 cores, 9 of them bf16, 1-2 layers, batch 1-4, 1-3
# tokens, 2 steps, 51 sequences, plus the two failing draws): bf16 flips at
# margins of 1.35e-5, 1.7e-4 and 2.1e-4 (tests/e2e/test_route_ties.py); none
# at 1.05e-3, 1.15e-3, 3.0e-3 or above (largest errors 0.32 of TOL and 0.70
# of CACHE_TOL), so 5e-4, 2.4x the largest flip. f32 logits err by at most 3.1e-6 of their scale
# (above) and a score moves at most 1/4 of its logit, so a flip needs a margin
# under ~2e-6 (1 + |router logit|): 1e-5 covers router logits up to ~4.
ROUTE_TIE = {"float32": 1e-5, "bfloat16": 5e-4}

# A bf16 wire (schedule_collectives: each core's partial rounded to bf16 once
# per all-reduce, f32 sums) is the one rounding the kernel has and the
# reference does not: on an f32 wire the same plans equal the reference to
# ~1e-5 of the logit scale. Its error adds to the dtype's bounds above, for
# logits and state alike (relative to 1 + the largest reference value), and
# the routing margin it can flip adds to ROUTE_TIE. Measured (2026-12-04,
# tools/measure_wire.py: bf16 draws, 2 steps, kernel vs reference):
# - attention models (model_configs, 1-2 layers, batch 1-8, 1-4 tokens): 10
#   MoE and 8 dense draws on 8 cores: logits <= 1.0e-2 of the scale, state
#   <= 0.75 of CACHE_TOL; the 40 draws on 2-4 cores above: <= 9.6e-3. So 1e-2.
# - models with a kind whose numerics amplify the rounding more (Gated
#   DeltaNet's): that kind's bound (models.reference.WIRE_TOLERANCE, measured
#   and registered with its reference, models/kind_gdn.py).
# - routing flips at margins up to 2.1e-4 on 2-4 cores (ROUTE_TIE above) and
#   of 7.9e-4 on 8 (sigmoid grouped routing, int8 attention projections; on an
#   f32 wire no flip, logits within 1.5e-5). Every all-reduce rounds each
#   core's partial once, and the router reads a residual every earlier
#   all-reduce has rounded into; independent roundings add in quadrature, so
#   the margin grows as sqrt(cores x all-reduces of a step): 4e-4 times it.
#   Measured (2026-12-07): a 4-layer draw on 2 cores (9 all-reduces a step, 6
#   before the router that flipped) flips at a margin of 1.06e-3, above the
#   1e-3 a rule of 2.5e-4 per core gave (tests/e2e/test_route_ties.py; on an
#   f32 wire it matches, logits 9e-4 off): 5e-4 + 4e-4 sqrt(18) =
#   2.2e-3 is 2.1x that flip; the 8-core flip above (the embedding's and at
#   least one layer's all-reduces: 3 or more) gets 2.5e-3 or more, 3.1x. On
#   25 drawn MoE models on 8 cores (46 sequences, 2 steps) it leaves out 12
#   sequences, the per-core rule 9, a linear rule (n half-ulps) 14.
WIRE_TOL = 1e-2
WIRE_ROUTE_TIE = 4e-4       # times sqrt(cores x all-reduces of a step)


@dataclass(frozen=True)
class Tolerances:
    """A check's relative bounds: logits and state within ``logits`` /
    ``state`` x (1 + the largest reference value); a sequence routed by a
    margin below ``route_tie`` is not compared."""

    logits: float
    state: float
    route_tie: float

    @classmethod
    def of(cls, model, plan=None) -> "Tolerances":
        """The dtype's bounds, plus the bf16 wire's on a plan whose all-reduces
        round partials to bf16 (a plan of one core has no wire)."""
        dt = model.dtype.value
        wire = plan.collectives.wire if plan is not None else None
        if wire != "bfloat16":
            return cls(TOL[dt], CACHE_TOL[dt], ROUTE_TIE[dt])
        kinds = {n.op.kind for layer in model.layers for n in layer.nodes}
        wire_tol = max([WIRE_TOL] + [reference.WIRE_TOLERANCE[k] for k in kinds
                                     if k in reference.WIRE_TOLERANCE])
        roundings = plan.shard.cores * max(plan.collectives.all_reduces_per_step, 1)
        return cls(TOL[dt] + wire_tol, CACHE_TOL[dt] + wire_tol,
                   ROUTE_TIE[dt] + WIRE_ROUTE_TIE * math.sqrt(roundings))


def used_logits(model, got, ref):
    """(kernel, reference) logits [..., V] cut to the ids a check compares:
    all, or those below the model's ``vocab_used``. The padding ids' logits
    are -inf on both sides (a kernel that writes any other value there is
    refused here, naming the first), so no tolerance is spent on them."""
    if model.vocab_used is None or got is None:
        return got, ref
    got, ref, used = np.asarray(got), np.asarray(ref), model.vocab_used
    pad = got[..., used:]
    wrong = np.argwhere(~np.isneginf(pad))
    if wrong.size:
        first = tuple(wrong[0])
        raise CheckError(f"the kernel's logit of padding id {used + int(first[-1])} is "
                         f"{pad[first]}, expected -inf", path="check.logits",
                         hint="ids from vocab_used on are never chosen")
    return got[..., :used], ref[..., :used]


def reference_step(model, weights, tokens, start_pos, caches, route_tie: float | None = None):
    """One reference step -> (logits [B, T, V] numpy, caches, route ties [B]
    bool: the sequences whose routing in this step is a near-tie, a margin
    below ``route_tie``, default ROUTE_TIE of the dtype), one pass."""
    logits, caches, margins = reference.decode_step_margins_jit(
        model, weights, jnp.asarray(tokens), jnp.asarray(start_pos), caches)
    tie = ROUTE_TIE[model.dtype.value] if route_tie is None else route_tie
    return np.asarray(logits), caches, np.asarray(margins) < tie


@dataclass
class CheckResult:
    max_abs_err: float            # max |kernel - reference| logits, over all steps
    token_agreement: float        # fraction of greedy tokens equal to the reference
    cache_max_err: float
    steps: int
    seconds: float
    races: bool = False
    tolerance: float = 0.0
    errors: list[float] = field(default_factory=list)
    cache_tolerance: float = 0.0
    tokens: "np.ndarray | None" = None     # a multi-step call's tokens [B, N]
    mismatches: int = 0           # greedy tokens unequal to the reference's
    near_ties: int = 0            # of those, the ones a near-tie explains (near_ties())
    route_ties: int = 0           # sequences not compared: routing near-ties (ROUTE_TIE)
    # tolerance = bounds.logits x (1 + logit_scale), cache_tolerance =
    # bounds.state x (1 + cache_scale): the largest |reference logit| and state
    bounds: "Tolerances | None" = None
    logit_scale: float = 0.0
    cache_scale: float = 0.0

    @property
    def tokens_agree(self) -> bool:
        """Every greedy token is the reference's, or a near-tie the logits
        check already bounds (see ``near_ties``; a result that did not count
        them, e.g. a multi-step call's, needs every token equal)."""
        return tokens_agree(self.token_agreement, self.mismatches, self.near_ties)

    @property
    def ok(self) -> bool:
        return (self.tokens_agree and not self.races
                and self.max_abs_err <= self.tolerance
                and self.cache_max_err <= self.cache_tolerance)


def tokens_agree(agreement: float, mismatches: int, ties: int) -> bool:
    """The token verdict of a check: all equal, or every mismatch a near-tie."""
    return agreement == 1.0 or 0 < mismatches == ties


def near_ties(got_tokens, got_logits, ref_logits) -> tuple[int, int]:
    """(mismatches, near ties) of greedy tokens [..] against the reference.

    A kernel token unequal to the reference's argmax r is a near tie when it
    is the argmax of the kernel's own logits and the reference ranks it within
    2e of r, e = max |kernel - reference| over that position's logits: with
    every logit within e of the reference, r and the kernel's token can
    swap places exactly when ref[r] - ref[token] <= 2e. The logits check
    bounds e; the token check then tests the kernel's argmax (in-kernel and
    across cores) rather than the rounding of two logits a hair apart. Seen
    in a property draw (CI, 2026-12-04): one of 12 tokens off, logits within
    0.024 of the reference against a tolerance of 0.086."""
    got_tokens = np.asarray(got_tokens).reshape(-1)
    if not got_tokens.size:             # every sequence left out (ROUTE_TIE)
        return 0, 0
    got = np.asarray(got_logits, np.float32).reshape(got_tokens.size, -1)
    ref = np.asarray(ref_logits, np.float32).reshape(got_tokens.size, -1)
    rows = np.arange(got_tokens.size)
    off = got_tokens != ref.argmax(-1)
    err = np.max(np.abs(got - ref), axis=-1)
    own = got[rows, got_tokens] >= got.max(-1)
    close = ref.max(-1) - ref[rows, got_tokens] <= 2 * err
    return int(off.sum()), int((off & own & close).sum())


def interpret_params(**kw):
    """Strict interpret mode: race detector with enough clock slots to see DMA
    races, out-of-bounds reads raise, uninitialised memory is NaN."""
    base = dict(detect_races=True, out_of_bounds_reads="raise", uninitialized_memory="nan",
                dma_execution_mode="on_wait", vector_clock_size=64)
    base.update(kw)
    return pltpu.InterpretParams(**base)


def races_found() -> bool:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    return bool(ipc.races is not None and ipc.races.races_found)


def make_mesh(n: int):
    devices = jax.devices()[:n]
    if len(devices) < n:
        raise CheckError(f"need {n} devices, found {len(devices)}", path="check.devices",
                         hint="set XLA_FLAGS=--xla_force_host_platform_device_count=N")
    return jax.sharding.Mesh(np.array(devices), ("x",))


class KernelRunner:
    """Holds the device-resident packed weights and caches of one kernel."""

    def __init__(self, module, model, plan, weights, mesh, interpret, with_logits=True):
        self.model, self.plan, self.mesh, self.module = model, plan, mesh, module
        self.ops = pack.operands(model, plan)
        self.step_fn = module.make_step(mesh, interpret=interpret, with_logits=with_logits)
        packed = pack.pack_weights(model, plan, weights)
        self.arrays = {o.name: self._put(o, packed[o.name]) for o in self.ops if o.name in packed}

    def _put(self, op, array):
        spec = P("x") if op.sharded else P()
        return jax.device_put(jnp.asarray(array), NamedSharding(self.mesh, spec))

    def set_caches(self, caches):
        packed = pack.pack_caches(self.model, self.plan, caches)
        for o in self.ops:
            if o.role == "cache":
                self.arrays[o.name] = self._put(o, packed[o.name])

    def caches(self):
        return pack.unpack_caches(self.model, self.plan, {
            o.name: np.asarray(self.arrays[o.name]) for o in self.ops if o.role == "cache"})

    def step(self, tokens, start_pos):
        """-> (next tokens [B, T], logits [B, T, V] or None); caches updated."""
        tok, start = pack.step_inputs(self.plan, tokens, start_pos)
        self.arrays["tokens"] = self._put(self.ops[0], tok)
        self.arrays["start_pos"] = self._put(self.ops[1], start)
        outs, logits_out = self.call("interpret-mode step")
        b, t = np.asarray(tokens).shape
        rows = self.plan.memory.rows
        nxt = np.asarray(outs[0])[:rows, 0].reshape(b, t)
        logits = None
        if logits_out is not None:
            logits = pack.logits_from(self.plan, np.asarray(logits_out), b, t)
        return nxt, logits

    def call(self, what: str):
        """One kernel call on the current arrays; the caches it returns replace
        the held ones. -> (outputs, the logits output or None)."""
        try:
            outs = self.step_fn(*[self.arrays[o.name] for o in self.ops])
        except Exception as err:  # noqa: BLE001 - re-raised naming the generated line
            from megakernel.backends.pallas_tpu.codegen import load

            raise load.located(err, self.module.__file__, what) from err
        caches = [o for o in self.ops if o.role == "cache"]
        for o, arr in zip(caches, outs[1:1 + len(caches)]):
            self.arrays[o.name] = arr
        return outs, (outs[-1] if len(outs) > 1 + len(caches) else None)
