"""What the user asks the planner for: batch, tokens per step, context, and
overrides of choices the planner would otherwise make itself.

After ``make_request``: every field is checked, so later stages can trust it;
``context`` is the number of cached tokens each sequence already holds (the
cost model reads only that valid prefix of the KV cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from megakernel.compiler.plan_json import OMIT_DEFAULT
from megakernel.errors import PlanningError
from megakernel.ir.graph import Model
from megakernel.registry import Registry

DEFAULT_CONTEXT = 2048

# Overrides of a choice one op kind's rules make (fields marked BY_KIND with
# that kind): the override's name -> the values it may take, registered with
# the kind's compiler rules (``mla_form``: compiler/kind_mla.py).
KIND_OVERRIDES: Registry = Registry("override", "compiler/kind_*.py", per_op_kind=False,
                                    keyed_by="override field")
BY_KIND = "by_kind"
# Greedy steps one kernel call may run: step i's token goes to lane i of the
# [rows, 128] token output, so at most one lane row of them.
MAX_STEPS_PER_CALL = 128


@dataclass(frozen=True)
class Overrides:
    """Each ``None`` means "let the planner choose".

    moe_parallel: "tp" (each expert split along its intermediate width over all
        cores), "ep" (experts spread over all cores), or an int expert-parallel
        degree d (experts over d groups, each expert split over cores // d).
    logits: "argmax" (vocab-sharded logits + distributed argmax) or "gather".
    allreduce: "one_shot" or "rs_ag" for every tensor-parallel all-reduce.
    allreduce_wide: the same for the all-reduces of partials wider than the
        hidden size (a per-slot MoE's picks) alone; None: ``allreduce`` if
        set, else the faster for their bytes (compiler/schedule_collectives.py).
    embed: "vocab" (vocab-sharded table + all-reduce) or "replicated".
    mla_form: "absorbed" or "expanded" for every multi-head latent attention
        (backends/pallas_tpu/kernels/mla.py); None: the cheaper by the cost model.
        Its values are the MLA rules' (KIND_OVERRIDES); the field stays here, so
        every plan's JSON keeps it.
    wire: "bfloat16" or "float32", the dtype the all-reduces' partials travel
        in; None: the model's activation dtype.
    expert_rows: the rows whose routed experts the cost model counts as
        distinct (a layer loads at most this x top_k experts); None: every row,
        the worst case. 1 models a batch whose rows all route alike, as
        Inferact's Muse Spark benchmark of identical rows does; the
        kernel itself runs whatever the router picks.
    """

    bank_bytes: int | None = None
    num_banks: int | None = None
    expert_slots: int | None = None
    slot_chunks: int | None = None       # expert tiles (intermediate chunks) per expert
    kv_tile: int | None = None
    moe_parallel: "str | int | None" = None
    logits: str = "argmax"
    allreduce: str | None = None
    embed: str = "vocab"
    mla_form: str | None = field(default=None, metadata={BY_KIND: "mla"})
    # Left out of the plan's JSON at its default, so plans that do not set it
    # keep their digest.
    wire: str | None = field(default=None, metadata={OMIT_DEFAULT: True})
    expert_rows: int | None = field(default=None, metadata={OMIT_DEFAULT: True})
    allreduce_wide: str | None = field(default=None, metadata={OMIT_DEFAULT: True})

    def __post_init__(self):
        for name in ("bank_bytes", "num_banks", "expert_slots", "slot_chunks", "kv_tile",
                     "expert_rows"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value > 0):
                raise PlanningError(f"{name}={value!r} must be a positive integer",
                                    path=f"overrides.{name}")
        if self.bank_bytes is not None and self.bank_bytes % 4096:
            raise PlanningError(f"bank_bytes={self.bank_bytes} must be a multiple of 4096 "
                                "(one native [sublanes, 128] tile)", path="overrides.bank_bytes")
        _choice(self.logits, ("argmax", "gather"), "logits")
        _choice(self.embed, ("vocab", "replicated"), "embed")
        if self.allreduce is not None:
            _choice(self.allreduce, ("one_shot", "rs_ag"), "allreduce")
        if self.allreduce_wide is not None:
            _choice(self.allreduce_wide, ("one_shot", "rs_ag"), "allreduce_wide")
        for f in fields(self):
            if f.metadata.get(BY_KIND) and getattr(self, f.name) is not None:
                _choice(getattr(self, f.name), KIND_OVERRIDES(f.name, f"overrides.{f.name}"),
                        f.name)
        if self.wire is not None:
            _choice(self.wire, ("bfloat16", "float32"), "wire")
        if self.moe_parallel is not None and not isinstance(self.moe_parallel, int):
            _choice(self.moe_parallel, ("tp", "ep"), "moe_parallel")

    @classmethod
    def parse(cls, value: "Overrides | dict | None") -> "Overrides":
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        known = {f.name for f in fields(cls)}
        extra = sorted(set(value) - known)
        if extra:
            raise PlanningError(f"unknown overrides {extra}; known: {sorted(known)}",
                                path="overrides")
        return cls(**value)


def _choice(value, allowed: tuple[str, ...], name: str) -> None:
    if value not in allowed:
        raise PlanningError(f"{name}={value!r} is not one of {list(allowed)}",
                            path=f"overrides.{name}")


@dataclass(frozen=True)
class PlanRequest:
    """One decode step of ``batch`` sequences x ``tokens`` new tokens each, at
    ``context`` cached tokens per sequence, over ``devices`` TensorCores."""

    devices: int
    batch: int
    tokens: int
    context: int
    overrides: Overrides
    # Greedy decode steps per kernel call (issue 14): step i's argmax is step
    # i + 1's token, fed back inside the kernel; per-call costs are paid once.
    steps: int = 1

    @property
    def rows(self) -> int:
        """Token rows of the step (B * T), the leading axis of every activation."""
        return self.batch * self.tokens


def make_request(model: Model, *, devices: int, batch: int = 1, tokens: int = 1,
                 context: int | None = None, overrides=None, steps: int = 1) -> PlanRequest:
    for name, value in (("batch", batch), ("tokens", tokens), ("steps_per_call", steps)):
        if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise PlanningError(f"{name}={value!r} must be a positive integer",
                                path=f"request.{name}")
    if steps > MAX_STEPS_PER_CALL:
        raise PlanningError(f"steps_per_call={steps} exceeds {MAX_STEPS_PER_CALL} (one token "
                            "per lane of the token output)", path="request.steps_per_call",
                            hint=f"use at most {MAX_STEPS_PER_CALL} steps per call")
    if steps > 1 and tokens != 1:
        raise PlanningError(f"steps_per_call={steps} needs tokens=1 per step, found "
                            f"tokens={tokens} (each step feeds back one greedy token per "
                            "sequence)", path="request.tokens",
                            hint="plan prefill (tokens > 1) with steps_per_call=1")
    if steps > 1:
        _check_stepped_state(model, steps)
    room = model.max_seq_len - tokens - (steps - 1)
    if room < 0:
        raise PlanningError(f"tokens={tokens} x steps_per_call={steps} exceeds max_seq_len="
                            f"{model.max_seq_len}", path="request.tokens",
                            hint="lower tokens per step or steps per call")
    if context is None:
        context = min(DEFAULT_CONTEXT, room)
    if not (isinstance(context, int) and 0 <= context <= room):
        raise PlanningError(f"context={context!r} must be in [0, max_seq_len - tokens - "
                            f"(steps_per_call - 1) = {room}]", path="request.context",
                            hint="lower context or build the model with a longer max_seq_len")
    return PlanRequest(devices, batch, tokens, context, Overrides.parse(overrides), steps)


def _check_stepped_state(model: Model, steps: int) -> None:
    """Every state-owning op's kind must carry its state across the steps of a
    call: its kernel library says so in ``STEPPING`` (a kind without a rule
    there is a MissingRuleError naming it)."""
    from megakernel.compiler.stepping import STEPPING

    for st in model.stacks:
        for node in st.layer.nodes:
            if not node.op.state(1, model.max_seq_len, model.dtype):
                continue
            rule = STEPPING(node.op.kind, f"{st.layer.kind}.{node.name}")
            if not rule.carries:
                raise PlanningError(
                    f"steps_per_call={steps}: op kind {node.op.kind!r} "
                    f"({st.layer.kind}.{node.name}) keeps state that its kernel library does "
                    f"not carry across the steps of one call: {rule.how}",
                    path="request.steps_per_call",
                    hint="use --steps-per-call 1 for this model")
