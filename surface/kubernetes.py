"""Kubernetes objects for the Prometheus Operator and Grafana, from the alert catalog and boards.

`python -m fabricscope.surface.kubernetes` writes them into deploy/kubernetes/, from the same
sources as deploy/prometheus/ and grafana/:

    python -m fabricscope.surface.kubernetes            # writes the files below under the repository
    python -m fabricscope.surface.kubernetes --check    # exit 2 naming the stale ones, writes nothing

- a PrometheusRule whose groups are the alert catalog's (surface/alerting/rules.py: the same
  groups as deploy/prometheus/fabricscope-alerts.yaml);
- one ConfigMap per Grafana board, labelled `grafana_dashboard: "1"` (the label
  kube-prometheus-stack's Grafana sidecar loads dashboards from), holding the same
  JSON as grafana/dashboards/<uid>.json;
- one ConfigMap of the boards' datasources, labelled `grafana_datasource: "1"` (the
  sidecar's datasource label), the same as grafana/provisioning/datasources/.

One board per ConfigMap keeps each object far below the 256 KiB that client-side
`kubectl apply` can keep in its last-applied annotation. Output is deterministic.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from fabricscope.errors import UserError, exit_code_of
from fabricscope.surface.grafana import dashboards
from fabricscope.surface.alerting.catalog import RUNBOOK_BASE
from fabricscope.surface.alerting.rules import groups
from fabricscope.surface.yamlout import dump_all, generated_header

ROOT = Path(__file__).resolve().parents[1]
#: the kustomize component that carries what the Prometheus Operator and Grafana read
COMPONENT_DIR = "deploy/kubernetes/components/prometheus-operator"
RULE_FILE = f"{COMPONENT_DIR}/generated-prometheusrule.yaml"
DASHBOARDS_FILE = f"{COMPONENT_DIR}/generated-grafana-dashboards.yaml"
DATASOURCES_FILE = f"{COMPONENT_DIR}/generated-grafana-datasources.yaml"
COMMAND = "python -m fabricscope.surface.kubernetes"
NAMESPACE = "fabricscope"
#: labels kube-prometheus-stack's Grafana sidecar watches (its chart defaults)
DASHBOARD_LABEL = {"grafana_dashboard": "1"}
DATASOURCE_LABEL = {"grafana_datasource": "1"}
#: the sidecar puts a board into the folder this annotation names (folderAnnotation)
FOLDER_ANNOTATION = {"grafana_folder": "fabricscope"}
_PART_OF = {"app.kubernetes.io/part-of": "fabricscope"}


def _dump(docs: list[dict], source: str) -> str:
    return dump_all(docs, generated_header(COMMAND, source, "what the sources render"))


def prometheus_rule(base: str = RUNBOOK_BASE) -> dict:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "fabricscope", "namespace": NAMESPACE, "labels": dict(_PART_OF)},
            "spec": {"groups": groups(base)}}


def _configmap(name: str, labels: dict, data: dict[str, str], annotations=None) -> dict:
    metadata = {"name": name, "namespace": NAMESPACE, "labels": {**_PART_OF, **labels}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def dashboard_configmaps() -> list[dict]:
    """One ConfigMap per board, its key the file name grafana/dashboards/ uses."""
    texts = dashboards.files()
    out = []
    for board in dashboards.boards():
        key = f"{board.uid}.json"
        out.append(_configmap(f"grafana-dashboard-{board.uid}", DASHBOARD_LABEL,
                              {key: texts[f"dashboards/{key}"]}, FOLDER_ANNOTATION))
    return out


def datasources_configmap() -> dict:
    """grafana/'s datasources, none of them the default: kube-prometheus-stack's own
    Prometheus datasource is, and Grafana refuses to provision two defaults."""
    doc = dashboards.datasources()
    for source in doc["datasources"]:
        source["isDefault"] = False
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    return _configmap("grafana-datasources-fabricscope", DATASOURCE_LABEL,
                      {"fabricscope.yaml": text})


def outputs(base: str = RUNBOOK_BASE) -> dict[str, str]:
    """path relative to the repository -> its text"""
    return {
        RULE_FILE: _dump([prometheus_rule(base)],
                         "surface/alerting/catalog.py (surface/alerting/rules.py)"),
        DASHBOARDS_FILE: _dump(dashboard_configmaps(),
                               "surface/grafana/boards*.py (surface/grafana/dashboards.py)"),
        DATASOURCES_FILE: _dump([datasources_configmap()], "surface/grafana/dashboards.py"),
    }


def stale(root: Path, base: str = RUNBOOK_BASE) -> list[str]:
    """The generated files under root that are missing or differ from their sources."""
    return [rel for rel, text in outputs(base).items()
            if not (root / rel).is_file() or (root / rel).read_text() != text]


def write(root: Path, base: str = RUNBOOK_BASE) -> list[str]:
    """Write what changed; the paths written."""
    changed = stale(root, base)
    texts = outputs(base)
    for rel in changed:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(texts[rel])
    return changed


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail naming the files that are stale")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="directory the paths are relative to (default: this repository)")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        raise UserError(f"--root {args.root} is not a directory",
                        "give the repository (or an empty directory) to write into")
    if args.check:
        if bad := stale(args.root):
            raise UserError(f"stale generated files: {', '.join(bad)}", f"run `{COMMAND}`")
        return 0
    for rel in write(args.root):
        print(f"wrote {rel}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return exit_code_of(lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
