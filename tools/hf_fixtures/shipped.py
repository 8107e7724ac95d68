"""Turn a saved bf16 fixture into the quantized layout its producer ships,
in place: ``model.safetensors`` gets the quantized tensors and
``config.json`` the ``quantization_config`` (spec.GPT_OSS_MXFP4 /
spec.DEEPSEEK_FP8 / spec.QWEN3_NVFP4).

Written here with torch from the published layouts, not by transformers:
transformers 5.24 quantizes to either format only on a GPU (its MXFP4
quantizer needs the triton kernels, its fp8 one CUDA or XPU). What it does
on a CPU is *read* them: it dequantizes pre-quantized checkpoints to bf16 on
load (its ``dequantize`` fallback), and that read is what the fixture's
logits come from. ``check_dequantized`` holds transformers' loaded weights
to the values written here, bit for bit.

* mxfp4 (openai/gpt-oss-*): every ``mlp.experts.{gate_up_proj,down_proj}``
  [E, in, out] becomes ``..._blocks`` U8 [E, out, in / 32, 16] (the 32
  e2m1 codes of one scale group, two per byte, the even input in the low
  nibble) and ``..._scales`` U8 [E, out, in / 32], E8M0 (2^(b - 127)); the
  OCP MX rule: exponent floor(log2(amax)) - 2, values rounded to the nearest
  e2m1 (ties to the even code), saturating at 6.
* fp8 (deepseek-ai/DeepSeek-V3*): every ``*_proj*.weight`` of the layers
  becomes float8 e4m3fn codes [out, in] and ``*_proj.weight_scale_inv`` f32
  [ceil(out / 128), ceil(in / 128)], one per 128 x 128 block (edge blocks
  cut short), weight = code x scale_inv; ``ue8m0`` scales (DeepSeek-V3.1)
  are powers of two, 2^ceil(log2(amax / 448)). The router, norms,
  embedding and LM head stay bf16.
* nvfp4 (compressed-tensors ``nvfp4-pack-quantized``, llm-compressor's
  NVFP4A16): every ``*_proj.weight`` of the layers becomes ``weight_packed``
  U8 [out, in / 2] (even input low), ``weight_scale`` e4m3 [out, in / 16]
  and ``weight_global_scale`` f32 [1] (weight = code x scale / global), with
  ``weight_shape``; transformers reads it through compressed-tensors.
* nvfp4_experts (Muse Spark's routed experts in the same compressed-tensors
  layout): the fused ``mlp.experts.gate_up_proj`` [E, 2I, Dm] and
  ``mlp.experts.down_proj`` [E, Dm, I] become one module per expert and
  projection, ``mlp.experts.N.gate_proj`` (rows [:I]), ``.up_proj`` (rows
  [I:]) and ``.down_proj``, each packed as above with its own global scale;
  every other tensor stays as saved.

All three give values that bf16 holds exactly (a 4- or 8-bit float times a power
of two), so transformers' bf16 dequantization loses nothing and the float32
reference computes on exactly the shipped values.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP8_MAX = 448.0
EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def mxfp4_encode(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., in, out] float -> (blocks U8 [..., out, in / 32, 16], scales U8
    [..., out, in / 32])."""
    x = w.float().transpose(-1, -2)                       # [..., out, in]
    g = x.reshape(*x.shape[:-1], -1, 32)
    amax = g.abs().amax(-1, keepdim=True)
    e = torch.where(amax > 0, torch.floor(torch.log2(torch.where(amax > 0, amax, 1.0))) - 2,
                    torch.zeros_like(amax))
    q = (g / torch.exp2(e)).clamp(-6.0, 6.0)
    dist = (q.abs().unsqueeze(-1) - E2M1).abs()
    dist = dist + 1e-6 * (torch.arange(8) % 2)            # a tie goes to the even code
    code = dist.argmin(-1).to(torch.uint8) | ((q < 0).to(torch.uint8) << 3)
    code = code.reshape(*x.shape)                         # [..., out, in]
    packed = code[..., 0::2] | (code[..., 1::2] << 4)     # even input low
    blocks = packed.reshape(*x.shape[:-1], -1, 16).contiguous()
    return blocks, (e.squeeze(-1) + 127).to(torch.uint8).contiguous()


def mxfp4_decode(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The inverse: [..., in, out] float32."""
    b = blocks.reshape(*blocks.shape[:-2], -1)
    nib = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(*b.shape[:-1], -1).long()
    v = E2M1[nib & 7] * torch.where(nib & 8 > 0, -1.0, 1.0)
    v = v * torch.exp2(scales.float() - 127).repeat_interleave(32, dim=-1)
    return v.transpose(-1, -2)


def fp8_encode(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (e4m3fn codes [out, in], f32 ue8m0 scale_inv per block)."""
    x = w.float()
    rows, cols = -(-x.shape[0] // 128), -(-x.shape[1] // 128)
    scale = torch.ones(rows, cols)
    codes = torch.zeros(x.shape, dtype=torch.float8_e4m3fn)
    for i in range(rows):
        for j in range(cols):
            block = x[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)]
            amax = float(block.abs().max())
            s = 2.0 ** torch.ceil(torch.log2(torch.tensor(amax / FP8_MAX))) if amax > 0 else 1.0
            scale[i, j] = s
            codes[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)] = (block / s).to(
                torch.float8_e4m3fn)
    return codes, scale


def fp8_decode(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    s = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
    return codes.float() * s[:codes.shape[0], :codes.shape[1]]


def nvfp4_encode(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[out, in] float -> (packed U8 [out, in / 2], e4m3 block scales [out, in / 16],
    f32 global scale [1]) as compressed-tensors' ``nvfp4-pack-quantized`` stores
    them (weight = code x block / global). The global scale is the power of two
    at or below 6 x 448 / amax, so block / global is exact and so are the
    values in bf16."""
    x = w.float()
    amax = float(x.abs().max())
    glob = 2.0 ** torch.floor(torch.log2(torch.tensor(6 * FP8_MAX / amax)))
    g = x.reshape(x.shape[0], -1, 16)
    bmax = g.abs().amax(-1)
    block = (bmax / 6 * glob).to(torch.float8_e4m3fn).float()
    block = torch.where(bmax > 0, block.clamp(min=2.0 ** -9), torch.ones_like(block))
    q = (g / (block / glob).unsqueeze(-1)).clamp(-6.0, 6.0)
    dist = (q.abs().unsqueeze(-1) - E2M1).abs()
    dist = dist + 1e-6 * (torch.arange(8) % 2)            # a tie goes to the even code
    code = dist.argmin(-1).to(torch.uint8) | ((q < 0).to(torch.uint8) << 3)
    code = code.reshape(x.shape)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).contiguous()
    return packed, block.to(torch.float8_e4m3fn), glob.reshape(1).float()


def nvfp4_decode(packed: torch.Tensor, block: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
    nib = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    v = E2M1[nib & 7] * torch.where(nib & 8 > 0, -1.0, 1.0)
    return v * (block.float() / glob).repeat_interleave(16, dim=-1)


def _nvfp4_target(name: str) -> bool:
    """Every linear of the layers (the ``Linear`` target, lm_head ignored)."""
    return name.startswith("model.layers.") and name.endswith("_proj.weight")


def _fp8_target(name: str) -> bool:
    """A matrix of the layers DeepSeek ships in fp8: every projection
    (``kv_a_proj_with_mqa`` included), not the router ``mlp.gate`` or norms."""
    return name.startswith("model.layers.") and name.endswith(".weight") and "_proj" in name


def ship(kind: str, folder: Path, quantization_config: dict) -> dict[str, torch.Tensor]:
    """Rewrite ``folder`` (a bf16 save) in layout ``kind``; {float tensor name:
    its shipped values, float32} of every tensor it quantized."""
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    out, values = {}, {}
    for name, t in tensors.items():
        if kind == "mxfp4" and name.endswith(EXPERTS):
            blocks, scales = mxfp4_encode(t)
            out[name + "_blocks"], out[name + "_scales"] = blocks, scales
            values[name] = mxfp4_decode(blocks, scales)
        elif kind == "nvfp4_experts" and name.endswith(EXPERTS):
            stem = name.removesuffix(name.rsplit(".", 1)[1])       # "...mlp.experts."
            half = t.shape[1] // 2
            for e in range(t.shape[0]):
                parts = ({"gate_proj": t[e, :half], "up_proj": t[e, half:]}
                         if name.endswith("gate_up_proj") else {"down_proj": t[e]})
                for proj, w in parts.items():
                    packed, block, glob = nvfp4_encode(w)
                    mod = f"{stem}{e}.{proj}."
                    out |= {mod + "weight_packed": packed, mod + "weight_scale": block,
                            mod + "weight_global_scale": glob,
                            mod + "weight_shape": torch.tensor(list(w.shape), dtype=torch.int64)}
                    values[mod + "weight"] = nvfp4_decode(packed, block, glob)
        elif kind == "nvfp4" and _nvfp4_target(name):
            packed, block, glob = nvfp4_encode(t)
            stem = name.removesuffix("weight")
            out |= {stem + "weight_packed": packed, stem + "weight_scale": block,
                    stem + "weight_global_scale": glob,
                    stem + "weight_shape": torch.tensor(list(t.shape), dtype=torch.int64)}
            values[name] = nvfp4_decode(packed, block, glob)
        elif kind == "fp8" and _fp8_target(name):
            codes, scale = fp8_encode(t)
            out[name], out[name.removesuffix("weight") + "weight_scale_inv"] = codes, scale
            values[name] = fp8_decode(codes, scale)
        else:
            out[name] = t
    if not values:
        raise SystemExit(f"{folder}: no tensor to ship as {kind}")
    for name, v in values.items():
        assert torch.equal(v, v.to(torch.bfloat16).float()), f"{name}: not bf16-exact"
    save_file(out, str(path), metadata={"format": "pt"})
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["quantization_config"] = quantization_config
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return values


def check_dequantized(model, values: dict[str, torch.Tensor]) -> int:
    """transformers' loaded ``model`` holds exactly ``values`` (its experts fused
    [E, ...] and named as in memory); the number of tensors compared."""
    params = dict(model.named_parameters())
    seen = 0
    for name, v in values.items():
        if name in params:                       # gpt-oss experts, DeepSeek linears
            got = params[name].detach().float()
            assert torch.equal(got, v), f"{name}: transformers read other values"
            seen += 1
    for name, (v, parts) in _fused_experts(values).items():
        got = params[name].detach().float()
        assert got.shape == v.shape, (name, got.shape, v.shape)
        assert torch.equal(got, v), f"{name}: transformers read other values"
        seen += parts
    assert seen == len(values), f"compared {seen} of {len(values)} shipped tensors"
    return seen


def _fused_experts(values: dict) -> dict:
    """DeepSeek's per-expert ``mlp.experts.N.{gate,up,down}_proj.weight`` as
    transformers 5 holds them, {name: (value, per-expert tensors in it)}:
    ``mlp.experts.gate_up_proj`` [E, 2I, D] (gate rows then up rows) and
    ``mlp.experts.down_proj`` [E, D, I]."""
    layers: dict[str, dict] = {}
    for name, v in values.items():
        head, sep, tail = name.partition(".mlp.experts.")
        if sep and tail.split(".")[0].isdigit():
            e, proj = tail.split(".")[:2]
            layers.setdefault(head, {}).setdefault(proj, {})[int(e)] = v
    out = {}
    for head, projs in layers.items():
        stack = {p: torch.stack([d[e] for e in sorted(d)]) for p, d in projs.items()}
        n = len(projs["down_proj"])
        out[f"{head}.mlp.experts.gate_up_proj"] = (torch.cat(
            [stack["gate_proj"], stack["up_proj"]], dim=1), 2 * n)
        out[f"{head}.mlp.experts.down_proj"] = (stack["down_proj"], n)
    return out
