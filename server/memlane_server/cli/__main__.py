"""``python -m memlane_server.cli``: the ``memlane`` command without its console script (tests, the
children ``memlane serve`` starts, the image's health probes)."""

import sys

from . import main

sys.exit(main())
