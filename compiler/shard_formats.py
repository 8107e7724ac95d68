"""Give each shard its storage format: quantized weights stream codes, and
their scales stream beside them.

After ``format_params``: a ring weight whose format is not plain has the
format's code dtype (``int8``, ``int4``, ``float8_e4m3fn``, ``float4_e2m1fn``;
the ring carries them as 32-bit words, megakernel/quantize.py's units), and
is followed by its scale companion ``{name}_scale``: f32 [K/g, N] per core
(one row for per-channel int8), split like the weight along N and along K
by whole groups, a ring weight of its own whose tiles interleave with the
weight's (compiler/tile_weights.py); the LM head is such a ring weight. Routed
experts go the same way through their slots (codes as words, scales beside
them). Formats on other channels (the MLA library's own matrices) are a named
``PlanningError``: their kernel paths read plain weights only.
"""

from __future__ import annotations

import dataclasses

from megakernel import formats
from megakernel.compiler.shard_rules import ParamShard, Split
from megakernel.errors import PlanningError

SCALE = "_scale"


# The hint of a core's rows cutting scale groups; the shard stage names the
# core counts that fit in its place.
CUT_GROUPS = "use another core count or format"


def scale_name(param: str) -> str:
    return param + SCALE


def _scale_split(s: Split, k_axis: int, fmt: formats.Format, k: int,
                 where: str) -> Split | None:
    if s.axis != k_axis:
        return s
    if fmt.group_rows == formats.WHOLE:
        return None          # one scale row serves every core's rows
    g = fmt.group(k)
    if s.stride % g or s.padded % g:
        raise PlanningError(f"a core's {s.stride} input rows (padded to {s.padded}) cut the "
                            f"{fmt.name} scale groups of {g}", path=where,
                            hint=CUT_GROUPS)
    return dataclasses.replace(s, stride=s.stride // g, padded=s.padded // g)


def format_params(params: tuple[ParamShard, ...], chosen: dict[str, str],
                  where: str) -> tuple[ParamShard, ...]:
    """``params`` of one stack body with the formats ``chosen`` ({local name:
    format}) applied, each quantized ring weight followed by its scales."""
    out = []
    for p in params:
        name = chosen.get(p.name, "plain")
        fmt = formats.get(name)
        if fmt.plain:
            out.append(p)
            continue
        if p.channel not in ("ring", "experts"):
            raise PlanningError(f"format {name!r} is only streamed through the weight ring "
                                f"and the expert slots yet; this weight reaches VMEM by "
                                f"{p.channel!r}", path=f"{where}.{p.name}",
                                hint="quantize another weight kind")
        k_axis = len(p.full_shape) - 2
        k = p.full_shape[k_axis]
        fmt.check(p.shape, f"{where}.{p.name}")
        out.append(dataclasses.replace(p, dtype=fmt.code, format=name))
        shape = list(p.full_shape)
        shape[k_axis] = k // fmt.group(k)
        splits = tuple(s for s in (_scale_split(s, k_axis, fmt, k, f"{where}.{p.name}")
                                               for s in p.splits) if s)
        out.append(ParamShard(scale_name(p.name), tuple(shape), "float32", splits, p.channel,
                              f"scales of {p.name} ({name})", scale_of=p.name))
    return tuple(out)


def check_target(shard, target) -> None:
    """Formats whose codes reach the MXU as float8 (``Format.mxu == "fp8"``)
    need a chip that takes float8 operands."""
    if target.fp8_flops:
        return
    for ss in shard.stacks:
        for p in ss.params:
            if formats.get(p.format).mxu == "fp8":
                raise PlanningError(f"format {p.format!r} feeds float8 codes to the MXU; "
                                    f"{target.chip} has no float8 matmul (pltpu)",
                                    path=f"shard.layers.{ss.start}.{p.name}",
                                    hint="plan for tpu7x or v6e, or quantize this weight kind "
                                         "to another format")


def check_globals(quantize) -> None:
    """The embedding is gathered plain (its kernel path reads plain rows); the
    LM head streams through the ring like any quantized ring weight."""
