"""`python -m dfl ...` is the `dfl` command."""

import sys

from dfl.cli import main

sys.exit(main())
