"""Tiny pre-quantized checkpoints written the way their producers lay them
out, by plain numpy written here, independently of the loader (models/shipped*.py)
and of megakernel/quantize.py: HF [out, in] orientation throughout.

* DeepSeek fp8: ``X.weight`` e4m3 codes, ``X.weight_scale_inv`` f32, one per
  128 x 128 block (edge blocks cut short), weight = code x scale_inv.
* compressed-tensors pack-quantized int4 / int8: codes + 2^(bits-1) packed
  into int32 words, the first input column in the lowest bits;
  ``weight_scale`` bf16 per (output, input group); ``weight_shape`` int64.
* compressed-tensors mxfp4: e2m1 nibbles two per byte, the even input column
  low; ``weight_scale`` E8M0 bytes (2^(b - 127)) per 32 inputs.
* compressed-tensors nvfp4 (llm-compressor's NVFP4A16): nibbles as mxfp4's;
  ``weight_global_scale`` f32 [1] = 6 x 448 / max|w|, ``weight_scale`` e4m3
  per 16 inputs = (max|w_block| / 6) x global; a weight is code x (scale /
  global), in f32.
* ModelOpt nvfp4 (NVIDIA's export): the codes and e4m3 block scales of the
  compressed-tensors nvfp4 above, in ``X.weight`` and ``X.weight_scale``, and
  ``X.weight_scale_2`` f32 [] = 1 / its global scale, which multiplies: a
  weight is code x (scale x scale_2), in f32; ``X.input_scale`` f32 [] beside.
* gpt-oss mxfp4 (OpenAI's release): the fused experts' [E, in, out] float
  tensors become ``X_blocks`` U8 [E, out, in / 32, 16] (each scale group's
  32 nibbles, the even input low) and ``X_scales`` U8 [E, out, in / 32].

Each rounds the way megakernel/quantize.py documents for quantize-on-load
(amax / 448 blocks; bf16(amax / 7); OCP MX exponents), so on the same bf16
weights both give the same codes.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


def bf16_exact(rng, *shape, scale=0.05, offset=0.0) -> np.ndarray:
    """Random f32 values that bf16 holds exactly (a bf16 checkpoint's weights)."""
    w = rng.standard_normal(shape).astype(np.float32) * scale + offset
    return w.astype(ml_dtypes.bfloat16).astype(np.float32)


# ---- DeepSeek fp8 ----------------------------------------------------------------

def fp8_ship(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[out, in] -> (e4m3 codes [out, in], f32 scale_inv [ceil(out/128), ceil(in/128)])."""
    rows, cols = -(-w.shape[0] // 128), -(-w.shape[1] // 128)
    codes = np.zeros(w.shape, ml_dtypes.float8_e4m3fn)
    scale = np.ones((rows, cols), np.float32)
    for i in range(rows):
        for j in range(cols):
            block = w[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)]
            amax = np.float32(np.abs(block).max())
            s = amax / np.float32(448.0) if amax > 0 else np.float32(1.0)
            scale[i, j] = s
            codes[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)] = (block / s).astype(
                ml_dtypes.float8_e4m3fn)
    return codes, scale


def fp8_values(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    out = codes.astype(np.float32)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            out[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)] *= scale[i, j]
    return out


# ---- compressed-tensors pack-quantized ------------------------------------------

def int_pack(w: np.ndarray, bits: int, group: int | None):
    """[out, in] -> (int32 words [out, in * bits / 32], bf16 scales [out, in / g]
    (int8: [out, 1]), int64 shape [2])."""
    top = 7 if bits == 4 else 127
    low = -8 if bits == 4 else -127
    g = group or w.shape[1]
    amax = np.abs(w.reshape(w.shape[0], -1, g)).max(axis=-1)
    s = np.where(amax == 0, 1.0, amax / top).astype(ml_dtypes.bfloat16)
    q = np.clip(np.rint(w / np.repeat(s.astype(np.float32), g, axis=1)), low, top)
    unsigned = (q.astype(np.int64) + (1 << (bits - 1))).astype(np.uint32)
    per = 32 // bits
    words = np.zeros((w.shape[0], w.shape[1] // per), np.uint32)
    for i in range(per):
        words |= unsigned[:, i::per] << np.uint32(bits * i)
    return words.view(np.int32), s, np.array(w.shape, np.int64)


def int_values(words: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    u = words.view(np.uint32)
    per = 32 // bits
    q = np.zeros((u.shape[0], u.shape[1] * per), np.float32)
    for i in range(per):
        q[:, i::per] = ((u >> np.uint32(bits * i)) & np.uint32((1 << bits) - 1)).astype(
            np.float32) - (1 << (bits - 1))
    g = q.shape[1] // scale.shape[1]
    return q * np.repeat(scale.astype(np.float32), g, axis=1)


def mxfp4_pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[out, in] -> (uint8 [out, in / 2] nibble pairs, uint8 E8M0 [out, in / 32])."""
    amax = np.abs(w.reshape(w.shape[0], -1, 32)).max(axis=-1)
    e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2, 0.0)
    q = np.clip(w / np.repeat(np.exp2(e), 32, axis=1), -6.0, 6.0)
    nibble = q.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    return (nibble[:, 0::2] | (nibble[:, 1::2] << 4)).astype(np.uint8), (e + 127).astype(
        np.uint8)


def mxfp4_values(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    nib = np.zeros((packed.shape[0], packed.shape[1] * 2), np.uint8)
    nib[:, 0::2], nib[:, 1::2] = packed & 0xF, packed >> 4
    v = np.where(nib & 8, -1.0, 1.0).astype(np.float32) * E2M1[nib & 7]
    return v * np.repeat(np.exp2(scale.astype(np.float32) - 127), 32, axis=1)


def nvfp4_pack(w: np.ndarray):
    """[out, in] -> (uint8 [out, in / 2] nibble pairs, e4m3 [out, in / 16],
    f32 global scale [1])."""
    f32 = np.float32
    top = f32(np.abs(w).max())
    glob = f32(6 * 448) / top if top > 0 else f32(1)
    amax = np.abs(w.reshape(w.shape[0], -1, 16)).max(axis=-1).astype(f32)
    block = ((amax / f32(6)) * glob).astype(ml_dtypes.float8_e4m3fn).astype(f32)
    block = np.where(amax > 0, np.maximum(block, f32(2.0 ** -9)), 1).astype(f32)
    s = (block / glob).astype(f32)
    q = np.clip(w / np.repeat(s, 16, axis=1), -6.0, 6.0)
    nibble = q.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    packed = (nibble[:, 0::2] | (nibble[:, 1::2] << 4)).astype(np.uint8)
    return packed, block.astype(ml_dtypes.float8_e4m3fn), np.array([glob], f32)


def nvfp4_values(packed: np.ndarray, block: np.ndarray, glob: np.ndarray) -> np.ndarray:
    nib = np.zeros((packed.shape[0], packed.shape[1] * 2), np.uint8)
    nib[:, 0::2], nib[:, 1::2] = packed & 0xF, packed >> 4
    v = np.where(nib & 8, -1.0, 1.0).astype(np.float32) * E2M1[nib & 7]
    return v * np.repeat(block.astype(np.float32) / glob[0], 16, axis=1)


def modelopt_values(packed: np.ndarray, block: np.ndarray, scale_2) -> np.ndarray:
    nib = np.zeros((packed.shape[0], packed.shape[1] * 2), np.uint8)
    nib[:, 0::2], nib[:, 1::2] = packed & 0xF, packed >> 4
    v = np.where(nib & 8, -1.0, 1.0).astype(np.float32) * E2M1[nib & 7]
    return v * np.repeat(block.astype(np.float32) * np.float32(scale_2), 16, axis=1)


def gpt_oss_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[E, in, out] -> (blocks [E, out, in / 32, 16], scales [E, out, in / 32],
    the dequantized [E, in, out] f32)."""
    e, k, n = w.shape
    blocks = np.zeros((e, n, k // 32, 16), np.uint8)
    scales = np.zeros((e, n, k // 32), np.uint8)
    values = np.zeros(w.shape, np.float32)
    for x in range(e):
        packed, scale = mxfp4_pack(w[x].T)
        blocks[x], scales[x] = packed.reshape(n, k // 32, 16), scale
        values[x] = mxfp4_values(packed, scale).T
    return blocks, scales, values


# ---- checkpoints -----------------------------------------------------------------

def ship(tensors: dict, quantized: dict[str, str]) -> tuple[dict, dict]:
    """(shipped tensors, dequantized twin): ``quantized`` maps a module's
    ``X.weight`` to its layout ("fp8", "int4_g32", ..., "int8", "mxfp4", "nvfp4"); the
    twin holds the numpy-dequantized values (f32) in their place."""
    out, twin = {}, {}
    for name, w in tensors.items():
        layout = quantized.get(name)
        module = name.removesuffix(".weight")
        if layout is None:
            out[name] = w.astype(np.float32 if w.ndim == 1 and "bias" in name
                                 else ml_dtypes.bfloat16)
            twin[name] = w
        elif layout == "fp8":
            codes, scale = fp8_ship(w)
            out |= {name: codes, module + ".weight_scale_inv": scale}
            twin[name] = fp8_values(codes, scale)
        elif layout == "gpt_oss_mxfp4":
            blocks, scale, twin[name] = gpt_oss_mxfp4(w)
            out |= {name + "_blocks": blocks, name + "_scales": scale}
        elif layout == "nvfp4":
            packed, block, glob = nvfp4_pack(w)
            out |= {module + ".weight_packed": packed, module + ".weight_scale": block,
                    module + ".weight_global_scale": glob,
                    module + ".weight_shape": np.array(w.shape, np.int64)}
            twin[name] = nvfp4_values(packed, block, glob)
        elif layout == "modelopt_nvfp4":
            packed, block, glob = nvfp4_pack(w)
            scale_2 = np.float32(1) / glob[0]
            out |= {name: packed, module + ".weight_scale": block,
                    module + ".weight_scale_2": np.asarray(scale_2, np.float32),
                    module + ".input_scale": np.asarray(0.01, np.float32)}
            twin[name] = modelopt_values(packed, block, scale_2)
        elif layout == "mxfp4":
            packed, scale = mxfp4_pack(w)
            out |= {module + ".weight_packed": packed, module + ".weight_scale": scale}
            twin[name] = mxfp4_values(packed, scale)
        else:
            bits, group = (8, None) if layout == "int8" else (4, int(layout.split("_g")[1]))
            words, scale, shape = int_pack(w, bits, group)
            out |= {module + ".weight_packed": words, module + ".weight_scale": scale,
                    module + ".weight_shape": shape}
            twin[name] = int_values(words, scale, bits)
    return out, twin


def write(folder, config: dict, tensors: dict):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, folder / "model.safetensors")
    return folder


# ---- two tiny models, named as Hugging Face saves them -------------------------------

DEEPSEEK = {
    "model_type": "deepseek_v3", "vocab_size": 256, "hidden_size": 128,
    "intermediate_size": 256, "moe_intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 128,
    "kv_lora_rank": 128, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 1,
    "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
    "norm_topk_prob": True, "max_position_embeddings": 256, "dtype": "bfloat16",
    "tie_word_embeddings": False,
}
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
       "activation_scheme": "dynamic"}
QWEN3 = {"model_type": "qwen3", "vocab_size": 256, "hidden_size": 128,
         "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 256,
         "dtype": "bfloat16", "tie_word_embeddings": False}
QWEN3_MOE = {**QWEN3, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
             "moe_intermediate_size": 128, "norm_topk_prob": True}


def deepseek_tensors(rng) -> tuple[dict, list[str]]:
    """(tensors, the names of the linears DeepSeek's fp8 checkpoints quantize)."""
    c = DEEPSEEK
    h, heads, e = c["hidden_size"], c["num_attention_heads"], c["n_routed_experts"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    r = lambda *s, **kw: bf16_exact(rng, *s, **kw)  # noqa: E731
    t = {"model.embed_tokens.weight": r(c["vocab_size"], h, scale=1.0),
         "model.norm.weight": r(h, offset=1.0), "lm_head.weight": r(c["vocab_size"], h)}
    linears = []
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": r(h, offset=1.0),
              p + "post_attention_layernorm.weight": r(h, offset=1.0),
              p + "self_attn.q_a_layernorm.weight": r(c["q_lora_rank"], offset=1.0),
              p + "self_attn.kv_a_layernorm.weight": r(c["kv_lora_rank"], offset=1.0)}
        shapes = {"self_attn.q_a_proj": (c["q_lora_rank"], h),
                  "self_attn.q_b_proj": (heads * qk, c["q_lora_rank"]),
                  "self_attn.kv_a_proj_with_mqa": (c["kv_lora_rank"] + c["qk_rope_head_dim"], h),
                  "self_attn.kv_b_proj": (heads * (c["qk_nope_head_dim"] + c["v_head_dim"]),
                                          c["kv_lora_rank"]),
                  "self_attn.o_proj": (h, heads * c["v_head_dim"])}
        width = c["intermediate_size"] if i < c["first_k_dense_replace"] else None
        ew = c["moe_intermediate_size"]
        mlps = [("mlp.", width)] if width else [("mlp.shared_experts.", ew)] + [
            (f"mlp.experts.{x}.", ew) for x in range(e)]
        for m, w in mlps:
            shapes |= {m + "gate_proj": (w, h), m + "up_proj": (w, h), m + "down_proj": (h, w)}
        if not width:
            t |= {p + "mlp.gate.weight": r(e, h),
                  p + "mlp.gate.e_score_correction_bias": r(e, scale=0.1)}
        for name, shape in shapes.items():
            t[p + name + ".weight"] = r(*shape)
            linears.append(p + name + ".weight")
    return t, linears


def qwen3_tensors(rng, config: dict) -> dict:
    c = config
    h, hd = c["hidden_size"], c["head_dim"]
    r = lambda *s, **kw: bf16_exact(rng, *s, **kw)  # noqa: E731
    t = {"model.embed_tokens.weight": r(c["vocab_size"], h, scale=1.0),
         "model.norm.weight": r(h, offset=1.0), "lm_head.weight": r(c["vocab_size"], h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": r(h, offset=1.0),
              p + "post_attention_layernorm.weight": r(h, offset=1.0),
              p + "self_attn.q_norm.weight": r(hd, offset=1.0),
              p + "self_attn.k_norm.weight": r(hd, offset=1.0),
              p + "self_attn.q_proj.weight": r(c["num_attention_heads"] * hd, h),
              p + "self_attn.k_proj.weight": r(c["num_key_value_heads"] * hd, h),
              p + "self_attn.v_proj.weight": r(c["num_key_value_heads"] * hd, h),
              p + "self_attn.o_proj.weight": r(h, c["num_attention_heads"] * hd)}
        if "num_experts" not in c:
            w = c["intermediate_size"]
            t |= {p + "mlp.gate_proj.weight": r(w, h), p + "mlp.up_proj.weight": r(w, h),
                  p + "mlp.down_proj.weight": r(h, w)}
            continue
        w = c["moe_intermediate_size"]
        t[p + "mlp.gate.weight"] = r(c["num_experts"], h)
        for x in range(c["num_experts"]):
            q = f"{p}mlp.experts.{x}."
            t |= {q + "gate_proj.weight": r(w, h), q + "up_proj.weight": r(w, h),
                  q + "down_proj.weight": r(h, w)}
    return t


GPT_OSS = {"model_type": "gpt_oss", "vocab_size": 256, "hidden_size": 64, "head_dim": 16,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
           "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4,
           "attention_bias": True, "rms_norm_eps": 1e-5, "swiglu_limit": 1.5,
           "max_position_embeddings": 256, "dtype": "bfloat16", "tie_word_embeddings": False,
           "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                               "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                               "original_max_position_embeddings": 4096}}
# As in openai/gpt-oss-20b's config.json.
GPT_OSS_MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


def gpt_oss_tensors(rng, c: dict) -> dict:
    """gpt-oss's tensors as transformers names them; experts fused [E, in, out]."""
    h, hd, e, w = c["hidden_size"], c["head_dim"], c["num_local_experts"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    r = lambda *s, **kw: bf16_exact(rng, *s, **kw)  # noqa: E731
    t = {"model.embed_tokens.weight": r(c["vocab_size"], h, scale=1.0),
         "model.norm.weight": r(h, offset=1.0), "lm_head.weight": r(c["vocab_size"], h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": r(h, offset=1.0),
              p + "post_attention_layernorm.weight": r(h, offset=1.0),
              p + "self_attn.sinks": r(c["num_attention_heads"]),
              p + "mlp.router.weight": r(e, h), p + "mlp.router.bias": r(e),
              p + "mlp.experts.gate_up_proj": r(e, h, 2 * w),
              p + "mlp.experts.gate_up_proj_bias": r(e, 2 * w),
              p + "mlp.experts.down_proj": r(e, w, h),
              p + "mlp.experts.down_proj_bias": r(e, h)}
        for name, rows, cols in (("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q)):
            t |= {f"{p}self_attn.{name}_proj.weight": r(rows, cols),
                  f"{p}self_attn.{name}_proj.bias": r(rows)}
    return t
