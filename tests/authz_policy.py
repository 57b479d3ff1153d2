"""Who may call each gRPC RPC: the declared policy that `tests/service/test_authz_matrix.py` checks.

The services enforce it in code (`services/coordinator/identity/auth.py` `require` and the API
modules that call it; the preview service forwards its caller's credential to the
coordinator); this table says the same thing in one place, so a change to either shows
up as a failing cell. Every RPC of every Workshop service needs a row: a new RPC
without one fails the matrix.

Credentials, as the matrix presents them in `authorization: Bearer ...`:

- REJECTED ones, which must be UNAUTHENTICATED everywhere (unless a row overrides):
  `none` (no metadata), `malformed` (`Basic ...`), `unknown` (a well-formed key id and
  secret that was never issued), `revoked` (an admin key revoked with RevokeKey),
  `expired` (an admin key created with a 60 s ttl, the coordinator's clock moved past
  it), `disabled_session` (a website session of a user disabled afterwards);
- VALID principals, allowed where the row lists them and PERMISSION_DENIED elsewhere:
  `session` (a website session of an enabled user), `workshop` (a `workshop` key),
  `footage_other` (`footage:read` of cam-b, a camera none of the world's runs use),
  `run_device` (`workshop:run` of device gpu-box, which holds the world's lease),
  `run_other_device` (`workshop:run` of another registered device), `service` (the
  preview service's own key), `gateway` (the gateway's key), `admin`.

"Wrong scope" is every VALID column a row does not allow. An allowed cell is called
with an empty request: it may answer anything but UNAUTHENTICATED, PERMISSION_DENIED,
INTERNAL or UNKNOWN (mostly INVALID_ARGUMENT or NOT_FOUND). `overrides` pins a cell to
one exact code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import grpc

REJECTED = ("none", "malformed", "unknown", "revoked", "expired", "disabled_session")
VALID = (
    "session",
    "workshop",
    "footage_other",
    "run_device",
    "run_other_device",
    "service",
    "gateway",
    "admin",
)
CREDENTIALS = REJECTED + VALID

# An allowed call: any answer but a refusal of the credential, INTERNAL or UNKNOWN.
ALLOWED = "allowed"
Expectation = str | grpc.StatusCode


@dataclasses.dataclass(frozen=True)
class Rule:
    """Who may call one RPC.

    `forwards`: for the PublicationService calls the preview service makes for someone
    else, the VALID credential it forwards in `workshop-on-behalf-of` (the matrix varies
    the calling credential; the forwarded one is a valid one of the right kind).
    """

    allowed: frozenset[str]
    overrides: Mapping[str, grpc.StatusCode] = dataclasses.field(default_factory=dict)
    forwards: str = ""

    def expected(self, credential: str) -> Expectation:
        if credential in self.overrides:
            return self.overrides[credential]
        if credential in self.allowed:
            return ALLOWED
        if credential in REJECTED:
            return grpc.StatusCode.UNAUTHENTICATED
        return grpc.StatusCode.PERMISSION_DENIED


def allow(*credentials: str, forwards: str = "", **overrides: grpc.StatusCode) -> Rule:
    unknown = set(credentials) - set(CREDENTIALS)
    if unknown:
        raise ValueError(f"unknown credentials {sorted(unknown)}")
    return Rule(frozenset(credentials), overrides, forwards)


ADMIN = allow("admin")
# `workshop` scope: a website session holds it, and admin holds every scope.
WORKSHOP = allow("session", "workshop", "admin")
# Reading labelled footage: `workshop` or `footage:read` (bound to cameras: a key of
# another camera is let in and sees none of this camera's items).
READ_FOOTAGE = allow("session", "workshop", "footage_other", "admin")
# Lease calls: a `workshop:run` key of any device passes the scope check; the device
# binding is checked against the runtime or the lease (test_authz_matrix's
# RESOURCE_CASES).
LEASE = allow("run_device", "run_other_device", "admin")
# The preview service's own calls; admin holds `service` too.
SERVICE = allow("service", "admin")
FOR_PROCESSOR = allow("service", "admin", forwards="run_device")
FOR_READER = allow("service", "admin", forwards="workshop")
# Only a website session manages its own keys (an admin uses OperatorService).
OWN_SESSION = allow("session")
ANY_VALID = allow(*VALID)
# Logout ends a website session; any valid key gets NOT_A_SESSION; a disabled user's
# session may still be signed out (it is revoked, which only takes authority away).
LOGOUT = Rule(
    frozenset({"session", "disabled_session"}),
    {name: grpc.StatusCode.FAILED_PRECONDITION for name in VALID if name != "session"},
)

POLICY: dict[str, Rule] = {
    # IdentityService
    "/workshop.v1.IdentityService/WhoAmI": ANY_VALID,
    "/workshop.v1.IdentityService/Login": allow("gateway", "admin"),
    "/workshop.v1.IdentityService/Logout": LOGOUT,
    "/workshop.v1.IdentityService/CreateOwnKey": OWN_SESSION,
    "/workshop.v1.IdentityService/ListOwnKeys": OWN_SESSION,
    "/workshop.v1.IdentityService/RevokeOwnKey": OWN_SESSION,
    # JobService
    "/workshop.v1.JobService/Claim": LEASE,
    "/workshop.v1.JobService/Heartbeat": LEASE,
    "/workshop.v1.JobService/ReportProgress": LEASE,
    "/workshop.v1.JobService/Complete": LEASE,
    "/workshop.v1.JobService/Fail": LEASE,
    "/workshop.v1.JobService/Release": LEASE,
    # the calls above on one stream: a credential that may make none of them is refused
    # when the stream opens
    "/workshop.v1.JobService/Session": LEASE,
    # OperatorService: admin, but for what the website shows of devices and runtimes
    "/workshop.v1.OperatorService/RegisterDevice": ADMIN,
    "/workshop.v1.OperatorService/ListDevices": WORKSHOP,
    "/workshop.v1.OperatorService/RegisterRuntime": WORKSHOP,
    "/workshop.v1.OperatorService/ListRuntimes": WORKSHOP,
    "/workshop.v1.OperatorService/PutCamera": ADMIN,
    "/workshop.v1.OperatorService/ListCameras": ADMIN,
    "/workshop.v1.OperatorService/PutRecording": ADMIN,
    "/workshop.v1.OperatorService/DeleteRecording": ADMIN,
    "/workshop.v1.OperatorService/ListRecordings": WORKSHOP,
    "/workshop.v1.OperatorService/PublishModelVersion": ADMIN,
    "/workshop.v1.OperatorService/ListModelVersions": ADMIN,
    "/workshop.v1.OperatorService/CreateBucket": ADMIN,
    "/workshop.v1.OperatorService/DeleteBucket": ADMIN,
    "/workshop.v1.OperatorService/ListBuckets": ADMIN,
    "/workshop.v1.OperatorService/CreateUser": ADMIN,
    "/workshop.v1.OperatorService/DisableUser": ADMIN,
    "/workshop.v1.OperatorService/SetUserPassword": ADMIN,
    "/workshop.v1.OperatorService/CreateSession": ADMIN,
    "/workshop.v1.OperatorService/RevokeSession": ADMIN,
    "/workshop.v1.OperatorService/CreateKey": ADMIN,
    "/workshop.v1.OperatorService/RevokeKey": ADMIN,
    "/workshop.v1.OperatorService/ListKeys": ADMIN,
    "/workshop.v1.OperatorService/GetPolicyRevision": ADMIN,
    "/workshop.v1.OperatorService/RaisePolicyRevision": ADMIN,
    "/workshop.v1.OperatorService/GetClock": ADMIN,
    "/workshop.v1.OperatorService/AdvanceClock": ADMIN,
    # PublicationService: the preview service's key, for a forwarded caller where it has one
    "/workshop.v1.PublicationService/CheckLease": FOR_PROCESSOR,
    "/workshop.v1.PublicationService/StageObject": FOR_PROCESSOR,
    "/workshop.v1.PublicationService/RecordPreview": FOR_PROCESSOR,
    "/workshop.v1.PublicationService/RecordPreviews": FOR_PROCESSOR,
    "/workshop.v1.PublicationService/ListCollectableObjects": SERVICE,
    "/workshop.v1.PublicationService/MarkObjectsDeleted": SERVICE,
    "/workshop.v1.PublicationService/SettleSweep": SERVICE,
    "/workshop.v1.PublicationService/AuthorizeImageRead": FOR_READER,
    "/workshop.v1.PublicationService/ListExportItems": FOR_READER,
    # PreviewService: the caller's own credential, forwarded to the coordinator
    "/workshop.v1.PreviewService/PublishPreview": LEASE,
    "/workshop.v1.PreviewService/StageUpload": LEASE,
    "/workshop.v1.PreviewService/GrantPreviewWrites": LEASE,
    "/workshop.v1.PreviewService/RecordWrittenPreviews": LEASE,
    "/workshop.v1.PreviewService/ReadImage": READ_FOOTAGE,
    "/workshop.v1.PreviewService/RunCleanup": ADMIN,
    "/workshop.v1.PreviewService/ExportBucket": READ_FOOTAGE,
    # EvaluationService (the processor's): an admin, by the coordinator's WhoAmI; each read
    # then made with the caller's own credential
    "/workshop.v1.EvaluationService/EvaluateModelVersion": ADMIN,
    # WorkshopService
    "/workshop.v1.WorkshopService/SaveWorkflow": WORKSHOP,
    "/workshop.v1.WorkshopService/GetWorkflow": WORKSHOP,
    "/workshop.v1.WorkshopService/ListWorkflows": WORKSHOP,
    "/workshop.v1.WorkshopService/DeleteWorkflow": WORKSHOP,
    "/workshop.v1.WorkshopService/ValidateWorkflow": WORKSHOP,
    "/workshop.v1.WorkshopService/GetCatalog": WORKSHOP,
    "/workshop.v1.WorkshopService/ChooseRuntime": WORKSHOP,
    "/workshop.v1.WorkshopService/CreateRun": WORKSHOP,
    # the gateway follows any run for the live view
    "/workshop.v1.WorkshopService/GetRun": allow("session", "workshop", "gateway", "admin"),
    "/workshop.v1.WorkshopService/ListRuns": WORKSHOP,
    "/workshop.v1.WorkshopService/CancelRun": WORKSHOP,
    "/workshop.v1.WorkshopService/WatchRun": allow("session", "workshop", "gateway", "admin"),
    "/workshop.v1.WorkshopService/GetRunSnapshot": WORKSHOP,
    "/workshop.v1.WorkshopService/GetRunTimeline": WORKSHOP,
    "/workshop.v1.WorkshopService/GetReview": READ_FOOTAGE,
    "/workshop.v1.WorkshopService/DecideSighting": WORKSHOP,
    "/workshop.v1.WorkshopService/CorrectItemBoxes": WORKSHOP,
    "/workshop.v1.WorkshopService/UndoItemCorrection": WORKSHOP,
    "/workshop.v1.WorkshopService/DecideItem": WORKSHOP,
    "/workshop.v1.WorkshopService/ClearItemDecision": WORKSHOP,
    "/workshop.v1.WorkshopService/GetReviewQueue": READ_FOOTAGE,
    "/workshop.v1.WorkshopService/BulkDecideSightings": WORKSHOP,
    "/workshop.v1.WorkshopService/UndoBulkDecision": WORKSHOP,
    "/workshop.v1.WorkshopService/GetSummary": WORKSHOP,
    "/workshop.v1.WorkshopService/ListBucketItems": READ_FOOTAGE,
    "/workshop.v1.WorkshopService/GetBucketItem": READ_FOOTAGE,
    "/workshop.v1.WorkshopService/RequestPhoto": WORKSHOP,
    "/workshop.v1.WorkshopService/GetPhoto": WORKSHOP,
    # DatasetService: freezing needs `workshop` (over every camera); reading `workshop` or
    # footage:read (a camera-bound key reads only versions of its cameras)
    "/workshop.v1.DatasetService/CreateDatasetVersion": WORKSHOP,
    "/workshop.v1.DatasetService/GetDatasetVersion": READ_FOOTAGE,
    "/workshop.v1.DatasetService/ListDatasetVersions": READ_FOOTAGE,
    "/workshop.v1.DatasetService/DiffDatasetVersions": READ_FOOTAGE,
    "/workshop.v1.DatasetService/ListItemVersions": READ_FOOTAGE,
}

# The calls on a JobService.Session stream (SessionRequest's `call` fields): the stream's
# credential is checked once, when it opens (the Session row above: a credential that may
# make none of them is refused then), and each call's SQL checks the key again as its
# unary RPC's does. record_previews has no unary JobService RPC: a processor records the
# previews it wrote with its own key there (PublicationService.RecordPreviews takes the
# same records from the preview service's key, for a forwarded processor key).
SESSION: dict[str, Rule] = {
    "claim": LEASE,
    "heartbeat": LEASE,
    "report_progress": LEASE,
    "complete": LEASE,
    "fail": LEASE,
    "release": LEASE,
    "record_previews": LEASE,
}
