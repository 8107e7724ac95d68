"""Typed, problem-collecting reads of a Hugging Face ``config.json``.

A ``FieldReader`` hands out values by key and remembers every key it was asked
for; a wrong type or an unsupported value becomes a *problem* instead of an
exception, so one import reports every problem of a file at once. Nothing is
ever evaluated: values are only type-checked JSON.
"""

from __future__ import annotations

from typing import Any

from megakernel.errors import ConfigError, IRError, shown
from megakernel.ir import limits
from megakernel.ir.schema import Float, Int, check

REQUIRED = object()

# Keys that never change the decode-step maths: metadata, tokenizer ids,
# training-only knobs (dropout, router losses and noise), and the model's
# context limit (read separately, to cap max_seq_len).
HARMLESS_KEYS = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version",
    "torch_dtype", "dtype", "bos_token_id", "eos_token_id", "pad_token_id",
    "use_cache", "initializer_range", "attention_dropout", "tokenizer_class",
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
    "max_position_embeddings", "output_attentions", "output_hidden_states",
    "return_dict", "pretraining_tp",  # tp slices the matmuls: same sums
})

# Hugging Face ``hidden_act`` values -> the card's activation (models/hf.py and
# models/hf_deepseek.py read them).
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu",
               "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}

_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false",
               str: "a string", dict: "an object", list: "a list"}


# No HF integer is larger than the IR's largest size (the vocabulary).
_MAX_INT = max(limits.MAX_VOCAB, limits.MAX_WIDTH, limits.MAX_SEQ_LEN)


def _matches(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


class FieldReader:
    """Reads keys of ``data`` (the parsed config of file ``source``)."""

    def __init__(self, data: dict[str, Any], source: str):
        self.data = data
        self.source = source
        self.used: set[str] = set()
        self.problems: list[str] = []

    def problem(self, key: str, message: str) -> None:
        self.problems.append(f"{key}: {message}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, kind: type, default: Any = REQUIRED, *,
            data: dict | None = None, prefix: str = "", low: float | None = None,
            high: float | None = None, open_low: bool = False) -> Any:
        """``data[key]`` checked to be of ``kind`` (null counts as absent) and,
        for numbers, finite and in [low, high] (``(low, high]`` with
        ``open_low``; an int's ``high`` defaults to the IR's size limit).
        A missing required key, a wrong type or a value out of range is
        recorded and gives ``default`` (or None), so reading goes on and later
        problems are found too; a 0 is a value, never "absent"."""
        src = self.data if data is None else data
        if data is None:
            self.used.add(key)
        name = prefix + key
        value = src.get(key)
        fallback = None if default is REQUIRED else default
        if value is None:
            if default is REQUIRED:
                self.problem(name, "is required but missing")
            return fallback
        if not _matches(value, kind):
            self.problem(name, f"{shown(value)} should be {_TYPE_WORDS[kind]}")
            return fallback
        bounded = {int: lambda: Int(-2**63 if low is None else int(low), _MAX_INT if high is None else int(high)),
                   float: lambda: Float(low, high, open_low=open_low)}.get(kind)
        if bounded is not None:
            try:
                value = check(bounded(), value)
            except IRError as err:
                self.problem(name, err.message)
                return fallback
        return float(value) if kind is float else value

    def mark_used(self, *keys: str) -> None:
        self.used.update(keys)

    def unknown_keys(self) -> None:
        """Record every key that is neither read nor known to be harmless. A null
        value is the absence of a feature, so unknown null keys pass."""
        for key in sorted(set(self.data) - self.used - HARMLESS_KEYS):
            if self.data[key] is None:
                continue
            self.problem(key, f"{shown(self.data[key])} (unknown key, not supported)")

    def raise_problems(self) -> None:
        if not self.problems:
            return
        lines = "\n".join(f"  - {p}" for p in self.problems)
        raise ConfigError(
            f"cannot import this config ({len(self.problems)} problem"
            f"{'s' if len(self.problems) > 1 else ''}):\n{lines}\n",
            path=self.source,
            hint="each listed key either changes the model in a way the IR cannot "
                 "express, or has a value of the wrong type; fix or remove it, or, if "
                 "a key is known not to affect inference, add it to HARMLESS_KEYS "
                 "in models/hf_fields.py")
