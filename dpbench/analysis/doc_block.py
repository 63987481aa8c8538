"""Replace a generated block between two markers in a docs page."""

from __future__ import annotations


def splice(text: str, block: str, start: str, end: str) -> str:
    """Return ``text`` with everything from ``start`` through ``end`` replaced by ``block``
    (which carries the markers itself); ValueError naming a missing marker."""
    for marker in (start, end):
        if marker not in text:
            raise ValueError(f"the document has no {marker} marker")
    head, rest = text.split(start, 1)
    return head + block + rest.split(end, 1)[1]
