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
import re
from typing import Any

# Bidi embedding, override and isolate controls and the directional marks (Unicode 15, UAX #9).
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}\u2028\u2029]")
_RAW_IN_JSON = re.compile(f"[\x7f-\x9f{_BIDI}\u2028\u2029]")  # json.dumps escapes the C0 range itself
_SPACES = str.maketrans({"\t": " ", "\n": " ", "\r": " "})


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(value: object) -> str:
    """``value`` as text safe to print on a terminal, on one line."""
    return _UNSAFE.sub(_escape, str(value).translate(_SPACES))


def json_line(obj: Any, *, pretty: bool = False) -> str:
    text = json.dumps(obj, indent=2 if pretty else None, ensure_ascii=False, sort_keys=pretty)
    # Outside strings JSON holds only ASCII structure and whitespace, so these can only be in strings.
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
