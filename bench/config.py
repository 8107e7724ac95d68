"""What ``make bench`` runs and records: the models, the stages and their fields.

Shared by the run (``bench/run.py``), one model's record (``bench/record.py``)
and the weight-format rows (``bench/formats.py``). It imports none of them, so
the imports go one way: run -> record, formats -> config.
"""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).parent / "results"
FORMAT = "megakernel.bench/1"

# (zoo name, TensorCores); all at batch 1. DeepSeek-V3 and Kimi-K2 (MLA) need
# 32 TensorCores (16 chips, tpu7x:4x4x1) to hold their bf16 weights.
MODELS = (("tiny-dense", 1), ("tiny-moe", 1), ("llama-3.2-1b", 1), ("gemma-3-1b", 1),
          ("gemma-2-2b", 4), ("phi-3-mini-4k", 4), ("qwen3-8b", 4), ("mistral-7b-v0.1", 8),
          ("olmo-2-7b", 8), ("qwen3-32b", 8), ("qwen3-30b-a3b", 8), ("mixtral-8x7b", 8),
          ("gpt-oss-20b", 8), ("qwen3.5-27b", 8), ("qwen3-next-80b-a3b", 8),
          ("deepseek-v3", 32), ("kimi-k2", 32))
# Interpret-mode stages (check, trace) run the kernel on this CPU: tiny models only.
INTERPRET = ("tiny-dense", "tiny-moe")
# AOT compile time of the 64-layer model against the same model cut to this many layers.
DEPTH_MODEL, DEPTH_CUT = "qwen3-32b", 4
TIMELINE_MODEL, TIMELINE_LAYERS = ("qwen3-32b", 8), 3
CHECK_STEPS = 2
REPLAY_CHART = "tiny-moe"      # its trace replays are drawn too

NUMBER_FIELDS = ("plan_s", "modeled_step_ms", "modeled_hbm_floor_ms", "modeled_efficiency",
                 "modeled_tokens_per_s_per_user", "modeled_bytes_per_step",
                 "min_bytes_per_step", "plan_vmem_bytes", "modeled_sync_step_ms",
                 "modeled_sync_overlap_step_ms", "modeled_sync_slowdown",
                 "modeled_state_bytes_per_step")
# Stage fields: a number when the stage ran, else the stage is in errors/skipped.
# In the order the stages run (a worker past its time names the first not done).
STAGE_FIELDS = {"codegen": ("codegen_s",),
                "aot": ("aot_compile_s", "compiled_vmem_bytes"),
                "profile": ("profile_s", "core_work_ms"),
                # the XLA baseline (bench/xla_baseline.py): modeled, then libtpu's schedule
                "xla": ("xla_s", "xla_modeled_step_ms", "xla_modeled_advantage"),
                "xla_profile": ("xla_profile_s", "xla_core_work_ms"),
                "check": ("check_s",),
                "trace": ("trace_s", "trace_bytes_per_step"),
                "replay": ("replay_s", "replay_step_ms")}


STAGES = ("plan",) + tuple(STAGE_FIELDS)


def field(stage: str) -> str:
    """The record's field that holds ``stage``'s time."""
    return "plan_s" if stage == "plan" else STAGE_FIELDS[stage][0]
