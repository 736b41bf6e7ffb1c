"""The operator surface, in parts generated from one alert catalog and the schema:

- surface/alerting/: the alert catalog, Prometheus rules, their promtool tests,
  runbooks and the Alertmanager example (`python -m fabricscope.surface.alerting`);
- surface/grafana/: the boards, their InfluxQL/PromQL builders and Grafana's macro
  expansion (`python -m fabricscope.surface.grafana` writes grafana/);
- surface/report/: `fabricscope report`, one self-contained HTML file;
- top.py (`fabricscope top`), cli.py (both subcommands), jobclass.py (a job's class
  as every view shows it), metrics.py (the engine's metric names the rules, boards
  and tests share), kubernetes.py (the operator objects from alerting and grafana,
  `python -m fabricscope.surface.kubernetes`) and yamlout.py (deterministic YAML).

Tests fail when a generated file differs from what its part renders."""
