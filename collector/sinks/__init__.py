"""Where the collector writes records: InfluxDB line protocol over HTTP (v1 or v2 API).

`make_sink(config)` picks the implementation named by `influx_api`; every sink
implements fabricscope.collector.sinks.base.Sink.
"""

from __future__ import annotations

from fabricscope.collector.sinks.base import Sink, SinkError, SinkRejected

__all__ = ["Sink", "SinkError", "SinkRejected", "make_sink"]


def make_sink(config) -> Sink:
    if config.influx_api == "v2":
        from fabricscope.collector.sinks.influx_v2 import InfluxV2Sink
        return InfluxV2Sink(config)
    from fabricscope.collector.sinks.influx_v1 import InfluxV1Sink
    return InfluxV1Sink(config)
