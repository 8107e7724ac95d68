#!/usr/bin/env python3
"""Cross-check the wave-2 and Muse Spark HF fixtures with an independent NumPy derivation.

Recomputes, in float64, the 7-position logits (and the Gated DeltaNet cache
states) of each wave-2 fixture in tests/fixtures/hf, and of muse_spark and
muse_spark_nvfp4 (whose NVFP4 experts it decodes itself), from its config.json and
model.safetensors, following the facts written in tests/fixtures/hf/README.md
("Facts checked against transformers 5.24 (Muse Spark: 5.25)") rather than
transformers' code, and compares them with expected.npz.  It shows those facts
are complete enough to reproduce HF.  torch is only used to read the safetensors.

Run in the fixture venv:
  .venv-hf/bin/python tools/hf_fixtures_crosscheck.py [FAMILY ...]
Exit status 1 if any family differs by more than 1e-4.
"""
import json
import math
import sys
from pathlib import Path
import numpy as np
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf"

def load(name):
    d = ROOT / name
    cfg = json.load(open(d / "config.json"))
    W = {k: v.double().numpy() for k, v in load_file(str(d / "model.safetensors")).items()}
    exp = np.load(d / "expected.npz")
    ids = np.concatenate([exp["prefill_ids"], exp["decode_ids_1"], exp["decode_ids_2"]], 1)
    want = np.concatenate([exp["logits_prefill"], exp["logits_decode_1"], exp["logits_decode_2"]], 1)
    return cfg, W, exp, ids, want

def rms(x, w, eps, centred=False):
    n = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return n * ((1.0 + w) if centred else w) if w is not None else n

silu = lambda x: x / (1 + np.exp(-x))
sigmoid = lambda x: 1 / (1 + np.exp(-x))
softplus = lambda x: np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
gelu_tanh = lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
lin = lambda x, w, b=None: x @ w.T + (0 if b is None else b)

def inv_freq_default(theta, dim):
    return 1.0 / theta ** (np.arange(0, dim, 2) / dim)

def yarn(theta, dim, factor, beta_fast, beta_slow, orig, truncate, mscale=None, mscale_all_dim=None):
    ext = inv_freq_default(theta, dim)
    itp = ext / factor
    corr = lambda n: dim * math.log(orig / (n * 2 * math.pi)) / (2 * math.log(theta))
    lo, hi = corr(beta_fast), corr(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2) - lo) / (hi - lo), 0, 1)
    e = 1 - ramp
    inv = itp * (1 - e) + ext * e
    gm = lambda s, m=1: 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
    af = gm(factor, mscale) / gm(factor, mscale_all_dim) if (mscale and mscale_all_dim) else gm(factor)
    return inv, af

def rope_half(x, pos, inv, rot=None, af=1.0):
    # x [..., T, d] rotated over its first `rot` dims as (i, i+rot/2) pairs
    rot = rot or x.shape[-1]
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang) * af, np.sin(ang) * af
    x1, x2, rest = x[..., : rot // 2], x[..., rot // 2 : rot], x[..., rot:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, rest], -1)

def rope_interleaved(x, pos, inv, af=1.0):
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang) * af, np.sin(ang) * af
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x2 * c + x1 * s
    return out

def attend(q, k, v, scale, window=None, softcap=None, sinks=None):
    # q [H,T,d], k/v [KV,T,d]; causal; window = number of keys incl. the query
    H, T, _ = q.shape
    r = H // k.shape[0]
    k = np.repeat(k, r, 0); v = np.repeat(v, r, 0)
    s = q @ k.transpose(0, 2, 1) * scale
    if softcap:
        s = np.tanh(s / softcap) * softcap
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    ok = j <= i
    if window:
        ok &= j > i - window
    s = np.where(ok, s, -np.inf)
    if sinks is not None:
        s = np.concatenate([s, np.broadcast_to(sinks[:, None, None], (H, T, 1))], -1)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s); p /= p.sum(-1, keepdims=True)
    if sinks is not None:
        p = p[..., :-1]
    return p @ v  # [H,T,dv]

def swiglu(x, g, u, d, act=silu):
    return lin(act(lin(x, g)) * lin(x, u), d)

# ---------------- Gated DeltaNet families ----------------
def gdn_layer(cfg, W, p, x, fused):
    """One Gated DeltaNet mixer over a whole sequence x [T, D].
    Returns (output [T, D], raw pre-conv qkv rows [T, C], {t: state [HV, dk, dv]})."""
    HK, HV = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, Kc = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    r = HV // HK
    T = x.shape[0]
    if fused:  # rows grouped per key head: [q | k | v (r heads) | z (r heads)], [b (r) | a (r)]
        qkvz = lin(x, W[p + "in_proj_qkvz.weight"]).reshape(T, HK, 2 * dk + 2 * r * dv)
        q = qkvz[..., :dk].reshape(T, -1)
        k = qkvz[..., dk:2 * dk].reshape(T, -1)
        v = qkvz[..., 2 * dk:2 * dk + r * dv].reshape(T, -1)
        z = qkvz[..., 2 * dk + r * dv:].reshape(T, HV, dv)
        ba = lin(x, W[p + "in_proj_ba.weight"]).reshape(T, HK, 2 * r)
        b, a = ba[..., :r].reshape(T, HV), ba[..., r:].reshape(T, HV)
        qkv = np.concatenate([q, k, v], -1)
    else:  # flat [q | k | v]
        qkv = lin(x, W[p + "in_proj_qkv.weight"])
        z = lin(x, W[p + "in_proj_z.weight"]).reshape(T, HV, dv)
        b, a = lin(x, W[p + "in_proj_b.weight"]), lin(x, W[p + "in_proj_a.weight"])
    cw = W[p + "conv1d.weight"][:, 0, :]  # [C, Kc], tap Kc-1 = current token
    padded = np.concatenate([np.zeros((Kc - 1, qkv.shape[1])), qkv], 0)
    conv = np.stack([silu((padded[t:t + Kc] * cw.T).sum(0)) for t in range(T)])
    q = conv[:, :HK * dk].reshape(T, HK, dk)
    k = conv[:, HK * dk:2 * HK * dk].reshape(T, HK, dk)
    v = conv[:, 2 * HK * dk:].reshape(T, HV, dv)
    l2 = lambda u: u / np.sqrt((u * u).sum(-1, keepdims=True) + 1e-6)
    q, k = l2(q) * dk ** -0.5, l2(k)
    beta = sigmoid(b)
    g = -np.exp(W[p + "A_log"]) * softplus(a + W[p + "dt_bias"])
    S = np.zeros((HV, dk, dv))
    o = np.zeros((T, HV, dv))
    states = {}
    for t in range(T):
        for h in range(HV):
            kh = h // r  # consecutive value heads share a key head
            S[h] *= np.exp(g[t, h])
            S[h] += np.outer(k[t, kh], beta[t, h] * (v[t, h] - S[h].T @ k[t, kh]))
            o[t, h] = S[h].T @ q[t, kh]
        states[t] = S.copy()
    y = rms(o, W[p + "norm.weight"], cfg["rms_norm_eps"]) * silu(z)  # plain-w gated norm
    return lin(y.reshape(T, -1), W[p + "out_proj.weight"]), qkv, states


def qwen_attn(cfg, W, p, x, pos):
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]; T = x.shape[0]
    rp = cfg["rope_parameters"]; rot = int(hd * rp["partial_rotary_factor"])
    qg = lin(x, W[p + "q_proj.weight"]).reshape(T, H, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T, H * hd)
    q = rms(q, W[p + "q_norm.weight"], eps, True).transpose(1, 0, 2)
    k = rms(lin(x, W[p + "k_proj.weight"]).reshape(T, KV, hd), W[p + "k_norm.weight"], eps, True).transpose(1, 0, 2)
    v = lin(x, W[p + "v_proj.weight"]).reshape(T, KV, hd).transpose(1, 0, 2)
    inv = inv_freq_default(rp["rope_theta"], rot)
    q, k = rope_half(q, pos, inv, rot), rope_half(k, pos, inv, rot)
    o = attend(q, k, v, hd ** -0.5).transpose(1, 0, 2).reshape(T, -1)
    return lin(o * sigmoid(gate), W[p + "o_proj.weight"])

def qwen_moe(cfg, W, p, x):
    E, K = cfg["num_experts"], cfg["num_experts_per_tok"]
    logits = lin(x, W[p + "gate.weight"])
    pr = np.exp(logits - logits.max(-1, keepdims=True)); pr /= pr.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        idx = np.argsort(-pr[t])[:K]; w = pr[t, idx]
        if cfg["norm_topk_prob"]:
            w = w / w.sum()
        for e, we in zip(idx, w):
            q = p + f"experts.{e}."
            out[t] += we * swiglu(x[t], W[q + "gate_proj.weight"], W[q + "up_proj.weight"], W[q + "down_proj.weight"])
    sh = swiglu(x, W[p + "shared_expert.gate_proj.weight"], W[p + "shared_expert.up_proj.weight"], W[p + "shared_expert.down_proj.weight"])
    return out + sigmoid(lin(x, W[p + "shared_expert_gate.weight"])) * sh

STEP_END = {"prefill": 4, "decode_1": 5, "decode_2": 6}  # last position covered by each call


def run_gdn(name, fused):
    cfg, W, exp, ids, want = load(name)
    eps = cfg["rms_norm_eps"]
    Kc = cfg["linear_conv_kernel_dim"]
    T = ids.shape[1]
    pos = np.arange(T, dtype=float)
    logits, serr = [], 0.0
    for bi in range(ids.shape[0]):
        h = W["model.embed_tokens.weight"][ids[bi]]
        for li, lt in enumerate(cfg["layer_types"]):
            p = f"model.layers.{li}."
            x = rms(h, W[p + "input_layernorm.weight"], eps, True)
            if lt == "linear_attention":
                out, raw, states = gdn_layer(cfg, W, p + "linear_attn.", x, fused)
                h = h + out
                for step, t in STEP_END.items():
                    conv_state = raw[t - Kc + 1:t + 1].T  # last Kc raw rows, oldest first
                    serr = max(serr, np.abs(exp[f"recurrent_state_{li}_{step}"][bi] - states[t]).max(),
                               np.abs(exp[f"conv_state_{li}_{step}"][bi] - conv_state).max())
            else:
                h = h + qwen_attn(cfg, W, p + "self_attn.", x, pos)
            x = rms(h, W[p + "post_attention_layernorm.weight"], eps, True)
            if "num_experts" in cfg:
                h = h + qwen_moe(cfg, W, p + "mlp.", x)
            else:
                h = h + swiglu(x, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"],
                               W[p + "mlp.down_proj.weight"])
        logits.append(lin(rms(h, W["model.norm.weight"], eps, True), W["lm_head.weight"]))
    return np.stack(logits), want, serr


# ---------------- DeepSeek-V3 ----------------
def run_deepseek(name):
    cfg, W, exp, ids, want = load(name)
    eps = cfg["rms_norm_eps"]; T = ids.shape[1]; pos = np.arange(T, dtype=float)
    H, dn, dr, dvh, rkv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    rp = cfg["rope_parameters"]; scale = (dn + dr) ** -0.5; af = 1.0
    if rp["rope_type"] == "yarn":
        inv, af = yarn(rp["rope_theta"], dr, rp["factor"], rp["beta_fast"], rp["beta_slow"], rp["original_max_position_embeddings"], True, rp.get("mscale"), rp.get("mscale_all_dim"))
        m = 0.1 * rp["mscale_all_dim"] * math.log(rp["factor"]) + 1.0
        scale *= m * m
    else:
        inv = inv_freq_default(rp["rope_theta"], dr)
    rope = rope_interleaved if cfg["rope_interleave"] else (lambda x, pos, inv, af: rope_half(x, pos, inv, None, af))
    out = []
    for bi in range(ids.shape[0]):
        h = W["model.embed_tokens.weight"][ids[bi]]
        for li in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{li}."; a = p + "self_attn."
            x = rms(h, W[p + "input_layernorm.weight"], eps)
            if cfg["q_lora_rank"]:
                q = lin(rms(lin(x, W[a + "q_a_proj.weight"]), W[a + "q_a_layernorm.weight"], 1e-6), W[a + "q_b_proj.weight"])
            else:
                q = lin(x, W[a + "q_proj.weight"])
            q = q.reshape(T, H, dn + dr).transpose(1, 0, 2)
            kva = lin(x, W[a + "kv_a_proj_with_mqa.weight"])
            ckv = rms(kva[:, :rkv], W[a + "kv_a_layernorm.weight"], 1e-6)
            kpe = rope(kva[None, :, rkv:], pos, inv, af)
            qpe = rope(q[..., dn:], pos, inv, af)
            kv = lin(ckv, W[a + "kv_b_proj.weight"]).reshape(T, H, dn + dvh).transpose(1, 0, 2)
            k = np.concatenate([kv[..., :dn], np.broadcast_to(kpe, (H, T, dr))], -1)
            qq = np.concatenate([q[..., :dn], qpe], -1)
            o = attend(qq, k, kv[..., dn:], scale).transpose(1, 0, 2).reshape(T, -1)
            h = h + lin(o, W[a + "o_proj.weight"])
            x = rms(h, W[p + "post_attention_layernorm.weight"], eps)
            m_ = p + "mlp."
            if li < cfg["first_k_dense_replace"]:
                h = h + swiglu(x, W[m_ + "gate_proj.weight"], W[m_ + "up_proj.weight"], W[m_ + "down_proj.weight"])
                continue
            E, K, G, KG = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_group"], cfg["topk_group"]
            s = sigmoid(lin(x, W[m_ + "gate.weight"])); bsc = s + W[m_ + "gate.e_score_correction_bias"]
            y = swiglu(x, W[m_ + "shared_experts.gate_proj.weight"], W[m_ + "shared_experts.up_proj.weight"], W[m_ + "shared_experts.down_proj.weight"])
            for t in range(T):
                gs = np.sort(bsc[t].reshape(G, E // G), -1)[:, -2:].sum(-1)
                keep = np.argsort(-gs)[:KG]
                cand = np.full(E, -np.inf)
                for g_ in keep:
                    cand[g_ * E // G:(g_ + 1) * E // G] = bsc[t, g_ * E // G:(g_ + 1) * E // G]
                idx = np.argsort(-cand)[:K]; w = s[t, idx]
                w = w / (w.sum() + 1e-20) * cfg["routed_scaling_factor"]
                for e, we in zip(idx, w):
                    q_ = m_ + f"experts.{e}."
                    y[t] += we * swiglu(x[t], W[q_ + "gate_proj.weight"], W[q_ + "up_proj.weight"], W[q_ + "down_proj.weight"])
            h = h + y
        out.append(lin(rms(h, W["model.norm.weight"], eps), W["lm_head.weight"]))
    return np.stack(out), want

# ---------------- plain attention families ----------------
def run_attn(name):
    cfg, W, exp, ids, want = load(name)
    mt = cfg["model_type"]; eps = cfg["rms_norm_eps"]; T = ids.shape[1]; pos = np.arange(T, dtype=float)
    H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    hd = cfg.get("head_dim") or D // H
    gemma = mt in ("gemma2", "gemma3_text")
    out = []
    for bi in range(ids.shape[0]):
        h = W["model.embed_tokens.weight"][ids[bi]] * (math.sqrt(D) if gemma else 1.0)
        for li in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{li}."; a = p + "self_attn."
            lt = (cfg.get("layer_types") or ["full_attention"] * 99)[li]
            window = cfg.get("sliding_window") if (lt == "sliding_attention" or mt in ("mistral", "phi3")) else None
            rp = cfg["rope_parameters"]; af = 1.0
            if mt == "gemma3_text":
                rp = rp[lt]
            x = h if mt == "olmo2" else rms(h, W[p + "input_layernorm.weight"], eps, gemma)
            if mt == "phi3":
                qkv = lin(x, W[a + "qkv_proj.weight"])
                q, k, v = qkv[:, :H * hd], qkv[:, H * hd:(H + KV) * hd], qkv[:, (H + KV) * hd:]
            else:
                bias = (lambda n: W.get(a + n + ".bias"))
                q = lin(x, W[a + "q_proj.weight"], bias("q_proj")); k = lin(x, W[a + "k_proj.weight"], bias("k_proj"))
                v = lin(x, W[a + "v_proj.weight"], bias("v_proj"))
            if mt == "olmo2":
                q = rms(q, W[a + "q_norm.weight"], eps); k = rms(k, W[a + "k_norm.weight"], eps)
            q = q.reshape(T, H, hd).transpose(1, 0, 2); k = k.reshape(T, KV, hd).transpose(1, 0, 2)
            v = v.reshape(T, KV, hd).transpose(1, 0, 2)
            if mt == "gemma3_text":
                q = rms(q, W[a + "q_norm.weight"], eps, True); k = rms(k, W[a + "k_norm.weight"], eps, True)
            rot = int(hd * rp.get("partial_rotary_factor", 1.0))
            if rp["rope_type"] == "yarn":
                inv, af = yarn(rp["rope_theta"], rot, rp["factor"], rp["beta_fast"], rp["beta_slow"], rp["original_max_position_embeddings"], rp.get("truncate", True))
            else:
                inv = inv_freq_default(rp["rope_theta"], rot)
                if rp["rope_type"] == "linear":
                    inv = inv / rp["factor"]
            q, k = rope_half(q, pos, inv, rot, af), rope_half(k, pos, inv, rot, af)
            scale = cfg["query_pre_attn_scalar"] ** -0.5 if gemma else hd ** -0.5
            o = attend(q, k, v, scale, window, cfg.get("attn_logit_softcapping") if mt == "gemma2" else None,
                       W.get(a + "sinks")).transpose(1, 0, 2).reshape(T, -1)
            o = lin(o, W[a + "o_proj.weight"], W.get(a + "o_proj.bias"))
            if gemma or mt == "olmo2":
                o = rms(o, W[p + "post_attention_layernorm.weight"], eps, gemma)
            h = h + o
            m = p + "mlp."
            if gemma:
                x = rms(h, W[p + "pre_feedforward_layernorm.weight"], eps, True)
            elif mt == "olmo2":
                x = h
            else:
                x = rms(h, W[p + "post_attention_layernorm.weight"], eps)
            if mt == "phi3":
                gu = lin(x, W[m + "gate_up_proj.weight"]); I = gu.shape[-1] // 2
                y = lin(silu(gu[:, :I]) * gu[:, I:], W[m + "down_proj.weight"])
            elif mt == "gpt_oss":
                y = np.zeros_like(x)
                logits = lin(x, W[m + "router.weight"], W[m + "router.bias"])
                K, lim, al = cfg["num_experts_per_tok"], cfg["swiglu_limit"], cfg["swiglu_alpha"]
                for t in range(T):
                    idx = np.argsort(-logits[t])[:K]; w = np.exp(logits[t, idx] - logits[t, idx].max()); w /= w.sum()
                    for e, we in zip(idx, w):
                        gu = x[t] @ W[m + "experts.gate_up_proj"][e] + W[m + "experts.gate_up_proj_bias"][e]
                        g_, u_ = np.minimum(gu[0::2], lim), np.clip(gu[1::2], -lim, lim)
                        act = (u_ + 1) * g_ * sigmoid(al * g_)
                        y[t] += we * (act @ W[m + "experts.down_proj"][e] + W[m + "experts.down_proj_bias"][e])
            else:
                act = gelu_tanh if gemma else silu
                y = swiglu(x, W[m + "gate_proj.weight"], W[m + "up_proj.weight"], W[m + "down_proj.weight"], act)
            if gemma or mt == "olmo2":
                y = rms(y, W[p + "post_feedforward_layernorm.weight"], eps, gemma)
            h = h + y
        z = lin(rms(h, W["model.norm.weight"], eps, gemma), W.get("lm_head.weight", W["model.embed_tokens.weight"]))
        if cfg.get("final_logit_softcapping"):
            c = cfg["final_logit_softcapping"]; z = np.tanh(z / c) * c
        out.append(z)
    return np.stack(out), want

# ---------------- Muse Spark ----------------
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def nvfp4(W, stem):
    """[out, in] weight of one compressed-tensors NVFP4 module: byte j of a row
    holds inputs 2j (low nibble) and 2j + 1; nibble = sign bit 3, e2m1 magnitude
    bits 0-2; weight = e2m1 x (e4m3 block scale of its 16 inputs / global scale)."""
    packed = W[stem + "weight_packed"].astype(np.int64)
    nib = np.stack([packed & 15, packed >> 4], -1).reshape(packed.shape[0], -1)
    val = E2M1[nib & 7] * np.where(nib & 8, -1.0, 1.0)
    scale = W[stem + "weight_scale"] / W[stem + "weight_global_scale"][0]
    return val * np.repeat(scale, 16, axis=1)


def muse_experts(W, m_, E):
    """Per expert (gate [I, Dm], up [I, Dm], down [Dm, I]): the fused bf16
    tensors (gate rows then up rows of gate_up_proj) or the NVFP4 modules."""
    if m_ + "experts.gate_up_proj" in W:
        gu, dn = W[m_ + "experts.gate_up_proj"], W[m_ + "experts.down_proj"]
        I = gu.shape[1] // 2
        return [(gu[e, :I], gu[e, I:], dn[e]) for e in range(E)]
    return [tuple(nvfp4(W, f"{m_}experts.{e}.{p}.") for p in ("gate_proj", "up_proj", "down_proj"))
            for e in range(E)]


def run_muse(name):
    cfg, W, exp, ids, want = load(name)
    c = cfg["text_config"]
    eps, peps = c["rms_norm_eps"], c["post_norm_eps"]
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, K, tau = c["num_local_experts"], c["num_experts_per_tok"], c["residual_gate_temperature"]
    mult, cap = c["output_multiplier"], c["final_logit_softcapping"]
    T = ids.shape[1]; pos = np.arange(T, dtype=float)
    inv = inv_freq_default(c["rope_parameters"]["rope_theta"], hd)  # one theta for every RoPE layer
    P = "model.language_model."

    def gate(h, branch, g):
        u = g / tau
        beta = sigmoid(u)
        alpha = np.sqrt(np.maximum(sigmoid(-u) * (1 + beta), 1e-3))
        return alpha * h + beta * branch

    experts = {li: muse_experts(W, f"{P}layers.{li}.mlp.", E) for li in range(c["num_hidden_layers"])
               if c["mlp_layer_types"][li] == "sparse"}
    out = []
    for bi in range(ids.shape[0]):
        h = rms(W[P + "embed_tokens.weight"][ids[bi]], None, eps)
        for li in range(c["num_hidden_layers"]):
            p = f"{P}layers.{li}."; a = p + "self_attn."
            x = rms(h, W[p + "input_layernorm.weight"], eps, True)
            q = rms(lin(x, W[a + "q_proj.weight"]).reshape(T, H, hd), None, eps) * c["qk_scale_factor"]
            k = rms(lin(x, W[a + "k_proj.weight"]).reshape(T, KV, hd), None, eps)
            v = lin(x, W[a + "v_proj.weight"]).reshape(T, KV, hd)
            q, k, v = (t.transpose(1, 0, 2) for t in (q, k, v))
            if c["layer_rope_theta"][li]:
                q, k = rope_half(q, pos, inv), rope_half(k, pos, inv)
            window = c["sliding_window"] if c["layer_types"][li] == "sliding_attention" else None
            o = rms(attend(q, k, v, hd ** -0.5, window), None, eps)  # per-head RMS, no weight
            o = o.transpose(1, 0, 2).reshape(T, -1) * sigmoid(lin(x, W[a + "gate_proj.weight"]))
            o = rms(lin(o, W[a + "o_proj.weight"]), None, peps)
            h = gate(h, o, W[p + "post_attention_residual_gate.gate"])
            x = rms(h, W[p + "pre_feedforward_layernorm.weight"], eps, True)
            m_ = p + "mlp."
            if c["mlp_layer_types"][li] == "sparse":
                s = sigmoid(lin(x, W[m_ + "gate.weight"]) * mult)
                b = s + W[m_ + "gate.e_score_correction_bias"]
                z = rms(lin(x, W[m_ + "pre_expert_proj.weight"]), W[m_ + "pre_expert_norm.weight"], eps, True)
                wpost = 1 + W[m_ + "experts.post_expert_norm.weight"]
                acc = np.zeros_like(z)
                for t in range(T):
                    idx = np.argsort(-b[t])[:K]
                    w = s[t, idx] / (s[t, idx].sum() + 1e-15) * c["routed_scaling_factor"]
                    for e, we in zip(idx, w):
                        g_, u_, d_ = experts[li][e]
                        acc[t] += we * rms(swiglu(z[t], g_, u_, d_) * wpost, None, peps)
                y = lin(acc, W[m_ + "post_expert_proj.weight"])
            else:
                y = swiglu(x, W[m_ + "gate_proj.weight"], W[m_ + "up_proj.weight"], W[m_ + "down_proj.weight"])
            y = rms(y * (1 + W[p + "post_feedforward_layernorm.weight"]), None, peps)
            h = gate(h, y, W[p + "post_feedforward_residual_gate.gate"])
        z = lin(rms(h, W[P + "norm.weight"], eps), W["lm_head.weight"]) * mult
        out.append(cap * np.tanh(z / cap))
    return np.stack(out), want


WAVE2 = ["qwen3_5", "qwen3_next", "deepseek_v3", "deepseek_v3_nolora", "mistral", "gemma2",
         "gemma3_text", "olmo2", "gpt_oss", "phi3", "muse_spark", "muse_spark_nvfp4"]


def main(names) -> int:
    bad = 0
    for name in names or WAVE2:
        serr = None
        if name in ("qwen3_5", "qwen3_next"):
            got, want, serr = run_gdn(name, name == "qwen3_next")
        elif name.startswith("deepseek"):
            got, want = run_deepseek(name)
        elif name.startswith("muse_spark"):
            got, want = run_muse(name)
        else:
            got, want = run_attn(name)
        err = float(np.abs(got - want).max())
        ok = err < 1e-4 and (serr is None or serr < 1e-4)
        bad += not ok
        extra = "" if serr is None else f", max|state diff| = {serr:.2e}"
        print(f"crosscheck {name}: max|logit diff| = {err:.2e}{extra} {'OK' if ok else 'FAIL'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
