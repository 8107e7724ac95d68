"""The test kit: hypothesis strategies and checks for users' (and our own)
property tests of generated kernels.

``model_configs()`` draws cards inside the supported space, over one table of
features (strategies.py; the latent MoE's in moe_strategies.py), and ``model_graphs()`` built models with the op kinds
no card writes (graph_strategies.py); ``mla_blocks()`` and ``hybrid_configs()``
the latent-attention blocks and Gated DeltaNet hybrids (mla_strategies.py,
hybrid_strategies.py); ``decode_cases(model)`` draws decode calls and
``check_case`` / ``assert_case`` check one through the kernel (cases.py);
``check_examples`` runs a seeded property (properties.py); ``check_hf_fixture``
decodes a Hugging Face parity fixture (hf_fixture.py). The pytest plugin
(pytest_plugin.py) sets up virtual devices; preflight.py turns a wrong set-up
into a SetupError naming the fix; kernel_cache.py shares compiled kernels
between the cases of a run; faults.py holds the test-only kernel faults.
"""

from megakernel.testing.cases import (  # noqa: F401 - the kit's public names
    CaseResult, DecodeCase, assert_case, check_case, decode_cases, replace)
from megakernel.testing.faults import FAULTS  # noqa: F401
from megakernel.testing.graph_strategies import model_graphs  # noqa: F401
from megakernel.testing.hf_fixture import check_hf_fixture  # noqa: F401
from megakernel.testing.hybrid_strategies import hybrid_configs  # noqa: F401
from megakernel.testing.properties import check_examples  # noqa: F401
from megakernel.testing.strategies import mla_blocks, model_configs, moe_configs  # noqa: F401
