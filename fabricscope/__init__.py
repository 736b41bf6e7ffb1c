"""fabricscope: network observability and bottleneck diagnosis for distributed training.

This package holds what the agent and the collector share (records, schema, wire
contract, config, self-metrics, errors) and the single CLI entry point.
"""

__version__ = "0.1.0"
