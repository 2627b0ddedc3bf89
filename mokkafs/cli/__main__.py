"""`python -m mokkafs.cli`: the `mokka` command."""
import sys

from mokkafs.cli.main import main

sys.exit(main())
