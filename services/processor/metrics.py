"""The processor's own series (docs/metrics.md). Counters, so that rate() gives frames per
second; the jobs in flight are read at scrape time from the processors of this process."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sized
from typing import Protocol

from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from workshop.kit.metrics import REGISTRY

# Seconds: a decode chunk or one model pass over a batch of frames.
STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

FRAMES_DECODED = Counter(
    "workshop_processor_frames_decoded", "Frames decoded from recordings.", registry=REGISTRY
)
FRAMES_INFERRED = Counter(
    "workshop_processor_frames_inferred",
    "Frames every model of their run has detected on.",
    registry=REGISTRY,
)
DETECTIONS_DROPPED = Counter(
    "workshop_processor_detections_dropped",
    "Detections a model answered with a NaN or infinite score or coordinate, left out "
    "(the coordinator refuses such a box).",
    ["model"],
    registry=REGISTRY,
)
FRAMES_PUBLISHED = Counter(
    "workshop_processor_frames_published",
    "Frames that reached an output and were published as previews.",
    registry=REGISTRY,
)
DECODE_SECONDS = Histogram(
    "workshop_processor_decode_seconds",
    "Seconds one chunk of frames takes to decode (off the event loop).",
    buckets=STAGE_BUCKETS,
    registry=REGISTRY,
)
INFERENCE_SECONDS = Histogram(
    "workshop_processor_inference_seconds",
    "Seconds one model takes over one batch of frames, by model name.",
    ["model"],
    buckets=STAGE_BUCKETS,
    registry=REGISTRY,
)
HAND_BACKS = Counter(
    "workshop_processor_hand_backs",
    "Jobs handed back to the queue (Release) because a service did not answer or refused "
    "for its own reasons.",
    registry=REGISTRY,
)

STOP_JOBS = Counter(
    "workshop_processor_stop_jobs",
    "Jobs in flight when the processor was stopped, by outcome: finished (ended during the "
    "drain: committed, or failed or fenced as any job may be) or handed_back (still running "
    "when the drain ended, released with no attempt spent).",
    ["outcome"],
    registry=REGISTRY,
)
for _outcome in ("finished", "handed_back"):
    STOP_JOBS.labels(_outcome)  # both series from the start, at 0


class _Running(Protocol):
    @property
    def running_jobs(self) -> Sized: ...


class _JobsInFlight:
    """`workshop_processor_jobs_in_flight`: jobs the started processors of this process hold."""

    def __init__(self) -> None:
        # by id: a processor is a dataclass, compared by value and so not hashable
        self._processors: weakref.WeakValueDictionary[int, _Running] = weakref.WeakValueDictionary()

    def add(self, processor: _Running) -> None:
        self._processors[id(processor)] = processor

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "workshop_processor_jobs_in_flight", "Jobs claimed and not yet finished, now."
        )
        family.add_metric([], sum(len(p.running_jobs) for p in list(self._processors.values())))
        return [family]


JOBS_IN_FLIGHT = _JobsInFlight()
REGISTRY.register(JOBS_IN_FLIGHT)
