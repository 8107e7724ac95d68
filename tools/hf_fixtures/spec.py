"""What each Hugging Face parity fixture is: one ``FixtureSpec`` per folder of
tests/fixtures/hf, in the order they are generated, and the constants that fix
their bytes (batch, prompt length, seeds, the init scales, the routing margins).

Plain Python: no torch or transformers import, so the project's own venv and
tests can read it. ``build.py`` turns a spec into a fixture, ``verify.py``
re-checks one.

The first five families (llama, qwen2, qwen3, qwen3_moe, mixtral) were written
before the others, with a weight init that reads parameter names
(``init="names"``) and 20 seed attempts; the rest read the class of the module
owning each parameter (``init="owners"``), draw every parameter HF sets to a
constant, and get 50 attempts. Both are kept so every committed fixture
regenerates bit for bit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

B = 2  # batch
T0 = 5  # prefill length
STEPS = ("prefill", "decode_1", "decode_2")
BASE_SEED = 20240601

# Shared tiny geometry.
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    attention_dropout=0.0,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)

# Embedding std.  With RMSNorm in front of every sublayer the absolute scale of
# the residual stream barely matters; this value keeps tied-embedding logits
# (hidden_size ** 0.5 * std after the final norm) around O(2-3).
EMBED_STD = 0.3
ROUTER_SCALE = 4.0
# Fail generation if any token's k-th vs (k+1)-th router logit gap is below this.
MIN_ROUTER_GAP = 0.1
# RMSNorm classes that scale by (1 + w) (weight zero-initialised by HF).
ZERO_CENTRED_NORMS = {"Qwen3_5RMSNorm", "Qwen3NextRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm",
                      "MuseSparkTextCenteredRMSNorm", "MuseSparkTextInputScaledRMSNorm"}
ROUTER_CLASSES = {"Qwen3NextTopKRouter", "DeepseekV3TopkRouter", "GptOssTopKRouter",
                  "MuseSparkTopkRouter"}
# Sigmoid routers (DeepSeek): minimum gap between the chosen and the next
# candidate, in units of biased sigmoid score, for experts and for groups.
MIN_SIGMOID_GAP = 0.005
# An ablated term must move some logit by more than this (parity tolerance is
# 1e-4 of the logit scale, which is O(1) here).
ABLATION_MIN = 1e-2
E_BIAS_STD = 0.1
# A term that the maths makes invisible (a ``no_ops`` entry) may move no logit
# by more than this: float32 rounding only, the bound of the cached-decode vs
# recompute self-check.
NO_OP_MAX = 1e-4
# Muse Spark's residual gate parameters: N(0, 1), so beta = sigmoid(g / 0.3)
# spans ~0.04-0.96 and some channels reach alpha's sqrt(1e-3) floor.
RESIDUAL_GATE_STD = 1.0


@dataclass
class FixtureSpec:
    """One fixture folder: the config and model class to build, their kwargs,
    and how the generator initialises, routes and checks it."""

    name: str  # folder under tests/fixtures/hf
    model_type: str  # what the saved config.json says
    config: str  # transformers config class name
    model: str  # transformers LM class name (a ForCausalLM, or muse_spark's ForConditionalGeneration)
    kwargs: dict
    init: str = "owners"  # "names" (first five families) or "owners"; see build.py
    router: str | None = None  # None, "softmax" (mlp.gate), "gpt_oss" (mlp.router), "deepseek"
    router_scale: float = ROUTER_SCALE
    linear_state: bool = False  # store GDN conv/recurrent states
    # (label, function(config) -> None) pairs; each must move the logits.
    ablations: list[tuple[str, Callable]] = field(default_factory=list)
    attempts: int = 50  # seeds tried until the routing margins are comfortable
    llama3_rope: bool = False  # check and print that llama3 rope scaling changes frequencies
    # None (bf16 as saved) or how the saved bf16 weights are then shipped: "mxfp4"
    # (gpt-oss's native experts), "fp8" (DeepSeek block fp8), "nvfp4" (every
    # linear of the layers) or "nvfp4_experts" (Muse Spark's routed experts);
    # see shipped.py.
    shipped: str | None = None
    # Nested sub-configs of a composite config (``text_config``, ``vision_config``,
    # ``audio_config``), passed to the config class beside ``kwargs``; the saved
    # config.json's sub-configs keep every value given here (build.py checks).
    sub_configs: dict = field(default_factory=dict)
    # (label, function(model) -> None): each edits the reloaded float32 model
    # (a weight set to HF's constant init, a parameter-free op bypassed) and must
    # move the logits by more than ABLATION_MIN, as ``ablations`` do for config terms.
    model_ablations: list[tuple[str, Callable]] = field(default_factory=list)
    # (label, "config" | "model", function): terms the maths makes invisible; each
    # must move no logit by more than NO_OP_MAX (the README states why).
    no_ops: list[tuple[str, str, Callable]] = field(default_factory=list)
    # Save the parameters HF keeps in float32 (``_keep_in_fp32_modules_strict``) as
    # F32 tensors, as a checkpoint saved from a loaded model has them (values stay
    # bf16-exact); the other families store every tensor in bf16.
    keep_fp32: bool = False
    # Reject a seed (and try the next) whose cached decode and full recompute differ
    # by 1e-4 or more, instead of failing: for families whose attention is sharp
    # enough (Muse Spark's q scale) that float32 rounding alone gets near that.
    cache_retry: bool = False


def family_seed(name: str) -> int:
    # Stable (not Python's salted hash()).
    return BASE_SEED + sum((i + 1) * ord(c) for i, c in enumerate(name))


def llama_rope_params(head_dim: int) -> dict:
    """Llama-3.2-style rope scaling; checked to actually alter frequencies."""
    return dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                high_freq_factor=4.0, original_max_position_embeddings=8192)


def _without(d: dict, *keys) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


def _set(**kw):
    def fn(cfg):
        for k, v in kw.items():
            setattr(cfg, k, v)

    return fn


def _set_text(**kw):
    """Set fields of a composite config's ``text_config``."""
    def fn(cfg):
        for k, v in kw.items():
            setattr(cfg.text_config, k, v)

    return fn


def _set_rope(**kw):
    def fn(cfg):
        cfg.rope_parameters = dict(cfg.rope_parameters, **kw)

    return fn


def _first(name: str, cls: str, **kwargs) -> FixtureSpec:
    """A first-generation family: model_type = folder, name-based init, MoE
    routing counted on ``mlp.gate``, 20 seed attempts."""
    moe = "num_experts" in kwargs or "num_local_experts" in kwargs
    return FixtureSpec(name, name, f"{cls}Config", f"{cls}ForCausalLM",
                       dict(TINY, hidden_act="silu", **kwargs), init="names",
                       router="softmax" if moe else None, attempts=20,
                       llama3_rope=name == "llama")


def _gdn_kwargs(**extra) -> dict:
    return dict(
        _without(TINY, "num_hidden_layers", "head_dim"),
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        hidden_act="silu",
        tie_word_embeddings=False,
        attention_bias=False,
        **extra,
    )


def _deepseek_kwargs(**extra) -> dict:
    return dict(
        _without(TINY, "num_key_value_heads", "head_dim"),
        num_key_value_heads=4,  # MLA: HF repeats nothing; must equal the head count
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        moe_intermediate_size=32,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        first_k_dense_replace=1,
        norm_topk_prob=True,
        hidden_act="silu",
        tie_word_embeddings=False,
        attention_bias=False,
        num_mtp_layers=0,
    ) | extra


DEFAULT_ROPE = dict(rope_type="default", rope_theta=1000000.0)
QWEN_DENSE = dict(tie_word_embeddings=False, attention_bias=False, use_sliding_window=False,
                  sliding_window=None)


def first_generation() -> list[FixtureSpec]:
    """llama, qwen2, qwen3, qwen3_moe, mixtral."""
    return [
        _first("llama", "Llama", rope_parameters=llama_rope_params(TINY["head_dim"]),
               tie_word_embeddings=True, attention_bias=False, mlp_bias=False),
        _first("qwen2", "Qwen2", rope_parameters=dict(DEFAULT_ROPE), tie_word_embeddings=True,
               use_sliding_window=False, sliding_window=None,
               max_window_layers=TINY["num_hidden_layers"]),
        _first("qwen3", "Qwen3", rope_parameters=dict(DEFAULT_ROPE), **QWEN_DENSE,
               max_window_layers=TINY["num_hidden_layers"]),
        _first("qwen3_moe", "Qwen3Moe", rope_parameters=dict(DEFAULT_ROPE), **QWEN_DENSE,
               num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
               norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
               output_router_logits=False, router_aux_loss_coef=0.001),
        _first("mixtral", "Mixtral", rope_parameters=dict(DEFAULT_ROPE), tie_word_embeddings=False,
               sliding_window=None, num_local_experts=4, num_experts_per_tok=2,
               output_router_logits=False, router_jitter_noise=0.0),
    ]


def second_generation() -> list[FixtureSpec]:
    """Hybrid linear attention (Gated DeltaNet), MLA with group-limited sigmoid
    routing, sliding windows, soft-capping, sinks, fused projections."""
    deepseek_yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, beta_fast=32.0,
                         beta_slow=1.0, mscale=1.0, mscale_all_dim=0.8,
                         original_max_position_embeddings=4096)
    gpt_oss_yarn = dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                        beta_slow=1.0, truncate=False, original_max_position_embeddings=4096)
    theta_1e4 = dict(rope_type="default", rope_theta=10000.0)
    return [
        FixtureSpec(
            "qwen3_5", "qwen3_5_text", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
            _gdn_kwargs(
                rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                     partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                                     mrope_interleaved=True),
                attn_output_gate=True),
            linear_state=True),
        FixtureSpec(
            "qwen3_next", "qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM",
            _gdn_kwargs(
                rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                     partial_rotary_factor=0.25),
                num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=64, norm_topk_prob=True, decoder_sparse_step=1,
                mlp_only_layers=[], output_router_logits=False, router_aux_loss_coef=0.001),
            router="softmax", linear_state=True),
        FixtureSpec(
            "deepseek_v3", "deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM",
            _deepseek_kwargs(n_group=2, topk_group=1, max_position_embeddings=163840,
                             rope_parameters=deepseek_yarn),
            router="deepseek", router_scale=2.0,
            ablations=[
                ("rope_interleave=False", _set(rope_interleave=False)),
                ("topk_group=n_group (no group limit)", _set(topk_group=2)),
                ("routed_scaling_factor=1", _set(routed_scaling_factor=1.0)),
                ("mscale_all_dim=mscale", _set_rope(mscale_all_dim=1.0)),
            ]),
        FixtureSpec(
            "deepseek_v3_nolora", "deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM",
            _deepseek_kwargs(q_lora_rank=None, n_group=1, topk_group=1,
                             rope_parameters=dict(theta_1e4)),
            router="deepseek", router_scale=2.0,
            ablations=[("rope_interleave=False", _set(rope_interleave=False))]),
        FixtureSpec(
            "mistral", "mistral", "MistralConfig", "MistralForCausalLM",
            dict(TINY, hidden_act="silu", rope_parameters=dict(theta_1e4), sliding_window=4,
                 tie_word_embeddings=False),
            ablations=[("sliding_window=None", _set(sliding_window=None))]),
        FixtureSpec(
            "gemma2", "gemma2", "Gemma2Config", "Gemma2ForCausalLM",
            dict(TINY, hidden_activation="gelu_pytorch_tanh", rope_parameters=dict(theta_1e4),
                 query_pre_attn_scalar=24, sliding_window=4,
                 layer_types=["sliding_attention", "full_attention"],
                 attn_logit_softcapping=5.0, final_logit_softcapping=4.0,
                 tie_word_embeddings=True, attention_bias=False),
            ablations=[
                ("sliding_window=64", _set(sliding_window=64)),
                ("attn_logit_softcapping=None", _set(attn_logit_softcapping=None)),
                ("final_logit_softcapping=None", _set(final_logit_softcapping=None)),
                ("query_pre_attn_scalar=head_dim", _set(query_pre_attn_scalar=16)),
            ]),
        FixtureSpec(
            "gemma3_text", "gemma3_text", "Gemma3TextConfig", "Gemma3ForCausalLM",
            dict(_without(TINY, "num_hidden_layers"), num_hidden_layers=6,
                 hidden_activation="gelu_pytorch_tanh",
                 rope_parameters={
                     "sliding_attention": dict(theta_1e4),
                     "full_attention": dict(rope_type="linear", rope_theta=1000000.0, factor=8.0),
                 },
                 query_pre_attn_scalar=24, sliding_window=4,
                 layer_types=["sliding_attention"] * 5 + ["full_attention"],
                 final_logit_softcapping=None, attn_logit_softcapping=None,
                 tie_word_embeddings=True, attention_bias=False),
            ablations=[
                ("sliding_window=64", _set(sliding_window=64)),
                ("query_pre_attn_scalar=head_dim", _set(query_pre_attn_scalar=16)),
                ("local rope theta = global", lambda c: c.rope_parameters.__setitem__(
                    "sliding_attention", dict(rope_type="default", rope_theta=1000000.0))),
            ]),
        FixtureSpec(
            "olmo2", "olmo2", "Olmo2Config", "Olmo2ForCausalLM",
            dict(_without(TINY, "head_dim"), hidden_act="silu",
                 rope_parameters=dict(rope_type="default", rope_theta=500000.0),
                 tie_word_embeddings=False, attention_bias=False)),
        FixtureSpec(
            "gpt_oss", "gpt_oss", "GptOssConfig", "GptOssForCausalLM",
            dict(TINY, rms_norm_eps=1e-5, max_position_embeddings=131072,
                 intermediate_size=96,  # != hidden, so [E, in, out] vs [E, out, in] shows
                 num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                 layer_types=["sliding_attention", "full_attention"], attention_bias=True,
                 swiglu_limit=1.5, tie_word_embeddings=False, output_router_logits=False,
                 rope_parameters=gpt_oss_yarn),
            router="gpt_oss",
            ablations=[
                ("sliding_window=64", _set(sliding_window=64)),
                ("swiglu_limit=7", _set(swiglu_limit=7.0)),
            ]),
        FixtureSpec(
            "phi3", "phi3", "Phi3Config", "Phi3ForCausalLM",
            dict(_without(TINY, "head_dim"), rms_norm_eps=1e-5, hidden_act="silu",
                 rope_parameters=dict(theta_1e4, partial_rotary_factor=0.75),
                 original_max_position_embeddings=256, sliding_window=None,
                 tie_word_embeddings=True, resid_pdrop=0.0, embd_pdrop=0.0),
            ablations=[("partial_rotary_factor=1", _set_rope(partial_rotary_factor=1.0))]),
    ]


# Two checkpoints quantized as their producers ship them (issue 33).
# gpt-oss-20b's config.json: everything but the experts stays bf16.
GPT_OSS_MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
# DeepSeek-V3.1's config.json: 128 x 128 blocks, power-of-two scales (ue8m0).
DEEPSEEK_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}


# llm-compressor's NVFP4A16 (weight-only) config.json: every Linear of the
# layers, e4m3 block scales per 16 inputs and an f32 global scale per module.
QWEN3_NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
               "quantization_status": "compressed", "ignore": ["lm_head"],
               "config_groups": {"group_0": {
                   "targets": ["Linear"], "format": "nvfp4-pack-quantized",
                   "weights": {"num_bits": 4, "type": "float", "symmetric": True,
                               "group_size": 16, "strategy": "tensor_group",
                               "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"}}}}


def shipped_quantized() -> list[FixtureSpec]:
    """gpt-oss with its experts in OpenAI's MXFP4 ``*_blocks`` / ``*_scales``,
    a DeepSeek-V3 in block fp8 whose routed experts' down projections
    have 64 inputs, half a 128-wide block (every other quantized input width
    is 128), and a qwen3 in compressed-tensors NVFP4."""
    gpt_oss = next(s for s in second_generation() if s.name == "gpt_oss")
    qwen3 = next(s for s in first_generation() if s.name == "qwen3")
    return [
        FixtureSpec(
            "gpt_oss_mxfp4", "gpt_oss", "GptOssConfig", "GptOssForCausalLM",
            # intermediate 128: both expert matrices are whole 64-row e2m1 code
            # tiles, so the experts load (and run) as MXFP4 codes
            dict(gpt_oss.kwargs, intermediate_size=128), router="gpt_oss", shipped="mxfp4"),
        FixtureSpec(
            "deepseek_v3_fp8", "deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM",
            # Every quantized matrix is whole 128 x 128 blocks (q_b 4 x 64 rows,
            # kv_b 4 x 96) or one cut-short block: transformers 5.24 derives the
            # block from the scale grid (rows / scale rows), right for those two
            # cases only. Inputs split over 2 cores stay whole blocks per core
            # (o_proj 4 x 64, dense down 256, shared down 4 x 64).
            _deepseek_kwargs(
                hidden_size=128, q_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=32,
                v_head_dim=64, intermediate_size=256, n_routed_experts=4,
                moe_intermediate_size=64, n_shared_experts=4, n_group=1, topk_group=1,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
            router="deepseek", router_scale=2.0, shipped="fp8"),
        # qwen3 with every linear of its layers in NVFP4 (compressed-tensors,
        # read by transformers through compressed-tensors' own decompression);
        # widths doubled so each of 2 cores holds whole 64-row e2m1 code tiles
        # of o_proj and down (4 heads x 32, intermediate 256)
        dataclasses.replace(qwen3, name="qwen3_nvfp4", shipped="nvfp4", ablations=[],
                            kwargs=dict(qwen3.kwargs, hidden_size=128, head_dim=32,
                                        intermediate_size=256)),
    ]


# --- Muse Spark (issue 34): transformers >= 5.25, models/muse_spark -----------

def _each(cls: str, fn: Callable) -> Callable:
    """fn(module) on every module of class ``cls``; fails if there is none."""
    def go(model):
        hits = [m for m in model.modules() if type(m).__name__ == cls]
        assert hits, f"no {cls} in the model"
        for m in hits:
            fn(m)

    return go


def _fill(suffix: str, value: float) -> Callable:
    """Every parameter or buffer whose name ends with ``suffix`` set to ``value``
    (HF's constant init of that term)."""
    def go(model):
        hits = [t for n, t in [*model.named_parameters(), *model.named_buffers()]
                if n.endswith(suffix)]
        assert hits, f"no tensor named *{suffix}"
        for t in hits:
            t.data.fill_(value)

    return go


def _bypass(attr: str) -> Callable:
    """module.<attr> (a parameter-free op) replaced by the identity."""
    def go(module):
        getattr(module, attr).forward = lambda x: x

    return go


def _negate(suffix: str) -> Callable:
    def go(model):
        for n, p in model.named_parameters():
            if n.endswith(suffix):
                p.data.neg_()

    return go


def _towers_zeroed(model):
    """Every vision and audio tower weight set to zero: the text logits must not see it."""
    for n, p in model.named_parameters():
        if not n.startswith(("model.language_model.", "lm_head.")):
            p.data.zero_()


# The text model: the shapes of the public checkpoint scaled down, every term at a
# value that shows at the parity tolerance. Four layers make HF's default pattern
# (full attention / NoPE every 4th layer counted from the last) S S S F; given
# explicitly, and build.py holds them (DERIVED) to what HF derives without them.
MUSE_TEXT = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,   # the dense MLP's width: unused, every layer is sparse
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    layer_types=["sliding_attention"] * 3 + ["full_attention"],
    layer_rope_theta=[500000.0] * 3 + [0],
    mlp_layer_types=["sparse"] * 4,
    rope_parameters=dict(rope_type="default", rope_theta=500000.0),
    sliding_window=4,        # keys per query including itself; the sequences are 7 long
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    post_norm_eps=1e-8,
    qk_scale_factor=5.4730064863875,
    output_multiplier=2.0,   # 1/sqrt(hidden / 256), the public checkpoint's rule; 2^-2.5 there
    final_logit_softcapping=4.0,  # 20 in the public checkpoint
    residual_gate_temperature=0.3,
    moe_hidden_size=32,      # latent width, < hidden
    moe_intermediate_size=64,
    num_local_experts=8,
    num_experts_per_tok=2,
    routed_scaling_factor=1.0,
    num_shared_experts=0,    # not a transformers field; the public config.json carries it
    hidden_act="silu",
    attention_bias=False,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)
# Text-config fields HF's __post_init__ derives when absent.
DERIVED = ("layer_types", "layer_rope_theta", "mlp_layer_types")
# Tiny towers: present, drawn and saved, never on the text path.
MUSE_VISION = dict(patch_size=2, pos_emb_height=2, pos_emb_width=2, num_attention_heads=2,
                   num_hidden_layers=1, hidden_size=8, intermediate_size=16, patch_temporal=1,
                   merge_size=1, max_position_embeddings=4,
                   rope_parameters=dict(rope_type="axial", rope_theta=10000.0))
MUSE_AUDIO = dict(patch_sizes=[2, 2], hidden_sizes=[4, 8], depths=[1, 1], num_hidden_layers=2,
                  mlp_ratio=2.0, conv_kernel_size=3)

# Routed experts as llm-compressor's NVFP4A16 ships them: one Linear per expert
# and projection (``mlp.experts.N.{gate,up,down}_proj``), e4m3 block scales per 16
# inputs and an f32 global scale per module; everything else stays bf16.
MUSE_SPARK_NVFP4 = {
    "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
    "quantization_status": "compressed", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["re:.*mlp\\.experts\\.\\d+\\.(gate|up|down)_proj$"],
        "format": "nvfp4-pack-quantized",
        "weights": {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16,
                    "strategy": "tensor_group", "dynamic": False,
                    "scale_dtype": "torch.float8_e4m3fn"}}}}


def _muse_sub_configs(**text) -> dict:
    t = dict(MUSE_TEXT, **text)
    return dict(text_config=t, vision_config=dict(MUSE_VISION),
                audio_config=dict(MUSE_AUDIO, out_hidden_size=t["hidden_size"]))


def muse_spark() -> list[FixtureSpec]:
    """The whole multimodal checkpoint class (vision and audio towers beside the
    text model), bf16 and with its routed experts in NVFP4."""
    attn, layer = "MuseSparkTextAttention", "MuseSparkTextDecoderLayer"
    bf16 = FixtureSpec(
        "muse_spark", "muse_spark", "MuseSparkConfig", "MuseSparkForConditionalGeneration",
        dict(out_hidden_size=8, projector_hidden_size=16),
        sub_configs=_muse_sub_configs(), router="muse_spark", router_scale=1.0, keep_fp32=True,
        attempts=200, cache_retry=True,
        ablations=[
            ("sliding_window=64", _set_text(sliding_window=64)),
            ("qk_scale_factor=1", _set_text(qk_scale_factor=1.0)),
            ("output_multiplier=1 (router and logits)", _set_text(output_multiplier=1.0)),
            ("final_logit_softcapping=1e6 (no cap)", _set_text(final_logit_softcapping=1e6)),
            ("layer_rope_theta all 5e5 (RoPE on the full layer)",
             _set_text(layer_rope_theta=[500000.0] * 4)),
            ("layer_rope_theta all 0 (NoPE everywhere)", _set_text(layer_rope_theta=[0] * 4)),
            ("residual_gate_temperature=1", _set_text(residual_gate_temperature=1.0)),
        ],
        model_ablations=[
            ("input_layernorm w=0", _fill("input_layernorm.weight", 0.0)),
            ("pre_feedforward_layernorm w=0", _fill("pre_feedforward_layernorm.weight", 0.0)),
            ("post_feedforward_layernorm w=0", _fill("post_feedforward_layernorm.weight", 0.0)),
            ("pre_expert_norm w=0", _fill("pre_expert_norm.weight", 0.0)),
            ("post_expert_norm w=0", _fill("post_expert_norm.weight", 0.0)),
            ("final norm w=1", _fill("language_model.norm.weight", 1.0)),
            ("e_score_correction_bias=0", _fill("e_score_correction_bias", 0.0)),
            ("residual gates g=0", _fill("residual_gate.gate", 0.0)),
            ("residual gate floor 1e-3 removed", _each("MuseSparkResidualGate",
                                                        lambda m: setattr(m, "eps", 0.0))),
            ("attention gate sigmoid(-x W_gate)", _negate("self_attn.gate_proj.weight")),
            ("o_norm bypassed", _each(attn, _bypass("o_norm"))),
            ("qk_norm bypassed", _each(attn, _bypass("qk_norm"))),
            ("post_attention_layernorm bypassed", _each(layer, _bypass("post_attention_layernorm"))),
            ("embed_norm bypassed", _each("MuseSparkTextNormedEmbedding", _bypass("embed_norm"))),
        ],
        no_ops=[
            ("routed_scaling_factor=1.7", "config", _set_text(routed_scaling_factor=1.7)),
            ("layer_rope_theta 1e4 on the RoPE layers", "config",
             _set_text(layer_rope_theta=[10000.0] * 3 + [0])),
            ("vision and audio towers zeroed", "model", _towers_zeroed),
        ])
    # NVFP4: every expert matrix whole 64-row e2m1 code tiles on each of 2 cores
    # (gate_up 64 inputs; down 128 inputs split along the expert width, 64 per
    # core), so hidden 128 (> the latent 64); q/gate/o_proj non-square (4 x 16
    # heads on hidden 128). Two layers (S F, HF's pattern for 2) keep it ~0.5 MB.
    nvfp4 = dataclasses.replace(
        bf16, name="muse_spark_nvfp4", shipped="nvfp4_experts", ablations=[],
        model_ablations=[], no_ops=[],
        sub_configs=_muse_sub_configs(
            hidden_size=128, moe_hidden_size=64, moe_intermediate_size=128, num_hidden_layers=2,
            layer_types=["sliding_attention", "full_attention"],
            layer_rope_theta=[500000.0, 0], mlp_layer_types=["sparse"] * 2))
    return [bf16, nvfp4]


def specs() -> list[FixtureSpec]:
    """Every fixture, in the order the generator writes them."""
    return first_generation() + second_generation() + shipped_quantized() + muse_spark()


def names() -> list[str]:
    return [s.name for s in specs()]
