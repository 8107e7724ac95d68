"""Greedy generation: prefill with the reference, then the kernel in chunks of N.

``generate(model, prompt_ids, max_new, steps_per_call=N)`` plans and emits
one kernel that runs N greedy steps per call (``steps_per_call``; "auto": the
planner's N, compiler/choose_steps.py, at most max_new - 1), prefills
the caches with the plain-JAX reference (the kernel decodes one token per
sequence per step), and calls the kernel ``ceil((max_new - 1) / N)`` times.
Each call's length limit stops every row at ``max_new`` tokens; a row that
emitted ``end_id`` is given no room in later calls, so its tokens repeat the
end id. On CPU the kernel runs in TPU interpret mode; on a TPU backend the
same calls run compiled (``interpret=False``).

``reference_greedy`` is the oracle: the reference's own greedy continuation.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from megakernel.errors import CheckError
from megakernel.models import reference


@dataclass(frozen=True)
class Generated:
    tokens: np.ndarray        # [B, max_new] int32; end_id repeated after a row ended
    calls: int                # kernel calls made
    seconds: float            # kernel calls only (prefill and compile excluded)
    plan: object


def prompt_array(prompt_ids, vocab_size: int) -> np.ndarray:
    """[B, P] int32 of equal-length prompts, every id in [0, vocab_size)."""
    rows = [list(p) for p in prompt_ids]
    if not rows or not rows[0] or len({len(r) for r in rows}) != 1:
        raise CheckError(f"prompts must be non-empty and of one length, found lengths "
                         f"{[len(r) for r in rows]}", path="generate.prompt_ids",
                         hint="give B prompts of P ids each")
    arr = np.asarray(rows)
    if arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() >= vocab_size:
        raise CheckError(f"prompt ids must be integers in [0, {vocab_size}), found "
                         f"{arr.min()}..{arr.max()}", path="generate.prompt_ids",
                         hint=f"give token ids below the vocabulary size {vocab_size}")
    return arr.astype(np.int32)


def end_ids(end_id, vocab_size: int) -> tuple[int, ...]:
    """``end_id`` (-1: none, one id, or several) as a tuple of distinct ids."""
    ids = [end_id] if isinstance(end_id, int) and not isinstance(end_id, bool) else end_id
    try:
        ids = [] if list(ids) == [-1] else list(ids)
    except TypeError:
        ids = None
    if ids is None or not all(type(i) is int and 0 <= i < vocab_size for i in ids):
        raise CheckError(f"end_id={end_id!r} must be -1 (none), a token id or a list of token "
                         f"ids in [0, {vocab_size})", path="generate.end_id",
                         hint="give the model's end-of-sequence id(s), or -1")
    return tuple(dict.fromkeys(ids))


def _after_end(tokens: np.ndarray, ends: tuple[int, ...]) -> np.ndarray:
    """``tokens`` [B, n] with every token after a row's first end id replaced
    by that id (the kernel stops on one id; a row may end on another)."""
    out = tokens.copy()
    for row in out:
        hit = np.flatnonzero(np.isin(row, ends)) if ends else ()
        if len(hit):
            row[hit[0]:] = row[hit[0]]
    return out


def _check_length(model, prompt: np.ndarray, max_new: int, end_id=-1) -> None:
    end_ids(end_id, model.vocab_size)
    if not (isinstance(max_new, int) and max_new > 0):
        raise CheckError(f"max_new={max_new!r} must be a positive integer",
                         path="generate.max_new", hint="ask for at least one new token")
    room = model.max_seq_len - prompt.shape[1]
    if room < 1:
        raise CheckError(f"a prompt of {prompt.shape[1]} ids leaves no room for a new token: "
                         f"{model.name} holds max_seq_len={model.max_seq_len} positions",
                         path="generate.prompt_ids",
                         hint=f"give prompts of at most {model.max_seq_len - 1} ids")
    if max_new > room:
        raise CheckError(f"a prompt of {prompt.shape[1]} ids plus {max_new} new tokens exceeds "
                         f"max_seq_len={model.max_seq_len}", path="generate.max_new",
                         hint=f"ask for at most {room} new tokens")


def prefill(model, weights, prompt: np.ndarray):
    """(first new token [B], caches) from the reference over the whole prompt."""
    b = prompt.shape[0]
    logits, caches = reference.decode_step_jit(model, weights, jnp.asarray(prompt),
                                               jnp.zeros((b,), jnp.int32),
                                               reference.init_caches(model, b))
    return np.asarray(logits)[:, -1].argmax(-1).astype(np.int32), caches


def plan_for(model, prompt_ids, max_new: int, *, steps_per_call: "int | str" = "auto",
             devices: int = 1, end_id: int = -1):
    """The plan ``generate`` runs: ``steps_per_call`` steps per call ("auto":
    the planner's N, but no more than the tokens left after the prefill's)."""
    from megakernel.compiler.pipeline import plan_model

    prompt = prompt_array(prompt_ids, model.vocab_size)
    _check_length(model, prompt, max_new, end_id)
    b, p = prompt.shape
    if steps_per_call == "auto":
        plan = plan_model(model, devices=devices, batch=b, steps="auto", context=p)
        if plan.request.steps <= max(max_new - 1, 1):
            return plan
        steps_per_call = max(max_new - 1, 1)
    return plan_model(model, devices=devices, batch=b, steps=steps_per_call,
                      context=min(p, model.max_seq_len - steps_per_call))


def generate(model, prompt_ids, max_new: int, *, steps_per_call: "int | str" = "auto",
             devices: int = 1, weights=None, seed: int = 0, end_id=-1, interpret=None,
             plan=None, progress=None) -> Generated:
    """Greedy tokens [B, max_new] (the prefill's first); ``end_id``: -1, one
    id or several (the kernel stops a row on the first; a row that emits any
    gets no room in later calls, and its tokens after it repeat it)."""
    from megakernel.backends.pallas_tpu.codegen.load import compile_model
    from megakernel.backends.pallas_tpu.codegen import load
    from megakernel.backends.pallas_tpu.check.against_reference import KernelRunner, make_mesh
    from megakernel.backends.pallas_tpu.check.multistep import call
    from megakernel.models.weights import init_weights

    prompt = prompt_array(prompt_ids, model.vocab_size)
    _check_length(model, prompt, max_new, end_id)
    ends = end_ids(end_id, model.vocab_size)
    stop = ends[0] if ends else -1
    b, p = prompt.shape
    if plan is None:
        plan = plan_for(model, prompt, max_new, steps_per_call=steps_per_call, devices=devices)
    n = plan.request.steps
    weights = weights if weights is not None else init_weights(model, seed)
    if interpret is None and jax.default_backend() != "tpu":
        from jax.experimental.pallas import tpu as pltpu

        interpret = pltpu.InterpretParams()
    w = reference.as_jax(weights)
    first, caches = prefill(model, w, prompt)
    out = np.full((b, max_new), stop, np.int32)
    out[:, 0] = first
    with tempfile.TemporaryDirectory(prefix="megakernel-generate-") as tmp:
        module = load.import_module(compile_model(model, plan, tmp))
        runner = KernelRunner(module, model, plan, weights, make_mesh(plan.shard.cores),
                              interpret or False, with_logits=False)
        runner.set_caches({k: np.asarray(v) for k, v in caches.items()})
        done, made = np.isin(first, ends), 1
        calls, t0 = -(-(max_new - 1) // n), time.perf_counter()
        for c in range(calls):
            start = np.full((b,), p + made - 1, np.int32)
            # rows that ended get no room; the rest stop at max_new tokens
            limit = np.where(done, start, p + max_new - 1).astype(np.int32)
            got, _ = call(runner, out[:, made - 1], start, end_id=stop, limit=limit)
            take = min(n, max_new - made)
            out[:, made:made + take] = np.where(done[:, None], out[:, made - 1:made],
                                                got[:, :take])
            done |= np.isin(got[:, :take], ends).any(axis=1)
            made += take
            if progress is not None:
                progress(c + 1, calls, made, time.perf_counter() - t0)
    return Generated(_after_end(out, ends), calls, time.perf_counter() - t0, plan)


def reference_greedy(model, weights, prompt_ids, max_new: int, end_id=-1) -> np.ndarray:
    """The reference's greedy continuation [B, max_new], a row's end id (any
    of ``end_id``'s) repeated after it."""
    prompt = prompt_array(prompt_ids, model.vocab_size)
    _check_length(model, prompt, max_new, end_id)
    ends = end_ids(end_id, model.vocab_size)
    w = reference.as_jax(weights)
    tok, caches = prefill(model, w, prompt)
    b, p = prompt.shape
    out = np.full((b, max_new), ends[0] if ends else -1, np.int32)
    out[:, 0], done = tok, np.isin(tok, ends)
    for j in range(1, max_new):
        logits, caches = reference.decode_step_jit(model, w, jnp.asarray(tok[:, None]),
                                                   jnp.full((b,), p + j - 1, jnp.int32), caches)
        tok = np.asarray(logits)[:, 0].argmax(-1).astype(np.int32)
        out[:, j] = np.where(done, out[:, j - 1], tok)
        done |= np.isin(tok, ends)
    return out


def running_on() -> str:
    """What the kernel calls run on, for the speed a progress line gives."""
    if jax.default_backend() != "tpu":
        return "TPU interpret mode on CPU, not a TPU speed"
    return f"compiled, on {jax.devices()[0].device_kind}"


def print_progress(call: int, calls: int, made: int, seconds: float) -> None:
    """One updating stderr line per call: calls, tokens per row, tokens/s, and
    what that speed is of (interpret mode on CPU, or the device)."""
    rate = made / seconds if seconds > 0 else 0.0
    end = "\n" if call == calls else ""
    print(f"\r  call {call}/{calls}: {made} tokens per row, {rate:.1f} tokens/s per row "
          f"({running_on()})", end=end, file=sys.stderr, flush=True)
