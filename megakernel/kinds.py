"""Every op kind beyond the core ones, module by module, for each layer of the
compiler. Importing this registers all their rules; every registry imports it
before its first lookup (megakernel/registry.py), so no stage can miss a kind
that another stage knows.

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
