"""Dataset versions through the real stack (docs/datasets.md): freezing, the content id,
the diff, the versions of an item, and exports made from a version (byte-identical, immune
to later review, resumable at any offset).

The world is test_dataset_export's: a full run whose items carry real JPEGs in SeaweedFS,
some sightings confirmed, relabelled or rejected.
"""

from __future__ import annotations

import hashlib
from typing import cast

import grpc
import pytest

from testbed.coordinator_world import error_reason
from tests.service.test_dataset_export import World, world_fixture  # noqa: F401
from workshop.v1 import common_pb2, dataset_pb2_grpc, run_pb2
from workshop.v1 import dataset_pb2 as dpb

ACCEPTED, PENDING = common_pb2.REVIEW_STATE_ACCEPTED, common_pb2.REVIEW_STATE_PENDING


def datasets(world: World) -> dataset_pb2_grpc.DatasetServiceAsyncStub:
    return cast(
        "dataset_pb2_grpc.DatasetServiceAsyncStub",
        dataset_pb2_grpc.DatasetServiceStub(world.c.channel),
    )


async def freeze(
    world: World,
    name: str = "v1",
    seed: int = 0,
    val_fraction: float | None = 0.5,
    wanted: run_pb2.BucketItemFilter | None = None,
) -> dpb.CreateDatasetVersionResponse:
    request = dpb.CreateDatasetVersionRequest(bucket_id="yard", name=name, seed=seed, filter=wanted)
    if val_fraction is not None:
        request.val_fraction = val_fraction
    answer: dpb.CreateDatasetVersionResponse = await datasets(world).CreateDatasetVersion(
        request, metadata=world.c.admin
    )
    return answer


def split_of(item_id: str, seed: int, val_fraction: float) -> str:
    """The split as docs/datasets.md states it."""
    digest = hashlib.sha256(f"{seed}:{item_id}".encode()).hexdigest()
    return "val" if int(digest[:13], 16) / 16**13 < val_fraction else "train"


async def test_freezing_is_content_addressed_and_idempotent(world: World) -> None:
    first = await freeze(world)
    assert first.created
    version = first.version
    assert version.version_id.startswith("dv_")
    assert len(version.version_id) == 67
    expected = world.items("yard")
    assert version.item_count == len(expected)
    assert list(version.filter.review_states) == [ACCEPTED]
    assert version.classes == ["person", "truck", "worker"]
    again = await freeze(world, name="another name")
    assert not again.created
    assert again.version.version_id == version.version_id
    assert again.version.name == "v1"  # the first name stays
    other = await freeze(world, seed=7)
    assert other.created
    assert other.version.version_id != version.version_id
    listed = await datasets(world).ListDatasetVersions(
        dpb.ListDatasetVersionsRequest(bucket_id="yard", page_size=1), metadata=world.c.admin
    )
    assert len(listed.versions) == 1
    assert listed.next_page_token
    rest = await datasets(world).ListDatasetVersions(
        dpb.ListDatasetVersionsRequest(bucket_id="yard", page_token=listed.next_page_token),
        metadata=world.c.admin,
    )
    assert {v.version_id for v in [*listed.versions, *rest.versions]} == {
        version.version_id,
        other.version.version_id,
    }
    assert not rest.next_page_token


async def test_bad_input_is_refused_precisely(world: World) -> None:
    stub, admin = datasets(world), world.c.admin
    cases = [
        (
            dpb.CreateDatasetVersionRequest(bucket_id="yard"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "name",
        ),
        (
            dpb.CreateDatasetVersionRequest(bucket_id="yard", name="x", val_fraction=1.0),
            grpc.StatusCode.INVALID_ARGUMENT,
            "val_fraction",
        ),
        (
            dpb.CreateDatasetVersionRequest(bucket_id="nowhere", name="x"),
            grpc.StatusCode.NOT_FOUND,
            None,
        ),
    ]
    for request, code, field in cases:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CreateDatasetVersion(request, metadata=admin)
        got, _, metadata = error_reason(caught.value)
        assert got == code
        if field:
            assert metadata["field"] == field
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetDatasetVersion(
            dpb.GetDatasetVersionRequest(version_id="dv_nope"), metadata=admin
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
