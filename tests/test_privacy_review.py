"""docs/privacy-review.md's line counts are generated from the files they count."""

from __future__ import annotations

from tests.helpers.review_table import PAGE, REPO, TABLES, rendered


def test_the_review_tables_are_the_files_as_they_are():
    page = PAGE.read_text()
    assert rendered(page) == page, (
        "docs/privacy-review.md is stale: run python -m tests.helpers.review_table --write")


def test_every_file_the_review_names_exists():
    assert all((REPO / path).is_file() for rows in TABLES.values() for path, _ in rows)
