"""What the demo prints: one line per stage, a progress bar, and fixed-width tables.

Lines may come from worker threads (parts of the stack start in parallel), so every write
takes one lock. On a terminal the progress bar redraws one line with `\\r`; elsewhere (a log,
a test reading the output) it prints a line only when the figures change.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TextIO

BAR_WIDTH = 30


class Console:
    def __init__(self, stream: TextIO = sys.stdout) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._interactive = stream.isatty()
        self._bar_open = False
        self._last_bar = ""

    def line(self, text: str = "") -> None:
        with self._lock:
            self._close_bar()
            self._stream.write(text + "\n")
            self._stream.flush()

    @contextlib.contextmanager
    def stage(self, doing: str, done: str = "done") -> Iterator[None]:
        """`doing… done in 1.2 s` on one line once the block finishes (or `failed`)."""
        began = time.perf_counter()
        try:
            yield
        except BaseException:
            self.line(f"{doing}… failed after {time.perf_counter() - began:.1f} s")
            raise
        self.line(f"{doing}… {done} in {time.perf_counter() - began:.1f} s")

    def progress(self, label: str, done: int, total: int, detail: str) -> None:
        """Draw `label [####....] done/total detail`; call again to update it."""
        filled = BAR_WIDTH * min(done, total) // total if total else 0
        text = f"{label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} {detail}"
        with self._lock:
            if self._interactive:
                self._stream.write("\r" + text.ljust(len(self._last_bar)))
                self._bar_open = True
            elif text != self._last_bar:
                self._stream.write(text + "\n")
            self._last_bar = text
            self._stream.flush()

    def end_progress(self) -> None:
        with self._lock:
            self._close_bar()
            self._last_bar = ""

    def _close_bar(self) -> None:
        if self._bar_open:
            self._stream.write("\n")
            self._bar_open = False


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart; the last column is not padded."""
    widths = [len(header) for header in headers]
    for row in rows:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]

    def render(cells: Sequence[str]) -> str:
        padded = [cell.ljust(width) for cell, width in zip(cells[:-1], widths, strict=False)]
        return "  ".join([*padded, cells[-1]]).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return [render(headers), rule, *(render(row) for row in rows)]
