"""Where a frame's picture lies in a model's input: stretched over it, or letterboxed.

The processor's decoders place frames this way and map boxes back through the same
placement; `workshop models evaluate` prepares a bucket's images alike
(docs/bring-your-own-model.md). Pure geometry, no imaging library.
"""

from __future__ import annotations

from dataclasses import dataclass

PAD_VALUE = 114  # the letterbox's gray, as Ultralytics pads


@dataclass(frozen=True)
class Placement:
    """Where the picture lies in a frame of `out_height` x `out_width`: resized to
    `height` x `width` with its top-left corner at (`left`, `top`), the rest PAD_VALUE."""

    out_height: int
    out_width: int
    top: int
    left: int
    height: int
    width: int

    @property
    def padded(self) -> bool:
        return (self.height, self.width) != (self.out_height, self.out_width)

    def to_picture(
        self, x1: float, y1: float, x2: float, y2: float
    ) -> tuple[float, float, float, float]:
        """A box in the frame's pixels as fractions of the picture (x, y, w, h), clipped to
        the picture (a box may reach into the padding)."""
        left, top, width, height = self.left, self.top, self.width, self.height
        x1, x2 = (min(max(x - left, 0.0), width) for x in (x1, x2))
        y1, y2 = (min(max(y - top, 0.0), height) for y in (y1, y2))
        return x1 / width, y1 / height, (x2 - x1) / width, (y2 - y1) / height


def stretch(out_height: int, out_width: int) -> Placement:
    """The whole frame resized to the output's size (the aspect may change)."""
    return Placement(out_height, out_width, 0, 0, out_height, out_width)


def letterbox(height: int, width: int, out_height: int, out_width: int) -> Placement:
    """A `width` x `height` picture letterboxed into the output: scaled by the smaller ratio,
    rounded, centred (Ultralytics' `LetterBox`: the odd pixel of padding goes below and right)."""
    if min(height, width, out_height, out_width) <= 0:
        raise ValueError(f"cannot letterbox {width}x{height} into {out_width}x{out_height}")
    ratio = min(out_height / height, out_width / width)
    new_width = min(out_width, max(1, round(width * ratio)))
    new_height = min(out_height, max(1, round(height * ratio)))
    top = round((out_height - new_height) / 2 - 0.1)
    left = round((out_width - new_width) / 2 - 0.1)
    return Placement(out_height, out_width, top, left, new_height, new_width)
