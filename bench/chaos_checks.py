"""The chaos soak's SQL (bench/chaos_soak.sql): the job history it installs and the checks
it runs after the soak, as named blocks.

Its own module so that tests/service/test_chaos_soak_checks.py, which proves each check
finds what it names, imports these statements and not the soak's whole stack launcher.
"""

from __future__ import annotations

from pathlib import Path

from services.coordinator.platform.queries import parse_queries

QUERIES = parse_queries(
    Path(__file__).with_name("chaos_soak.sql").read_text(encoding="utf-8"), source="chaos_soak.sql"
)
