"""The browser tests change no tracked file: they write the README's screenshots
(docs/screenshots/) only when `make screenshots` asks them to, and into a folder of their
own otherwise (testbed/harness/browser.py)."""

from __future__ import annotations

import re
from pathlib import Path

from testbed.harness.browser import DOCS_SCREENSHOTS, WRITE_SCREENSHOTS, screenshot_folder

ROOT = DOCS_SCREENSHOTS.parents[1]  # the repository (wherever this file lies in tests/)


def test_screenshots_go_to_docs_only_when_asked(tmp_path: Path) -> None:
    assert screenshot_folder({}, tmp_path) == tmp_path / "screenshots"
    assert screenshot_folder({WRITE_SCREENSHOTS: "0"}, tmp_path) == tmp_path / "screenshots"
    assert screenshot_folder({WRITE_SCREENSHOTS: "1"}, tmp_path) == DOCS_SCREENSHOTS
    assert (ROOT / "Makefile").is_file()


def test_make_screenshots_asks_for_them_and_every_screenshot_goes_through_the_fixture() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^screenshots:.*\n\t(.+)$", makefile, re.MULTILINE)
    assert recipe is not None
    assert recipe.group(1).startswith(f"{WRITE_SCREENSHOTS}=1 $(BIN)/pytest ")
    # Each screenshot a test takes is a file in the `screenshots` fixture's folder.
    takes = 0
    for test in sorted((ROOT / "tests").rglob("test_*.py")):
        for call in re.findall(r"\.screenshot\((.*?)\)", test.read_text(), re.DOTALL):
            assert "path=str(screenshots / " in call, (test.name, call)
            takes += 1
    assert takes >= 6
