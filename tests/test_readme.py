"""The README's settings table is the one the code describes."""

from __future__ import annotations

from pathlib import Path

from scripts.settings_table import render

README = Path(__file__).resolve().parents[1] / "README.md"


def test_settings_table_matches_the_code() -> None:
    text = README.read_text()
    begin = text.index("-->\n", text.index("<!-- settings:begin")) + len("-->\n")
    end = text.index("<!-- settings:end -->")
    assert text[begin:end] == render(), "run `python -m scripts.settings_table` into README.md"
