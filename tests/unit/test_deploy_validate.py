"""Every object each kustomization renders is valid against Kubernetes' own schemas
(kubernetes-validate, offline, strict: an unknown field fails) at a pinned version,
and the Prometheus Operator's objects against the vendored CRDs' OpenAPI v3 schemas
(deploy/kubernetes/schemas/prometheus-operator/README.md)."""

from __future__ import annotations

import functools
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from test_deploy import DEPLOY, KUSTOMIZATIONS, needs_kubectl, render

#: the Kubernetes release whose schemas the manifests must satisfy
KUBERNETES_VERSION = "1.32.0"
CRD_DIR = DEPLOY / "schemas" / "prometheus-operator"
CRD_GROUP = "monitoring.coreos.com"


def _closed(schema):
    """The schema with unknown fields refused wherever it lists the known ones, as the
    API server's strict field validation does (a plain jsonschema run would accept a
    misspelt field, which the server then silently prunes)."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> openAPIV3Schema of each served version of the vendored CRDs."""
    out = {}
    for path in sorted(Path(CRD_DIR).glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            if version["served"]:
                key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                out[key] = _closed(version["schema"]["openAPIV3Schema"])
    return out


def _validate(obj: dict) -> None:
    where = f"{obj['kind']} {obj['metadata'].get('name')}"
    if obj["apiVersion"].startswith(CRD_GROUP + "/"):
        schema = crd_schemas().get((obj["apiVersion"], obj["kind"]))
        assert schema is not None, f"{where}: no vendored CRD for {obj['apiVersion']}"
        try:
            jsonschema.Draft7Validator(schema).validate(obj)
        except jsonschema.ValidationError as exc:
            pytest.fail(f"{where}: {exc.message} at {'/'.join(map(str, exc.absolute_path))}")
        return
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{where}: {exc.message} at {'/'.join(map(str, exc.path))}")


@needs_kubectl
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_rendered_object_is_valid_for_its_kind(kustomization):
    objs = render(kustomization)
    assert objs
    for obj in objs:
        _validate(obj)


@needs_kubectl
def test_the_vendored_crds_cover_every_prometheus_operator_kind_rendered():
    kinds = {(o["apiVersion"], o["kind"]) for k in KUSTOMIZATIONS for o in render(k)
             if o["apiVersion"].startswith(CRD_GROUP + "/")}
    assert kinds == {(f"{CRD_GROUP}/v1", k) for k in ("PrometheusRule", "ServiceMonitor",
                                                      "PodMonitor")}
    assert kinds <= crd_schemas().keys()


def test_a_misspelt_field_or_a_wrong_type_fails_validation():
    bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"},
           "data": {}, "dta": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)
    schema = crd_schemas()[(f"{CRD_GROUP}/v1", "PodMonitor")]
    for endpoint in ({"interval": 5}, {"honorLabel": True}):
        monitor = {"apiVersion": f"{CRD_GROUP}/v1", "kind": "PodMonitor",
                   "metadata": {"name": "x"}, "spec": {"podMetricsEndpoints": [endpoint]}}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft7Validator(schema).validate(monitor)
