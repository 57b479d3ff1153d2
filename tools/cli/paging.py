"""How many entries a list asks for: the server's own bounds (`workshop.kit.limits`),
never numbers of the CLI's own, so `--limit`'s help and range are what the server keeps."""

from __future__ import annotations

from typing import Any

import typer

from workshop.kit.limits import IMAGE_LIMIT, PAGE

# One page as large as the server allows: "all" for the lists an operator keeps short.
WHOLE_PAGE = PAGE.maximum
IMAGE_LIMIT_HELP = (
    f"test runs: {IMAGE_LIMIT.minimum}..{IMAGE_LIMIT.maximum} images "
    f"(default {IMAGE_LIMIT.default})"
)


def limit_option(order: str) -> Any:
    """`--limit`: 1 to the server's maximum page, its default page by default."""
    return typer.Option(
        PAGE.default,
        min=1,
        max=PAGE.maximum,
        help=f"at most this many, {order} (1..{PAGE.maximum:,})",
    )
