"""Every op kind's rules, registered and checked complete.

Each layer's package registers its own rules for every kind when it is
imported (``ir/__init__.py``, ``compiler/__init__.py``, ``models/__init__.py``,
``backends/pallas_tpu/codegen/__init__.py`` list their ``kind_<name>.py``
modules), so a library user's fresh process finds every kind a stage needs.
This module imports all of them with the stage modules that create the
remaining tables, then runs the start-up check that every kind has every rule
it needs (``registry.check_complete``). The entry points import it - the CLI
(megakernel/cli/commands.py), the test kit's pytest plugin
(megakernel/testing/pytest_plugin.py) and bench - so a kind missing a rule
fails at start, not in the one run that meets it.

Adding an op kind (docs/architecture.md): its IR class in ``ir/kind_<name>.py``,
its reference and weight init in ``models/kind_<name>.py``, its sharding,
buffer, cost, constant and multi-step rules in ``compiler/kind_<name>.py``, its
emitter (and kernel library, if it has one) in
``backends/pallas_tpu/codegen/kind_<name>.py``; then one import in each of the
four packages' ``__init__.py``.
"""

from megakernel import ir, registry
from megakernel.backends.pallas_tpu import codegen  # noqa: F401
from megakernel.compiler import pipeline as _pipeline  # noqa: F401
from megakernel.models import reference as _reference, weights as _weights  # noqa: F401
from megakernel.ir.ops import OP_KINDS

del ir
registry.mark_loaded()
registry.check_complete(dict(OP_KINDS.items()))
