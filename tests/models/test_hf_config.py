"""Importing Hugging Face config.json files into cards."""

import copy
import json
from pathlib import Path

import pytest

from megakernel.errors import ConfigError
from megakernel.ir.config import build
from megakernel.models import zoo
from megakernel.models.hf import from_hf
from published_configs import QWEN2_5_7B, ZOO_SOURCES

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"

SMALL = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}


def small(**changes):
    out = {**SMALL, **changes}
    return {k: v for k, v in out.items() if v is not None}


# Published in float32; their zoo cards serve them in bfloat16.
_FLOAT32_PUBLISHED = {"gemma-2-2b", "olmo-2-7b"}


@pytest.mark.parametrize("name", sorted(ZOO_SOURCES))
def test_published_config_imports_to_the_zoo_card(name):
    dtype = "bfloat16" if name in _FLOAT32_PUBLISHED else None
    assert from_hf(ZOO_SOURCES[name], name=name, dtype=dtype) == zoo.card(name)


def test_qwen2_has_qkv_bias_and_published_size():
    card = from_hf(QWEN2_5_7B)
    assert card.qkv_bias and not card.o_bias and card.sliding_window is None
    assert build(card).param_count == 7_615_616_512   # Qwen2.5-7B


EXPECTED_FIXTURES = {
    "llama": dict(tie_embeddings=True, rope_theta=5e5, qk_norm=False),
    "qwen2": dict(tie_embeddings=True, qkv_bias=True, rope_theta=1e6),
    "qwen3": dict(tie_embeddings=False, qk_norm=True, rope_theta=1e6),
    "qwen3_moe": dict(qk_norm=True, first_k_dense=0),
    "mixtral": dict(qk_norm=False, rope_theta=1e6),
}


@pytest.mark.parametrize("family", sorted(EXPECTED_FIXTURES))
def test_fixture_configs_import(family):
    card = from_hf(FIXTURES / family / "config.json")
    assert (card.hidden_size, card.num_layers, card.num_q_heads, card.num_kv_heads,
            card.head_dim, card.vocab_size) == (64, 2, 4, 2, 16, 128)
    assert card.max_seq_len == 256          # capped by max_position_embeddings
    assert card.dtype == "bfloat16" and card.name == family
    for field, value in EXPECTED_FIXTURES[family].items():
        assert getattr(card, field) == value, field
    if family == "llama":
        assert card.rope_scaling.rope_type == "llama3" and card.rope_scaling.factor == 8.0
    if family in ("qwen3_moe", "mixtral"):
        assert (card.moe.num_experts, card.moe.top_k, card.moe.renormalize) == (4, 2, True)
        assert card.moe.expert_intermediate == (64 if family == "qwen3_moe" else 128)


def test_folder_and_file_and_dict_agree(tmp_path):
    folder = FIXTURES / "qwen3"
    data = json.loads((folder / "config.json").read_text())
    assert from_hf(folder) == from_hf(folder / "config.json") == from_hf(data, name="qwen3")


def test_all_unsupported_keys_are_listed_at_once():
    cfg = small(mlp_bias=True, foo_bar=3, attn_logit_softcapping=50.0,
                rope_scaling={"rope_type": "longrope", "factor": 4.0})
    with pytest.raises(ConfigError) as err:
        from_hf(cfg)
    text = str(err.value)
    for part in ("mlp_bias", "foo_bar", "3", "attn_logit_softcapping", "50.0", "longrope",
                 "config.json", "4 problems"):
        assert part in text, part


def test_wrong_types_name_the_field():
    with pytest.raises(ConfigError, match=r"hidden_size: '64' should be an integer"):
        from_hf(small(hidden_size="64"))
    with pytest.raises(ConfigError, match=r"tie_word_embeddings: 1 should be true or false"):
        from_hf(small(tie_word_embeddings=1))
    with pytest.raises(ConfigError, match=r"rms_norm_eps: .* should be a number"):
        from_hf(small(rms_norm_eps="1e-6"))


def test_missing_size_and_unknown_family():
    with pytest.raises(ConfigError, match="num_hidden_layers: is required"):
        from_hf(small(num_hidden_layers=None))
    with pytest.raises(ConfigError, match="model_type='gpt2' is not supported"):
        from_hf(small(model_type="gpt2"))


def test_unknown_null_keys_are_harmless():
    assert from_hf(small(quantization_config=None)).num_layers == 2


def test_rope_forms():
    new = from_hf(small(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                         "rope_theta": 5e5}))
    assert new.rope_theta == 5e5 and new.rope_scaling.rope_type == "linear"
    old = from_hf(small(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0}))
    assert old == new
    for kind in ("dynamic", "longrope"):
        with pytest.raises(ConfigError, match=f"'{kind}' is not supported"):
            from_hf(small(rope_scaling={"rope_type": kind, "factor": 2.0}))
    with pytest.raises(ConfigError, match="original_max_position_embeddings: is required"):
        from_hf(small(rope_scaling={"rope_type": "yarn", "factor": 2.0}))
    with pytest.raises(ConfigError, match="differs"):
        from_hf(small(rope_theta=1e4, rope_parameters={"rope_type": "default",
                                                       "rope_theta": 1e6}))


def test_activation_head_dim_and_dtype():
    assert from_hf(small(hidden_act="gelu_pytorch_tanh")).activation == "gelu_tanh"
    assert from_hf(small(hidden_act="gelu")).activation == "gelu"
    with pytest.raises(ConfigError, match="hidden_act: 'relu2'"):
        from_hf(small(hidden_act="relu2"))
    assert from_hf(small()).head_dim == 16                 # hidden / heads
    assert from_hf(small(model_type="qwen3")).head_dim == 128  # Qwen3's default
    assert from_hf(small(torch_dtype="float32")).dtype == "float32"
    assert from_hf(small(dtype="bfloat16")).dtype == "bfloat16"
    with pytest.raises(ConfigError, match="'float16' is not supported"):
        from_hf(small(torch_dtype="float16"))
    assert from_hf(small(torch_dtype="float16"), dtype="float32").dtype == "float32"


def test_attention_bias_and_size_errors():
    card = from_hf(small(attention_bias=True))
    assert card.qkv_bias and card.o_bias
    with pytest.raises(ConfigError, match="config.json"):
        from_hf(small(num_key_value_heads=3))   # the IR rejects it; named by file


def test_sliding_window_only_uniform():
    qwen = small(model_type="qwen2", sliding_window=32, num_hidden_layers=4)
    assert from_hf({**qwen, "use_sliding_window": False}).sliding_window is None
    assert from_hf({**qwen, "use_sliding_window": True,
                    "max_window_layers": 0}).sliding_window == 32
    assert from_hf({**qwen, "use_sliding_window": True,
                    "max_window_layers": 4}).sliding_window is None
    with pytest.raises(ConfigError, match=r"layers \[2, 3\] only"):
        from_hf({**qwen, "use_sliding_window": True, "max_window_layers": 2})
    with pytest.raises(ConfigError, match="one window"):
        from_hf({**qwen, "layer_types": ["full_attention", "sliding_attention"] * 2})
    mixtral = small(model_type="mixtral", sliding_window=4096)
    assert from_hf(mixtral).sliding_window == 4096
    with pytest.raises(ConfigError, match="sliding_window"):
        from_hf(small(sliding_window=4096))   # llama has no sliding window


def _qwen_moe(**changes):
    base = small(model_type="qwen3_moe", num_hidden_layers=4, num_experts=8,
                 num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16)
    return {**base, **changes}


def test_moe_layer_layouts():
    assert from_hf(_qwen_moe()).first_k_dense == 0
    assert from_hf(_qwen_moe()).moe.renormalize is False       # norm_topk_prob default
    assert from_hf(_qwen_moe(mlp_only_layers=[0, 1])).first_k_dense == 2
    assert from_hf(_qwen_moe(mlp_only_layers=[0, 1, 2, 3])).moe is None
    assert from_hf(_qwen_moe(num_experts=0, norm_topk_prob=True)).moe is None
    for bad in (dict(mlp_only_layers=[1]), dict(decoder_sparse_step=2)):
        with pytest.raises(ConfigError, match="all-MoE or the first k layers dense"):
            from_hf(_qwen_moe(**bad))
    both = _qwen_moe(num_local_experts=4)
    with pytest.raises(ConfigError, match="differs from num_local_experts"):
        from_hf(both)


def test_mixtral_routes_softmax_over_top_k():
    card = from_hf(small(model_type="mixtral", num_local_experts=8, num_experts_per_tok=2))
    assert card.moe.scoring == "softmax" and card.moe.renormalize
    assert card.moe.expert_intermediate == card.intermediate_size


def test_input_dict_is_not_modified():
    cfg = copy.deepcopy(ZOO_SOURCES["llama-3.2-1b"])
    from_hf(cfg)
    assert cfg == ZOO_SOURCES["llama-3.2-1b"]
