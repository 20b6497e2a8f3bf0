"""python -m runtime.cli: the `edge` command."""

import sys

from runtime.cli import main

sys.exit(main())
