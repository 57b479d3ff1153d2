"""The README's settings table is the one the code describes."""

from __future__ import annotations

from scripts.settings_table import README, render, table_span


def test_settings_table_matches_the_code() -> None:
    text = README.read_text()
    begin, end = table_span(text)
    assert text[begin:end] == render(), "run `python -m scripts.settings_table --write`"
