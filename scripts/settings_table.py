"""Print the README's settings table from the services' settings dataclasses.

`python -m scripts.settings_table` prints it; tests/test_readme.py checks that
the README holds exactly this text, so the table cannot drift from the code.
"""

from __future__ import annotations

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


if __name__ == "__main__":
    print(render(), end="")
