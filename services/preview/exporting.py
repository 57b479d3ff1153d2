"""Exporting a bucket as a dataset (PreviewService.ExportBucket, docs/review.md).

The coordinator pages the bucket's items for the caller (ListExportItems, the caller's
credential on behalf, so it decides who sees which cameras); their bytes come from
object storage; export.py turns both into tar chunks that go out as the stream's
responses. Two reads run ahead of the archive, each bounded: the next page while the
current one is written, and up to READ_AHEAD objects. Everything else is taken, written
and sent one item at a time, and gRPC's flow control holds the loop while the client
is slower than we are, so memory stays flat at any bucket size.

A dataset version's archive (docs/datasets.md) is the same bytes every time, so it can be
resumed at any byte (`offset`) and measured (`with_size`): a first pass lays it out from
the images' headers alone (`HEADER_BYTES` each: the byte size and, for COCO, the width
and height), then the archive is written from the offset on, reading whole only the
images whose members reach past it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

from services.preview.coordinator import CoordinatorClient
from services.preview.errors import (
    ImageChanged,
    ImageMissing,
    InvalidField,
    NotResumable,
    OffsetPastEnd,
)
from services.preview.export import SUFFIXES, DatasetArchive, ImageFacts, dataset_archive
from services.preview.images import jpeg_dimensions
from services.preview.storage import ObjectStore
from workshop.v1 import common_pb2, run_pb2
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import publication_pb2 as pub

PAGE_SIZE = 500
# Objects read ahead of the archive: enough to hide an S3 round trip behind the writing
# of the items before it, few enough that a bucket of large images stays small in memory.
READ_AHEAD = 8
# Bytes read of an image to lay out a member it skips: its size comes with the answer, and
# a JPEG's frame header (its width and height) sits in its first kilobytes.
HEADER_BYTES = 64 * 1024
# Header reads in flight at once while laying out a version's archive.
LAYOUT_READS = 32


class BucketExports:
    def __init__(self, coordinator: CoordinatorClient, store: ObjectStore) -> None:
        self.coordinator = coordinator
        self.store = store

    async def export(
        self, reader: str, request: pb.ExportBucketRequest
    ) -> AsyncIterator[pb.ExportBucketResponse]:
        """The archive's chunks: the first with its file name, the last with the count."""
        suffix = SUFFIXES.get(request.format)
        if suffix is None:
            raise InvalidField("format", "format must be DATASET_FORMAT_COCO or _YOLO.")
        version_id = request.dataset_version_id
        if version_id and request.HasField("filter"):
            raise InvalidField(
                "filter", "filter must be unset with dataset_version_id: a version is frozen."
            )
        if not version_id:
            if request.offset or request.with_size:
                field = "offset" if request.offset else "with_size"
                raise NotResumable(
                    field,
                    "Only a dataset version's export can be resumed or measured: a live "
                    "export changes with the bucket. Freeze a version (DatasetService."
                    "CreateDatasetVersion) and export it.",
                )
            if not request.bucket_id:
                raise InvalidField("bucket_id", "bucket_id is required.")
        wanted = run_pb2.BucketItemFilter()
        if not version_id:
            wanted.CopyFrom(request.filter)
            if not wanted.review_states:
                wanted.review_states.append(common_pb2.REVIEW_STATE_ACCEPTED)
        source = _Source(self.coordinator, reader, request.bucket_id, wanted, version_id)
        pages = source.pages()
        try:
            first = await pages.first()
            version = first.version if first.HasField("version") else None
            bucket_id = version.bucket_id if version is not None else request.bucket_id
            total: int | None = None
            facts: dict[str, ImageFacts] = {}
            if version is not None and (request.offset or request.with_size):
                facts, total = await self._layout(source, request.format, first)
                if request.offset >= total:
                    raise OffsetPastEnd(request.offset, total)
            name = f"{bucket_id}-{suffix}.tar"
            if version is not None:
                name = f"{bucket_id}-{version.version_id[:15]}-{suffix}.tar"
            with dataset_archive(
                request.format, bucket_id, first.classes, version=version, start=request.offset
            ) as archive:
                out = _Responses(name, archive, total)
                # aclosing: an abandoned stream cancels the reads in flight at once.
                async with aclosing(_with_bytes(pages, self.store, archive, facts)) as items:
                    async for item, image in items:
                        chunks = (
                            archive.add(item, image)
                            if image is not None
                            else _known(archive, item, facts[item.item_id])
                        )
                        for response in out.send(chunks):
                            yield response
                for response in out.send(archive.finish()):
                    yield response
                yield out.last()
        finally:
            pages.stop()

    async def _layout(
        self,
        source: _Source,
        dataset_format: run_pb2.DatasetFormat.ValueType,
        first: pub.ListExportItemsResponse,
    ) -> tuple[dict[str, ImageFacts], int]:
        """Every image's facts from its header, and the archive's size: the archive made
        with no byte written (every member counted, none emitted)."""
        facts: dict[str, ImageFacts] = {}
        pages = source.pages()
        gate = asyncio.Semaphore(LAYOUT_READS)
        try:
            await pages.first()
            with dataset_archive(
                dataset_format,
                first.version.bucket_id,
                first.classes,
                version=first.version,
                start=2**62,
            ) as archive:
                while True:
                    batch = list(pages.items)
                    pages.items.clear()
                    found = await asyncio.gather(
                        *(_facts(self.store, item, gate) for item in batch)
                    )
                    for item, one in zip(batch, found, strict=True):
                        facts[item.item_id] = one
                        archive.add_known(item, one)
                    if not await pages.more():
                        break
                for _ in archive.finish():
                    pass  # nothing is emitted before the start
                return facts, archive.size
        finally:
            pages.stop()


def _known(archive: DatasetArchive, item: pub.ExportItem, facts: ImageFacts) -> Iterator[bytes]:
    archive.add_known(item, facts)
    return iter(())


async def _facts(store: ObjectStore, item: pub.ExportItem, gate: asyncio.Semaphore) -> ImageFacts:
    """An image's size and dimensions from its first HEADER_BYTES (all of it when its frame
    header lies further in)."""
    async with gate:
        try:
            head, size = await store.get_head(item.object_key, HEADER_BYTES)
            dimensions = jpeg_dimensions(head)
            if dimensions is None and size > len(head):
                head = await store.get(item.object_key)
                dimensions = jpeg_dimensions(head)
        except ImageMissing:
            raise _missing(item) from None
    if dimensions is None:
        dimensions = (0, 0)  # not a JPEG: the export stops when it reaches the item's bytes
    return ImageFacts(size, *dimensions)


class _Source:
    """Where an export's items come from: a bucket (filtered) or a dataset version."""

    def __init__(
        self,
        coordinator: CoordinatorClient,
        reader: str,
        bucket_id: str,
        wanted: run_pb2.BucketItemFilter,
        version_id: str,
    ) -> None:
        self._args = (coordinator, reader, bucket_id, wanted, version_id)

    def pages(self) -> _Pages:
        return _Pages(*self._args)


class _Pages:
    """The items of every page in order, asking for the next page as soon as one
    arrives (one page in flight at most)."""

    def __init__(
        self,
        coordinator: CoordinatorClient,
        reader: str,
        bucket_id: str,
        wanted: run_pb2.BucketItemFilter,
        version_id: str = "",
    ) -> None:
        self._coordinator = coordinator
        self._reader = reader
        self._bucket_id = bucket_id
        self._wanted = wanted
        self._version_id = version_id
        self._next: asyncio.Task[pub.ListExportItemsResponse] | None = None
        self.items: deque[pub.ExportItem] = deque()

    async def first(self) -> pub.ListExportItemsResponse:
        page = await self._ask("")
        self._took(page)
        return page

    def _ask(self, token: str) -> asyncio.Task[pub.ListExportItemsResponse]:
        request = pub.ListExportItemsRequest(
            bucket_id=self._bucket_id, page_size=PAGE_SIZE, page_token=token
        )
        if self._version_id:
            request.dataset_version_id = self._version_id
        else:
            request.filter.CopyFrom(self._wanted)
        return asyncio.ensure_future(self._coordinator.list_export_items(request, self._reader))

    def _took(self, page: pub.ListExportItemsResponse) -> None:
        self.items.extend(page.items)
        self._next = self._ask(page.next_page_token) if page.next_page_token else None

    def ready(self) -> bool:
        """Whether the next page is here (or there is none), so taking it waits for nothing."""
        return self._next is None or self._next.done()

    async def more(self) -> bool:
        """Waits for the next page into `items`; False when there is none."""
        if self._next is None:
            return False
        self._took(await self._next)
        return True

    def has_more(self) -> bool:
        return self._next is not None

    def stop(self) -> None:
        if self._next is not None:
            _abandon(self._next)
            self._next = None


async def _with_bytes(
    pages: _Pages,
    store: ObjectStore,
    archive: DatasetArchive,
    facts: dict[str, ImageFacts],
) -> AsyncGenerator[tuple[pub.ExportItem, bytes | None], None]:
    """Each item with its bytes, in order, reading up to READ_AHEAD objects ahead; None
    for the items of a resumed archive that end before its start (`facts` knows them)."""
    window: deque[tuple[pub.ExportItem, asyncio.Task[bytes]]] = deque()
    try:
        while True:
            # Take the next page once it is here, or once there is nothing else to do.
            while not pages.items and (pages.ready() or not window) and await pages.more():
                pass  # a page may come empty with more after it
            while not window and pages.items:
                known = facts.get(pages.items[0].item_id)
                if known is None or not archive.skips(pages.items[0], known):
                    break
                yield pages.items.popleft(), None
            while pages.items and len(window) < READ_AHEAD:
                item = pages.items.popleft()
                window.append((item, asyncio.ensure_future(_read(store, item))))
            if not window:
                if pages.has_more():
                    continue  # every item of this page was skipped
                return
            item, read = window.popleft()
            yield item, await read
    finally:
        for _, read in window:
            _abandon(read)


async def _read(store: ObjectStore, item: pub.ExportItem) -> bytes:
    try:
        return await store.get(item.object_key)
    except ImageMissing:
        raise _missing(item) from None


def _missing(item: pub.ExportItem) -> ImageChanged:
    return ImageChanged(
        item.item_id,
        f"The bytes of item {item.item_id} are missing from object storage; the export stopped.",
    )


def _abandon(task: asyncio.Task[Any]) -> None:
    """Cancels a read nobody will wait for, and takes its outcome so none is logged."""
    task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())


class _Responses:
    """Chunks as responses, one held back so that the last can say it is the last."""

    def __init__(self, file_name: str, archive: DatasetArchive, total: int | None) -> None:
        self._file_name = file_name
        self._archive = archive
        self._total = total
        self._held: bytes | None = None
        self._sent = False

    def send(self, chunks: Iterator[bytes]) -> Iterator[pb.ExportBucketResponse]:
        for chunk in chunks:
            if self._held is not None:
                yield self._response(self._held)
            self._held = chunk

    def last(self) -> pb.ExportBucketResponse:
        response = self._response(self._held or b"")
        response.last = True
        response.items = self._archive.items
        return response

    def _response(self, data: bytes) -> pb.ExportBucketResponse:
        response = pb.ExportBucketResponse(data=data)
        if not self._sent:
            response.file_name = self._file_name
            if self._total is not None:
                response.total_bytes = self._total
            self._sent = True
        return response
