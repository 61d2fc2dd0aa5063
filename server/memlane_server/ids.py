"""The one grammar of ids a client may send (user, agent, group, session, channel, memory, message).

Checked at the API boundary for every RPC, so whatever an RPC accepted, every other RPC accepts too:
a user the memory API stored can always be exported and erased. The grammar is wide enough for real
identifiers (``o'brien``, ``bob+tag@example.com``, ``José``, ``user 42``, ``D3:7``) and narrow enough
for every place an id travels:

- 1 to 128 characters and at most 200 bytes of UTF-8 (file names of archives stay under 255 bytes);
- every character printable (``str.isprintable``): no control or format characters, no line or
  paragraph separators, no surrogates, private-use or unassigned code points, no space other than
  U+0020: an id cannot forge a log line or hide text;
- it starts with a letter or digit (of any script) and does not end with a space: archive file names
  start with the session id, dataset readers skip names that start with ``.`` or ``_``, and
  ``"alice "`` cannot pose as ``alice``;
- neither ``{`` nor ``}``: ids sit inside Redis hash tags (``ml:{<session_id>}:...``,
  ``ml:user:{<user_id>}:...``);
- an id naming a session (a field ``session_id`` or ``source_session_id``) has no ``/`` either:
  archive files are named after it. Other ids may hold ``/`` (a channel ``web/eu``): where they
  reach a path they are percent-encoded.

Ids are compared in Unicode normalization form C: "José" typed on one keyboard (é, one code point)
and pasted from another (e and a combining accent) are one user everywhere, and erasing either
erases both. ``normalized`` is applied at the boundary (every id field of every request, the agent
header, an end-user token's subject) before the grammar is checked.

Ids never reach SQL text (LanceDB predicates compare digests, see ``ltm.filters``), so quotes and
backslashes are harmless and allowed.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from .errors import InvalidArgument

MAX_ID_CHARS = 128
MAX_ID_BYTES = 200
_FORBIDDEN = frozenset("{}")
_SESSION_FIELDS = ("session_id", "source_session_id")
GRAMMAR = (
    f"1-{MAX_ID_CHARS} printable characters (at most {MAX_ID_BYTES} bytes of UTF-8) starting with a"
    " letter or digit, not ending with a space, no { or }, and no / in a session id"
)


def normalized(value: str) -> str:
    """``value`` in NFC (most ids already are, and cost one check)."""
    return (
        value
        if value.isascii() or unicodedata.is_normalized("NFC", value)
        else unicodedata.normalize("NFC", value)
    )


def equivalent_forms(value: str, stored: Iterable[str] = ()) -> list[str]:
    """Every form under which an id canonically equal to ``value`` may be stored: its NFC and NFD, and
    those of ``stored`` (the ids a store holds) that normalize to the same NFC. Rows written before ids
    were normalized (or by an import that did not normalize) hold the id as the client sent it: NFD, or
    any mix of composed and decomposed marks, which only a look at what is stored can find. Compatibility
    forms (NFKC, NFKD) are not among them: "ﬁle" and "file" are two users here, and erasing one must not
    erase the other."""
    canonical = unicodedata.normalize("NFC", value)
    forms = {canonical, unicodedata.normalize("NFD", value)}
    forms.update(s for s in stored if unicodedata.normalize("NFC", s) == canonical)
    # A form outside the grammar (an NFD longer than 128 characters) was never accepted, so never stored.
    return sorted(f for f in forms if is_valid_id(f))


def id_problem(value: str, *, session: bool = False) -> str:
    """Why ``value`` is not a valid id (of a session, with ``session``), or "" when it is one."""
    if not value:
        return "is empty"
    if len(value) > MAX_ID_CHARS or len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        return "is too long"
    if not value.isprintable():
        return "holds a control, format or separator character"
    if not value[0].isalnum():
        return "does not start with a letter or digit"
    if value[-1] == " ":
        return "ends with a space"
    if _FORBIDDEN.intersection(value):
        return "holds { or }"
    if session and "/" in value:
        return "holds / (a session id names archive files)"
    return ""


def is_valid_id(value: str, *, session: bool = False) -> bool:
    return not id_problem(value, session=session)


def check_id(value: str, field: str, *, required: bool = True) -> None:
    """Raises InvalidArgument naming ``field`` unless ``value`` is a valid id (or empty and optional)."""
    if not value:
        if required:
            raise InvalidArgument(f"{field} is required", field=field, reason="REQUIRED")
        return
    problem = id_problem(value, session=field.rsplit(".", 1)[-1] in _SESSION_FIELDS)
    if problem:
        # repr() of a printable-checked prefix: the message (and the log line it lands in) stays one line.
        raise InvalidArgument(
            f"{field} {value[:64]!r} is not a valid id: it {problem} ({GRAMMAR})",
            field=field,
            reason="INVALID_ID",
        )
