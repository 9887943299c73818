import sys

from opsbook.cli import main

sys.exit(main())
