"""A process that writes many cells to one choices file (the locking test's writer).

It lives apart from the test module so that a spawned writer imports only
``dpbench.tune.choices``, not the test module's torch and dp-accounting: the writers then
start together and their writes overlap.
"""

from __future__ import annotations

from dpbench.tune.choices import write_choice


def write_many(path: str, writer: int, cells: int = 15) -> None:
    for i in range(cells):
        write_choice(path, f"w{writer}-{i}", {"mode": "unaccounted", "overrides": {}})
