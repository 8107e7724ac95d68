"""transformers as the fixtures' reference: load a fixture in float32, run the
prefill and two cached decode steps, record Gated DeltaNet cache states.
Shared by build.py and verify.py."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

from .spec import STEPS, T0, FixtureSpec


def classes(spec: FixtureSpec):
    """(config class, model class) of ``spec``, from transformers."""
    return getattr(transformers, spec.config), getattr(transformers, spec.model)


def model_class(config: dict):
    """The class a saved config.json names: the causal LM of every family but
    muse_spark, whose only LM class (``MuseSparkForConditionalGeneration``) is not
    in ``AutoModelForCausalLM``'s mapping (transformers 5.25: image-text-to-text)."""
    if config.get("model_type") == "muse_spark":
        return getattr(transformers, config["architectures"][0])
    return AutoModelForCausalLM


@contextlib.contextmanager
def per_expert_merge(config: dict):
    """While loading a muse_spark checkpoint whose routed experts are stored one
    module per expert and projection (``mlp.experts.N.{gate,up,down}_proj``, as
    compressed-tensors ships them), give transformers the merge it applies to every
    such MoE family (``qwen2_moe``'s: experts stacked on dim 0, gate rows then up
    rows into ``gate_up_proj``). transformers 5.25 has no conversion mapping for
    muse_spark: without this it reports those keys UNEXPECTED, ``gate_up_proj`` and
    ``down_proj`` MISSING, and runs on random experts."""
    from transformers import conversion_mapping as cm

    key = "muse_spark_text"
    if config.get("model_type") != "muse_spark" or cm.get_checkpoint_conversion_mapping(key):
        yield
        return
    cm.register_checkpoint_conversion_mapping(key, cm.get_checkpoint_conversion_mapping("qwen2_moe"))
    try:
        yield
    finally:
        cm._checkpoint_conversion_mapping_cache.pop(key, None)
        cm.USER_REGISTERED_MAPPINGS.discard(key)


def load_fp32(path: Path, config=None, repair: bool = True):
    """The fixture at ``path`` in float32, eager attention; ``config`` (a config
    object) replaces the saved one (ablations); ``repair=False`` keeps the experts
    as transformers read them (see repair_expert_global_scales)."""
    # compressed-tensors checkpoints are kept packed unless asked to dequantize
    # (transformers 5.24 with compressed-tensors 0.20); mxfp4 and fp8 dequantize
    # on a CPU by themselves.
    saved = json.loads((Path(path) / "config.json").read_text())
    method = saved.get("quantization_config", {}).get("quant_method")
    extra = {"quantization_config": transformers.CompressedTensorsConfig(dequantize=True)} \
        if method == "compressed-tensors" else {}
    if config is not None:
        extra["config"] = config
    with per_expert_merge(saved) if method else contextlib.nullcontext():
        model = model_class(saved).from_pretrained(
            str(path), dtype=torch.float32, attn_implementation="eager", **extra
        )
    # transformers 5.25 + compressed-tensors 0.20 hand a fused MoE's dequantized
    # experts over in bf16 whatever the load dtype (the packed-expert branch of
    # CompressedTensorsDequantize does not cast; its dense branch does), and the
    # experts then run in bf16 (grouped_mm casts the input to the weight's dtype).
    # Their values are bf16-exact, so the cast to float32 loses nothing.
    if any(p.is_floating_point() and p.dtype != torch.float32 for p in model.parameters()):
        model = model.float()
    if method == "compressed-tensors" and repair:
        repair_expert_global_scales(model, Path(path), saved["quantization_config"])
    model.eval()
    return model


@torch.no_grad()
def repair_expert_global_scales(model, path: Path, quantization_config: dict) -> int:
    """Per-expert NVFP4 modules merged into fused experts: transformers 5.25's
    ``CompressedTensorsDequantize`` decompresses them through a stand-in module that
    carries ``weight_packed``, ``weight_scale`` and ``weight_shape`` but not
    ``weight_global_scale``, so compressed-tensors dequantizes without it and every
    expert weight comes out multiplied by its module's global scale. Recompute each
    fused expert tensor with compressed-tensors' own ``decompress`` of the complete
    state dict (the call transformers makes for a dense module) and put it in its
    place, after checking that transformers' values are exactly those times the
    global scale (or already right, if a later transformers fixes it). The number of
    fused tensors replaced."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file

    tensors = load_file(str(path / "model.safetensors"))
    stems = sorted({k.removesuffix(".weight_packed") for k in tensors
                    if k.endswith(".weight_packed") and ".mlp.experts." in k})
    if not stems:
        return 0
    ct = QuantizationConfig.model_validate(quantization_config)
    [scheme] = ct.config_groups.values()
    compressor = BaseCompressor.get_value_from_registry(scheme.format or ct.format)
    per_layer: dict[str, dict[str, dict[int, tuple]]] = {}
    for stem in stems:
        head, _, tail = stem.partition(".mlp.experts.")
        e, proj = tail.split(".")
        sd = {n: tensors[f"{stem}.{n}"] for n in
              ("weight_packed", "weight_scale", "weight_global_scale", "weight_shape")}
        w = compressor.decompress(dict(sd), scheme)["weight"].float()
        per_layer.setdefault(head, {}).setdefault(proj, {})[int(e)] = (w, float(sd["weight_global_scale"]))
    params = dict(model.named_parameters())
    replaced = 0
    for head, projs in per_layer.items():
        fused = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
        for name, parts in fused.items():
            n = len(projs[parts[0]])
            right = torch.stack([torch.cat([projs[p][e][0] for p in parts], 0) for e in range(n)])
            times_g = torch.stack([torch.cat([projs[p][e][0] * projs[p][e][1] for p in parts], 0)
                                   for e in range(n)])
            param = params[f"{head}.mlp.experts.{name}"]
            if torch.equal(param, right):
                continue
            assert torch.equal(param, times_g), \
                f"{head}.mlp.experts.{name}: transformers read neither the values nor them x global scale"
            param.copy_(right)
            replaced += 1
    return replaced


def run_reference(model, prefill, d1, d2, on_step=None):
    """Prefill then two cached decode steps; returns three float32 arrays.

    on_step(step_name, cache), if given, is called after each of the three calls
    (step_name in STEPS) while the cache holds that call's state."""
    # transformers >= 5.2x renamed past_key_values -> cache (same DynamicCache
    # object, positions continue from the cache length); support both.
    new_api = "cache" in inspect.signature(model.forward).parameters
    kw = "cache" if new_api else "past_key_values"

    def step(ids, cache):
        extra = {} if cache is None else {kw: cache}
        out = model(input_ids=ids, use_cache=True, **extra)
        return out, getattr(out, kw)

    out0, kv = step(prefill, None)
    if on_step:
        on_step(STEPS[0], kv)
    out1, kv = step(d1, kv)
    if on_step:
        on_step(STEPS[1], kv)
    out2, kv = step(d2, kv)
    if on_step:
        on_step(STEPS[2], kv)
    assert kv.get_seq_length() == T0 + 2, kv.get_seq_length()
    return (
        out0.logits.float().numpy(),
        out1.logits.float().numpy(),
        out2.logits.float().numpy(),
    )


def linear_layers(cfg) -> list:
    return [i for i, t in enumerate(getattr(cfg, "layer_types", None) or []) if t == "linear_attention"]


class StateRecorder:
    """Copies HF's GDN cache states (conv + recurrent, float32) after each step."""

    def __init__(self, cfg):
        self.layers = linear_layers(cfg)
        self.arrays = {}

    def __call__(self, step, cache):
        for i in self.layers:
            layer = cache.layers[i]
            self.arrays[f"conv_state_{i}_{step}"] = layer.conv_states[0].detach().float().numpy().copy()
            self.arrays[f"recurrent_state_{i}_{step}"] = layer.recurrent_states[0].detach().float().numpy().copy()


def assert_torch_paths() -> None:
    """transformers silently swaps in fla / causal-conv1d kernels when they are
    importable; the fixtures must come from its pure-torch path."""
    found = [m for m in ("fla", "causal_conv1d") if importlib.util.find_spec(m) is not None]
    if found:
        raise SystemExit(f"{found} importable in this venv: remove them (the fixtures use HF's torch path)")
