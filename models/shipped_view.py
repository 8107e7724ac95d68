"""Read a pre-quantized checkpoint's weights as shipped (models/shipped.py says
which modules are quantized and how they are stored).

``load`` gives one IR weight through the checkpoint's ordinary rule
(models/checkpoint.py: transposes, row splits, the rope permutation, expert
stacking), which sees the checkpoint through a ``View``:

* the weight's format is the one its module ships in: the rule runs twice,
  once on the codes (one per weight, HF [out, in]) and once on the scales
  (one per output row and input group, [out, in / g]); every rule only moves
  whole rows and columns and never cuts the input dimension, so codes and
  scales come out in the IR's [..., K, N] and [..., K/g, N] as a
  ``quantize.Packed`` whose codes are exactly the shipped ones;
* the weight's format is plain (a kind the kernel reads plain, like MLA's
  up-projections, or one the card leaves plain): the rule sees code x scale
  in f32, which ``load_checkpoint`` rounds to the model dtype, the rounding
  the kernel applies to a packed weight;
* the module ships as a float weight: quantized on load as before.

A module shipped in another format than the weight's is an error: the
codes would be rounded a second time. Every tensor is checked on the way
(``quantize.from_shipped``: scale shapes, zero / NaN / infinite scales, E8M0
bytes 0 and 255, NaN e4m3 codes), errors naming the checkpoint tensor.

``card_table`` gives the card's ``quantize`` table of a quantized config: a
weight kind gets the format its modules ship in when all of them ship in it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from megakernel import formats
from megakernel.errors import ConfigError
from megakernel.ir.types import ParamSpec
from megakernel.models.checkpoint_families import family_tables
from megakernel.models.checkpoint_names import LAYER_PREFIX, PREFIXES, weight_sources
from megakernel.models.shipped import Layout, Scheme
from megakernel.quantize import Packed, decode_np, from_shipped

# The kinds whose kernel path reads formats (formats.PLAIN_ONLY and the
# planner's refusal of a quantized LM head keep the others plain).
CHOSEN_KINDS = ("dense", "experts")


def module_of(name: str) -> str | None:
    """HF module of a weight tensor name (``X.weight`` -> ``X``); None for a
    tensor that is no module's weight (fused experts, vectors)."""
    return name[:-len(".weight")] if name.endswith(".weight") else None


class View:
    """The checkpoint as one IR weight's rule sees it (``has``, ``shape``,
    ``get``), its quantized modules given as ``mode`` says: "codes", "scales"
    or "values" (dequantized, f32). ``seen`` records each name the rule read
    and its layout (None: a float tensor)."""

    def __init__(self, files, scheme: Scheme, kind: str | None, mode: str,
                 fmt: formats.Format = formats.PLAIN):
        self.files, self.scheme, self.kind, self.mode, self.fmt = files, scheme, kind, mode, fmt
        self.seen: dict[str, Layout | None] = {}
        self.shaped: set[str] = set()       # quantized modules whose shape was asked
        self._packed: dict[str, Packed] = {}

    def _layout(self, name: str) -> Layout | None:
        module = module_of(name)
        return None if module is None else self.scheme.layout_of(module, self.kind)

    def has(self, name: str) -> bool:
        layout = self._layout(name)
        return self.files.has(name) or (
            layout is not None and self.files.has(f"{module_of(name)}.{layout.codes}"))

    def shape(self, name: str) -> tuple[int, ...]:
        layout = self._layout(name)
        if layout is None:
            return self.files.shape(name)
        self.shaped.add(name)
        out, width = _logical_shape(self.files, module_of(name), layout)
        if self.mode == "scales":
            return out, width // self.fmt.group(width)
        return out, width

    def get(self, name: str) -> np.ndarray:
        layout = self._layout(name)
        self.seen[name] = layout
        if layout is None:
            return self.files.get(name)
        if self.mode != "values" and layout.fmt != self.fmt.name:
            raise ConfigError(f"{name} ships as {layout.fmt} ({layout.method}) but the card "
                              f"makes this weight {self.fmt.name}: its codes would be rounded "
                              "a second time", path="checkpoint",
                              hint=f"use --quantize KIND={layout.fmt} (keeps the shipped "
                              "codes) or KIND=plain (dequantizes them)")
        if name not in self._packed:
            self._packed[name] = _read_packed(self.files, module_of(name), layout)
        p = self._packed[name]
        if self.mode == "codes":
            return p.codes.T
        if self.mode == "scales":
            return p.scales.T
        return (decode_np(p) * np.repeat(p.scales, p.group(), axis=-2)).T


def load(files, scheme: Scheme, weight: str, kind: str | None, spec: ParamSpec, dtype: str,
         run):
    """IR weight ``weight`` of ``spec`` (weight kind ``kind``), ``run(view,
    spec)`` being its checkpoint rule: a ``Packed`` when its modules ship in
    the weight's format, else an array (dequantized or float)."""
    fmt = formats.get(spec.format)
    if fmt.plain:
        return _run(run, View(files, scheme, kind, "values"), spec)
    view = View(files, scheme, kind, "codes", fmt)
    codes = _run(run, view, spec)
    shipped = sorted(n for n, lay in view.seen.items() if lay is not None)
    if not shipped:
        return codes                     # float weights, quantized on load
    floats = sorted(n for n, lay in view.seen.items() if lay is None)
    if floats:
        raise ConfigError(f"one weight from tensors of which {shipped[:3]} ship quantized and "
                          f"{floats[:3]} do not", path=weight,
                          hint="quantize all of them (config_groups / ignore) or none")
    k = spec.shape[-2]
    view.mode = "scales"
    scales = run(view, dataclasses.replace(
        spec, shape=(*spec.shape[:-2], k // fmt.group(k), spec.shape[-1])))
    return Packed(fmt, np.ascontiguousarray(codes), np.ascontiguousarray(scales, np.float32),
                  dtype)


def _run(run, view: View, spec: ParamSpec):
    """``run(view, spec)``; a shape error about a packed module says where its
    shape comes from."""
    try:
        return run(view, spec)
    except ConfigError as err:
        if not any(err.message.startswith(f"{n} has shape") for n in view.shaped):
            raise
        raise ConfigError(err.message, path=err.path, hint=(err.hint + "; " if err.hint else "")
                          + f"the [out, in] of {sorted(view.shaped)[0]} is its codes' shape "
                          "(and weight_shape tensor)") from None


def _logical_shape(files, module: str, layout: Layout) -> tuple[int, int]:
    """[out, in] of a quantized module: its codes' shape times the codes per
    element, checked against its shape tensor when it has one."""
    codes = f"{module}.{layout.codes}"
    if not files.has(codes):
        plain = f"{module}.weight"
        found = f"; the checkpoint has {plain} {files.tensors[plain].dtype}" \
            if files.has(plain) else ""
        raise ConfigError(f"{codes} is missing: quantization_config makes {module} "
                          f"{layout.fmt} ({layout.method}){found}", path="checkpoint",
                          hint="the config's targets / ignore do not describe this "
                          "checkpoint's tensors")
    shape = files.shape(codes)
    if len(shape) != 2:
        raise ConfigError(f"{codes} has shape {list(shape)}, expected [out, in / "
                          f"{layout.per}]", path="checkpoint")
    out, width = shape[0], shape[1] * layout.per
    name = f"{module}.{layout.shape}" if layout.shape else ""
    if name and files.has(name):
        given = files.get_coded(name, ("I64", "I32"), "shape")
        if given.shape != (2,) or given[0] != out or -(-int(given[1]) // layout.per) != shape[1]:
            raise ConfigError(f"{name} is {given.tolist()}, but {codes} {list(shape)} holds "
                              f"[{out}, up to {width}] weights", path="checkpoint",
                              hint="the checkpoint is corrupt")
        width = int(given[1])
    elif layout.shape_required:
        raise ConfigError(f"{name} is missing ({layout.method} stores the unpacked [out, in] "
                          "of each packed weight there)", path="checkpoint")
    return out, width


def _read_packed(files, module: str, layout: Layout) -> Packed:
    """The module's codes and scales in the IR's orientation ([in, out] and
    [in / g, out]), checked by ``quantize.from_shipped``."""
    fmt = formats.get(layout.fmt)
    out, width = _logical_shape(files, module, layout)
    codes_name, scale_name = f"{module}.{layout.codes}", f"{module}.{layout.scales}"
    if not files.has(scale_name):
        raise ConfigError(f"{scale_name} is missing: {codes_name} ships {layout.fmt} codes "
                          "and needs its scales", path="checkpoint",
                          hint="the checkpoint is incomplete")
    if fmt.group_rows and width % fmt.group_rows:
        raise ConfigError(f"{module} has {width} inputs, not a multiple of {layout.fmt}'s "
                          f"{fmt.group_rows}-input scale groups", path="checkpoint",
                          hint="leave this module out of the quantized ones")
    codes = layout.unpack(files.get_coded(codes_name, layout.code_dtypes, "codes"), width)
    scales = files.get_coded(scale_name, layout.scale_dtypes, "scales")
    try:
        # from_shipped checks the scales' shape and values; int8's per-channel
        # scales ship as [out, 1], i.e. [1, out] in the IR's orientation.
        return from_shipped(fmt, codes.T, np.asarray(scales).T, scale_name,
                            codes_name=codes_name, transposed=True)
    except ConfigError as err:
        raise ConfigError(f"{err.path}: {err.message}", path="checkpoint",
                          hint=err.hint) from None


def weight_kinds(model) -> dict[str, str]:
    """{IR weight name: weight kind} of every matrix of ``model``."""
    from megakernel.ir.weight_kinds import WEIGHT_KINDS

    kinds = {"embed.weight": "embedding", "lm_head.weight": "lm_head"}
    for i, layer in enumerate(model.layers):
        for n in layer.nodes:
            for pname, kind in WEIGHT_KINDS(n.op.kind, n.name)(n.op).items():
                kinds[f"layers.{i}.{n.name}.{pname}"] = kind
    return kinds


def card_table(scheme: Scheme, model, config: dict) -> dict[str, str]:
    """{weight kind: format} for the card of a checkpoint quantized as
    ``scheme``: dense and experts get the format every module of theirs ships
    in (a kind some of whose modules ship as floats, or in two formats, stays
    plain: its shipped modules are dequantized on load). Each IR weight's
    modules are its checkpoint names (every alternative the loader tries)."""
    names, _ = family_tables(config["model_type"], config, model)
    specs = model.params()
    found: dict[str, set] = {k: set() for k in CHOSEN_KINDS}
    for weight, kind in weight_kinds(model).items():
        if kind not in found or weight not in specs:
            continue
        sources, layer = weight_sources(names, weight)
        prefixes = ("",) if layer is None else tuple(
            p.format(i=layer) for p in PREFIXES.get(config["model_type"], (LAYER_PREFIX,)))
        for name in (p + s.name for p in prefixes for s in sources):
            experts = range(specs[weight].shape[0]) if "{e}" in name else (None,)
            for e in experts:
                module = module_of(name if e is None else name.format(e=e))
                if module is not None:
                    layout = scheme.layout_of(module, kind)
                    found[kind].add(None if layout is None else layout.fmt)
    return {k: f.pop() for k, f in found.items() if len(f) == 1 and None not in f}
