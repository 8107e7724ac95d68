"""Careless and hostile model files through the CLI: exit code 2, no traceback,
the field named, each under 2 s and bounded memory, no output folder left.

A hypothesis strategy mutates valid documents (zoo cards, IR files, HF
fixture configs): wrong types, out-of-range and non-finite numbers, deleted
required keys, duplicated keys, oversized values and deep nesting.
"""

import contextlib
import dataclasses
import io
import json
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megakernel.cli import main
from megakernel.ir.config import ModelConfig, MoEConfig
from megakernel.ir.ops import OP_KINDS, RopeScaling
from megakernel.ir.serialize import model_to_json
from megakernel.models import zoo
from megakernel.models.cards import card_to_dict
from megakernel.models.hf_fields import HARMLESS_KEYS

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"
MAX_SECONDS = 2.0
MAX_PEAK_BYTES = 256 * 2**20
HOSTILE = "__import__('os').system('touch /tmp/megakernel-pwned') == 0"


class Pairs(list):
    """A JSON object written with the given (key, value) pairs, duplicates kept."""


class Raw(str):
    """JSON text written as it is."""


def dump(value) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Pairs):
        return "{" + ", ".join(f"{json.dumps(k)}: {dump(v)}" for k, v in value) + "}"
    if isinstance(value, dict):
        return dump(Pairs(value.items()))
    if isinstance(value, list):
        return "[" + ", ".join(dump(v) for v in value) + "]"
    return json.dumps(value)


def run_cli(text: str, command: str = "compile") -> tuple[int, str, float, int]:
    """(exit code, stderr, seconds, peak traced bytes) of ``megakernel command``
    on a file holding ``text``; the output folder must not exist afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        path, out = Path(tmp) / "model.json", Path(tmp) / "out"
        path.write_text(text)
        argv = [command, str(path)] + (["-o", str(out)] if command == "compile" else [])
        err = io.StringIO()
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(argv)
        finally:
            seconds = time.perf_counter() - t0
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert not out.exists(), "a refused compile left an output folder"
        return code, err.getvalue(), seconds, peak


def assert_refused(text: str, field: str, command: str = "compile") -> str:
    code, err, seconds, peak = run_cli(text, command)
    assert code == 2, err
    assert "Traceback" not in err and "\nerror: " in "\n" + err, err
    assert field in err, (field, err)
    assert seconds < MAX_SECONDS, (seconds, err)
    assert peak < MAX_PEAK_BYTES, (peak, err)
    return err


# --- documents and where a mutation must be refused -------------------------

def _required(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


CARD_REQUIRED = _required(ModelConfig) | _required(MoEConfig) | _required(RopeScaling) | {"format"}
OP_REQUIRED = set().union(*(_required(c) for c in OP_KINDS.values())) | {"kind"}
# An IR file's op documents (a node's "op", the final norm, the embed and logit
# ops) may leave out the fields that have defaults; the model's own optional keys.
IR_OP_DOCS = {"op", "final_norm", "embed_ops", "logit_ops"}
IR_OPTIONAL = {"embed_ops", "logit_ops"}
HF_REQUIRED = {"model_type", "vocab_size", "hidden_size", "num_hidden_layers",
               "num_attention_heads", "intermediate_size"}
HF_READ_HARMLESS = {"model_type", "dtype", "torch_dtype", "max_position_embeddings"}
# Numbers Hugging Face types as floats that the fixtures happen to write as
# integers (gemma2/gemma3: "query_pre_attn_scalar": 24): 256.5 is a valid value
# of such a field, so its wrong values are a float's.
HF_FLOATS = {"query_pre_attn_scalar"}


def _card(name):
    c = card_to_dict(zoo.card(name))
    return {k: v for k, v in c.items() if v is not None}


DOCS = {
    "card": [_card(n) for n in ("tiny-moe", "llama-3.2-1b")],
    "ir": [json.loads(model_to_json(zoo.model(n))) for n in ("tiny-moe", "tiny-dense")],
    "hf": [json.loads((FIXTURES / f / "config.json").read_text())
           for f in ("llama", "qwen2", "qwen3_moe", "mixtral", "gemma2", "gemma3_text",
                     "olmo2", "gpt_oss", "phi3", "deepseek_v3")],
}


def _checked(kind: str, path: tuple) -> bool:
    """Whether the value at ``path`` is read and checked (HF configs carry keys
    known to be harmless, which are not)."""
    return kind != "hf" or path[0] not in HARMLESS_KEYS or path[0] in HF_READ_HARMLESS


def _deletable(kind: str, path: tuple) -> bool:
    leaf = path[-1]
    if kind == "card":
        return leaf in CARD_REQUIRED
    if kind == "hf":
        return len(path) == 1 and leaf in HF_REQUIRED
    if not isinstance(leaf, str) or leaf in IR_OPTIONAL:
        return False
    return leaf in OP_REQUIRED or not IR_OP_DOCS & set(path[:-1])


def _paths(value, prefix=()):
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        path = (*prefix, key)
        if item is None:
            continue          # null is a valid "absent" for every optional field
        yield path, item
        if isinstance(item, (dict, list)):
            yield from _paths(item, path)


def _wrong_values(value):
    """Replacements that are wrong for a field holding ``value``."""
    if isinstance(value, bool):
        return ["false", "no", 0, 1, HOSTILE, [True]]
    if isinstance(value, int):
        return ["256", 256.5, True, -1, 2**40, 10**30, [value], HOSTILE]
    if isinstance(value, float):
        return ["1.0", True, Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), 1e300, [value]]
    if isinstance(value, str):
        return [123, True, [value], {"v": value}, HOSTILE, "x" * 100_000, "a\nb"]
    return ["text", 7, True] + ([[value]] if isinstance(value, dict) else [{"v": 1}])


@st.composite
def mutations(draw, kind: str):
    """(document text, a word the error must contain)."""
    doc = json.loads(json.dumps(draw(st.sampled_from(DOCS[kind]))))
    paths = [p for p, _ in _paths(doc) if _checked(kind, p)]
    path = draw(st.sampled_from(paths))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    leaf = path[-1]
    field = next((str(k) for k in reversed(path) if isinstance(k, str)), "layers")
    how = draw(st.sampled_from(["wrong", "wrong", "wrong", "delete", "duplicate", "deep"]))
    if how == "delete" and _deletable(kind, path):
        del parent[leaf]
    elif how == "duplicate" and isinstance(leaf, str):
        pairs = Pairs(parent.items())
        pairs.append((leaf, parent[leaf]))
        doc = _put(doc, path[:-1], pairs)
    elif how == "deep":
        parent[leaf] = Raw("[" * 40 + "]" * 40)
    else:
        value = parent[leaf]
        if kind == "hf" and leaf in HF_FLOATS:
            value = float(value)
        parent[leaf] = draw(st.sampled_from(_wrong_values(value)))
    return dump(doc), field


def _put(doc, path, value):
    """``doc`` with the value at ``path`` replaced (the root when ``path`` is empty)."""
    if not path:
        return value
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mutated_cards_ir_files_and_hf_configs_are_refused_by_name(data):
    kind = data.draw(st.sampled_from(sorted(DOCS)))
    text, field = data.draw(mutations(kind))
    command = data.draw(st.sampled_from(["compile", "compile", "show", "plan"]))
    assert_refused(text, field, command)


# --- one test per case of issue 9 (the model-file half) ---------------------

def card_text(**changes):
    c = _card("tiny-moe")
    c.update(changes)
    return dump(c)


def ir_text(edit):
    doc = json.loads(model_to_json(zoo.model("tiny-moe")))
    edit(doc)
    return dump(doc)


ISSUE_CASES = [
    ("code in a boolean", card_text(tie_embeddings=HOSTILE), "tie_embeddings"),
    ("code in rmsnorm offset", ir_text(lambda d: d["final_norm"].update(offset=HOSTILE)),
     "offset"),
    ("code in a layer's rmsnorm offset",
     ir_text(lambda d: d["layer_defs"][0]["nodes"][0]["op"].update(offset=HOSTILE)), "offset"),
    ("string false qkv_bias", card_text(qkv_bias="false"), "qkv_bias"),
    ("string false qk_norm", card_text(qk_norm="false"), "qk_norm"),
    ("string no tie", card_text(tie_embeddings="no"), "tie_embeddings"),
    ("duplicate keys", card_text()[:-1] + ', "hidden_size": 512}', "hidden_size"),
    ("unknown IR field", ir_text(lambda d: d.update(comment="x")), "comment"),
    ("IR bias string", ir_text(lambda d: d["layer_defs"][0]["nodes"][1]["op"].update(
        bias="false")), "bias"),
    ("IR gated string", ir_text(lambda d: d["layer_defs"][0]["nodes"][10]["op"].update(
        gated="no")), "gated"),
    ("keyword node name", ir_text(lambda d: d["layer_defs"][0]["nodes"][0].update(
        name="class")), "name"),
    ("keyword tensor name", ir_text(lambda d: d["layer_defs"][0]["tensors"][1].update(
        name="import")), "name"),
    ("infinite rope_theta", card_text(rope_theta=Raw("Infinity")), "rope_theta"),
    ("infinite softmax_scale", card_text(softmax_scale=Raw("Infinity")), "softmax_scale"),
    ("infinite routed_scaling", card_text(moe={**_card("tiny-moe")["moe"],
                                               "routed_scaling": Raw("Infinity")}),
     "routed_scaling"),
    ("infinite llama3 factor", card_text(rope_scaling={"rope_type": "llama3",
                                                       "factor": Raw("Infinity")}), "factor"),
    ("tiny norm_eps", card_text(norm_eps=1e-300), "eps"),
    ("first_k_dense too large", card_text(first_k_dense=3), "first_k_dense"),
    ("newline in name", card_text(name="tiny-moe\n"), "name"),
    ("list as moe", card_text(moe=[1]), "moe"),
    ("string as number", card_text(hidden_size="256"), "hidden_size"),
    ("integer name", card_text(name=7), "name"),
    ("list name", card_text(name=["a"]), "name"),
    ("op as a string", ir_text(lambda d: d["layer_defs"][0]["nodes"][0].update(op="rmsnorm")),
     "op"),
    ("nested 10,000 deep", card_text(moe=Raw("[" * 10_000 + "]" * 10_000)), "nested deeper"),
    ("hidden_size 1e12", card_text(hidden_size=10**12), "hidden_size"),
    ("vocab_size 2**40", card_text(vocab_size=2**40), "vocab_size"),
    ("intermediate_size 1e9", card_text(intermediate_size=10**9), "intermediate_size"),
    ("num_layers 1e7", card_text(num_layers=10**7), "num_layers"),
    ("20 MB string", card_text(name="x" * 20_000_000), "limited"),
    ("fits no topology", card_text(num_layers=1024, hidden_size=2**17, intermediate_size=2**20,
                                   moe=None, first_k_dense=0), "32 TensorCore(s)"),
    ("fits not one core", card_text(num_layers=1024, hidden_size=2**16,
                                    intermediate_size=2**18), "1 TensorCore(s)"),
]


@pytest.mark.parametrize("text, field", [c[1:] for c in ISSUE_CASES],
                         ids=[c[0] for c in ISSUE_CASES])
def test_issue_case_is_a_named_error(text, field):
    assert_refused(text, field)


def test_hf_cases_through_the_cli():
    base = json.loads((FIXTURES / "qwen3_moe" / "config.json").read_text())
    for change, field in ((dict(num_experts_per_tok=0), "num_experts_per_tok"),
                          (dict(moe_intermediate_size=0), "moe_intermediate_size"),
                          (dict(rope_parameters={"rope_type": "default", "rope_theta": 0}),
                           "rope_theta")):
        assert_refused(dump({**base, **change}), field, "show")
