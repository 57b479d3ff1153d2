"""Exporting a bucket as a dataset (PreviewService.ExportBucket, docs/review.md).

The coordinator pages the bucket's items for the caller (ListExportItems, the caller's
credential on behalf, so it decides who sees which cameras); their bytes come from
object storage; export.py turns both into tar chunks that go out as the stream's
responses. Two reads run ahead of the archive, each bounded: the next page while the
current one is written, and up to READ_AHEAD objects. Everything else is taken, written
and sent one item at a time, and gRPC's flow control holds the loop while the client
is slower than we are, so memory stays flat at any bucket size.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

from services.preview.coordinator import CoordinatorClient
from services.preview.errors import ImageChanged, ImageMissing, InvalidField
from services.preview.export import SUFFIXES, DatasetArchive, dataset_archive
from services.preview.storage import ObjectStore
from workshop.v1 import common_pb2, run_pb2
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import publication_pb2 as pub

PAGE_SIZE = 500
# Objects read ahead of the archive: enough to hide an S3 round trip behind the writing
# of the items before it, few enough that a bucket of large images stays small in memory.
READ_AHEAD = 8


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
        if not request.bucket_id:
            raise InvalidField("bucket_id", "bucket_id is required.")
        wanted = run_pb2.BucketItemFilter()
        wanted.CopyFrom(request.filter)
        if not wanted.review_states:
            wanted.review_states.append(common_pb2.REVIEW_STATE_ACCEPTED)
        pages = _Pages(self.coordinator, reader, request.bucket_id, wanted)
        try:
            first = await pages.first()
            with dataset_archive(request.format, request.bucket_id, first.classes) as archive:
                out = _Responses(f"{request.bucket_id}-{suffix}.tar", archive)
                # aclosing: an abandoned stream cancels the reads in flight at once.
                async with aclosing(_with_bytes(pages, self.store)) as items:
                    async for item, image in items:
                        for response in out.send(archive.add(item, image)):
                            yield response
                for response in out.send(archive.finish()):
                    yield response
                yield out.last()
        finally:
            pages.stop()


class _Pages:
    """The items of every page in order, asking for the next page as soon as one
    arrives (one page in flight at most)."""

    def __init__(
        self,
        coordinator: CoordinatorClient,
        reader: str,
        bucket_id: str,
        wanted: run_pb2.BucketItemFilter,
    ) -> None:
        self._coordinator = coordinator
        self._reader = reader
        self._bucket_id = bucket_id
        self._wanted = wanted
        self._next: asyncio.Task[pub.ListExportItemsResponse] | None = None
        self.items: deque[pub.ExportItem] = deque()

    async def first(self) -> pub.ListExportItemsResponse:
        page = await self._ask("")
        self._took(page)
        return page

    def _ask(self, token: str) -> asyncio.Task[pub.ListExportItemsResponse]:
        request = pub.ListExportItemsRequest(
            bucket_id=self._bucket_id, filter=self._wanted, page_size=PAGE_SIZE, page_token=token
        )
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

    def stop(self) -> None:
        if self._next is not None:
            _abandon(self._next)
            self._next = None


async def _with_bytes(
    pages: _Pages, store: ObjectStore
) -> AsyncGenerator[tuple[pub.ExportItem, bytes], None]:
    """Each item with its bytes, in order, reading up to READ_AHEAD objects ahead."""
    window: deque[tuple[pub.ExportItem, asyncio.Task[bytes]]] = deque()
    try:
        while True:
            # Take the next page once it is here, or once there is nothing else to do.
            while not pages.items and (pages.ready() or not window) and await pages.more():
                pass  # a page may come empty with more after it
            while pages.items and len(window) < READ_AHEAD:
                item = pages.items.popleft()
                window.append((item, asyncio.ensure_future(_read(store, item))))
            if not window:
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
        raise ImageChanged(
            item.item_id,
            f"The bytes of item {item.item_id} are missing from object storage; "
            "the export stopped.",
        ) from None


def _abandon(task: asyncio.Task[Any]) -> None:
    """Cancels a read nobody will wait for, and takes its outcome so none is logged."""
    task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())


class _Responses:
    """Chunks as responses, one held back so that the last can say it is the last."""

    def __init__(self, file_name: str, archive: DatasetArchive) -> None:
        self._file_name = file_name
        self._archive = archive
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
            self._sent = True
        return response
