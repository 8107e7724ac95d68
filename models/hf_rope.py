"""The RoPE keys of a Hugging Face ``config.json``: base, scaling, partial
rotary, and per-layer-type parameters.

4.x files carry ``rope_theta`` and ``rope_scaling`` at the top level; 5.x
files one ``rope_parameters`` object (with ``rope_theta`` inside), which
Gemma 3 nests by layer type (``{"full_attention": {...},
"sliding_attention": {...}}``; 4.x: ``rope_local_base_freq`` for the sliding
layers). Every key of a parameter object is read or reported.
"""

from __future__ import annotations

from typing import Any

from megakernel.errors import shown
from megakernel.ir import limits
from megakernel.models.hf_fields import FieldReader

# rope_type -> the keys of its parameter object besides rope_type / rope_theta.
ROPE_KEYS = {"default": (), "linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                        "original_max_position_embeddings"),
             "yarn": ("factor", "beta_fast", "beta_slow", "original_max_position_embeddings",
                      "truncate", "attention_factor", "mscale", "mscale_all_dim")}
_THETA = dict(low=limits.ROPE_THETA[0], high=limits.ROPE_THETA[1], open_low=True)
_LAYER_TYPES = ("full_attention", "sliding_attention")


def read_rope(r: FieldReader, theta_default: float, *, by_type: bool = False,
              partial: bool = False, head_dim: int | None = None,
              partial_default: float | None = None,
              extra_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """Card fields ``rope_theta``, ``rope_scaling`` and, with ``by_type``
    (Gemma 3), ``sliding_rope_theta``; with ``partial``, ``rotary_dim`` from
    ``partial_rotary_factor`` (top level or inside the parameter object; when
    absent, ``partial_default``). ``extra_keys``: keys of the parameter object
    the family accepts besides its rope_type's (read by no one, harmless)."""
    theta = r.get("rope_theta", float, None, **_THETA)
    params = r.get("rope_parameters", dict, None)
    scaling = r.get("rope_scaling", dict, None)
    if params is not None and scaling is not None:
        r.problem("rope_scaling", "given together with rope_parameters; keep one")
    key = "rope_parameters" if params is not None else "rope_scaling"
    p = params if params is not None else scaling or {}
    out: dict[str, Any] = {}
    if by_type:
        nested = any(t in p for t in _LAYER_TYPES)
        local = _object(r, p, "sliding_attention", key) if nested else {}
        if nested:
            whole = p
            p = _object(r, whole, "full_attention", key)
            key = f"{key}.full_attention"
            for k in sorted(set(whole) - set(_LAYER_TYPES)):
                r.problem(f"rope_parameters.{k}", f"={shown(whole[k])} beside the "
                          "per-layer-type objects is not supported")
        out["sliding_rope_theta"] = _local_theta(r, local, nested)
    if partial:
        out.update(_partial(r, p, key, head_dim, partial_default))
    out.update(_one(r, p, key, theta, theta_default, partial, extra_keys))
    return out


def _object(r: FieldReader, p: dict, name: str, key: str) -> dict:
    """``p[name]`` if it is an object (absent: empty), else a problem."""
    value = p.get(name, {})
    if isinstance(value, dict):
        return value
    r.problem(f"{key}.{name}", f"{shown(value)} should be an object")
    return {}


def _one(r: FieldReader, p: dict, key: str, theta: float | None,
         theta_default: float, partial: bool, extra_keys: tuple[str, ...]) -> dict[str, Any]:
    """rope_theta and rope_scaling of one parameter object ``p`` (at ``key``)."""
    pre = f"{key}."
    kind = p.get("rope_type", p.get("type", "default"))
    kind = kind if isinstance(kind, str) else shown(kind)
    inner = r.get("rope_theta", float, None, data=p, prefix=pre, **_THETA)
    if theta is not None and inner is not None and theta != inner:
        r.problem(key, f"rope_theta={inner} differs from the top-level {theta}")
    # `is None`, not `or`: a 0 is a value (reported above), never a request for the default.
    given = [t for t in (inner, theta) if t is not None]
    out: dict[str, Any] = {"rope_theta": given[0] if given else theta_default}
    if kind not in ROPE_KEYS:
        r.problem(pre + "rope_type", f"{shown(kind)} is not supported; supported: "
                  f"{sorted(ROPE_KEYS)} (dynamic, longrope etc. change the "
                  "frequencies in ways the IR's Rope cannot express)")
        return out
    allowed = {"rope_type", "type", "rope_theta", *ROPE_KEYS[kind]}
    allowed |= ({"partial_rotary_factor"} if partial else set()) | set(extra_keys)
    for extra in sorted(set(p) - allowed):
        r.problem(pre + extra, f"={shown(p[extra])} is not supported for rope_type {kind!r}")
    if kind == "default":
        return out
    get = lambda k, d, bounds: r.get(k, float, d, data=p, prefix=pre, low=bounds[0],  # noqa: E731
                                     high=bounds[1], open_low=True)
    scale = {"rope_type": kind, "factor": get("factor", None, limits.ROPE_FACTOR)}
    if kind in ("llama3", "yarn"):
        scale["original_max_position"] = r.get(
            "original_max_position_embeddings", int, 8192 if kind == "llama3" else None,
            data=p, prefix=pre, low=1, high=limits.MAX_SEQ_LEN)
    if kind == "llama3":
        scale.update(low_freq_factor=get("low_freq_factor", 1.0, limits.ROPE_FREQ_FACTOR),
                     high_freq_factor=get("high_freq_factor", 4.0, limits.ROPE_FREQ_FACTOR))
    if kind == "yarn":
        scale.update(_yarn(r, p, pre, scale, get))
    # Only keys that are absent: a given but bad value was reported by r.get already.
    missing = [hf for k, hf in (("factor", "factor"), ("original_max_position",
                                                       "original_max_position_embeddings"))
               if k in scale and scale[k] is None and p.get(hf) is None]
    for hf in missing:
        r.problem(pre + hf, "is required but missing")
    if any(scale[k] is None for k in ("factor", "original_max_position") if k in scale):
        return out
    out["rope_scaling"] = scale
    return out


def _yarn(r: FieldReader, p: dict, pre: str, scale: dict, get) -> dict[str, Any]:
    """YaRN's ramp and the keys of its cos/sin factor: ``attention_factor`` if
    given, and ``mscale`` / ``mscale_all_dim`` (absent: left out), from which
    ``RopeScaling`` derives the factor when it is not given (ir/ops.py
    ``rope_attention_factor``) and DeepSeek's MLA its softmax scale."""
    if scale["factor"] is None and scale["original_max_position"]:
        top = r.data.get("max_position_embeddings")
        if isinstance(top, int) and not isinstance(top, bool) and top > 0:
            scale["factor"] = top / scale["original_max_position"]   # transformers' default
    out = dict(beta_fast=get("beta_fast", 32.0, limits.ROPE_FREQ_FACTOR),
               beta_slow=get("beta_slow", 1.0, limits.ROPE_FREQ_FACTOR),
               truncate=r.get("truncate", bool, True, data=p, prefix=pre))
    factor = r.get("attention_factor", float, None, data=p, prefix=pre, low=0.0,
                   high=limits.ROPE_FACTOR[1], open_low=True)
    if factor is not None:
        out["attention_factor"] = factor
    for k in ("mscale", "mscale_all_dim"):
        m = r.get(k, float, None, data=p, prefix=pre, low=0.0, high=limits.MAX_SCALE)
        if m:
            out[k] = m
    return out


def _local_theta(r: FieldReader, local: dict, nested: bool) -> float:
    """Gemma 3's sliding-layer base: 5.x ``sliding_attention`` object (plain
    RoPE only) or 4.x ``rope_local_base_freq`` (transformers' default 1e4)."""
    base = r.get("rope_local_base_freq", float, None, **_THETA)
    if not nested:
        return 1e4 if base is None else base
    pre = "rope_parameters.sliding_attention."
    kind = local.get("rope_type", local.get("type", "default"))
    if kind != "default":
        r.problem(pre + "rope_type", f"{shown(kind)} is not supported for the sliding layers "
                  "(they take an unscaled base, sliding_rope_theta)")
    for extra in sorted(set(local) - {"rope_type", "type", "rope_theta"}):
        r.problem(pre + extra, f"={shown(local[extra])} is not supported")
    inner = r.get("rope_theta", float, None, data=local, prefix=pre, **_THETA)
    if base is not None and inner is not None and base != inner:
        r.problem("rope_local_base_freq", f"{base} differs from {pre}rope_theta={inner}")
    given = [t for t in (inner, base) if t is not None]
    return given[0] if given else 1e4


def _partial(r: FieldReader, p: dict, key: str, head_dim: int | None,
             default: float | None) -> dict[str, Any]:
    """rotary_dim = int(head_dim * partial_rotary_factor) (0: the whole head)."""
    bounds = dict(low=0.0, high=1.0, open_low=True)
    top = r.get("partial_rotary_factor", float, None, **bounds)
    inner = r.get("partial_rotary_factor", float, None, data=p, prefix=f"{key}.", **bounds)
    if top is not None and inner is not None and top != inner:
        r.problem("partial_rotary_factor", f"{top} differs from {key}.partial_rotary_factor"
                  f"={inner}")
    f = next((x for x in (inner, top, default) if x is not None), None)
    if f is None or f == 1.0 or not head_dim:
        return {}
    return {"rotary_dim": int(head_dim * f)}
