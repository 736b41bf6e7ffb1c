"""`fabricscope collector`: receive agent batches over gRPC and write them to InfluxDB."""

from __future__ import annotations

import argparse
import asyncio
import signal

EPILOG = """\
examples:
  fabricscope collector --influx-url http://127.0.0.1:8086
  fabricscope collector --listen 127.0.0.1:0 --metrics-port 0
  fabricscope collector --influx-api v2 --influx-url http://127.0.0.1:8428 --influx-db fs
  fabricscope collector --spool-dir /var/lib/fabricscope/collector-spool \
      --tls-cert server.crt --tls-key server.key --tls-client-ca agents-ca.crt \
      --tokens-file /etc/fabricscope/tokens.yaml

The first log line names the bound address: `collector listening on HOST:PORT`.
Configuration: docs/config.md (flags > FABRICSCOPE_COLLECTOR_* > YAML > defaults).
"""


def register(subparsers) -> None:
    from fabricscope.collector.config import CollectorConfig
    from fabricscope.config import add_arguments
    parser = subparsers.add_parser(
        "collector", help="receive agent batches and write them to InfluxDB",
        description=__doc__.split(":", 1)[1].strip(), epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, CollectorConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fabricscope.collector.config import CollectorConfig
    from fabricscope.config import load
    config = load(CollectorConfig, "collector", args)
    return asyncio.run(serve(config))


async def serve(config) -> int:
    """Run until SIGINT or SIGTERM, then stop gracefully."""
    from fabricscope.collector.server import Collector
    collector = Collector(config)
    await collector.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await stopping.wait()
    finally:
        await collector.stop()
    return 0
