"""Every op kind's rules, registered: the stage modules (which register the
core kinds and create every registry) and each kind module of each layer.
The entry points import this module - the CLI (megakernel/cli/commands.py),
the test kit's pytest plugin (megakernel/testing/pytest_plugin.py) and bench -
never the registry itself, so the base layer depends on nothing above it.
Importing it ends with the start-up check that every kind has every rule it
needs (``registry.check_complete``).

Adding an op kind (docs/architecture.md): its IR class in ``ir/kind_<name>.py``,
its reference and weight init in ``models/kind_<name>.py``, its sharding,
buffer, cost and constant rules in ``compiler/kind_<name>.py``, its emitter
(and kernel library, if it has one) in ``backends/pallas_tpu/kind_<name>.py``;
then one line for each below.
"""

from megakernel.ir import kind_elementwise  # noqa: F401
from megakernel.models import kind_elementwise as _models_elementwise  # noqa: F401
from megakernel.compiler import kind_elementwise as _compiler_elementwise  # noqa: F401,E402
from megakernel.backends.pallas_tpu.codegen import kind_elementwise as _pallas_elementwise  # noqa: F401,E402
from megakernel.ir import kind_gdn  # noqa: F401,E402
from megakernel.models import kind_gdn as _models_gdn  # noqa: F401,E402
from megakernel.compiler import kind_gdn as _compiler_gdn  # noqa: F401,E402
from megakernel.backends.pallas_tpu.codegen import kind_gdn as _pallas_gdn  # noqa: F401,E402
from megakernel.ir import kind_norm_parts  # noqa: F401,E402
from megakernel.models import kind_norm_parts as _models_norm_parts  # noqa: F401,E402
from megakernel.compiler import kind_norm_parts as _compiler_norm_parts  # noqa: F401,E402
from megakernel.backends.pallas_tpu.codegen import kind_norm_parts as _pallas_norm_parts  # noqa: F401,E402
from megakernel.ir import kind_mla  # noqa: F401,E402
from megakernel.models import kind_mla as _models_mla  # noqa: F401,E402
from megakernel.compiler import kind_mla as _compiler_mla  # noqa: F401,E402
from megakernel.backends.pallas_tpu.codegen import kind_mla as _pallas_mla  # noqa: F401,E402
# The stage modules: every registry exists and the core kinds are registered.
from megakernel.compiler import pipeline as _pipeline  # noqa: F401,E402
from megakernel.models import reference as _reference, weights as _weights  # noqa: F401,E402
from megakernel.backends.pallas_tpu.codegen import emit as _emit  # noqa: F401,E402
from megakernel.ir.ops import OP_KINDS  # noqa: E402
from megakernel import registry  # noqa: E402

registry.mark_loaded()
registry.check_complete(dict(OP_KINDS.items()))
