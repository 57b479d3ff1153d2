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
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

from services.preview.coordinator import CoordinatorClient
from services.preview.errors import (
    ImageChanged,
    ImageMissing,
    InvalidField,
    LayoutMismatch,
    NotResumable,
    OffsetPastEnd,
    StorageUnavailable,
)
from services.preview.export import SUFFIXES, DatasetArchive, ImageFacts, dataset_archive
from services.preview.images import jpeg_dimensions
from services.preview.layouts import CONTENT_TYPE as LAYOUT_CONTENT_TYPE
from services.preview.layouts import BadLayout, Layout, decode, encode, layout_key
from services.preview.metrics import EXPORT_LAYOUTS, EXPORT_READS
from services.preview.storage import ObjectStore
from workshop.v1 import common_pb2, dataset_pb2, run_pb2
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

log = logging.getLogger(__name__)


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
            layout: Layout | None = None  # what the archive is said to be (a resume's)
            recording: Layout | None = None  # what a whole export learns, to be stored
            if version is not None and (request.offset or request.with_size):
                layout = await self._layout(source, request.format, first)
                total = layout.total_bytes
                if request.offset >= total:
                    raise OffsetPastEnd(request.offset, total)
            elif version is not None and not await self.store.exists(
                layout_key(version.version_id, suffix)
            ):
                recording = Layout(version.version_id, suffix, 0)
            name = f"{bucket_id}-{suffix}.tar"
            if version is not None:
                name = f"{bucket_id}-{version.version_id[:15]}-{suffix}.tar"
            with dataset_archive(
                request.format, bucket_id, first.classes, version=version, start=request.offset
            ) as archive:
                archive.recording = recording
                out = _Responses(name, archive, total)
                # aclosing: an abandoned stream cancels the reads in flight at once.
                async with aclosing(_with_bytes(pages, self.store, archive, layout)) as items:
                    async for item, image, known in items:
                        if image is None:
                            assert known is not None
                            archive.add_known(item, known)
                            continue
                        for response in out.send(archive.add(item, image)):
                            yield response
                for response in out.send(archive.finish()):
                    yield response
                if layout is not None and archive.size != layout.total_bytes:
                    EXPORT_LAYOUTS.labels("mismatch").inc()
                    await self.store.remove([layout_key(layout.version_id, suffix)])
                    raise LayoutMismatch(layout.version_id)
                if recording is not None:
                    recording.total_bytes = archive.size
                    await self._store_layout(recording)
                yield out.last()
        finally:
            pages.stop()

    async def _layout(
        self,
        source: _Source,
        dataset_format: run_pb2.DatasetFormat.ValueType,
        first: pub.ListExportItemsResponse,
    ) -> Layout:
        """The version's archive layout: stored, else laid out from the images' headers
        (or from the facts of its layout in the other format) and stored."""
        version = first.version
        suffix = SUFFIXES[dataset_format]
        stored = await self._stored_layout(version, suffix)
        if stored is not None:
            return stored
        facts: Layout | None = None
        for other in SUFFIXES.values():
            if other != suffix and facts is None:
                facts = await self._stored_layout(version, other, quiet=True)
        layout = await self._lay_out(source, dataset_format, first, facts)
        await self._store_layout(layout)
        return layout

    async def _stored_layout(
        self, version: dataset_pb2.DatasetVersion, suffix: str, *, quiet: bool = False
    ) -> Layout | None:
        """The stored layout, checked; None when there is none or it is not this one's."""
        key = layout_key(version.version_id, suffix)
        try:
            data = await self.store.get(key)
        except ImageMissing:
            if not quiet:
                EXPORT_LAYOUTS.labels("missing").inc()
            return None
        EXPORT_READS.labels("layout").inc()
        try:
            layout = await asyncio.to_thread(
                decode, data, version.version_id, suffix, version.item_count
            )
        except BadLayout as error:
            EXPORT_LAYOUTS.labels("bad").inc()
            log.warning("the stored layout %s is not usable (%s); laying out again", key, error)
            return None
        if not quiet:
            EXPORT_LAYOUTS.labels("found").inc()
        return layout

    async def _store_layout(self, layout: Layout) -> None:
        """Stores a layout; a failure costs the next resume a layout pass, not this export."""
        key = layout_key(layout.version_id, layout.suffix)
        try:
            data = await asyncio.to_thread(encode, layout)
            await self.store.put_unrecorded(key, data, LAYOUT_CONTENT_TYPE)
        except StorageUnavailable as error:
            log.warning("could not store the layout %s: %s", key, error)
            return
        EXPORT_LAYOUTS.labels("stored").inc()

    async def _lay_out(
        self,
        source: _Source,
        dataset_format: run_pb2.DatasetFormat.ValueType,
        first: pub.ListExportItemsResponse,
        known: Layout | None,
    ) -> Layout:
        """Every image's facts from its header (or from `known`, the layout in another
        format), and the archive's size: the archive made with no byte written (every
        member counted, none emitted)."""
        layout = Layout(first.version.version_id, SUFFIXES[dataset_format], 0)
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
                    if known is not None:
                        found = [known.at(layout.items + n) for n in range(len(batch))]
                    else:
                        found = await asyncio.gather(
                            *(_facts(self.store, item, gate) for item in batch)
                        )
                    for item, one in zip(batch, found, strict=True):
                        layout.append(one)
                        archive.add_known(item, one)
                    if not await pages.more():
                        break
                for _ in archive.finish():
                    pass  # nothing is emitted before the start
                layout.total_bytes = archive.size
                return layout
        finally:
            pages.stop()


async def _facts(store: ObjectStore, item: pub.ExportItem, gate: asyncio.Semaphore) -> ImageFacts:
    """An image's size and dimensions from its first HEADER_BYTES (all of it when its frame
    header lies further in)."""
    async with gate:
        try:
            head, size = await store.get_head(item.object_key, HEADER_BYTES)
            EXPORT_READS.labels("header").inc()
            dimensions = jpeg_dimensions(head)
            if dimensions is None and size > len(head):
                head = await store.get(item.object_key)
                EXPORT_READS.labels("image").inc()
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
    layout: Layout | None,
) -> AsyncGenerator[tuple[pub.ExportItem, bytes | None, ImageFacts | None], None]:
    """Each item with its bytes, in order, reading up to READ_AHEAD objects ahead; for the
    items of a resumed archive that end before its start, no bytes but their facts (from
    `layout`)."""
    window: deque[tuple[pub.ExportItem, asyncio.Task[bytes]]] = deque()
    taken = 0  # items taken off the pages: the next one's index in the layout
    try:
        while True:
            # Take the next page once it is here, or once there is nothing else to do.
            while not pages.items and (pages.ready() or not window) and await pages.more():
                pass  # a page may come empty with more after it
            while layout is not None and not window and pages.items:
                known = layout.at(taken)
                if not archive.skips(pages.items[0], known):
                    break
                taken += 1
                yield pages.items.popleft(), None, known
            while pages.items and len(window) < READ_AHEAD:
                item = pages.items.popleft()
                taken += 1
                window.append((item, asyncio.ensure_future(_read(store, item))))
            if not window:
                if pages.has_more():
                    continue  # every item of this page was skipped
                return
            item, read = window.popleft()
            yield item, await read, None
    finally:
        for _, read in window:
            _abandon(read)


async def _read(store: ObjectStore, item: pub.ExportItem) -> bytes:
    try:
        image = await store.get(item.object_key)
    except ImageMissing:
        raise _missing(item) from None
    EXPORT_READS.labels("image").inc()
    return image


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
