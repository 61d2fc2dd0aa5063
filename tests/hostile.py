"""A corpus of hostile strings for ids and contents: SQL breakouts (the LanceDB ``to_sql`` bug with a
quote after a backslash), comments, NUL, newlines, Unicode quotes and look-alikes, very long values.
Shared by the predicate tests and the property tests through the server."""

from __future__ import annotations

from hypothesis import strategies as st

from memlane_server.ids import is_valid_id

HOSTILE: list[str] = [
    "a\\')) OR true --",
    "a\\') OR true --",
    "o'brien",
    "o''brien",
    "x' OR '1'='1",
    "x\\' OR 1=1 /* c */ --",
    "x\\\\'; DELETE FROM memories; --",
    "x/* */' OR user_id IS NOT NULL --",
    'x" OR "1"="1',
    "x`) OR true --",
    "x\u2019 OR true --",  # right single quotation mark
    "x\u02bc OR true",  # modifier letter apostrophe
    "x\uff07 OR true",  # fullwidth apostrophe
    "x%' OR '%'='",
    "x_%",
    "José",
    "user 42",
    "bob+tag@example.com",
    "x\\",
    "x\\\\",
    "a\x00b",
    "a\nb' OR true --",
    "a\rb",
    "a\u2028b",
    "a\u202eb",  # right-to-left override
    "a\u200bb",  # zero width space
    "x" + "'" * 300,
    "y" * 5000,
]


def hostile_ids() -> st.SearchStrategy[str]:
    """Ids a caller may send: the corpus, corpus pieces glued to random text, and random Unicode."""
    text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=0, max_size=16)
    return st.one_of(
        st.sampled_from(HOSTILE),
        st.builds(lambda a, b: a + b, st.sampled_from(HOSTILE), text),
        st.builds(lambda a, b: "u" + a + b, text, st.sampled_from(["'", "\\'", "')) OR true --", "*/"])),
        text,
    )


def valid_ids() -> st.SearchStrategy[str]:
    """Random ids the grammar accepts (``memlane_server.ids``)."""
    chars = st.characters(codec="utf-8", exclude_categories=["Cs", "Cc", "Cf", "Zl", "Zp", "Co", "Cn"])
    return st.text(chars, min_size=1, max_size=12).filter(is_valid_id)
