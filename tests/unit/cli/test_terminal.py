"""What the CLI prints is inert on a terminal: every C0/C1 control, DEL and bidi control escaped in human
output; JSON lines the same JSON value (tests/integration/test_operator_cli.py runs the real commands)."""

from __future__ import annotations

import json

from memlane_server.cli.terminal import json_line, shown

CONTROLS = [*map(chr, range(0x20)), *map(chr, range(0x7F, 0xA0)), "\u061c", "\u200e", "\u200f"]
CONTROLS += [*map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A)), "\u2028", "\u2029"]


def test_no_control_character_survives() -> None:
    text = "a" + "".join(CONTROLS) + "é 日本"
    for out in (shown(text), json_line({"content": text}), json_line({"content": text}, pretty=True)):
        assert not any(c in out for c in CONTROLS if c != "\n") and "é 日本" in out
    assert json.loads(json_line({"content": text})) == {"content": text}
    assert shown("tab\there\nnext") == "tab here next" and shown("\x1b[2J") == "\\x1b[2J"
