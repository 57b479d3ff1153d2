"""The web console's pages: `GET /` answers the entry page, `/console/...` its files.

The console is plain HTML, CSS and JavaScript ES modules in `services/gateway/console/`,
served as they are committed: no build step, so nothing to install to work on it and
nothing fetched at run time (no CDN, no external fonts). The files hold no data and
need no credential; every page reads the data from the `/api` routes with the session
cookie, so the API's checks are the only ones (docs/console.md).
"""

from __future__ import annotations

import os
from os import PathLike
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

CONSOLE_DIR = Path(__file__).resolve().parent / "console"
ASSETS_PATH = "/console"
# Only this origin's scripts, styles, images and connections; no framing, no <base>,
# forms post only here. The pages have no inline script or style.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


async def entry(_: Request) -> Response:
    """The console's entry page (revalidated on every load, so a new release shows)."""
    return FileResponse(
        CONSOLE_DIR / "index.html",
        media_type="text/html; charset=utf-8",
        headers={**HEADERS, "Cache-Control": "no-cache"},
    )


class _Assets(StaticFiles):
    """StaticFiles with the console's headers; browsers revalidate (ETag) every load."""

    def file_response(
        self,
        full_path: PathLike[str] | str,
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update({**HEADERS, "Cache-Control": "no-cache"})
        return response


def assets() -> StaticFiles:
    return _Assets(directory=CONSOLE_DIR)
