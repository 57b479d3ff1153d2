"""The tensors of Workshop's model contract, named once for everything that talks to a served
model: the processor, `workshop models publish` (which wraps other layouts into the contract)
and the evaluation (docs/bring-your-own-model.md)."""

from __future__ import annotations

# Today's contract input: uint8 NHWC frames resized (stretched) to the model's size.
STRETCH_INPUT = "images"
# The input of a served graph whose frames are letterboxed (aspect kept, padded).
LETTERBOX_INPUT = "letterboxed_images"
INPUTS = (STRETCH_INPUT, LETTERBOX_INPUT)
# The contract's outputs, in the order they are read.
CONTRACT_OUTPUTS = ("num_dets", "det_boxes", "det_scores", "det_classes")
# Statuses of tritonclient's errors that mean Triton did not answer, as its gRPC
# client words them; any other is Triton's answer about the model or the request.
UNREACHABLE_STATUSES = frozenset({"StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED"})
