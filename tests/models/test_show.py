"""describe() prints what a reader needs to recognise a model and its size."""

from megakernel.models import zoo
from megakernel.models.show import describe


def test_describe_dense():
    text = describe(zoo.model("llama-3.2-1b"))
    assert text.startswith("llama-3.2-1b  (bfloat16")
    assert "0-15" in text and "x16" in text
    assert "1,235,814,400" in text and "60,821,504 per layer" in text
    assert "tied to embed" in text
    assert "h_attn[2048] -> k[512]" in text          # per-token shapes
    assert "scaling=llama3" in text
    # 16 layers * (k + v) * 8 kv heads * 64 dims * 2 bytes
    assert f"kv cache: {16 * 2 * 8 * 64 * 2:,} bytes per token" in text


def test_describe_mixed_stacks():
    text = describe(zoo.model("tiny-moe"))
    assert "layer dense:" in text and "layer moe:" in text
    assert "1-2" in text and "x2" in text
    assert "corr_bias" in text and "scale=2.5" in text
    assert "float32" in text                          # the router bias
    assert max(len(line) for line in text.splitlines()) < 200


def test_every_zoo_model_describes():
    for name in zoo.names():
        assert f"{zoo.model(name).param_count:,}" in describe(zoo.model(name))


def test_describe_lists_embed_and_logit_ops():
    text = describe(zoo.model("gemma-2-2b"))
    assert "embed ops: scale factor=48" in text and "logit ops: softcap cap=30" in text
