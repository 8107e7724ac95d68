"""Stacks are periodic: a body of p layers repeated n times, found from the
layer list alone, and mapped back to global layer names."""

import pytest

from megakernel.ir.config import ModelConfig, build
from megakernel.ir.graph import find_stacks, merge_body


def _layers():
    dense = build(ModelConfig("a", 256, 128, 2, 4, 2, 64, 256, max_seq_len=64)).layers[0]
    window = build(ModelConfig("b", 256, 128, 1, 4, 2, 64, 256, sliding_window=8,
                               max_seq_len=64)).layers[0]
    return dense, window


@pytest.mark.parametrize("pattern, expected", [
    ("AAAA", [(0, 4, 1)]),
    ("ABABAB", [(0, 3, 2)]),
    ("AAABAAABAAAB", [(0, 3, 4)]),               # 3:1 hybrid: one stack, body of 4
    ("BAAAA", [(0, 1, 1), (1, 4, 1)]),          # an irregular head
    ("ABABA", [(0, 2, 2), (4, 1, 1)]),          # and tail
    ("AABAABAABA", [(0, 3, 3), (9, 1, 1)]),
])
def test_find_stacks_covers_the_layers_with_the_longest_repetition(pattern, expected):
    a, b = _layers()
    layers = tuple(a if ch == "A" else b for ch in pattern)
    stacks = find_stacks(layers)
    assert [(s.start, s.count, s.period) for s in stacks] == expected
    for s in stacks:                         # the body repeats exactly
        for k in range(s.count):
            assert layers[s.start + k * s.period:s.start + (k + 1) * s.period] == s.body


def test_merged_body_chains_its_layers_and_maps_names_back():
    a, b = _layers()
    st = find_stacks((a, b, a, b))[0]
    merged = st.layer
    assert merged == merge_body((a, b))
    assert merged.input == "l0_x" and merged.output == "l1_y"
    assert merged.node("l1_input_norm").inputs == ("l0_y",)   # layer 1 reads layer 0's output
    assert st.place(1, "l1_attention") == (3, "attention")
    assert st.global_name(1, "l0_q_proj.weight") == "layers.2.q_proj.weight"
    assert set(merged.params(a.tensors[0].dtype)) == {
        f"l{j}_{k}" for j in (0, 1) for k in a.params(a.tensors[0].dtype)}


def test_card_layer_types_build_each_layer_from_the_mixer_table():
    config = ModelConfig("m", 256, 128, 6, 4, 2, 64, 256, sliding_window=8, max_seq_len=64,
                         layer_types=("sliding_attention", "full_attention") * 3)
    model = build(config)
    windows = [next(n.op.sliding_window for n in layer.nodes if n.op.kind == "attention")
               for layer in model.layers]
    assert windows == [8, None] * 3
    assert [(s.start, s.count, s.period) for s in model.stacks] == [(0, 3, 2)]


def test_a_body_keeps_one_copy_of_each_run_of_equal_layers():
    """AAAB x 3: runs (0, 3) and (3, 1); the merged body is one A (``l0_``)
    then B (``l3_``), and run-layer k of a run of c layers is repetition
    k // c, layer k % c of the run."""
    a, b = _layers()
    layers = (a, a, a, b) * 3
    st = find_stacks(layers)[0]
    assert (st.start, st.count, st.period, st.runs) == (0, 3, 4, ((0, 3), (3, 1)))
    assert st.layer == merge_body((a, a, a, b), st.runs)
    assert {n.name.split("_")[0] for n in st.layer.nodes} == {"l0", "l3"}
    assert st.layer.node("l3_input_norm").inputs == ("l0_y",)
    assert st.reps("l0_attention") == 9 and st.reps("l3_attention") == 3
    assert st.place(4, "l0_attention") == (5, "attention")      # repetition 1, layer 1
    assert st.place(2, "l3_attention") == (11, "attention")
    # every layer's every weight has exactly one (run-layer, body name)
    from megakernel.ir.graph import body_local_name

    seen = set()
    for i in range(len(layers)):
        for p in layers[i].params(a.tensors[0].dtype):
            k, local = body_local_name(0, 4, i, p, st.runs)
            assert st.global_name(k, local) == f"layers.{i}.{p}"
            seen.add((k, local))
    assert len(seen) == sum(len(layer.params(a.tensors[0].dtype)) for layer in layers)


def test_bodies_without_repeated_layers_have_no_runs():
    a, b = _layers()
    assert find_stacks((a, b) * 3)[0].runs == ()
    assert find_stacks((a,) * 4)[0].runs == ()
