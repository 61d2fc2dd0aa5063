"""What the operator commands print reaches a terminal: stored text (a memory, a summary, a turn) is a
caller's string, and a terminal acts on the control characters in it (ESC and CSI sequences move the
cursor, rewrite earlier lines, set the window title; BEL rings; bidi overrides make ``rm -rf`` read as
something else). So every printed string goes through here.

- ``shown``: a table cell or message for people. C0 and C1 controls, DEL and the bidi controls print as
  visible escapes (``\\x1b``, ``\\u202e``); a tab or line break becomes a space (one row per line).
- ``json_line``: JSON for programs, as before; JSON escapes C0 already, and the characters it leaves raw
  under ``ensure_ascii=False`` (DEL, C1, bidi controls, the line and paragraph separators) are written
  as ``\\uXXXX`` escapes, so the line is the same JSON value and inert on a terminal.
"""

from __future__ import annotations

import json
from typing import Any

# Bidi embedding, override and isolate controls and the directional marks (Unicode 15, UAX #9), and the
# line and paragraph separators.
_BIDI = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029]


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


# str.translate tables (one pass, no pattern engine). JSON escapes the C0 range itself.
_RAW_IN_JSON = {c: f"\\u{c:04x}" for c in [*range(0x7F, 0xA0), *_BIDI]}
_SHOWN = {c: _escape(c) for c in [*range(0x20), *range(0x7F, 0xA0), *_BIDI]}
_SHOWN.update({ord("\t"): " ", ord("\n"): " ", ord("\r"): " "})


def shown(value: object) -> str:
    """``value`` as text safe to print on a terminal, on one line."""
    return str(value).translate(_SHOWN)


def json_line(obj: Any, *, pretty: bool = False) -> str:
    text = json.dumps(obj, indent=2 if pretty else None, ensure_ascii=False, sort_keys=pretty)
    # Outside strings JSON holds only ASCII structure and whitespace, so these can only be in strings.
    return text.translate(_RAW_IN_JSON)
