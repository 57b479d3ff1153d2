"""`workshop recordings import|list|delete`: recording files into the recordings bucket and
the coordinator (PutCamera, PutRecording), read back and ended (docs/cli.md)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import typer

from tools.cli.context import Options, fail, options, run
from tools.cli.output import as_dict, emit
from tools.cli.paging import WHOLE_PAGE, limit_option
from workshop.kit.cli import Metadata
from workshop.v1 import operator_pb2 as op

if TYPE_CHECKING:  # PyAV and minio load when a command needs them (start-up time)
    from minio import Minio

    from tools.cli import media
from workshop.v1 import operator_pb2_grpc, resources_pb2

app = typer.Typer(help="Import, list and delete recordings.", no_args_is_help=True)

KEY_PREFIX = "recordings/"


@dataclasses.dataclass(frozen=True)
class Planned:
    """One file as it will be registered."""

    path: Path
    recording_id: str
    camera_id: str
    start: datetime
    probe: media.Probe
    digest: media.Digest

    @property
    def object_key(self) -> str:
        # The digest in the key: other bytes under one recording id never overwrite the
        # object an admitted run's jobs will read (they check its SHA-256).
        return f"{KEY_PREFIX}{self.recording_id}-{self.digest.sha256[:12]}"

    def row(self) -> dict[str, Any]:
        return {
            "file": str(self.path),
            "recording_id": self.recording_id,
            "camera_id": self.camera_id,
            "start": self.start.isoformat(),
            "end": (self.start + self.probe.duration).isoformat(),
            "fps": self.probe.fps,
            "sha256": self.digest.sha256,
            "byte_size": self.digest.byte_size,
            "object_key": self.object_key,
        }


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        if not found:
            fail("INVALID_FIELD", f"{path} holds no files")
        return found
    if not path.is_file():
        fail("NOT_FOUND", f"{path} is not a file or a folder")
    return [path]


def _parse_start(value: str) -> datetime:
    try:
        start = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        fail("INVALID_FIELD", f"--start {value!r} is not an ISO 8601 instant")
    if start.tzinfo is None:
        fail("INVALID_FIELD", f"--start {value!r} needs a UTC offset, e.g. 2026-11-29T08:00:00Z")
    return start


def plan(
    path: Path, camera: str | None, start: str | None, recording_id: str | None
) -> list[Planned]:
    """Every file with its camera, start, duration, fps and digest; a file that lacks one
    ends the command before anything is uploaded."""
    from tools.cli import media

    files = _files(path)
    if len(files) > 1 and (start or recording_id):
        fail(
            "INVALID_FIELD",
            "--start and --id name one file; a folder's files need "
            "names like <camera>_<YYYYMMDD>T<HHMMSS>Z.<ext> or a creation_time in their metadata",
        )
    planned = []
    for file in files:
        try:
            probe = media.probe(file)
        except media.BadMedia as error:
            fail("INVALID_FIELD", str(error))
        named = media.from_filename(file)
        # --start, else the file's name, else its metadata (docs/cli.md).
        first = _parse_start(start) if start else named[1] if named else probe.creation_time
        if first is None:
            fail(
                "INVALID_FIELD",
                f"{file}: no start time: pass --start, name the file "
                "<camera>_<YYYYMMDD>T<HHMMSS>Z.<ext>, or give it a creation_time",
            )
        cam = camera or (named[0] if named else None)
        if cam is None:
            fail(
                "INVALID_FIELD",
                f"{file}: no camera: pass --camera or name the file "
                "<camera>_<YYYYMMDD>T<HHMMSS>Z.<ext>",
            )
        utc = first.astimezone(UTC)
        rid = recording_id or f"{cam}-{utc.strftime(media.FILENAME_TIME)}"
        planned.append(Planned(file, rid, cam, first, probe, media.digest(file)))
    return planned


def _s3(endpoint: str, access_key: str, secret_key: str, secure: bool, region: str) -> Minio:
    from minio import Minio

    if not (endpoint and access_key and secret_key):
        fail(
            "INVALID_FIELD",
            "recordings import needs --s3-endpoint, --s3-access-key and --s3-secret-key "
            "(or WORKSHOP_S3_ENDPOINT, WORKSHOP_S3_ACCESS_KEY, WORKSHOP_S3_SECRET_KEY)",
            code=2,
        )
    return Minio(
        endpoint, access_key=access_key, secret_key=secret_key, secure=secure, region=region
    )


def upload(client: Minio, bucket: str, item: Planned) -> None:
    """Puts the file (unless the same bytes are there) and checks that the object is there
    with its size: a recording is never registered for an object the store lacks."""
    from minio.error import MinioException, S3Error

    try:
        client.fput_object(bucket, item.object_key, str(item.path))
        stat = client.stat_object(bucket, item.object_key)
    except S3Error as error:
        fail("UNAVAILABLE", f"S3 refused {bucket}/{item.object_key}: {error.code}: {error.message}")
    except (MinioException, OSError) as error:  # unreachable, refused, timed out
        fail("UNAVAILABLE", f"S3 did not take {bucket}/{item.object_key}: {error}")
    if stat.size != item.digest.byte_size:
        fail(
            "UNAVAILABLE",
            f"{bucket}/{item.object_key} holds {stat.size} bytes, not {item.digest.byte_size}; "
            "not registered",
        )


async def _cameras(stub: operator_pb2_grpc.OperatorServiceAsyncStub, md: Metadata) -> set[str]:
    known: set[str] = set()
    token = ""
    while True:
        page = await stub.ListCameras(
            op.ListCamerasRequest(page_size=WHOLE_PAGE, page_token=token), metadata=md
        )
        known.update(camera.camera_id for camera in page.cameras)
        token = page.next_page_token
        if not token:
            return known


async def _current(
    stub: operator_pb2_grpc.OperatorServiceAsyncStub, md: Metadata, item: Planned
) -> resources_pb2.Recording | None:
    """The live recording of that id, looked up around the file's own span."""
    request = op.ListRecordingsRequest(camera_id=item.camera_id, page_size=WHOLE_PAGE)
    request.overlaps_from.FromDatetime(item.start)
    request.overlaps_until.FromDatetime(item.start + item.probe.duration)
    page = await stub.ListRecordings(request, metadata=md)
    return next((r for r in page.recordings if r.recording_id == item.recording_id), None)


def register(opts: Options, items: list[Planned], camera_name: str = "") -> list[dict[str, Any]]:
    """PutCamera for unknown cameras, PutRecording for each file whose recording is not
    already these bytes (a re-import changes nothing; other bytes are a new generation)."""

    async def call(channel: grpc.aio.Channel, md: Metadata) -> list[dict[str, Any]]:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        known = await _cameras(stub, md)
        done = []
        for item in items:
            if item.camera_id not in known:
                await stub.PutCamera(
                    op.PutCameraRequest(camera_id=item.camera_id, name=camera_name), metadata=md
                )
                known.add(item.camera_id)
            current = await _current(stub, md, item)
            if current is not None and current.sha256 == item.digest.sha256:
                done.append(item.row() | {"generation": current.generation, "imported": False})
                continue
            request = op.PutRecordingRequest(
                recording_id=item.recording_id,
                camera_id=item.camera_id,
                fps=item.probe.fps,
                object_key=item.object_key,
                sha256=item.digest.sha256,
                byte_size=item.digest.byte_size,
            )
            request.start.FromDatetime(item.start)
            request.end.FromDatetime(item.start + item.probe.duration)
            reply = await stub.PutRecording(request, metadata=md)
            done.append(item.row() | {"generation": reply.recording.generation, "imported": True})
        return done

    return run(opts, call)


@app.command("import")
def import_recordings(
    ctx: typer.Context,
    path: Path = typer.Argument(..., help="a video file, or a folder of them"),
    camera: str | None = typer.Option(None, help="camera id (default: from the file name)"),
    camera_name: str = typer.Option("", help="display name of a camera this registers"),
    start: str | None = typer.Option(
        None, help="first frame's instant, ISO 8601 with offset (one file only)"
    ),
    recording_id: str | None = typer.Option(
        None, "--id", help="recording id (one file only; default <camera>-<start>)"
    ),
    bucket: str = typer.Option(
        "recordings", envvar="WORKSHOP_RECORDINGS_BUCKET", help="the recordings bucket"
    ),
    s3_endpoint: str = typer.Option("", envvar="WORKSHOP_S3_ENDPOINT", help="S3 host:port"),
    s3_access_key: str = typer.Option("", envvar="WORKSHOP_S3_ACCESS_KEY"),
    s3_secret_key: str = typer.Option("", envvar="WORKSHOP_S3_SECRET_KEY", show_default=False),
    s3_secure: bool = typer.Option(False, envvar="WORKSHOP_S3_SECURE", help="HTTPS to S3"),
    s3_region: str = typer.Option("us-east-1", envvar="WORKSHOP_S3_REGION"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print what would be imported"),
) -> None:
    """Upload recordings to the recordings bucket and register their cameras and recordings.

    The start of each file: --start, else its name `<camera>_<YYYYMMDD>T<HHMMSS>Z.<ext>`,
    else its container's creation_time. Duration and fps come from the file (PyAV)."""
    opts = options(ctx)
    items = plan(path, camera, start, recording_id)
    if dry_run:
        rows = [item.row() for item in items]
        emit(opts, rows, table=rows, title="would import (nothing was uploaded)")
        return
    opts.secret(), opts.target()  # a missing key or address ends it before any upload
    client = _s3(s3_endpoint, s3_access_key, s3_secret_key, s3_secure, s3_region)
    for item in items:
        upload(client, bucket, item)
    rows = register(opts, items, camera_name)
    emit(opts, rows, table=[_short(r) for r in rows], title="recordings")


def _short(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("recording_id", "camera_id", "start", "end", "fps", "byte_size", "generation")
    return {k: row[k] for k in keep} | {"imported": "yes" if row["imported"] else "unchanged"}


def _recording_row(r: resources_pb2.Recording) -> dict[str, Any]:
    return {
        "recording": r.recording_id,
        "camera": r.camera_id,
        "generation": r.generation,
        "start": r.start.ToJsonString(),
        "end": r.end.ToJsonString(),
        "fps": r.fps,
        "bytes": r.byte_size,
        "object key": r.object_key,
    }


@app.command("list")
def list_recordings(
    ctx: typer.Context,
    camera: str = typer.Option("", help="only this camera's recordings"),
    limit: int = limit_option("oldest start first"),
) -> None:
    """List live recordings (ListRecordings)."""
    opts = options(ctx)

    async def call(channel: grpc.aio.Channel, md: Metadata) -> op.ListRecordingsResponse:
        reply: op.ListRecordingsResponse = await operator_pb2_grpc.OperatorServiceStub(
            channel
        ).ListRecordings(op.ListRecordingsRequest(camera_id=camera, page_size=limit), metadata=md)
        return reply

    reply = run(opts, call)
    emit(
        opts,
        [as_dict(r) for r in reply.recordings],
        table=[_recording_row(r) for r in reply.recordings],
        title="recordings",
    )


@app.command()
def delete(
    ctx: typer.Context, recording_id: str = typer.Argument(..., help="recording id")
) -> None:
    """End a recording (DeleteRecording): runs admitted on it fail their jobs with
    source_changed; its object stays in the bucket."""
    opts = options(ctx)

    async def call(channel: grpc.aio.Channel, md: Metadata) -> resources_pb2.Recording:
        reply = await operator_pb2_grpc.OperatorServiceStub(channel).DeleteRecording(
            op.DeleteRecordingRequest(recording_id=recording_id), metadata=md
        )
        return reply.recording

    recording = run(opts, call)
    emit(opts, as_dict(recording), table=[_recording_row(recording)], title="deleted")
