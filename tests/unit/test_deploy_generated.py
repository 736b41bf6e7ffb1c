"""deploy/kubernetes/'s PrometheusRule and Grafana ConfigMaps are current and say what
deploy/prometheus/ and grafana/ say: one alert catalog, one set of boards."""

from __future__ import annotations

import json

import yaml

from fabricscope.surface import kubernetes
from fabricscope.surface.grafana import dashboards
from fabricscope.surface.alerting.rules import RULES_FILE

ROOT = kubernetes.ROOT


def _docs(rel: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / rel).read_text()) if d]


def test_checked_in_files_are_what_the_sources_render():
    assert kubernetes.stale(ROOT) == [], "run `python -m fabricscope.surface.kubernetes`"


def test_rendering_is_deterministic():
    assert kubernetes.outputs() == kubernetes.outputs()


def test_check_names_the_stale_file_and_the_fix(tmp_path, capsys):
    assert kubernetes.main(["--root", str(tmp_path)]) == 0
    (tmp_path / kubernetes.RULE_FILE).write_text("groups: []\n")
    assert kubernetes.main(["--root", str(tmp_path), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert kubernetes.RULE_FILE in err and "python -m fabricscope.surface.kubernetes" in err


def test_a_missing_root_is_one_line_naming_the_fix(tmp_path, capsys):
    assert kubernetes.main(["--root", str(tmp_path / "absent"), "--check"]) == 2
    err = capsys.readouterr().err
    assert "is not a directory" in err and "fix:" in err and err.count("\n") == 1


def test_the_prometheus_rule_holds_the_groups_of_the_prometheus_rule_file():
    (rule,) = _docs(kubernetes.RULE_FILE)
    plain = yaml.safe_load((ROOT / "deploy" / "prometheus" / RULES_FILE).read_text())
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == plain["groups"]


def test_every_board_is_one_configmap_the_grafana_sidecar_loads():
    maps = _docs(kubernetes.DASHBOARDS_FILE)
    files = dashboards.files()
    boards = {p for p in files if p.startswith("dashboards/")}
    assert len(maps) == len(boards)
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, text),) = cm["data"].items()
        assert text == files[f"dashboards/{key}"]
        assert json.loads(text)["uid"] == key.removesuffix(".json")
        # client-side apply keeps the whole object in an annotation of at most 256 KiB
        assert len(json.dumps(cm)) < 200_000


def test_the_datasources_are_grafanas_without_claiming_the_default():
    (cm,) = _docs(kubernetes.DATASOURCES_FILE)
    assert cm["metadata"]["labels"]["grafana_datasource"] == "1"
    shipped = yaml.safe_load(cm["data"]["fabricscope.yaml"])["datasources"]
    ours = dashboards.datasources()["datasources"]
    assert [s["uid"] for s in shipped] == [s["uid"] for s in ours]
    assert not any(s["isDefault"] for s in shipped)
