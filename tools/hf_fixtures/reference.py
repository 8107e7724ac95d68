"""transformers as the fixtures' reference: load a fixture in float32, run the
prefill and two cached decode steps, record Gated DeltaNet cache states.
Shared by build.py and verify.py."""

from __future__ import annotations

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


def load_fp32(path: Path):
    # compressed-tensors checkpoints are kept packed unless asked to dequantize
    # (transformers 5.24 with compressed-tensors 0.20); mxfp4 and fp8 dequantize
    # on a CPU by themselves.
    config = json.loads((Path(path) / "config.json").read_text())
    method = config.get("quantization_config", {}).get("quant_method")
    extra = {"quantization_config": transformers.CompressedTensorsConfig(dequantize=True)} \
        if method == "compressed-tensors" else {}
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager", **extra
    )
    model.eval()
    return model


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
