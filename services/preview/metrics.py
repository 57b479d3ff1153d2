"""The preview service's own series (docs/metrics.md); RPC series come from the kit."""

from __future__ import annotations

from prometheus_client import Counter

from workshop.kit.metrics import REGISTRY
from workshop.kit.object_keys import TEST_PREFIX

KINDS = ("preview", "upload")

# path: `relayed` (this service wrote the bytes) or `direct` (a processor wrote them
# with a grant and this service recorded them).
PUTS = Counter(
    "workshop_preview_puts",
    "Objects written to the bucket and recorded, by kind (preview, upload) and path.",
    ["kind", "path"],
    registry=REGISTRY,
)
PUT_BYTES = Counter(
    "workshop_preview_put_bytes",
    "Bytes of the objects written to the bucket and recorded, by kind and path.",
    ["kind", "path"],
    registry=REGISTRY,
)
# source: `attestation` (the claim's signed lease attestation verified: no call), `cache`
# (CheckLease's answer of the last few seconds reused) or `coordinator` (CheckLease asked).
LEASE_CHECKS = Counter(
    "workshop_preview_lease_checks",
    "Leases checked before granting or writing preview bytes, by where the answer came from "
    "(attestation, cache, coordinator).",
    ["source"],
    registry=REGISTRY,
)
for _source in ("attestation", "cache", "coordinator"):
    LEASE_CHECKS.labels(_source)  # every series from the start, at 0
CLEANUP_DELETIONS = Counter(
    "workshop_preview_cleanup_deletions",
    "Objects the cleanup passes deleted, by kind.",
    ["kind"],
    registry=REGISTRY,
)
CLEANUP_DELETED_BYTES = Counter(
    "workshop_preview_cleanup_deleted_bytes",
    "Bytes of the objects the cleanup passes deleted, by kind.",
    ["kind"],
    registry=REGISTRY,
)

# outcome: `ok` (the pass ran through), `partial` (it ran through, but the store refused to
# delete some objects, handed back for the next pass) or `failed` (it stopped on an error:
# the coordinator or the store did not answer).
CLEANUP_PASSES = Counter(
    "workshop_preview_cleanup_passes",
    "Cleanup passes run (the loop's and RunCleanup's), by outcome (ok, partial, failed).",
    ["outcome"],
    registry=REGISTRY,
)
for _outcome in ("ok", "partial", "failed"):
    CLEANUP_PASSES.labels(_outcome)  # every series from the start, at 0


def kind_of(key: str) -> str:
    """`preview` or `upload` from an object key (workshop.kit.object_keys); `other` for a
    key of another shape, so the label set stays bounded."""
    kind = key.removeprefix(TEST_PREFIX).partition("/")[0].removesuffix("s")
    return kind if kind in KINDS else "other"


def count_put(key: str, size: int, path: str = "relayed") -> None:
    kind = kind_of(key)
    PUTS.labels(kind, path).inc()
    PUT_BYTES.labels(kind, path).inc(size)


def count_deletion(key: str, size: int) -> None:
    kind = kind_of(key)
    CLEANUP_DELETIONS.labels(kind).inc()
    CLEANUP_DELETED_BYTES.labels(kind).inc(size)


# kind: `image` (an exported image read whole), `header` (its first HEADER_BYTES, to lay a
# version's archive out) or `layout` (a version's stored layout, docs/datasets.md).
EXPORT_READS = Counter(
    "workshop_preview_export_reads",
    "Objects read from the bucket by dataset exports, by kind (image, header, layout).",
    ["kind"],
    registry=REGISTRY,
)
# outcome: `found` (a resume read it back), `missing`, `bad` (corrupt or of something else:
# laid out again), `stored` (written by the export that worked it out) or `mismatch` (the
# archive written did not match it: deleted).
EXPORT_LAYOUTS = Counter(
    "workshop_preview_export_layouts",
    "Stored archive layouts of dataset versions, by outcome (found, missing, bad, stored, "
    "mismatch).",
    ["outcome"],
    registry=REGISTRY,
)
for _kind in ("image", "header", "layout"):
    EXPORT_READS.labels(_kind)
for _outcome in ("found", "missing", "bad", "stored", "mismatch"):
    EXPORT_LAYOUTS.labels(_outcome)
