"""One inference on a synthetic frame through the Triton that will serve a version, before
anything is written or recorded (docs/bring-your-own-model.md).

The version is loaded under a name of its own (`workshop-check-<name>-<random>`) with its
config and files sent in the load request, so nothing lands in the model repository and the
versions Triton serves under the model's name are not touched; it is unloaded afterwards.
Refusals (`ModelRefused`) name what went wrong: Triton cannot load the model, its answer lacks
an output or has the wrong shape, or names a class the class list does not have.
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

import numpy as np
import tritonclient.grpc as triton
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from tools.model_repository.families import ModelRefused
from tools.model_repository.repository import VersionPlan
from workshop.kit.letterbox import PAD_VALUE
from workshop.kit.model_io import CONTRACT_OUTPUTS, LETTERBOX_INPUT

CHECK_PREFIX = "workshop-check-"
TIMEOUT_S = 120.0
# The synthetic frame's scene: 16:9 footage, letterboxed when the model takes letterboxed frames.
SCENE_ASPECT = 16 / 9


class TritonUnreachable(RuntimeError):
    """Triton did not answer at the address given."""


def synthetic_frame(plan: VersionPlan, seed: int = 0) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """uint8 [1, H, W, 3]: noise, letterboxed as a 16:9 frame when the model letterboxes."""
    height, width = plan.input_shape[0], plan.input_shape[1]
    frame = np.random.default_rng(seed).integers(0, 256, (1, height, width, 3), dtype=np.uint8)
    if plan.input_name == LETTERBOX_INPUT:
        content = min(height, round(width / SCENE_ASPECT))
        top = (height - content) // 2
        frame[:, :top] = PAD_VALUE
        frame[:, top + content :] = PAD_VALUE
    return frame


def check_on_triton(url: str, plan: VersionPlan, *, timeout_s: float = TIMEOUT_S) -> None:
    """Loads `plan` on the Triton at `url` under a check name, runs one synthetic frame and
    checks the answer; ModelRefused when it fails, TritonUnreachable when Triton is not there."""
    check_name = f"{CHECK_PREFIX}{plan.name}-{secrets.token_hex(4)}"
    client = triton.InferenceServerClient(url)
    try:
        try:
            client.is_server_live(client_timeout=10)
        except InferenceServerException as error:
            raise TritonUnreachable(f"Triton at {url} did not answer: {error.message()}") from None
        try:
            client.load_model(
                check_name,
                config=_config_json(plan, check_name),
                files={f"file:1/{name}": data for name, data in plan.files.items()},
                client_timeout=timeout_s,
            )
        except InferenceServerException as error:
            raise ModelRefused(
                f"Triton at {url} cannot load the model: {error.message()}"
            ) from None
        try:
            _check_answer(client, check_name, plan, timeout_s)
        finally:
            # Unloading is tidying up; the check's outcome stands.
            with contextlib.suppress(InferenceServerException):
                client.unload_model(check_name)
    finally:
        client.close()


def _config_json(plan: VersionPlan, check_name: str) -> str:
    config = model_config_pb2.ModelConfig()
    text_format.Parse(plan.config, config)
    config.name = check_name
    config.ClearField("version_policy")
    return json_format.MessageToJson(config, preserving_proto_field_name=True)


def _check_answer(
    client: triton.InferenceServerClient, check_name: str, plan: VersionPlan, timeout_s: float
) -> None:
    frame = synthetic_frame(plan)
    request = triton.InferInput(plan.input_name, list(frame.shape), "UINT8")
    request.set_data_from_numpy(frame)
    try:
        reply = client.infer(
            check_name,
            [request],
            model_version="1",
            outputs=[triton.InferRequestedOutput(name) for name in CONTRACT_OUTPUTS],
            client_timeout=timeout_s,
        )
    except InferenceServerException as error:
        raise ModelRefused(
            f"the model failed on a synthetic frame {list(frame.shape)}: {error.message()}"
        ) from None
    found = {name: reply.as_numpy(name) for name in CONTRACT_OUTPUTS}
    missing = [name for name, value in found.items() if value is None]
    if missing:
        raise ModelRefused(f"the model's answer lacks {', '.join(missing)}")
    counts, boxes, scores, classes = (np.asarray(found[name]) for name in CONTRACT_OUTPUTS)
    slots = scores.shape[-1] if scores.ndim == 2 else -1
    if (
        counts.shape != (1, 1)
        or boxes.shape != (1, slots, 4)
        or scores.shape != (1, slots)
        or classes.shape != (1, slots)
    ):
        raise ModelRefused(
            "the model's answer does not have the EfficientNMS shapes: num_dets "
            f"{list(counts.shape)}, det_boxes {list(boxes.shape)}, det_scores "
            f"{list(scores.shape)}, det_classes {list(classes.shape)}"
        )
    count = int(counts[0, 0])
    if not 0 <= count <= slots:
        raise ModelRefused(f"the model answered num_dets {count} with {slots} detection slots")
    used = classes[0, :count]
    outside = [int(c) for c in used if not 0 <= int(c) < len(plan.classes)]
    if outside:
        raise ModelRefused(
            f"the model answered class index {outside[0]}, but it has {len(plan.classes)} "
            "class names: the class list disagrees with the model"
        )
