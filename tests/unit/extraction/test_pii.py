"""The PII guard: what it must catch, and what ordinary memories it must leave alone."""

from __future__ import annotations

import pytest

from memlane_server.extraction.pii import find_pii, luhn_ok, redact

CAUGHT = [
    ("write to priya.sharma+work@example.co.in", "EMAIL"),
    ("my number is +91 98450 12345", "PHONE"),
    ("call me on (415) 555-2671", "PHONE"),
    ("office 020 7946 0958", "PHONE"),
    ("card 4111 1111 1111 1111 exp 12/27", "CARD"),
    ("card 5500-0000-0000-0004", "CARD"),
    ("IBAN DE89 3704 0044 0532 0130 00", "IBAN"),
    ("pay GB82WEST12345698765432", "IBAN"),
    ("my SSN is 123-45-6789", "NATIONAL_ID"),
    ("NI number AB 12 34 56 C", "NATIONAL_ID"),
    ("aadhaar 2345 6789 0123", "NATIONAL_ID"),
    ("PAN ABCDE1234F", "NATIONAL_ID"),
    ("passport number X1234567", "NATIONAL_ID"),
    ("key sk-proj-abcdefghijklmnopqrstuvwx", "SECRET"),
    ("AKIAIOSFODNN7EXAMPLE", "SECRET"),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "SECRET"),
    ("my password is hunter22", "SECRET"),
    ("api_key=abcd1234efgh", "SECRET"),
    ("I live at 221B Baker Street", "ADDRESS"),
    ("ship it to 1600 Pennsylvania Avenue", "ADDRESS"),
    ("flat 4B, apt 12", "ADDRESS"),
    ("PO Box 1234", "ADDRESS"),
    ("My date of birth is 12 March 1990.", "DATE_OF_BIRTH"),
    ("DOB: 1990-03-12", "DATE_OF_BIRTH"),
    ("I was born on March 12th, 1990 in Goa", "DATE_OF_BIRTH"),
    ("the server's IP is 192.168.10.24.", "IP_ADDRESS"),
    ("ssh to 2001:db8::ff00:42:8329 now", "IP_ADDRESS"),
]

CLEAN = [
    "User lives in Pune.",
    "User prefers metric units.",
    "Order 12345678 shipped on 2024-05-01",
    "ticket INC-2024-00123 is open",
    "SKU-4411-B is out of stock",
    "meeting at 10:30 tomorrow",
    "my birthday is 12 March",
    "I was born in Goa",
    "upgrade to version 1.2.3 first",
    "the call is at 10:30:45",
    "I ran 5 km on the main road",
    "version 1.2.3 of the app",
    "card 4111 1111 1111 1112",  # fails Luhn: not a card number
    "User has 3 kids and 2 dogs.",
    "the years 2019 and 2020",
]


@pytest.mark.parametrize(("text", "kind"), CAUGHT)
def test_catches(text: str, kind: str) -> None:
    assert kind in find_pii(text)
    assert f"[{kind}]" in redact(text)


@pytest.mark.parametrize("text", CLEAN)
def test_leaves_ordinary_text_alone(text: str) -> None:
    assert find_pii(text) == []
    assert redact(text) == text


def test_luhn() -> None:
    assert luhn_ok("4111111111111111")
    assert not luhn_ok("4111111111111112")


def test_redact_keeps_the_rest() -> None:
    assert redact("mail a@b.io or call +1 415 555 2671 today") == "mail [EMAIL] or call [PHONE] today"
