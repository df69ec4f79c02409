"""``python -m stowage``: the same as the ``stowage`` command."""

import sys

from stowage.cli import main

sys.exit(main())
