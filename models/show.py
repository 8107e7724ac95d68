"""A terminal summary of a model: what it is, its layers, its graph, its sizes.

``describe(model)`` lists the name and dtype; the layers as index ranges of
stacks with their kind; the op graph of each distinct layer once, with
per-token shapes; parameter counts (total and per stack); weight bytes per
storage dtype; and KV-cache bytes per token. Pure text, no colour.
"""

from __future__ import annotations

from collections import defaultdict

from megakernel.ir.graph import Layer, Model
from megakernel.ir.ops import Op
from megakernel.ir.types import APPEND


def describe(model: Model) -> str:
    lines = [f"{model.name}  ({model.dtype.value}, vocab {model.vocab_size:,}, hidden "
             f"{model.hidden_size:,}, {len(model.layers)} layers, "
             f"{'tied' if model.tie_embeddings else 'untied'} embeddings, "
             f"max_seq_len {model.max_seq_len:,})", "", "layers:"]
    kinds: dict[Layer, str] = {}
    for s in model.stacks:
        body = s.body or (s.layer,)
        labels = ", ".join(kinds.setdefault(layer, _kind_label(layer, kinds)) for layer in body)
        period = f" (a body of {s.period} layers)" if s.period > 1 else ""
        lines.append(f"  {_range(s.start, s.count * s.period):<10} {labels:<10} "
                     f"x{s.count}{period}")
    for where, ops in (("embed ops", model.embed_ops), ("logit ops", model.logit_ops)):
        if ops:
            lines.append(f"  {where + ':':<10} " + ", then ".join(_op_text(op) for op in ops))
    for layer, label in kinds.items():
        lines += ["", f"layer {label}:"] + _graph(layer)
    lines += [""] + _params(model, kinds) + [""] + _bytes(model)
    return "\n".join(lines) + "\n"


def _kind_label(layer: Layer, seen: dict[Layer, str]) -> str:
    # Two different layers may share a kind (e.g. a window change); number them.
    same = [lab for lay, lab in seen.items() if lay.kind == layer.kind]
    return layer.kind if not same else f"{layer.kind}#{len(same) + 1}"


def _range(start: int, count: int) -> str:
    return f"{start}" if count == 1 else f"{start}-{start + count - 1}"


# Shorter field names keep one op on one line of a terminal.
_SHORT = {"in_features": "in", "out_features": "out", "num_heads": "heads",
          "num_q_heads": "q_heads", "num_kv_heads": "kv_heads", "num_experts": "experts",
          "expert_intermediate": "expert_width", "correction_bias": "corr_bias",
          "renormalize": "renorm", "routed_scaling": "scale", "intermediate": "width",
          "num_shared_experts": "shared", "shared_intermediate": "shared_width",
          "softmax_scale": "scale", "activation": "act", "router_logit_scale": "logit_scale",
          "renormalize_eps": "renorm_eps", "expert_output_norm": "out_norm",
          "expert_output_norm_eps": "out_norm_eps",
          "expert_output_norm_input_scaled": "out_norm_input_scaled",
          "expert_output_norm_offset": "out_norm_offset"}


# Fields that only mean something beside another (swiglu_alpha with
# swiglu_limit), or whose default means "off" (plain top-k routing): left out
# at their default.
_QUIET_DEFAULTS = {"swiglu_alpha": 1.0, "n_group": 1, "topk_group": 1, "router_logit_scale": 1.0}
# Fields shown only beside the flag they belong to (a MoE's expert norm eps).
_BESIDE = {"expert_output_norm_eps": "expert_output_norm"}


def _op_text(op: Op) -> str:
    """``kind field=value ...``: fields that are off or unset left out, true
    flags shown by name alone."""
    parts = [op.kind]
    for k, v in op.to_dict().items():
        if k == "kind" or v in (None, False, 0) or _QUIET_DEFAULTS.get(k, object()) == v:
            continue
        if k in _BESIDE and not getattr(op, _BESIDE[k]):
            continue
        if isinstance(v, dict):
            v = v["rope_type"]
        if isinstance(v, float):
            v = f"{v:.6g}"
        parts.append(_SHORT.get(k, k) if v is True else f"{_SHORT.get(k, k)}={v}")
    return " ".join(parts)


def _graph(layer: Layer) -> list[str]:
    shape = {t.name: "x".join(map(str, t.shape)) for t in layer.tensors}
    rows = []
    for n in layer.nodes:
        ins = ", ".join(f"{t}[{shape[t]}]" for t in n.inputs)
        outs = ", ".join(f"{t}[{shape[t]}]" for t in n.outputs)
        rows.append((n.name, f"{ins} -> {outs}", _op_text(n.op)))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return [f"  {a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]


def _params(model: Model, kinds: dict[Layer, str]) -> list[str]:
    total = model.param_count
    h, v = model.hidden_size, model.vocab_size
    lines = [f"parameters: {total:,} ({_short(total)})",
             f"  {'embed':<24} {v * h:>18,}"]
    for s in model.stacks:
        body = s.body or (s.layer,)
        per = sum(p.size for layer in body for p in layer.params(model.dtype).values())
        label = "+".join(kinds[layer] for layer in body)
        unit = "per layer" if s.period == 1 else f"per body of {s.period}"
        lines.append(f"  {'layers ' + _range(s.start, s.count * s.period) + ' ' + label:<24} "
                     f"{per * s.count:>18,}  ({per:,} {unit})")
    lines.append(f"  {'final_norm':<24} {h:>18,}")
    head = "tied to embed" if model.tie_embeddings else f"{h * v:>18,}"
    lines.append(f"  {'lm_head':<24} {head:>18}")
    return lines


def _bytes(model: Model) -> list[str]:
    per_dtype: dict[str, int] = defaultdict(int)
    for spec in model.params().values():
        per_dtype[spec.dtype.value] += spec.nbytes
    lines = ["weight bytes:"] + [f"  {d:<10} {n:>18,}  ({_gib(n)})"
                                 for d, n in sorted(per_dtype.items())]
    specs = model.cache_specs(1).values()
    rows = sum(c.nbytes for c in specs if c.access == APPEND) // model.max_seq_len
    whole = sum(c.nbytes for c in specs if c.access != APPEND)
    lines.append(f"kv cache: {rows:,} bytes per token (all layers' appended state: K/V, "
                 f"latents); {_gib(rows * model.max_seq_len)} per sequence of "
                 f"{model.max_seq_len:,}")
    if whole:
        lines.append(f"recurrent state: {whole:,} bytes per sequence ({_gib(whole)}), "
                     "whatever the context")
    return lines


def _short(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _gib(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
