"""OperatorService: translates the contract to calls of the resources room (`Resources`),
identity's `Accounts` (users, sessions, keys, the policy revision) and `ClockControl`,
and back."""

from __future__ import annotations

from datetime import UTC

from services.coordinator import convert
from services.coordinator.clock_control import ClockControl
from services.coordinator.identity.accounts import Accounts
from services.coordinator.platform.errors import InvalidField
from services.coordinator.platform.fields import page_size, page_token
from services.coordinator.resources.registry import ModelDecoding, Resources
from services.coordinator.servicers.common import (
    Authenticator,
    Context,
    next_token,
    split_token,
    time_and_id_token,
)
from workshop.v1 import operator_pb2 as pb
from workshop.v1 import operator_pb2_grpc


class OperatorServicer(operator_pb2_grpc.OperatorServiceServicer):
    def __init__(
        self,
        resources: Resources,
        accounts: Accounts,
        clock_control: ClockControl,
        authenticate: Authenticator,
    ) -> None:
        self.resources = resources
        self.accounts = accounts
        self.clock_control = clock_control
        self.who = authenticate

    async def RegisterDevice(
        self, request: pb.RegisterDeviceRequest, context: Context
    ) -> pb.RegisterDeviceResponse:
        row = await self.resources.register_device(
            await self.who(context), request.device_id, request.description
        )
        return pb.RegisterDeviceResponse(device=convert.device(row))

    async def ListDevices(
        self, request: pb.ListDevicesRequest, context: Context
    ) -> pb.ListDevicesResponse:
        limit = page_size(request.page_size)
        rows = await self.resources.list_devices(
            await self.who(context), page_token(request.page_token), limit
        )
        return pb.ListDevicesResponse(
            devices=[convert.device(row) for row in rows],
            next_page_token=next_token(rows, limit, lambda row: (row.device_id,)),
        )

    async def RegisterRuntime(
        self, request: pb.RegisterRuntimeRequest, context: Context
    ) -> pb.RegisterRuntimeResponse:
        row, manifest = await self.resources.register_runtime(
            await self.who(context),
            device_id=request.device_id,
            engine=request.engine,
            code_sha256=request.code_sha256,
            capabilities=list(request.capabilities),
        )
        return pb.RegisterRuntimeResponse(
            runtime=convert.runtime(row), manifest_json=manifest, created=row.created
        )

    async def ListRuntimes(
        self, request: pb.ListRuntimesRequest, context: Context
    ) -> pb.ListRuntimesResponse:
        limit = page_size(request.page_size)
        rows = await self.resources.list_runtimes(
            await self.who(context),
            request.device_id,
            time_and_id_token(request.page_token),
            limit,
        )
        return pb.ListRuntimesResponse(
            runtimes=[convert.runtime(row) for row in rows],
            next_page_token=next_token(
                rows, limit, lambda row: (row.registered_at, row.runtime_id)
            ),
        )

    async def PutCamera(
        self, request: pb.PutCameraRequest, context: Context
    ) -> pb.PutCameraResponse:
        row = await self.resources.put_camera(
            await self.who(context), request.camera_id, request.name
        )
        return pb.PutCameraResponse(camera=convert.camera(row))

    async def ListCameras(
        self, request: pb.ListCamerasRequest, context: Context
    ) -> pb.ListCamerasResponse:
        limit = page_size(request.page_size)
        rows = await self.resources.list_cameras(
            await self.who(context), page_token(request.page_token), limit
        )
        return pb.ListCamerasResponse(
            cameras=[convert.camera(row) for row in rows],
            next_page_token=next_token(rows, limit, lambda row: (row.camera_id,)),
        )

    async def PutRecording(
        self, request: pb.PutRecordingRequest, context: Context
    ) -> pb.PutRecordingResponse:
        who = await self.who(context)
        row = await self.resources.put_recording(
            who,
            recording_id=request.recording_id,
            camera_id=request.camera_id,
            start=convert.from_ts("start", request.start),
            end=convert.from_ts("end", request.end),
            fps=request.fps,
            object_key=request.object_key,
            sha256=request.sha256,
            byte_size=request.byte_size,
        )
        return pb.PutRecordingResponse(recording=convert.recording(row))

    async def DeleteRecording(
        self, request: pb.DeleteRecordingRequest, context: Context
    ) -> pb.DeleteRecordingResponse:
        row = await self.resources.delete_recording(await self.who(context), request.recording_id)
        return pb.DeleteRecordingResponse(recording=convert.recording(row))

    async def ListRecordings(
        self, request: pb.ListRecordingsRequest, context: Context
    ) -> pb.ListRecordingsResponse:
        limit = page_size(request.page_size)
        after = time_and_id_token(request.page_token)
        rows = await self.resources.list_recordings(
            await self.who(context),
            camera_id=request.camera_id,
            overlaps_from=convert.from_optional_ts(
                request.overlaps_from if request.HasField("overlaps_from") else None
            ),
            overlaps_until=convert.from_optional_ts(
                request.overlaps_until if request.HasField("overlaps_until") else None
            ),
            after=after,
            limit=limit,
        )
        return pb.ListRecordingsResponse(
            recordings=[convert.recording(row) for row in rows],
            next_page_token=next_token(rows, limit, lambda row: (row.start_at, row.recording_id)),
        )

    async def PublishModelVersion(
        self, request: pb.PublishModelVersionRequest, context: Context
    ) -> pb.PublishModelVersionResponse:
        row, created = await self.resources.publish_model_version(
            await self.who(context),
            name=request.name,
            version=request.version,
            weights_sha256=request.weights_sha256,
            classes=list(request.classes),
            input_shape=list(request.input_shape),
            decoding=ModelDecoding(
                family=request.family,
                confidence_threshold=request.confidence_threshold,
                iou_threshold=request.iou_threshold,
                max_detections=request.max_detections,
                source_sha256=request.source_sha256,
            ),
        )
        return pb.PublishModelVersionResponse(
            model_version=convert.model_version(row), created=created
        )

    async def ListModelVersions(
        self, request: pb.ListModelVersionsRequest, context: Context
    ) -> pb.ListModelVersionsResponse:
        limit = page_size(request.page_size)
        token = split_token(request.page_token, 2)
        after = None
        if token is not None:
            if not token[1].isdigit():
                raise InvalidField("page_token is malformed.")
            after = (token[0], int(token[1]))
        rows = await self.resources.list_model_versions(
            await self.who(context), request.name, after, limit
        )
        return pb.ListModelVersionsResponse(
            model_versions=[convert.model_version(row) for row in rows],
            next_page_token=next_token(rows, limit, lambda row: (row.name, row.version)),
        )

    async def CreateBucket(
        self, request: pb.CreateBucketRequest, context: Context
    ) -> pb.CreateBucketResponse:
        row = await self.resources.create_bucket(
            await self.who(context), request.bucket_id, request.name
        )
        return pb.CreateBucketResponse(bucket=convert.bucket(row))

    async def DeleteBucket(
        self, request: pb.DeleteBucketRequest, context: Context
    ) -> pb.DeleteBucketResponse:
        cancelled, items = await self.resources.delete_bucket(
            await self.who(context), request.bucket_id
        )
        return pb.DeleteBucketResponse(cancelled_run_ids=cancelled, items_deleted=items)

    async def ListBuckets(
        self, request: pb.ListBucketsRequest, context: Context
    ) -> pb.ListBucketsResponse:
        limit = page_size(request.page_size)
        rows = await self.resources.list_buckets(
            await self.who(context), page_token(request.page_token), limit
        )
        return pb.ListBucketsResponse(
            buckets=[convert.bucket(row) for row in rows],
            next_page_token=next_token(rows, limit, lambda row: (row.bucket_id,)),
        )

    async def CreateUser(
        self, request: pb.CreateUserRequest, context: Context
    ) -> pb.CreateUserResponse:
        row = await self.accounts.create_user(
            await self.who(context), request.user_id, request.display_name
        )
        return pb.CreateUserResponse(user=convert.user(row))

    async def DisableUser(
        self, request: pb.DisableUserRequest, context: Context
    ) -> pb.DisableUserResponse:
        row = await self.accounts.disable_user(await self.who(context), request.user_id)
        self.who.forget()  # cached principals of the user's keys and sessions
        return pb.DisableUserResponse(user=convert.user(row))

    async def SetUserPassword(
        self, request: pb.SetUserPasswordRequest, context: Context
    ) -> pb.SetUserPasswordResponse:
        row = await self.accounts.set_user_password(
            await self.who(context), request.user_id, request.password
        )
        return pb.SetUserPasswordResponse(user=convert.user(row))

    async def CreateSession(
        self, request: pb.CreateSessionRequest, context: Context
    ) -> pb.CreateSessionResponse:
        row, secret = await self.accounts.create_session(
            await self.who(context), request.user_id, convert.from_duration(request.ttl)
        )
        return pb.CreateSessionResponse(session=convert.session(row), secret=secret)

    async def RevokeSession(
        self, request: pb.RevokeSessionRequest, context: Context
    ) -> pb.RevokeSessionResponse:
        row = await self.accounts.revoke_session(await self.who(context), request.session_id)
        self.who.forget()
        return pb.RevokeSessionResponse(session=convert.session(row))

    async def CreateKey(
        self, request: pb.CreateKeyRequest, context: Context
    ) -> pb.CreateKeyResponse:
        row, secret = await self.accounts.create_key(
            await self.who(context),
            name=request.name,
            grants=[convert.grant_from_proto(scope) for scope in request.scopes],
            user_id=request.user_id,
            ttl=convert.from_duration(request.ttl),
        )
        return pb.CreateKeyResponse(key=convert.key(row), secret=secret)

    async def RevokeKey(
        self, request: pb.RevokeKeyRequest, context: Context
    ) -> pb.RevokeKeyResponse:
        row = await self.accounts.revoke_key(await self.who(context), request.key_id)
        self.who.forget()
        return pb.RevokeKeyResponse(key=convert.key(row))

    async def ListKeys(self, request: pb.ListKeysRequest, context: Context) -> pb.ListKeysResponse:
        limit = page_size(request.page_size)
        rows = await self.accounts.list_keys(
            await self.who(context),
            request.include_revoked,
            time_and_id_token(request.page_token),
            limit,
        )
        return pb.ListKeysResponse(
            keys=[convert.key(row) for row in rows],
            next_page_token=next_token(rows, limit, lambda row: (row.created_at, row.key_id)),
        )

    async def GetPolicyRevision(
        self, request: pb.GetPolicyRevisionRequest, context: Context
    ) -> pb.GetPolicyRevisionResponse:
        revision = await self.accounts.policy_revision(await self.who(context))
        return pb.GetPolicyRevisionResponse(revision=revision)

    async def RaisePolicyRevision(
        self, request: pb.RaisePolicyRevisionRequest, context: Context
    ) -> pb.RaisePolicyRevisionResponse:
        expected = request.expected_revision if request.HasField("expected_revision") else None
        revision = await self.accounts.raise_policy_revision(await self.who(context), expected)
        return pb.RaisePolicyRevisionResponse(revision=revision)

    async def GetClock(self, request: pb.GetClockRequest, context: Context) -> pb.GetClockResponse:
        now, manual = await self.clock_control.get_clock(await self.who(context))
        return pb.GetClockResponse(now=convert.ts(now), manual=manual)

    async def AdvanceClock(
        self, request: pb.AdvanceClockRequest, context: Context
    ) -> pb.AdvanceClockResponse:
        who = await self.who(context)
        target = request.WhichOneof("target")
        by = request.by.ToTimedelta() if target == "by" else None
        to = request.to.ToDatetime(tzinfo=UTC) if target == "to" else None
        now = await self.clock_control.advance_clock(who, by, to)
        return pb.AdvanceClockResponse(now=convert.ts(now))
