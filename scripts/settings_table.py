"""The README's settings table, from the services' settings dataclasses.

`python -m scripts.settings_table` prints it; `--write` puts it into README.md
between its markers. tests/unit/test_readme.py checks that the README holds exactly
this text, so the table cannot drift from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from services.coordinator.settings import PREFIX as COORDINATOR
from services.coordinator.settings import CoordinatorSettings
from services.gateway.settings import PREFIX as GATEWAY
from services.gateway.settings import GatewaySettings
from services.preview.settings import PREFIX as PREVIEW
from services.preview.settings import PreviewSettings
from services.processor.settings import PREFIX as PROCESSOR
from services.processor.settings import ProcessorSettings
from workshop.kit.settings import describe_settings

SERVICES = [
    (COORDINATOR, CoordinatorSettings),
    (PREVIEW, PreviewSettings),
    (GATEWAY, GatewaySettings),
    (PROCESSOR, ProcessorSettings),
]


def render() -> str:
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for prefix, cls in SERVICES:
        for variable, default, help_text in describe_settings(cls, prefix):
            shown = "**required**" if default == "required" else f"`{default}`"
            lines.append(f"| `{variable}` | {shown} | {help_text} |")
    return "\n".join(lines) + "\n"


README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- settings:begin"
END = "<!-- settings:end -->"


def table_span(text: str) -> tuple[int, int]:
    """Where the generated table sits in the README's text."""
    begin = text.index("-->\n", text.index(BEGIN)) + len("-->\n")
    return begin, text.index(END)


def write_readme() -> None:
    text = README.read_text()
    begin, end = table_span(text)
    README.write_text(text[:begin] + render() + text[end:])


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_readme()
    else:
        print(render(), end="")
