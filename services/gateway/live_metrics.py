"""The gateway's live-socket series, read from its hub's counts at scrape time (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.gateway.live import LiveHub


class LiveMetrics:
    """A ScrapeCollector over one hub's `stats()`: nothing is counted twice, the hub keeps
    the counts it already keeps for its own tests and logs."""

    def __init__(self, hub: LiveHub) -> None:
        self.hub = hub

    async def collect_now(self) -> Iterable[Metric]:
        stats = self.hub.stats()
        return [
            GaugeMetricFamily(
                "workshop_gateway_sockets_open", "Live WebSockets open now.", stats["sockets"]
            ),
            GaugeMetricFamily(
                "workshop_gateway_watch_streams_open",
                "WatchRun streams open now (one per run, shared by its sockets).",
                stats["streams"],
            ),
            GaugeMetricFamily(
                "workshop_gateway_buffered_bytes",
                "Bytes waiting in the live sockets' queues and transport buffers now.",
                stats["buffered_bytes"],
            ),
            CounterMetricFamily(
                "workshop_gateway_sockets_served",
                "Live WebSockets accepted and authorized.",
                stats["sockets_served"],
            ),
            CounterMetricFamily(
                "workshop_gateway_messages_sent",
                "Messages sent over live WebSockets, all sockets together.",
                stats["messages"],
            ),
            CounterMetricFamily(
                "workshop_gateway_slow_readers_dropped",
                "Live WebSockets closed (1013) because their reader stopped taking messages.",
                stats["slow_closes"],
            ),
        ]
