"""``python -m asynclock``: the same as the ``asynclock`` command."""

import sys

from .cli import main

sys.exit(main())
