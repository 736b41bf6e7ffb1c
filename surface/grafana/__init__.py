"""Grafana boards as code: what each board shows (boards.py, boards_ops.py), the
panels (panels.py, Grafana's own grafana-foundation-sdk builders), the queries
checked against the schema (queries.py) and Grafana's macro expansion (macros.py,
which the report and the live tests use to run the boards' queries as Grafana
would). `python -m fabricscope.surface.grafana` writes grafana/ (dashboards.py)."""
