"""Alerts, generated from one list (catalog.py, with the alerts on findings, on trends
and on the pipeline itself in finding_alerts.py, trend_alerts.py and
pipeline_alerts.py): Prometheus rules (rules.py), their promtool tests
(promtool_tests.py, cases.py), runbooks (runbooks.py) and the Alertmanager example
(alertmanager.py). `python -m fabricscope.surface.alerting` writes them (generate.py)."""
