"""Pre-quantized checkpoints: what a ``quantization_config`` says is shipped
quantized, and how each format's tensors are stored.

``METHODS`` maps a config's ``quant_method`` to the reader of its config, which
returns a ``Scheme``: the ``Layout`` (IR format, tensor names and dtypes, bit
packing) of every module it quantizes. A method, format or argument this file
does not list is a ``ConfigError`` naming the field, what was found and what
loads. ``models/shipped_view.py`` reads the tensors through a ``Scheme``.

* ``fp8`` (DeepSeek-V3 / Hugging Face fine-grained fp8): ``X.weight`` is
  F8_E4M3 [out, in] and ``X.weight_scale_inv`` [ceil(out/128), ceil(in/128)]
  the f32 factor of each 128 x 128 block (weight = code x scale_inv); every
  matrix of the layers (weight kinds dense, experts, attention) is quantized
  but the ``modules_to_not_convert``; router, embedding and LM head are not.
* ``compressed-tensors``: the modules ``config_groups[*].targets`` match and
  ``ignore`` does not (``re:`` entries are matched from the start of the name,
  on RE2: models/quant_targets.py; others are exact module names, ``Linear``
  is every matrix but the embedding), in the group's
  ``format``:
  - ``pack-quantized``, symmetric int: ``X.weight_packed`` I32 [out, ceil(in/p)]
    with p = 32 / num_bits codes per word, ``X.weight_scale`` [out, in/g]
    (bf16/f16/f32), ``X.weight_shape`` [2] = [out, in]. int4 groups of 32, 64
    or 128 give int4_g32/64/128, int8 per channel gives int8.
  - ``mxfp4-pack-quantized``: ``X.weight_packed`` U8 [out, in/2] of e2m1
    codes, ``X.weight_scale`` U8 E8M0 exponents [out, in/32], giving mxfp4.
  - ``nvfp4-pack-quantized`` (strategy ``tensor_group``, weight-only NVFP4A16):
    ``X.weight_packed`` as mxfp4's, ``X.weight_scale`` F8_E4M3 [out, in/16]
    and ``X.weight_global_scale`` F32 [1], giving nvfp4; a weight is
    code x (scale / global_scale), in f32 (``fp4_quantized.py``
    ``decompress_weight``), so the global scale is the reciprocal of the one
    the kernel's scales are multiplied by.
* ``mxfp4`` (gpt-oss as OpenAI ships it; transformers' ``Mxfp4Config``): the
  experts of every MLP but the ``modules_to_not_convert`` ship as
  ``X.experts.{gate_up_proj,down_proj}_blocks`` U8 [E, out, in/32, 16] (the
  32 e2m1 codes of one scale group, two per byte, even input low) and
  ``..._scales`` U8 E8M0 [E, out, in/32]; everything else (attention, router,
  biases) is a float tensor. Per expert these are exactly the bytes of
  ``mxfp4-pack-quantized`` with the last two axes merged, so they load as
  mxfp4 codes with no dequantisation. The float tensors they replace are
  gpt-oss's [E, in, out] ``gate_up_proj`` / ``down_proj`` (``in_out``).

Bit order, confirmed in compressed-tensors' source (vllm-project/compressed-tensors,
``compressors/quantized_compressors/pack_quantized.py`` ``pack_to_int32`` and
``fp4_quantized.py`` ``pack_fp4_to_uint8``; read, not copied): pack-quantized
adds 2^(bits-1) to each signed code (int4 -8..7 -> 0..15), pads ``in`` to a
multiple of p, and puts input column p j + i into bits [bits i, bits (i+1)) of
word j (the low bits hold the first column); mxfp4 puts input column 2 j in the
low nibble of byte j and 2 j + 1 in the high nibble, with no offset (the
nibble is the e2m1 bit pattern, sign in bit 3), and its scale byte b means
2^(b - 127) (``mxfp4_utils.py``). gpt-oss's native layout, read in
transformers' ``integrations/mxfp4.py`` (``_convert_moe_packed_tensors``:
low nibble to the even column, ``ldexp`` by the scale byte - 127, then a
transpose to [E, in, out]), has the same nibble order and scale bytes.
tests/models/test_shipped_checkpoints.py packs with an independent numpy
writer and checks the decoded values.
"""

from __future__ import annotations

from typing import Any

from megakernel.errors import ConfigError, shown
from megakernel.models.quant_targets import Boundary, module_or_parent, pattern_problems
from megakernel.models.shipped_layout import (FLOAT_SCALES, Group, Layout, Scheme,
                                              check_keys, want)
from megakernel.models.shipped_modelopt import modelopt


FP8 = Layout("fp8", "fp8_b128", "weight", ("F8_E4M3",), "weight_scale_inv", FLOAT_SCALES)
# (format, type, num_bits, strategy) -> layout; the group size picks int4_g{g}.
_PACKED = {
    ("pack-quantized", "int", 4, "group"): lambda g: Layout(
        "compressed-tensors", f"int4_g{g}", "weight_packed", ("I32",), "weight_scale",
        FLOAT_SCALES, per=8, bits=4, offset=8, shape="weight_shape", shape_required=True),
    ("pack-quantized", "int", 8, "channel"): lambda g: Layout(
        "compressed-tensors", "int8", "weight_packed", ("I32",), "weight_scale",
        FLOAT_SCALES, per=4, bits=8, offset=128, shape="weight_shape", shape_required=True),
    ("mxfp4-pack-quantized", "float", 4, "group"): lambda g: Layout(
        "compressed-tensors", "mxfp4", "weight_packed", ("U8",), "weight_scale", ("U8",),
        per=2, bits=4, shape="weight_shape"),
    ("nvfp4-pack-quantized", "float", 4, "tensor_group"): lambda g: Layout(
        "compressed-tensors", "nvfp4", "weight_packed", ("U8",), "weight_scale", ("F8_E4M3",),
        per=2, bits=4, shape="weight_shape", global_scale="weight_global_scale",
        global_divides=True),
}
_GROUPS = {"int4": (32, 64, 128), "int8": (None,), "mxfp4": (32,), "nvfp4": (16,)}
GPT_OSS_MXFP4 = Layout("mxfp4", "mxfp4", "{stem}_blocks", ("U8",), "{stem}_scales", ("U8",),
                       per=2, bits=4, stems=("gate_up_proj", "down_proj"), blocks=16, ndim=3,
                       in_out=True)




def read(config: Any, *, path: str = "quantization_config") -> Scheme:
    """The scheme of a ``quantization_config`` value, or one ConfigError listing
    every problem of it."""
    scheme, problems = read_problems(config)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"cannot load this quantized checkpoint ({len(problems)} problem"
                          f"{'s' if len(problems) > 1 else ''}):\n{lines}\n", path=path,
                          hint="docs/formats.md, 'Pre-quantized checkpoints', lists what loads")
    return scheme


def read_problems(config: Any) -> tuple[Scheme | None, list[str]]:
    """(the scheme or None, the problems of a ``quantization_config`` value,
    each ``field: what was found, what loads``)."""
    if not isinstance(config, dict):
        return None, [f"expected an object, found {shown(config)}"]
    method = config.get("quant_method")
    if method not in METHODS:
        return None, [f"quant_method: {shown(method)} is not supported; supported: "
                      f"{sorted(METHODS)} (or give a bf16 / f32 checkpoint, quantized on "
                      "load by the card's quantize table)"]
    problems: list[str] = []
    scheme = METHODS[method](config, problems)
    return (None if problems else scheme), problems



def _fp8(config: dict, problems: list[str]) -> Scheme:
    check_keys(config, {"quant_method", "fmt", "weight_block_size", "activation_scheme",
                         "modules_to_not_convert", "scale_fmt", "dequantize"}, "", problems)
    want(config, "fmt", ("e4m3",), "", problems, " (the IR's fp8_b128 codes are e4m3fn)")
    want(config, "weight_block_size", ([128, 128],), "", problems,
          " (fp8_b128 blocks are 128 x 128)")
    # Activations stay in the model dtype here: "dynamic" quantizes them per
    # step in DeepSeek's own kernels, which this loader does not mimic.
    want(config, "activation_scheme", ("dynamic",), "", problems,
          " (static activation scales are not read)")
    want(config, "scale_fmt", (None, "ue8m0"), "", problems)
    skip = config.get("modules_to_not_convert") or []
    if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
        problems.append(f"modules_to_not_convert: {shown(skip)} should be a list of names")
        skip = []
    # An entry names a module, any module ending in it, or a parent of modules.
    ignore = tuple(module_or_parent(s) for s in skip)
    return Scheme("fp8", (Group(FP8, ("Linear",)),), ignore,
                  frozenset({"dense", "experts", "attention"}))


_CT_KEYS = {"quant_method", "format", "config_groups", "ignore", "quantization_status",
            "kv_cache_scheme", "sparsity_config", "transform_config",
            "global_compression_ratio", "version", "run_compressed"}
_WEIGHT_KEYS = {"num_bits", "type", "symmetric", "group_size", "strategy", "block_structure",
                "dynamic", "actorder", "observer", "observer_kwargs", "scale_dtype",
                "zp_dtype"}


def _compressed_tensors(config: dict, problems: list[str]) -> Scheme:
    check_keys(config, _CT_KEYS, "", problems)
    want(config, "quantization_status", ("compressed",), "", problems,
          " (other statuses store unpacked weights)")
    groups = config.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        problems.append(f"config_groups: {shown(groups)} should be an object of groups")
        groups = {}
    out = [g for name, spec in groups.items()
           if (g := _ct_group(name, spec, config.get("format"), problems)) is not None]
    ignore = config.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(s, str) for s in ignore):
        problems.append(f"ignore: {shown(ignore)} should be a list of module names")
        ignore = []
    problems += pattern_problems(ignore, "ignore")
    return Scheme("compressed-tensors", tuple(out), tuple(ignore),
                  frozenset({"dense", "experts", "attention", "router", "lm_head"}))


def _ct_group(name: str, spec: Any, fmt: Any, problems: list[str]) -> Group | None:
    where = f"config_groups.{name}."
    if not isinstance(spec, dict):
        problems.append(f"{where[:-1]}: {shown(spec)} should be an object with targets and "
                        "weights (preset scheme names are not read)")
        return None
    check_keys(spec, {"targets", "weights", "input_activations", "output_activations",
                       "format"}, where, problems)
    for key in ("input_activations", "output_activations"):
        if spec.get(key) is not None:
            problems.append(f"{where}{key}: {shown(spec[key])}; only weight-only "
                            "quantization loads (activations stay in the model dtype)")
    targets = spec.get("targets")
    if not isinstance(targets, list) or not targets or not all(
            isinstance(t, str) for t in targets):
        problems.append(f"{where}targets: {shown(targets)} should be a list of module names")
        return None
    for t in targets:
        if not t.startswith("re:") and "." not in t and t[:1].isupper() and t != "Linear":
            problems.append(f"{where}targets: class name {t!r}; of module classes only "
                            "'Linear' is matched (or give module names / re: patterns)")
    problems += pattern_problems(targets, f"{where}targets")
    fmt = spec.get("format") or fmt
    w = spec.get("weights")
    if not isinstance(w, dict):
        problems.append(f"{where}weights: {shown(w)} should be an object")
        return None
    check_keys(w, _WEIGHT_KEYS, where + "weights.", problems)
    key = (fmt, w.get("type"), w.get("num_bits"), w.get("strategy"))
    if key not in _PACKED:
        problems.append(
            f"{where}weights: format={shown(fmt)}, type={shown(key[1])}, num_bits="
            f"{shown(key[2])}, strategy={shown(key[3])} has no IR format; loadable: "
            "pack-quantized int 4-bit group (int4_g32/64/128), pack-quantized int 8-bit "
            "channel (int8), mxfp4-pack-quantized float 4-bit group 32 (mxfp4), "
            "nvfp4-pack-quantized float 4-bit tensor_group 16 (nvfp4)")
        return None
    size = w.get("group_size")
    layout = _PACKED[key](size)
    if size not in _GROUPS[layout.fmt.split("_")[0]]:
        problems.append(f"{where}weights.group_size: found {shown(size)}, expected one of "
                        f"{_GROUPS[layout.fmt.split('_')[0]]} for {fmt} {key[1]}{key[2]} "
                        f"(the IR's {layout.fmt.split('_')[0]} formats); re-quantize with one")
        return None
    if w.get("symmetric") is not True:
        problems.append(f"{where}weights.symmetric: found {shown(w.get('symmetric'))}, "
                        "expected true (zero points are not read: the IR's formats are "
                        "symmetric)")
    if w.get("dynamic") not in (None, False):
        problems.append(f"{where}weights.dynamic: found {shown(w.get('dynamic'))}, expected "
                        "false (shipped weights carry their scales)")
    if w.get("actorder") not in (None, "static", "weight"):
        problems.append(f"{where}weights.actorder: found {shown(w.get('actorder'))}; group "
                        "reordering (g_idx) is not read")
    if w.get("block_structure") is not None:
        problems.append(f"{where}weights.block_structure: {shown(w['block_structure'])}; "
                        "block strategies are not read")
    return Group(layout, tuple(targets))


def _mxfp4(config: dict, problems: list[str]) -> Scheme:
    check_keys(config, {"quant_method", "modules_to_not_convert", "dequantize"}, "", problems)
    skip = config.get("modules_to_not_convert") or []
    if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
        problems.append(f"modules_to_not_convert: {shown(skip)} should be a list of names")
        skip = []
    # transformers' should_convert_module: a regex matched from the start up
    # to a module boundary, or a suffix of the module name (quant_targets).
    bad = pattern_problems([f"re:{s}" for s in skip], "modules_to_not_convert")
    problems += bad
    ignore = [] if bad else [Boundary(s) for s in skip]
    # ``dequantize`` asks transformers to widen on load; the files are the same.
    return Scheme("mxfp4", (Group(GPT_OSS_MXFP4, ("re:(?:.*\\.)?mlp\\.experts$",)),),
                  tuple(ignore), frozenset({"experts"}))


METHODS = {"fp8": _fp8, "compressed-tensors": _compressed_tensors, "mxfp4": _mxfp4,
           "modelopt": modelopt}
