"""``python -m opsbook.cli``: the ``opsbook`` command."""

import sys

from opsbook.cli import main

sys.exit(main())
