"""`python -m mokkafs.cli`: the `mokka` command."""
import sys

from mokkafs.cli.main import entry

sys.exit(entry())
