"""Import a Hugging Face ``config.json`` into a model card.

Supported ``model_type``: llama, qwen2, qwen3, qwen3_moe, mixtral. Every key of
the file is either mapped to a card field, known to be harmless for inference
(``hf_fields.HARMLESS_KEYS``), or reported: one ``ConfigError`` lists every
unsupported key and value of the file. Families differ only by the rows of
``FAMILIES``; both the 4.x form (``rope_theta``, ``rope_scaling``,
``torch_dtype``) and the 5.x form (``rope_parameters``, ``dtype``) are read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megakernel.errors import ConfigError, IRError
from megakernel.ir.config import MoEConfig, ModelConfig, build
from megakernel.ir.types import DType
from megakernel.models.hf_fields import FieldReader


@dataclass(frozen=True)
class Family:
    """How one ``model_type`` maps onto the card.

    ``qkv_bias`` / ``o_bias``: "always", "never", or "attention_bias" (the key
    decides). ``window``: "none" (no sliding-window keys), "global" (one
    ``sliding_window`` for every layer) or "qwen" (``use_sliding_window`` for the
    layers from ``max_window_layers`` on). ``moe``: "none", "qwen", "mixtral".
    ``head_dim``: default when the key is absent (0 = hidden / heads)."""

    qkv_bias: str
    o_bias: str
    qk_norm: bool
    head_dim: int
    norm_eps: float
    rope_theta: float
    window: str
    moe: str


FAMILIES: dict[str, Family] = {
    "llama":     Family("attention_bias", "attention_bias", False, 0, 1e-6, 1e4, "none", "none"),
    "qwen2":     Family("always", "never", False, 0, 1e-6, 1e4, "qwen", "none"),
    "qwen3":     Family("attention_bias", "attention_bias", True, 128, 1e-6, 1e4, "qwen", "none"),
    "qwen3_moe": Family("attention_bias", "attention_bias", True, 128, 1e-6, 1e4, "qwen", "qwen"),
    "mixtral":   Family("never", "never", False, 0, 1e-5, 1e6, "global", "mixtral"),
}

ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu",
               "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}
DTYPES = {"bfloat16": "bfloat16", "float32": "float32"}

# rope_type -> the keys of its parameter object besides rope_type / rope_theta.
_ROPE_KEYS = {"default": (), "linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings")}


def from_hf(config: dict[str, Any] | str | Path, *, dtype: str | None = None,
            name: str | None = None, max_seq_len: int = 4096) -> ModelConfig:
    """The card of a HF config (a dict, a ``config.json`` path, or its folder).

    ``dtype`` overrides the file's ``torch_dtype``/``dtype`` (which defaults to
    bfloat16 when absent); ``max_seq_len`` is capped by
    ``max_position_embeddings``. The card is built once to check it."""
    data, source, folder = _read(config)
    r = FieldReader(data, source)
    model_type = r.get("model_type", str)
    family = FAMILIES.get(model_type)
    if family is None:
        raise ConfigError(f"model_type={model_type!r} is not supported; supported: "
                          f"{sorted(FAMILIES)}", path=source)
    fields = _dense_fields(r, family)
    fields.update(_rope(r, family))
    fields["sliding_window"] = _window(r, family, fields.get("num_layers") or 0)
    fields.update(_moe(r, family, fields))
    fields["dtype"] = _dtype(r, dtype)
    limit = r.get("max_position_embeddings", int, max_seq_len)
    fields["max_seq_len"] = min(max_seq_len, limit or max_seq_len)
    fields["name"] = name or _default_name(data, folder, model_type)
    r.unknown_keys()
    r.raise_problems()
    try:
        card = ModelConfig(**fields)
        build(card)
    except IRError as err:
        raise ConfigError(err.message, path=f"{source}: {err.path}" if err.path else source,
                          hint=err.hint) from None
    return card


def _read(config) -> tuple[dict, str, str | None]:
    if isinstance(config, dict):
        return config, "config.json", None
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("file not found", path=str(path)) from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"not valid JSON: {err}", path=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"expected a JSON object, found {type(data).__name__}",
                          path=str(path))
    return data, str(path), path.parent.name


def _dense_fields(r: FieldReader, f: Family) -> dict[str, Any]:
    hidden = r.get("hidden_size", int)
    heads = r.get("num_attention_heads", int)
    default_hd = f.head_dim or (hidden // heads if hidden and heads else None)
    out = dict(
        vocab_size=r.get("vocab_size", int), hidden_size=hidden,
        num_layers=r.get("num_hidden_layers", int), num_q_heads=heads,
        num_kv_heads=r.get("num_key_value_heads", int, heads),
        head_dim=r.get("head_dim", int, default_hd),
        intermediate_size=r.get("intermediate_size", int),
        norm_eps=r.get("rms_norm_eps", float, f.norm_eps),
        tie_embeddings=r.get("tie_word_embeddings", bool, False),
        qk_norm=f.qk_norm,
    )
    act = r.get("hidden_act", str, "silu")
    if act is not None and act not in ACTIVATIONS:
        r.problem("hidden_act", f"{act!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    out["activation"] = ACTIVATIONS.get(act, "silu")
    attention_bias = r.get("attention_bias", bool, False) if "attention_bias" in (
        f.qkv_bias, f.o_bias) else False
    rule = {"always": True, "never": False, "attention_bias": attention_bias}
    out["qkv_bias"], out["o_bias"] = rule[f.qkv_bias], rule[f.o_bias]
    if r.get("mlp_bias", bool, False):
        r.problem("mlp_bias", "true is not supported (the IR's MLP has no biases)")
    return out


def _rope(r: FieldReader, f: Family) -> dict[str, Any]:
    """rope_theta and rope_scaling from the 4.x keys or the 5.x rope_parameters."""
    theta = r.get("rope_theta", float, None)
    params = r.get("rope_parameters", dict, None)
    scaling = r.get("rope_scaling", dict, None)
    if params is not None and scaling is not None:
        r.problem("rope_scaling", "given together with rope_parameters; keep one")
    key = "rope_parameters" if params is not None else "rope_scaling"
    p = params if params is not None else scaling or {}
    pre = f"{key}."
    kind = p.get("rope_type", p.get("type", "default"))
    kind = kind if isinstance(kind, str) else repr(kind)
    inner_theta = r.get("rope_theta", float, None, data=p, prefix=pre)
    if theta is not None and inner_theta is not None and theta != inner_theta:
        r.problem(key, f"rope_theta={inner_theta} differs from the top-level {theta}")
    out: dict[str, Any] = {"rope_theta": inner_theta or theta or f.rope_theta}
    if kind not in _ROPE_KEYS:
        r.problem(pre + "rope_type", f"{kind!r} is not supported; supported: "
                  f"{sorted(_ROPE_KEYS)} (yarn, dynamic, longrope etc. change the "
                  "frequencies in ways the IR's Rope cannot express)")
        return out
    allowed = {"rope_type", "type", "rope_theta", *_ROPE_KEYS[kind]}
    for extra in sorted(set(p) - allowed):
        r.problem(pre + extra, f"={p[extra]!r} is not supported for rope_type {kind!r}")
    if kind == "default":
        return out
    get = lambda k, d: r.get(k, float, d, data=p, prefix=pre)  # noqa: E731
    scale = {"rope_type": kind, "factor": get("factor", None)}
    if kind == "llama3":
        omp = r.get("original_max_position_embeddings", int, None, data=p, prefix=pre)
        scale.update(low_freq_factor=get("low_freq_factor", 1.0),
                     high_freq_factor=get("high_freq_factor", 4.0),
                     original_max_position=omp or 8192)
    if scale["factor"] is None:
        r.problem(pre + "factor", "is required but missing")
        return out
    out["rope_scaling"] = scale
    return out


def _window(r: FieldReader, f: Family, num_layers: int) -> int | None:
    """One window for every layer, or none; a mix is a problem."""
    window = r.get("sliding_window", int, None) if f.window != "none" else None
    if f.window == "qwen":
        use = r.get("use_sliding_window", bool, False)
        first = r.get("max_window_layers", int, 28)  # HF's default
        windows = [window if use and i >= first else None for i in range(num_layers)]
    else:
        windows = [window] * num_layers
    types = r.get("layer_types", list, None)
    if types is not None:
        # 5.x spells the per-layer choice out; it wins over the derived one.
        kinds = {"full_attention": None, "sliding_attention": window}
        bad = [t for t in types if t not in kinds]
        if bad or len(types) != num_layers:
            r.problem("layer_types", f"{types!r} should list {num_layers} of {sorted(kinds)}")
            return None
        if "sliding_attention" in types and window is None:
            r.problem("layer_types", "names sliding_attention but sliding_window is null")
        windows = [kinds[t] for t in types]
    if len(set(windows)) > 1:
        on = [i for i, w in enumerate(windows) if w is not None]
        r.problem("sliding_window", f"{window} applies to layers {on} only; the IR "
                  "applies one window to all layers or to none")
        return None
    return windows[0] if windows else None


def _moe(r: FieldReader, f: Family, fields: dict) -> dict[str, Any]:
    if f.moe == "none":
        return {}
    n = fields.get("num_layers") or 0
    top_k = r.get("num_experts_per_tok", int, 8 if f.moe == "qwen" else 2)
    if f.moe == "mixtral":
        experts = r.get("num_local_experts", int, 8)
        return {"moe": MoEConfig(experts or 1, top_k or 1, fields["intermediate_size"] or 1,
                                 "softmax", renormalize=True)}
    experts = _num_experts(r)
    width = r.get("moe_intermediate_size", int, 768)
    step = r.get("decoder_sparse_step", int, 1)
    dense_only = r.get("mlp_only_layers", list, [])
    renorm = r.get("norm_topk_prob", bool, False)
    if step < 1 or not all(isinstance(i, int) for i in dense_only):
        r.problem("decoder_sparse_step", f"{step} and mlp_only_layers={dense_only} should "
                  "be a positive integer and a list of layer indices")
        return {}
    is_moe = [bool(experts) and i not in dense_only and (i + 1) % step == 0 for i in range(n)]
    first_k = is_moe.index(True) if True in is_moe else n
    if not all(is_moe[first_k:]):
        r.problem("decoder_sparse_step", f"{step} with mlp_only_layers={dense_only} makes "
                  f"layers {[i for i in range(n) if is_moe[i]]} MoE; the IR supports "
                  "all-MoE or the first k layers dense")
        return {}
    if first_k == n:
        return {}
    return {"moe": MoEConfig(experts, top_k or 1, width or 1, "softmax", renormalize=renorm),
            "first_k_dense": first_k}


def _num_experts(r: FieldReader) -> int:
    # 4.x names it num_experts; 5.x num_local_experts.
    a = r.get("num_experts", int, None)
    b = r.get("num_local_experts", int, None)
    if a is not None and b is not None and a != b:
        r.problem("num_experts", f"{a} differs from num_local_experts={b}")
    return a if a is not None else (b if b is not None else 128)


def _dtype(r: FieldReader, override: str | None) -> str:
    if override is not None:
        r.mark_used("torch_dtype", "dtype")
        return DType.parse(override, path="dtype").value
    key = "dtype" if r.has("dtype") else "torch_dtype"
    value = r.get(key, str, "bfloat16")
    if value not in DTYPES:
        r.problem(key, f"{value!r} is not supported; supported: {sorted(DTYPES)} "
                  "(or pass dtype= to convert the weights)")
        return "bfloat16"
    return DTYPES[value]


def _default_name(data: dict, folder: str | None, model_type: str) -> str:
    raw = str(data.get("_name_or_path") or folder or model_type).rstrip("/").split("/")[-1]
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.") or model_type
    return clean if clean[0].isalpha() or clean[0] == "_" else f"m-{clean}"
