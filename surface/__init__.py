"""The operator surface: alerts, their promtool tests, runbooks and (imported by the
dashboards) the same names, all generated from one list (surface/catalog.py).

`python -m surface.alerts` writes deploy/prometheus/, deploy/alertmanager/ and
docs/runbooks.md from it; tests fail when the checked-in files differ."""
