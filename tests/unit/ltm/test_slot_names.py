"""One name per single-valued attribute (ltm/core.py): the names callers give fold into the family's."""

from __future__ import annotations

import pytest

from memlane_server.ltm.core import FAMILIES, MAX_SLOT_CHARS, canonical_slot, slot_by_wording


@pytest.mark.parametrize(
    ("given", "family"),
    [
        ("location", "location"),
        ("home_city", "location"),
        ("Home City", "location"),
        ("lives-in", "location"),
        (" ADDRESS ", "location"),
        ("company", "employer"),
        ("works_at", "employer"),
        ("occupation", "job"),
        ("time zone", "timezone"),
        ("favorite:Pizza Topping", "favorite:pizza_topping"),
        ("favourite_band", "favourite_band"),  # no family: kept, folded
        ("", ""),
    ],
)
def test_every_name_of_a_family_folds_to_it(given: str, family: str) -> None:
    assert canonical_slot(given) == family


def test_families_do_not_share_a_name() -> None:
    names = [n for family, aliases in FAMILIES.items() for n in (family, *aliases)]
    assert len(names) == len(set(names))


def test_a_hostile_name_is_only_folded_and_bounded() -> None:
    assert canonical_slot("../../etc/passwd") == "etc_passwd"
    assert len(canonical_slot("x" * 10_000)) == MAX_SLOT_CHARS


@pytest.mark.parametrize(
    ("content", "slot"),
    [
        ("Lives in Munich.", "location"),
        ("The user lives in Munich.", "location"),
        ("User is now based in Oslo.", "location"),
        ("Works at Acme.", "employer"),
        ("User works as a nurse.", "job"),
        ("User's name is Priya.", "name"),
        ("Was born in Porto.", "hometown"),
        ("User is from Porto.", "hometown"),
        ("I'm from Porto.", "hometown"),
        ("From now on, answer in French.", ""),
        ("Likes living in big cities.", ""),
        ("User's dog lives in the garden.", ""),
        ("Prefers window seats.", ""),
    ],
)
def test_a_statement_names_its_slot_by_its_first_words(content: str, slot: str) -> None:
    assert slot_by_wording(content) == slot
