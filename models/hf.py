"""Import a Hugging Face ``config.json`` into a model card.

Supported ``model_type``: llama, qwen2, qwen3, qwen3_moe, mixtral, mistral,
gemma2, gemma3_text, olmo2, gpt_oss, phi3, the hybrid linear-attention
families qwen3_5, qwen3_5_text, qwen3_next (``hf_hybrid``), and through their
own importers (``_importers``) deepseek_v3, kimi_k2 and muse_spark (the text
model of Muse Spark's multimodal checkpoint, ``hf_muse``; docs/new-model.md
lists the card fields each uses). Every key of
the file is either mapped to a card field, known to be harmless for inference
(``hf_fields.HARMLESS_KEYS``), or reported: one ``ConfigError`` lists every
unsupported key and value of the file. Families differ only by the rows of
``FAMILIES``; both the 4.x form (``rope_theta``, ``rope_scaling``,
``torch_dtype``) and the 5.x form (``rope_parameters``, ``dtype``) are read.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megakernel.errors import ConfigError, IRError, shown
from megakernel.ir import limits
from megakernel.ir.config import MoEConfig, ModelConfig, build
from megakernel.ir.jsonfile import read_json
from megakernel.ir.types import DType
from megakernel.ir.weight_kinds import Quantize
from megakernel.models import hf_deepseek, hf_hybrid, hf_muse, shipped, shipped_view
from megakernel.models.hf_extras import EXTRAS, gpt_oss_moe
from megakernel.models.hf_fields import ACTIVATIONS, REQUIRED, FieldReader
from megakernel.models.hf_rope import read_rope


@dataclass(frozen=True)
class Family:
    """How one ``model_type`` maps onto the card.

    ``qkv_bias`` / ``o_bias``: "always", "never", or "attention_bias" (the key
    decides; its default is ``bias_default``). ``window``: "none" (no
    sliding-window keys), "global" (one ``sliding_window`` for every layer),
    "qwen" (``use_sliding_window`` for the layers from ``max_window_layers``
    on) or "types" (``layer_types``; when absent, layer i is full iff
    (i + 1) % ``pattern`` == 0). ``moe``: "none", "qwen", "mixtral",
    "gpt_oss" or "qwen_next" (a sigmoid-gated shared expert). ``head_dim``:
    default when the key is absent (0 = hidden / heads). ``norms``: "pre",
    "sandwich" (pre and post) or "post"; ``extras``: the reader of the
    family's own keys (models/hf_extras.py). ``hybrid``: Gated DeltaNet and
    gated full-attention layers (models/hf_hybrid.py)."""

    qkv_bias: str
    o_bias: str
    qk_norm: bool
    head_dim: int
    norm_eps: float
    rope_theta: float
    window: str
    moe: str
    bias_default: bool = False
    qk_norm_all_heads: bool = False
    norms: str = "pre"
    norm_offset: bool = False
    act_key: str = "hidden_act"
    act_default: str = "silu"
    pattern: int = 0
    window_default: int | None = None
    partial_rotary: bool = False
    rope_by_type: bool = False
    scale_embeddings: bool = False
    tied_default: bool = False
    extras: str = ""
    hybrid: bool = False


_GEMMA = dict(norms="sandwich", norm_offset=True, scale_embeddings=True, tied_default=True,
              act_key="hidden_activation", act_default="gelu_pytorch_tanh", window_default=4096)
_HYBRID = dict(hybrid=True, norm_offset=True, partial_rotary=True)
FAMILIES: dict[str, Family] = {
    "llama":     Family("attention_bias", "attention_bias", False, 0, 1e-6, 1e4, "none", "none"),
    "qwen2":     Family("always", "never", False, 0, 1e-6, 1e4, "qwen", "none"),
    "qwen3":     Family("attention_bias", "attention_bias", True, 128, 1e-6, 1e4, "qwen", "none"),
    "qwen3_moe": Family("attention_bias", "attention_bias", True, 128, 1e-6, 1e4, "qwen", "qwen"),
    "mixtral":   Family("never", "never", False, 0, 1e-5, 1e6, "global", "mixtral"),
    "mistral":   Family("never", "never", False, 0, 1e-6, 1e4, "global", "none"),
    "gemma2":    Family("attention_bias", "attention_bias", False, 256, 1e-6, 1e4, "types", "none",
                        pattern=2, extras="gemma2", **_GEMMA),
    "gemma3_text": Family("attention_bias", "attention_bias", True, 256, 1e-6, 1e6, "types",
                          "none", pattern=6, rope_by_type=True, extras="gemma3", **_GEMMA),
    "olmo2":     Family("attention_bias", "attention_bias", True, 0, 1e-5, 1e4, "none", "none",
                        qk_norm_all_heads=True, norms="post"),
    "gpt_oss":   Family("attention_bias", "attention_bias", False, 64, 1e-5, 1.5e5, "types",
                        "gpt_oss", bias_default=True, pattern=2, window_default=128,
                        extras="gpt_oss"),
    "phi3":      Family("never", "never", False, 0, 1e-5, 1e4, "global", "none",
                        partial_rotary=True, extras="phi3"),
    "qwen3_5":   Family("attention_bias", "attention_bias", True, 256, 1e-6, 1e4, "none", "none",
                        **_HYBRID),
    "qwen3_5_text": Family("attention_bias", "attention_bias", True, 256, 1e-6, 1e4, "none",
                           "none", **_HYBRID),
    "qwen3_next": Family("attention_bias", "attention_bias", True, 256, 1e-6, 1e4, "none",
                         "qwen_next", **_HYBRID),
}

DTYPES = {"bfloat16": "bfloat16", "float32": "float32"}


def _importers() -> dict:
    """model_type -> field importer, for families ``FAMILIES`` rows cannot
    describe (each a function of the FieldReader giving card fields)."""
    return {**hf_deepseek.IMPORTERS, **hf_muse.IMPORTERS}


def from_hf(config: dict[str, Any] | str | Path, *, dtype: str | None = None,
            name: str | None = None, max_seq_len: int = 4096) -> ModelConfig:
    """The card of a HF config (a dict, a ``config.json`` path, or its folder).

    ``dtype`` overrides the file's ``torch_dtype``/``dtype`` (which defaults to
    bfloat16 when absent); ``max_seq_len`` is capped by
    ``max_position_embeddings``. The card is built once to check it."""
    data, source, folder = _read(config)
    data = hf_muse.unwrap(hf_hybrid.unwrap(data, source), source)
    r = FieldReader(data, source)
    model_type = r.get("model_type", str)
    family = FAMILIES.get(model_type)
    importer = _importers().get(model_type)
    if family is None and importer is None:
        given = data.get("model_type")   # as written: r.get gives None for a non-string
        what = "is not supported" if given is None or isinstance(given, str) else \
            "should be a string naming the model family"
        raise ConfigError(f"model_type={shown(given)} {what}; supported: {supported()}",
                          path=source)
    if importer is not None:
        fields = importer(r)
    else:
        fields = _family_fields(r, family, model_type)
    fields["dtype"] = _dtype(r, dtype)
    limit = r.get("max_position_embeddings", int, max_seq_len, low=1)
    fields["max_seq_len"] = min(max_seq_len, max_seq_len if limit is None else limit)
    fields["name"] = name or _default_name(data, folder, model_type)
    scheme = _shipped_scheme(r)
    r.unknown_keys()
    r.raise_problems()
    try:
        card = ModelConfig(**fields)
        model = build(card)
        if scheme is not None:
            # Pre-quantized: the kinds that ship in one format take it (models/shipped_view.py).
            table, _ = shipped_view.card_table(scheme, model, data)
            card = dataclasses.replace(card, quantize=Quantize(**table))
            build(card)
    except IRError as err:
        raise ConfigError(err.message, path=f"{source}: {err.path}" if err.path else source,
                          hint=err.hint) from None
    return card


def _shipped_scheme(r: FieldReader):
    """The ``shipped.Scheme`` of a pre-quantized checkpoint's config, or None;
    its problems are recorded as ``quantization_config.*``."""
    config = r.get("quantization_config", dict, None)
    if config is None:
        return None
    scheme, problems = shipped.read_problems(config)
    for p in problems:
        r.problems.append(f"quantization_config.{p}")
    return scheme


def _family_fields(r: FieldReader, family, model_type: str) -> dict:
    """Card fields of a family described by a ``FAMILIES`` row."""
    fields = _dense_fields(r, family)
    fields.update(read_rope(r, family.rope_theta, by_type=family.rope_by_type,
                            partial=family.partial_rotary, head_dim=fields.get("head_dim"),
                            **(hf_hybrid.ROPE if family.hybrid else {})))
    if family.hybrid:
        fields.update(hf_hybrid.hybrid_fields(r, fields, dense=family.moe == "none"))
    elif family.window == "types":
        fields.update(_types_window(r, family, fields.get("num_layers") or 0, model_type))
        if "layer_types" not in fields:         # every layer full: no local RoPE base
            fields.pop("sliding_rope_theta", None)
    else:
        fields["sliding_window"] = _window(r, family, fields.get("num_layers") or 0)
    fields.update(_moe(r, family, fields))
    if family.extras:
        fields.update(EXTRAS[family.extras](r, fields))
    return fields


def supported() -> list[str]:
    """Every model_type this module imports."""
    return sorted({*FAMILIES, *_importers()})


def _read(config) -> tuple[dict, str, str | None]:
    if isinstance(config, dict):
        return config, "config.json", None
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError("file not found", path=str(path))
    data = read_json(path, error=ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"expected a JSON object, found {type(data).__name__}",
                          path=str(path))
    folder = path.parent.resolve()
    # A hub cache snapshot (models--ORG--NAME/snapshots/REV) is named by its repository.
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return data, str(path), folder.parent.parent.name.split("--")[-1]
    return data, str(path), path.parent.name


def _dense_fields(r: FieldReader, f: Family) -> dict[str, Any]:
    size = lambda key, high, default=REQUIRED: r.get(key, int, default, low=1, high=high)  # noqa: E731
    hidden = size("hidden_size", limits.MAX_WIDTH)
    heads = size("num_attention_heads", limits.MAX_HEADS)
    default_hd = f.head_dim or (hidden // heads if hidden and heads else None)
    out = dict(
        vocab_size=size("vocab_size", limits.MAX_VOCAB), hidden_size=hidden,
        num_layers=size("num_hidden_layers", limits.MAX_LAYERS), num_q_heads=heads,
        num_kv_heads=size("num_key_value_heads", limits.MAX_HEADS, heads),
        head_dim=size("head_dim", limits.MAX_HEAD_DIM, default_hd),
        intermediate_size=size("intermediate_size", limits.MAX_WIDTH),
        norm_eps=r.get("rms_norm_eps", float, f.norm_eps, low=limits.NORM_EPS[0],
                       high=limits.NORM_EPS[1]),
        tie_embeddings=r.get("tie_word_embeddings", bool, f.tied_default),
        qk_norm=f.qk_norm, qk_norm_all_heads=f.qk_norm_all_heads,
        pre_norms=f.norms != "post", post_norms=f.norms != "pre", norm_offset=f.norm_offset,
        scale_embeddings=f.scale_embeddings,
    )
    act = r.get(f.act_key, str, f.act_default)
    if act is not None and act not in ACTIVATIONS:
        r.problem(f.act_key, f"{act!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    out["activation"] = ACTIVATIONS.get(act, "silu")
    if f.act_key != "hidden_act":       # carried by some files, never read by the model
        r.get("hidden_act", str, None)
    attention_bias = r.get("attention_bias", bool, f.bias_default) if "attention_bias" in (
        f.qkv_bias, f.o_bias) else False
    rule = {"always": True, "never": False, "attention_bias": attention_bias}
    out["qkv_bias"], out["o_bias"] = rule[f.qkv_bias], rule[f.o_bias]
    if r.get("mlp_bias", bool, False):
        r.problem("mlp_bias", "true is not supported (the IR's MLP has no biases)")
    return out


def _window(r: FieldReader, f: Family, num_layers: int) -> int | None:
    """One window for every layer, or none; a mix is a problem."""
    window = (r.get("sliding_window", int, None, low=1, high=limits.MAX_SEQ_LEN)
              if f.window != "none" else None)
    if f.window == "qwen":
        use = r.get("use_sliding_window", bool, False)
        first = r.get("max_window_layers", int, 28, low=0)  # HF's default
        windows = [window if use and i >= first else None for i in range(num_layers)]
    else:
        windows = [window] * num_layers
    types = r.get("layer_types", list, None)
    if types is not None:
        # 5.x spells the per-layer choice out; it wins over the derived one.
        kinds = {"full_attention": None, "sliding_attention": window}
        bad = [t for t in types if not isinstance(t, str) or t not in kinds]
        if bad or len(types) != num_layers:
            r.problem("layer_types", f"{shown(types)} should list {num_layers} of {sorted(kinds)}")
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


def _types_window(r: FieldReader, f: Family, n: int, model_type: str) -> dict[str, Any]:
    """``sliding_window`` and ``layer_types`` of a family whose layers mix
    sliding and full attention (the card's mixer table)."""
    window = r.get("sliding_window", int, f.window_default, low=1, high=limits.MAX_SEQ_LEN)
    period = f.pattern
    if model_type == "gemma3_text":      # 4.x and 5.x spellings; layer_types wins over both
        given = [r.get(k, int, None, low=1, high=limits.MAX_LAYERS)
                 for k in ("sliding_window_pattern", "_sliding_window_pattern")]
        period = next((p for p in given if p is not None), period)
    types = r.get("layer_types", list, None)
    kinds = ("full_attention", "sliding_attention")
    if types is None:
        types = [kinds[(i + 1) % period != 0] for i in range(n)]
    elif len(types) != n or any(not isinstance(t, str) or t not in kinds for t in types):
        r.problem("layer_types", f"{shown(types)} should list {n} of {list(kinds)}")
        return {"sliding_window": window}
    if "sliding_attention" not in types:
        return {"sliding_window": None}
    if window is None:
        r.problem("sliding_window", "is null but layer_types names sliding_attention layers")
    return {"sliding_window": window, "layer_types": tuple(types)}


def _moe(r: FieldReader, f: Family, fields: dict) -> dict[str, Any]:
    if f.moe == "none":
        return {}
    if f.moe == "gpt_oss":
        return {"moe": gpt_oss_moe(r, fields)}
    n = fields.get("num_layers") or 0
    # A value that is None here was reported as a problem (raised before the
    # card is made); 1 only keeps the arithmetic going until then.
    top_k = r.get("num_experts_per_tok", int, 8 if f.moe == "qwen" else 2, low=1,
                  high=limits.MAX_EXPERTS) or 1
    if f.moe == "mixtral":
        experts = r.get("num_local_experts", int, 8, low=1, high=limits.MAX_EXPERTS) or 1
        return {"moe": MoEConfig(experts, top_k, fields["intermediate_size"] or 1,
                                 "softmax", renormalize=True)}
    shared = {}
    if f.moe == "qwen_next":    # one shared expert, its output scaled by sigmoid(x . w)
        width = r.get("shared_expert_intermediate_size", int, 0, low=0, high=limits.MAX_WIDTH)
        if width:
            shared = dict(num_shared_experts=1, shared_intermediate=width,
                          shared_expert_gate=True)
    experts = _num_experts(r)
    width = r.get("moe_intermediate_size", int, 768, low=1, high=limits.MAX_WIDTH) or 1
    step = r.get("decoder_sparse_step", int, 1)
    dense_only = r.get("mlp_only_layers", list, [])
    renorm = r.get("norm_topk_prob", bool, False)
    if step < 1 or not all(isinstance(i, int) for i in dense_only):
        r.problem("decoder_sparse_step", f"{step} and mlp_only_layers={shown(dense_only)} should "
                  "be a positive integer and a list of layer indices")
        return {}
    is_moe = [bool(experts) and i not in dense_only and (i + 1) % step == 0 for i in range(n)]
    first_k = is_moe.index(True) if True in is_moe else n
    if not all(is_moe[first_k:]):
        r.problem("decoder_sparse_step", f"{step} with mlp_only_layers={shown(dense_only)} makes "
                  f"layers {[i for i in range(n) if is_moe[i]]} MoE; the IR supports "
                  "all-MoE or the first k layers dense")
        return {}
    if first_k == n:
        return {}
    return {"moe": MoEConfig(experts, top_k, width, "softmax", renormalize=renorm, **shared),
            "first_k_dense": first_k}


def _num_experts(r: FieldReader) -> int:
    # 4.x names it num_experts; 5.x num_local_experts.
    # 0 experts is a dense model (the key is then ignored), so 0 is in range.
    a = r.get("num_experts", int, None, low=0, high=limits.MAX_EXPERTS)
    b = r.get("num_local_experts", int, None, low=0, high=limits.MAX_EXPERTS)
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
        r.problem(key, f"{shown(value)} is not supported; supported: {sorted(DTYPES)} "
                  "(or pass dtype= to convert the weights)")
        return "bfloat16"
    return DTYPES[value]


def _default_name(data: dict, folder: str | None, model_type: str) -> str:
    given = data.get("_name_or_path")
    raw = given if isinstance(given, str) and given else folder or model_type
    raw = raw.rstrip("/").split("/")[-1][-limits.MAX_NAME_CHARS:]
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.") or model_type
    name = clean if clean[0].isalpha() or clean[0] == "_" else f"m-{clean}"
    # A derived name is only a label: cut it to the limit rather than refuse the file.
    return name[:limits.MAX_NAME_CHARS]
