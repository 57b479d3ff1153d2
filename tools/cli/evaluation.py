"""What `workshop models evaluate` asks the services: the version the bucket's items came from
(the pins of the runs that saved them) and the bucket's export as a stream of chunks
(docs/bring-your-own-model.md#evaluating-a-version)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from tools.cli.context import Options, fail, run
from workshop.kit.cli import Metadata
from workshop.v1 import preview_pb2, preview_pb2_grpc, run_pb2, workshop_pb2_grpc
from workshop.v1 import workshop_pb2 as ws

ITEMS_PAGE = 1000  # ListBucketItems' largest page
CHUNKS_AHEAD = 8  # export chunks (up to 1 MiB each) read ahead of the evaluation


@dataclass(frozen=True)
class Pin:
    """A model version some of the bucket's items came from."""

    name: str
    version: int
    classes: tuple[str, ...]
    items: int  # of the bucket's (filtered) items, saved by runs pinning it
    runs: tuple[str, ...]


def source_pins(opts: Options, bucket: str, item_filter: run_pb2.BucketItemFilter) -> list[Pin]:
    """The model versions pinned by the runs that saved the bucket's items (those the filter
    keeps), most items first: the items' run ids page by page (only their counts are kept),
    then each run's snapshot."""

    async def call(channel: grpc.aio.Channel, md: Metadata) -> list[Pin]:
        stub = workshop_pb2_grpc.WorkshopServiceStub(channel)
        by_run: Counter[str] = Counter()
        token = ""
        while True:
            page = await stub.ListBucketItems(
                ws.ListBucketItemsRequest(
                    bucket_id=bucket, filter=item_filter, page_size=ITEMS_PAGE, page_token=token
                ),
                metadata=md,
            )
            by_run.update(item.run_id for item in page.items)
            token = page.next_page_token
            if not token:
                break
        items: Counter[tuple[str, int]] = Counter()
        runs: dict[tuple[str, int], list[str]] = {}
        classes: dict[tuple[str, int], tuple[str, ...]] = {}
        for run_id, count in by_run.items():
            reply = await stub.GetRunSnapshot(
                ws.GetRunSnapshotRequest(run_id=run_id, page_size=1), metadata=md
            )
            for model in reply.snapshot.models:
                key = (model.name, model.version)
                items[key] += count
                runs.setdefault(key, []).append(run_id)
                classes[key] = tuple(model.classes)
        return [
            Pin(
                name, version, classes[(name, version)], count, tuple(sorted(runs[(name, version)]))
            )
            for (name, version), count in items.most_common()
        ]

    return run(opts, call)


def baseline_of(pins: list[Pin], name: str, version: int) -> Pin | None:
    """The version to compare with: of the same model, the one most items came from; else
    the model most items came from (the bucket was filled by another detector). None when
    that is the version evaluated, or no run pinned a model."""
    same = [p for p in pins if p.name == name]
    chosen = same[0] if same else pins[0] if pins else None
    if chosen is None or (chosen.name, chosen.version) == (name, version):
        return None
    return chosen


def export_chunks(opts: Options, request: preview_pb2.ExportBucketRequest) -> Iterator[bytes]:
    """The export's chunks as they arrive, read by a thread a few chunks ahead (so memory
    holds CHUNKS_AHEAD MiB of it at most); a failure of the stream is raised where it is
    read."""
    ahead: queue.Queue[bytes | BaseException | None] = queue.Queue(CHUNKS_AHEAD)
    stop = threading.Event()

    async def call(channel: grpc.aio.Channel, md: Metadata) -> None:
        stream = preview_pb2_grpc.PreviewServiceStub(channel).ExportBucket(request, metadata=md)
        last = False
        async for chunk in stream:
            if stop.is_set():
                stream.cancel()
                return
            while not stop.is_set():
                try:
                    ahead.put(chunk.data, timeout=0.2)
                    break
                except queue.Full:
                    continue
            last = last or chunk.last
        if not last:
            fail("UNAVAILABLE", "the export stream ended before its last chunk")

    def read() -> None:
        end: BaseException | None = None
        try:
            run(opts, call, service="preview")
        except BaseException as error:  # SystemExit from fail(), too: raised by the reader
            end = error
        while not stop.is_set():
            try:
                ahead.put(end, timeout=0.2)
                return
            except queue.Full:
                continue

    thread = threading.Thread(target=read, name="export", daemon=True)
    thread.start()
    try:
        while True:
            chunk = ahead.get()
            if chunk is None:
                return
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk
    finally:
        # the reader stops at its next chunk (it never waits on a full queue once stopped);
        # a daemon thread, it is not waited for: the stream may be long
        stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                ahead.get_nowait()
