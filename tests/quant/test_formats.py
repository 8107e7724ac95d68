"""Weight formats as per-parameter data: bytes per format, the card's table and
its named errors, and the shared decode checked against ml_dtypes."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from megakernel import formats
from megakernel import quantize as Q
from megakernel.compiler.tile_weights import row_blocks, slice_ok
from megakernel.errors import IRError
from megakernel.ir.config import ModelConfig, build
from megakernel.ir.serialize import model_from_json, model_to_json
from megakernel.ir.weight_kinds import Quantize
from megakernel.models import zoo
from megakernel.shipped_scales import from_shipped


def test_bytes_per_format_of_a_4096_square_matrix():
    shape = (4096, 4096)
    got = {name: f.shipped_bytes(shape, 2) for name, f in formats.FORMATS.items()}
    n = 4096 * 4096
    assert got == {
        "plain": 2 * n,
        "int8": n + 4096 * 2,                      # bf16 scale per column
        "int4_g32": n // 2 + (4096 // 32) * 4096 * 2,
        "int4_g64": n // 2 + (4096 // 64) * 4096 * 2,
        "int4_g128": n // 2 + (4096 // 128) * 4096 * 2,
        "fp8_b128": n + 32 * 32 * 4,               # f32 per 128 x 128 block, as shipped
        "mxfp4": n // 2 + (4096 // 32) * 4096,     # one E8M0 byte per 32 inputs
        "nvfp4": n // 2 + (4096 // 16) * 4096,     # one e4m3 byte per 16 inputs
    }
    # as the kernel's HBM operands hold them: scales f32 per group and column
    streamed = {name: f.hbm_bytes(shape, 2) for name, f in formats.FORMATS.items()}
    assert streamed == {"plain": 2 * n, "int8": n + 4096 * 4,
                        "int4_g32": n // 2 + n // 32 * 4, "int4_g64": n // 2 + n // 64 * 4,
                        "int4_g128": n // 2 + n // 128 * 4, "fp8_b128": n + n // 128 * 4,
                        "mxfp4": n // 2 + n // 32 * 4, "nvfp4": n // 2 + n // 16 * 4}


def test_row_quantum_is_whole_code_tiles_and_whole_groups():
    assert formats.get("int8").row_quantum(4096) == 32          # [32, 128] int8 tile
    assert formats.get("int4_g32").row_quantum(4096) == 64      # [64, 128] int4 tile
    assert formats.get("int4_g128").row_quantum(4096) == 128
    assert formats.get("fp8_b128").row_quantum(4096) == 128
    assert formats.get("mxfp4").row_quantum(4096) == 64
    assert formats.get("nvfp4").row_quantum(4096) == 64         # 4 groups of 16


def test_blocks_bring_scale_slices_mosaic_can_cut():
    """A row block's f32 scales are sliced from HBM: whole 8-row tiles, or 1, 2
    or 4 rows at a multiple of their size (5 rows fail the TPU compile), or
    all of them (libtpu 0.0.51, tile_weights.slice_ok)."""
    assert row_blocks("fp8_b128", 7168) == ((1024, 7168), (512, 512), (256, 256), (128, 128))
    assert row_blocks("fp8_b128", 1536) == ((1536, 1536), (512, 512), (256, 256), (128, 128))
    assert row_blocks("fp8_b128", 1152) == ((1152, 1152), (128, 128))     # 9 scale rows
    assert row_blocks("int4_g32", 4096) == ((256, 4096), (128, 128), (64, 64))
    assert row_blocks("int8", 4096) == ((32, 4096),)                       # one scale row
    # equal slices (expert chunks): 1, 2, 4, 8 or all 56 scale rows
    ok = [b for b in range(128, 7169, 128) if slice_ok("fp8_b128", 7168, b)]
    assert ok == [128, 256, 512, 1024, 7168]
    assert not slice_ok("fp8_b128", 1920, 640)          # 5 of 15 scale rows
    assert slice_ok("mxfp4", 3072, 128) and not slice_ok("mxfp4", 3072, 192)   # 4 and 6


def test_the_card_chooses_formats_per_weight_kind():
    card = dataclasses.replace(zoo.card("tiny-moe"),
                               quantize=Quantize(experts="mxfp4", dense="int8"))
    model = build(card)
    params = model.params()
    assert params["layers.1.moe.experts_gate"].format == "mxfp4"
    assert params["layers.0.q_proj.weight"].format == "int8"
    assert params["layers.1.moe.router"].format == "plain"
    assert params["embed.weight"].format == "plain"
    assert params["layers.0.input_norm.weight"].format == "plain"
    assert model_from_json(model_to_json(model)) == model
    plain = sum(s.nbytes for s in build(zoo.card("tiny-moe")).params().values())
    assert sum(s.nbytes for s in params.values()) < plain / 2


@pytest.mark.parametrize("table, path, words", [
    ({"experts": "mxfp5"}, "quantize.experts", "unknown weight format 'mxfp5'"),
    ({"embedding": "int8"}, "quantize.embedding", "can only be plain"),
    ({"router": "int4_g32"}, "quantize.router", "can only be plain"),
    ({"expert": "int8"}, "quantize", "unknown fields ['expert']"),
    ({"dense": 8}, "quantize", "dense"),
])
def test_a_bad_quantize_table_is_a_named_error(table, path, words):
    data = zoo.card("tiny-moe").to_dict()
    data["quantize"] = table
    with pytest.raises(IRError) as info:
        ModelConfig.from_dict(data)
    assert path in str(info.value) and words in str(info.value)


def test_a_weight_whose_inputs_do_not_fill_whole_groups_is_named():
    card = dataclasses.replace(zoo.card("tiny-dense"), intermediate_size=320,
                               quantize=Quantize(dense="int4_g128"))
    with pytest.raises(IRError) as info:
        build(card)
    assert "layers.0.mlp.down" in str(info.value) and "multiple of 128" in str(info.value)


def test_a_tied_head_cannot_be_quantized_apart_from_the_embedding():
    card = dataclasses.replace(zoo.card("tiny-dense"), tie_embeddings=True,
                               quantize=Quantize(lm_head="int8"))
    with pytest.raises(IRError, match="quantize.lm_head"):
        build(card)


def test_cli_pairs_parse_and_name_their_flag():
    assert Quantize.parse(["experts=mxfp4", "dense=int8"]).chosen() == {
        "experts": "mxfp4", "dense": "int8"}
    with pytest.raises(IRError, match="--quantize: expected KIND=FORMAT"):
        Quantize.parse(["mxfp4"])
    with pytest.raises(IRError, match="--quantize.dense: unknown weight format"):
        Quantize.parse(["dense=int3"])


def _packed(name, codes, n=128):
    """Every code of a format down a [unit, n] column block, scale 1."""
    f = formats.get(name)
    rows = Q.unit_rows(f)
    c = np.resize(codes, rows * n).reshape(n, rows).T.copy()
    return Q.Packed(f, c, np.ones((rows // f.group(rows), n), np.float32))


@pytest.mark.parametrize("name, codes", [
    ("int8", np.arange(-128, 128, dtype=np.int8)),
    ("int4_g32", np.arange(-8, 8, dtype=np.int8)),
    # every e4m3 bit pattern but the two NaNs (0x7f, 0xff), which loaders refuse
    ("fp8_b128", np.array([b for b in range(256) if b & 0x7F != 0x7F], np.uint8)),
    ("mxfp4", np.arange(16, dtype=np.uint8)),
    ("nvfp4", np.arange(16, dtype=np.uint8)),
])
def test_the_shift_and_mask_decode_equals_ml_dtypes(name, codes):
    import jax.numpy as jnp

    p = _packed(name, codes)
    got = np.asarray(Q.decode(p.fmt, jnp.asarray(Q.to_words(p))))
    if p.fmt.code == "float8_e4m3fn":
        want = p.codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    elif p.fmt.code == "float4_e2m1fn":
        want = p.codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    else:
        want = p.codes.astype(np.float32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["int8", "int4_g32", "int4_g64", "int4_g128",
                                  "fp8_b128", "mxfp4", "nvfp4"])
def test_round_to_nearest_stays_within_half_a_step(name):
    import jax.numpy as jnp

    w = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)
    w[:64, 3] = 0.0                                  # an all-zero group: scale 1
    p = Q.quantize(formats.get(name), w)
    deq = np.asarray(Q.dequantize_packed(p, jnp.float32))
    scale = np.repeat(p.scales, p.group(), axis=0)
    err = np.abs(deq - w) / scale
    if p.fmt.code in ("int8", "int4"):
        assert err.max() <= 0.5 + 1e-6              # half a code step
    elif p.fmt.code == "float8_e4m3fn":
        # e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 of the value, and
        # 2^-10 of a scale below the normal range (448 * 2^-4 = 28 at most)
        assert (np.abs(deq - w) <= np.maximum(np.abs(w) * 2**-4, scale * 2**-10)).all()
    else:
        # values over 6 x 2^E saturate (OCP MX): at most 2 steps of 2^E; below,
        # half an e2m1 step (0.25 under 2, 0.5 to 4, 1 above). nvfp4's block
        # scale is e4m3-rounded, so max|w| / s is within 6 x (1 +- 2^-4)
        assert err.max() <= 2.0
        inside = np.abs(w) / scale <= 6
        assert (err[inside] <= np.where(np.abs(w[inside]) / scale[inside] < 4, 0.5, 1.0)).all()
    np.testing.assert_array_equal(deq[:64, 3], 0.0)


@pytest.mark.parametrize("name, bad, words", [
    ("int4_g32", 0.0, "zero, NaN or infinite scales (first at [1, 3]"),
    ("int8", float("nan"), "zero, NaN or infinite scales (first at [0, 3]"),
    ("fp8_b128", float("inf"), "zero, NaN or infinite scales (first at [1, 0]"),
    ("mxfp4", 0, "E8M0 bytes 0 or 255 (first at [1, 3]"),
    ("mxfp4", 255, "E8M0 bytes 0 or 255"),
])
def test_malformed_shipped_scales_are_named_by_tensor(name, bad, words):
    from megakernel.errors import ConfigError

    f = formats.get(name)
    p = Q.quantize(f, np.random.default_rng(2).standard_normal((256, 256)))
    scales = np.ones(f.scale_shape((256, 256)), np.uint8 if f.scale == "e8m0" else np.float32)
    scales = scales * (127 if f.scale == "e8m0" else 1)
    scales[min(1, scales.shape[0] - 1), 3 if scales.shape[1] > 3 else 0] = bad
    with pytest.raises(ConfigError) as info:
        from_shipped(f, p.codes, scales, "layers.2.mlp.down")
    assert str(info.value).startswith("layers.2.mlp.down: ") and words in str(info.value)


def test_shipped_scales_expand_to_the_streamed_layout():
    f = formats.get("fp8_b128")
    p = Q.quantize(f, np.random.default_rng(3).standard_normal((256, 384)))
    blocks = p.scales[:, ::128]                     # [2, 3]: one per 128 x 128 block
    assert np.array_equal(from_shipped(f, p.codes, blocks, "w").scales, p.scales)
    m = formats.get("mxfp4")
    q = Q.quantize(m, np.random.default_rng(4).standard_normal((128, 128)))
    exps = (np.log2(q.scales) + 127).astype(np.uint8)
    assert np.array_equal(from_shipped(m, q.codes, exps, "w").scales, q.scales)


def _nvfp4_shipped(seed=5, shape=(2, 128, 64)):
    """A stack of two matrices quantized as nvfp4, and their block scales and
    global scales as compressed-tensors stores them: e4m3 bytes b and 1/G."""
    f = formats.get("nvfp4")
    w = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    w[1] *= 300.0                       # the second matrix has its own global scale
    p = Q.quantize(f, w)
    inv = np.float32(6 * 448) / np.abs(w).max(axis=(-2, -1)).astype(np.float32)
    blocks = (p.scales * inv[:, None, None]).astype(ml_dtypes.float8_e4m3fn)
    return f, w, p, blocks, inv


def test_nvfp4_scales_are_block_over_global_scale():
    f, w, p, blocks, inv = _nvfp4_shipped()
    # the block scales are exactly e4m3 values, and b / (1/G) gives back s
    got = from_shipped(f, p.codes, blocks.view(np.uint8), "w", global_scale=inv,
                       global_divides=True)
    assert np.array_equal(got.scales, p.scales) and np.array_equal(got.codes, p.codes)
    times = from_shipped(f, p.codes, blocks, "w", global_scale=1 / inv)   # modelopt's form
    np.testing.assert_allclose(times.scales, p.scales, rtol=2**-23)
    assert np.abs(w[1]).max() / np.abs(w[0]).max() > 100    # distinct global scales


KEEP = "keep"      # the matrices' own global scales


@pytest.mark.parametrize("block, glob, where, words", [
    (((0, 3, 1), np.uint8(0x7F)), KEEP, "w", "NaN or negative e4m3 block scales (first at [0, 3, 1]"),
    (((1, 0, 0), np.uint8(0xB8)), KEEP, "w", "NaN or negative"),          # e4m3 -1.0
    (None, None, "w.global", "need the weight's global scale"),
    (None, np.ones(3, np.float32), "w.global", "global scale has shape [3]"),
    (None, np.array([1.0, 0.0], np.float32), "w.global", "not a finite positive"),
])
def test_malformed_nvfp4_scales_are_named(block, glob, where, words):
    from megakernel.errors import ConfigError

    f, _, p, blocks, inv = _nvfp4_shipped()
    raw = blocks.view(np.uint8).copy()
    if block is not None:
        raw[block[0]] = block[1]
    with pytest.raises(ConfigError) as info:
        from_shipped(f, p.codes, raw, "w", global_scale=inv if glob is KEEP else glob,
                     global_name="w.global", global_divides=True)
    assert str(info.value).startswith(where + ": ") and words in str(info.value)
