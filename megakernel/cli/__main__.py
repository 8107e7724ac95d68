"""``python -m megakernel.cli``: the same as the ``megakernel`` command."""

import sys

from megakernel.cli.commands import main

sys.exit(main())
