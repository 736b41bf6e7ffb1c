"""User-space sources that are not kernel probes: the training markers ring and the
load generator. Declared for the registry in agent/probes/__init__.py."""

PROBES = {"markers": "fabricscope.agent.sources.markers:MarkersSource",
          "synthetic": "fabricscope.agent.sources.synthetic:SyntheticSource",   # load generator
          "nccl_inspector": "fabricscope.agent.sources.nccl_inspector:NcclInspectorSource",
          "nccl_ras": "fabricscope.agent.sources.nccl_ras:NcclRasSource"}
