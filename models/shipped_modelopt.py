"""NVIDIA ModelOpt's NVFP4 checkpoints (``quant_method`` ``modelopt``,
``quant_algo`` ``NVFP4``), read as models/shipped.py reads the others.

Every matrix but the excluded ones ships as ``X.weight`` U8 [out, in / 2] of
e2m1 codes (input column 2 j in the low nibble of byte j, as compressed-tensors'
nvfp4), ``X.weight_scale`` F8_E4M3 [out, in / 16] and ``X.weight_scale_2``, the
module's f32 global scale, which multiplies: a weight is code x scale x
scale_2 (compressed-tensors stores the reciprocal and divides). So the codes
and block scales load as the IR's nvfp4 with no dequantisation, and the global
scale is folded into the f32 scales as for compressed-tensors.

ModelOpt's NVFP4 is W4A4: ``X.input_scale`` is the static scale of the
activations' fp4 quantization, and an FP8 cache (``kv_cache_quant_algo``)
stores ``k_scale`` / ``v_scale``. This loader keeps activations and the cache in
the model dtype (as vLLM does unless asked for an fp8 cache), so those tensors
are listed as not read rather than refused. The excluded modules
(``exclude_modules``, or ``ignore`` in the newer config.json form) are
fnmatch patterns; they are matched whole, translated to RE2 patterns.
"""

from __future__ import annotations

import re
from typing import Any

from megakernel.errors import shown
from megakernel.models.quant_targets import pattern_problems
from megakernel.models.shipped_layout import Group, Layout, Scheme, check_keys, want

NVFP4 = Layout("modelopt", "nvfp4", "weight", ("U8",), "weight_scale", ("F8_E4M3",),
               per=2, bits=4, global_scale="weight_scale_2")
KEYS = {"quant_method", "quant_algo", "group_size", "exclude_modules", "ignore",
        "kv_cache_quant_algo", "kv_cache_scheme", "producer", "config_groups"}
# the newer config.json form restates the algorithm per group
GROUP_KEYS = {"targets", "weights", "input_activations"}
FP4 = {"num_bits": 4, "type": "float", "group_size": 16}
UNREAD = ("input_scale", "k_scale", "v_scale")


def modelopt(config: dict, problems: list[str]) -> Scheme:
    """The scheme of a ModelOpt ``quantization_config`` (problems recorded)."""
    check_keys(config, KEYS, "", problems)
    want(config, "quant_algo", ("NVFP4",), "", problems,
         " (of ModelOpt's algorithms only NVFP4 loads; give a bf16 checkpoint and the "
         "card's quantize table for others)")
    want(config, "group_size", (None, 16), "", problems, " (nvfp4 scales 16 inputs each)")
    for name, group in (config.get("config_groups") or {}).items():
        _group(f"config_groups.{name}.", group, problems)
    both = [k for k in ("exclude_modules", "ignore") if config.get(k) is not None]
    if len(both) == 2 and config["exclude_modules"] != config["ignore"]:
        problems.append("exclude_modules and ignore differ: give the excluded modules once")
    skip = config.get(both[0]) if both else []
    if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
        problems.append(f"{both[0]}: {shown(skip)} should be a list of module names")
        skip = []
    for i, s in enumerate(skip):
        if "[" in s:
            problems.append(f"{both[0]}[{i}]: {shown(s)}: fnmatch character classes are not "
                            "read; list the modules, or use * and ?")
    ignore = [fnmatch_target(s) for s in skip if "[" not in s]
    problems += pattern_problems(ignore, both[0] if both else "exclude_modules")
    return Scheme("modelopt", (Group(NVFP4, ("Linear",)),), tuple(ignore),
                  frozenset({"dense", "experts", "attention", "router", "lm_head"}),
                  unread=UNREAD)


def _group(where: str, group: Any, problems: list[str]) -> None:
    if not isinstance(group, dict):
        problems.append(f"{where[:-1]}: {shown(group)} should be an object")
        return
    check_keys(group, GROUP_KEYS, where, problems)
    if group.get("targets") not in (None, ["Linear"]):
        problems.append(f"{where}targets: found {shown(group['targets'])}, expected "
                        "['Linear'] (the excluded modules say which are not quantized)")
    for key in ("weights", "input_activations"):
        spec = group.get(key)
        if spec is None:
            continue
        if not isinstance(spec, dict) or any(spec.get(k) != v for k, v in FP4.items()):
            problems.append(f"{where}{key}: found {shown(spec)}, expected {FP4} (NVFP4)")


def fnmatch_target(pattern: str) -> str:
    """An exact module name as it is, a wildcard pattern (``*``, ``?``) as the
    ``re:`` entry matching the same whole names."""
    if not any(c in pattern for c in "*?"):
        return pattern
    out = []
    for c in pattern:
        out.append(".*" if c == "*" else "." if c == "?" else re.escape(c))
    return "re:" + "".join(out) + "$"
