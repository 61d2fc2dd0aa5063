"""``python -m memlane.mcp``: the MCP server without the server package installed."""

import sys

from . import main

sys.exit(main())
