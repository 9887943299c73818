import sys

from opsbook.cli import console

sys.exit(console())
