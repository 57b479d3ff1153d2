"""The gateway's OpenAPI documents hold for what it serves: schemathesis generates requests
from each served document (`/api/openapi.json`, `/v1/openapi.json`) and checks every
answer of the running gateway (in front of the real coordinator and preview service):
no 5xx, every status documented for its operation, every JSON body valid against the
documented schema (the error shape included), every content type as documented.

The gateway serves from this test's event loop, so schemathesis's synchronous client
(requests) cannot run on it: the whole run (loading the documents with `from_url`,
hypothesis drawing the cases, `case.call`, `case.validate_response`) goes to a worker
thread (`asyncio.to_thread`) while the loop keeps serving. Each operation gets a fixed,
derandomized number of positive and negative examples, and first a few explicit calls
with real ids of the world of tests/service/test_gateway_authz.py (random ids mostly find
nothing: 404), whose expected statuses are asserted too. Every credential is the valid
one of its document (a session cookie with its CSRF token and `Sec-Fetch-Site:
same-origin` on /api, a `workshop` Agent key on /v1), sent over whatever the case
generated for the security parameters (schemathesis still leaves the header out of the
negative cases that test a missing credential: 401, documented); signing out uses a
session of its own.

Left out on purpose: `positive_data_acceptance` and `negative_data_rejection`. The request
schemas require nothing and leave meaning to the server (docs/http-api.md), so a
schema-valid request that names no run is a 400 by design. A last test checks the
`Allow` header of 405 answers against the documents (schemathesis's coverage phase
found it listing only some of a path's methods).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
from collections.abc import Callable
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core import NOT_SET
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.core.result import Err
from schemathesis.schemas import APIOperation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from services.gateway.guard import csrf_token
from testbed.harness.gateway import PASSWORD, GatewayHarness
from tests.service.test_gateway_authz import SPEC, Ids, build, session_of

pytestmark = pytest.mark.timeout(240)

Case = schemathesis.Case[APIOperation[Any, Any, Any, Any]]

EXAMPLES = {GenerationMode.POSITIVE: 8, GenerationMode.NEGATIVE: 5}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@dataclasses.dataclass(frozen=True)
class Explicit:
    """One call with real ids, and the status it must get."""

    status: int
    path: dict[str, Any] = dataclasses.field(default_factory=dict)
    query: dict[str, Any] = dataclasses.field(default_factory=dict)
    body: Any = NOT_SET


def explicit_calls(prefix: str, ids: Ids, runtime: str) -> dict[str, list[Explicit]]:
    """By operationId (without its prefix): calls that reach existing resources."""
    full = {"run_id": "full"}
    calls: dict[str, list[Explicit]] = {
        "listWorkflows": [Explicit(200), Explicit(200, query={"page_size": 1})],
        "getWorkflow": [Explicit(200, {"workflow_id": "watch"})],
        "saveWorkflow": [
            Explicit(
                200, {"workflow_id": f"fz-{prefix}"}, body={"expected_revision": 0, "spec": SPEC}
            ),
            Explicit(
                409, {"workflow_id": f"fz-{prefix}"}, body={"expected_revision": 0, "spec": SPEC}
            ),
        ],
        "deleteWorkflow": [
            Explicit(409, {"workflow_id": f"del-{prefix}"}, {"expected_revision": 7}),
            Explicit(200, {"workflow_id": f"del-{prefix}"}, {"expected_revision": 1}),
        ],
        "validateWorkflow": [Explicit(200, body={"spec": SPEC})],
        "chooseRuntime": [
            Explicit(200, {"workflow_id": "watch"}, {"choice": "newest"}),
            Explicit(200, {"workflow_id": "watch"}, {"choice": "recent_capable"}),
        ],
        "getCatalog": [Explicit(200)],
        "listDevices": [Explicit(200)],
        "listRuntimes": [Explicit(200, query={"device_id": "gpu-box"})],
        "listRecordings": [
            Explicit(200, query={"camera_id": "cam-a", "from": "2026-11-29T00:00:00Z"})
        ],
        "registerRuntime": [
            Explicit(
                200,
                body={"device_id": "gpu-box", "engine": f"fz-{prefix}", "code_sha256": "ef" * 32},
            ),
            Explicit(404, body={"device_id": "nope", "engine": "x", "code_sha256": "ef" * 32}),
        ],
        "createRun": [
            Explicit(
                200,
                body={
                    "id": f"fz-{prefix}",
                    "workflow_id": "watch-a",
                    "runtime_id": runtime,
                    "revision": 1,
                    "mode": "test",
                    "image_limit": 3,
                },
            )
        ],
        "listRuns": [Explicit(200, query={"workflow": "watch"})],
        "getRun": [Explicit(200, full, {"job_limit": 2})],
        "cancelRun": [Explicit(200, {"run_id": f"cancel-{prefix}"})],
        "getRunSnapshot": [Explicit(200, full)],
        "getRunTimeline": [Explicit(200, full), Explicit(404, {"run_id": "no-such-run"})],
        "getReview": [Explicit(200, full), Explicit(200, full, {"page_size": 1})],
        "decideSighting": [
            Explicit(
                200,
                {**full, "sighting_id": ids.sighting_id},
                body={"decision": "relabel", "class_name": "vehicle", "seen_item_count": 1},
            )
        ],
        "correctItemBoxes": [
            Explicit(200, {"item_id": ids.item_id}, body={"boxes": []}),
            Explicit(409, {"item_id": ids.item_id}, body={"boxes": [], "expected_revision": 999}),
            Explicit(404, {"item_id": "no-such-item"}, body={"boxes": []}),
        ],
        "undoItemCorrection": [Explicit(409, {"item_id": ids.item_id}, {"expected_revision": 999})],
        "decideItem": [
            Explicit(200, {"item_id": ids.item_id}, body={"decision": "confirm"}),
            Explicit(
                409, {"item_id": ids.item_id}, body={"decision": "none", "expected_revision": 999}
            ),
        ],
        "clearItemDecision": [Explicit(409, {"item_id": ids.item_id}, {"expected_revision": 999})],
        "getSummary": [Explicit(200, query={"time_zone": "Europe/Oslo", "days": 3})],
        "listBucketItems": [
            Explicit(
                200, {"bucket_id": "yard"}, {"review_state": ["accepted"], "camera_id": "cam-a"}
            ),
            Explicit(200, {"bucket_id": "yard"}, {"run_id": "r1", "min_score": 0.5}),
            Explicit(400, {"bucket_id": "yard"}, {"min_score": 0.9, "max_score": 0.1}),
        ],
        "getBucketItem": [
            Explicit(200, {"item_id": ids.item_id}),
            Explicit(404, {"item_id": "no-such-item"}),
            Explicit(400, {"item_id": "bad id!"}),
        ],
        "getReviewQueue": [
            Explicit(200, {"bucket_id": "yard"}, {"order": "lowest_score", "min_score": 0.5}),
            Explicit(400, {"bucket_id": "yard"}, {"page_size": 101}),
        ],
        "bulkDecideSightings": [
            Explicit(
                200,
                {"bucket_id": "yard"},
                body={"decision": "none", "dry_run": True, "filter": {"camera_id": "cam-a"}},
            ),
            Explicit(
                409,
                {"bucket_id": "yard"},
                body={"decision": "none", "expected_selection_revision": "sel1.stale"},
            ),
        ],
        "undoBulkDecision": [Explicit(404, {"action_id": "bulk-nothing"})],
        "exportBucket": [
            Explicit(200, {"bucket_id": "yard"}, {"format": "yolo", "review_state": ["accepted"]})
        ],
        "createDatasetVersion": [
            Explicit(200, {"bucket_id": "yard"}, body={"name": f"openapi {prefix}", "seed": 3}),
            Explicit(404, {"bucket_id": "nowhere"}, body={"name": "openapi"}),
        ],
        "listDatasetVersions": [Explicit(200, {"bucket_id": "yard"}, {"page_size": 5})],
        "getDatasetVersion": [Explicit(200, {"version_id": ids.version_id})],
        "diffDatasetVersions": [
            Explicit(200, {"to_version_id": ids.version_id}, {"from": ids.version_id})
        ],
        "listItemVersions": [Explicit(200, {"item_id": ids.item_id})],
        "exportDatasetVersion": [
            Explicit(200, {"dataset_version_id": ids.version_id}, {"format": "coco"})
        ],
        "getPreviewImage": [Explicit(200, {"run_id": "t", "item_id": ids.preview_id})],
        "getItemImage": [Explicit(200, {**full, "item_id": ids.item_id})],
        "requestPhoto": [
            Explicit(200, body={"camera_id": "cam-a", "time": "2026-11-29T08:00:10Z"})
        ],
        "getPhoto": [Explicit(200, {"photo_id": ids.photo_id})],
        "whoAmI": [Explicit(200)],
        "listOwnKeys": [Explicit(200 if prefix == "api" else 403)],
        "createOwnKey": [
            Explicit(
                200 if prefix == "api" else 403,
                body={
                    "name": "fuzz",
                    "scopes": [{"scope": "footage_read", "camera_ids": ["cam-a"]}],
                },
            )
        ],
        "revokeOwnKey": [
            Explicit(200 if prefix == "api" else 403, {"key_id": ids.own_keys[prefix]})
        ],
        "watchRunLive": [Explicit(426, full)],
    }
    if prefix == "api":
        calls["login"] = [Explicit(200, body={"user_id": "bob", "password": PASSWORD})]
        calls["getSession"] = [Explicit(200)]
        calls["logout"] = [Explicit(204)]
    return calls


@dataclasses.dataclass
class Document:
    prefix: str
    headers: dict[str, str]
    cookies: dict[str, str]
    explicit: dict[str, list[Explicit]]
    # operationId -> credentials of its own (headers, cookies)
    own: dict[str, tuple[dict[str, str], dict[str, str]]] = dataclasses.field(default_factory=dict)


def run_document(url: str, document: Document) -> list[str]:
    """Loads the served document and runs every operation; the problems found."""
    schema = schemathesis.openapi.from_url(
        f"{url}/{document.prefix}/openapi.json",
        headers=document.headers,
        cookies=document.cookies,
    )
    problems: list[str] = []
    seen: set[str] = set()
    with requests.Session() as session:
        for result in schema.get_all_operations():
            if isinstance(result, Err):
                raise result.err()
            operation = result.ok()
            name = operation.definition.raw["operationId"].removeprefix(f"{document.prefix}_")
            seen.add(name)
            headers, cookies = document.own.get(name, (document.headers, document.cookies))

            def send(
                case: Case, headers: dict[str, str] = headers, cookies: dict[str, str] = cookies
            ) -> Any:
                response = case.call(
                    base_url=url, session=session, headers=headers, cookies=cookies
                )
                case.validate_response(response, checks=CHECKS, headers=headers)
                return response

            for call in document.explicit.get(name, []):
                case = operation.Case(path_parameters=call.path, query=call.query, body=call.body)
                try:
                    response = send(case)
                except (AssertionError, FailureGroup) as error:
                    problems.append(f"{operation.label} (explicit {call}): {described(error)}")
                    continue
                if response.status_code != call.status:
                    problems.append(
                        f"{operation.label} (explicit {call}): {response.status_code} "
                        f"{response.text[:300]}, expected {call.status}"
                    )
            for mode, count in EXAMPLES.items():
                problems += fuzz(operation.label, operation.as_strategy(mode), count, send)
    assert seen == set(document.explicit), "every operation, and only those, has explicit calls"
    return problems


def described(error: AssertionError | FailureGroup) -> str:
    if isinstance(error, FailureGroup):
        return "; ".join(described(failure) for failure in error.exceptions)
    if isinstance(error, Failure):
        return f"{error.title}: {error.message}"
    return str(error)


def fuzz(label: str, strategy: Any, count: int, send: Callable[[Case], Any]) -> list[str]:
    problems: list[str] = []

    @hypothesis.settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],  # a failure is reported as found (no shrinking)
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @hypothesis.given(case=strategy)
    def run(case: Case) -> None:
        try:
            send(case)
        except (AssertionError, FailureGroup) as error:
            problems.append(f"{label}: {described(error)}\n  {case.as_curl_command()}")
            raise AssertionError(label) from None

    with contextlib.suppress(AssertionError):  # recorded
        run()
    return problems


@pytest.mark.parametrize("prefix", ["api", "v1"])
async def test_every_answer_matches_the_served_document(
    gateway: GatewayHarness, prefix: str
) -> None:
    """One document a test, so that the two run on two workers."""
    world = await build(gateway)
    explicit = explicit_calls(prefix, world.ids, world.ids.tracking_runtime)
    if prefix == "api":
        ada = world.secrets["ada"]
        same_site = {"sec-fetch-site": "same-origin"}
        document = Document(
            "api",
            headers={"x-csrf-token": csrf_token(ada), **same_site},
            cookies={"workshop_session": ada},
            explicit=explicit,
        )
        leaving = await session_of(gateway, "ada")
        document.own["logout"] = (
            {"x-csrf-token": csrf_token(leaving), **same_site},
            {"workshop_session": leaving},
        )
    else:
        document = Document(
            "v1",
            headers={"authorization": f"Bearer {world.secrets['workshop']}"},
            cookies={},
            explicit=explicit,
        )
    problems = await asyncio.to_thread(run_document, gateway.url, document)
    assert problems == [], "\n\n".join(problems)


async def test_a_method_not_served_is_405_with_every_served_method_in_allow(
    gateway: GatewayHarness,
) -> None:
    """RFC 9110: a 405 lists in `Allow` the methods the resource supports. Every operation
    is a route of its own, so this is the union over every documented path that matches
    the URL (`/workflows/validate` is also `/workflows/{workflow_id}` with that id)."""
    async with gateway.client() as client:
        for prefix in ("api", "v1"):
            document = (await client.get(f"/{prefix}/openapi.json")).json()
            paths: dict[str, dict[str, Any]] = document["paths"]
            patterns = {
                re.compile("^" + re.sub(r"\{[^/]+\}", "[^/]+", path) + "$"): set(item)
                for path, item in paths.items()
            }
            for path in paths:
                url = re.sub(r"\{[^/]+\}", "some-id", path)
                expected = {
                    method.upper()
                    for pattern, methods in patterns.items()
                    if pattern.match(url)
                    for method in methods
                }
                if "GET" in expected:
                    expected.add("HEAD")
                answer = await client.request("OPTIONS", url)
                assert answer.status_code == 405, (url, answer.text)
                assert answer.json()["reason"] == "METHOD_NOT_ALLOWED"
                allowed = {method.strip() for method in answer.headers["allow"].split(",")}
                assert allowed == expected, url
