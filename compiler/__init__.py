"""compiler: the plan - shard, plan memory, schedule collectives, cost.

Importing the package registers every op kind's compiler rules (sharding,
buffers, cost, constants, state updates, multi-step) and every geometry
record, so the pipeline and ``Plan.from_json`` work in a fresh process. A new
op kind adds its ``kind_<name>.py`` here (docs/architecture.md).
"""

from megakernel.compiler.geometry import attention, gdn, mla, moe  # noqa: F401
from megakernel.compiler import (kind_attention, kind_elementwise,  # noqa: F401
                                 kind_expert_combine, kind_gdn,
                                 kind_mla, kind_mlp, kind_moe, kind_norm_parts,
                                 kind_residual_gate, kind_rmsnorm)
