"""fabricscope.config with the collector's config: precedence, bad values, docs/config.md."""

import argparse
from pathlib import Path

import pytest

from fabricscope.collector.config import CollectorConfig
from fabricscope import config as fsconfig
from fabricscope.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def parse(*argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    fsconfig.add_arguments(parser, CollectorConfig)
    return parser.parse_args(list(argv))


def load(argv=(), env=None, yaml_text=None, tmp_path=None) -> CollectorConfig:
    path = None
    if yaml_text is not None:
        path = tmp_path / "fs.yaml"
        path.write_text(yaml_text)
        argv = ("--config", str(path), *argv)
    return fsconfig.load(CollectorConfig, "collector", parse(*argv), env=env or {})


def test_defaults():
    cfg = load()
    assert cfg == CollectorConfig()
    assert (cfg.listen, cfg.influx_api, cfg.influx_batch_lines) == ("0.0.0.0:9470", "v1", 5000)


def test_precedence_defaults_yaml_env_flags(tmp_path):
    yaml_text = "collector:\n  influx_db: from_yaml\n  influx_timeout_s: 3\n" \
                "  max_message_bytes: 1000\n  listen: 127.0.0.1:1\n"
    env = {"FABRICSCOPE_COLLECTOR_INFLUX_TIMEOUT_S": "4.5",
           "FABRICSCOPE_COLLECTOR_MAX_MESSAGE_BYTES": "2000"}
    cfg = load(["--max-message-bytes", "3000"], env, yaml_text, tmp_path)
    assert cfg.influx_db == "from_yaml"            # yaml over default
    assert cfg.influx_timeout_s == 4.5             # env over yaml
    assert cfg.max_message_bytes == 3000           # flag over env
    assert cfg.listen == "127.0.0.1:1"
    assert cfg.influx_url == CollectorConfig().influx_url   # untouched default


def test_top_level_yaml_keys_and_other_sections_are_ignored(tmp_path):
    cfg = load(yaml_text="influx_db: top\nagent:\n  node: x\n", tmp_path=tmp_path)
    assert cfg.influx_db == "top"


def test_config_file_from_environment(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("collector:\n  influx_api: v2\n")
    cfg = fsconfig.load(CollectorConfig, "collector", parse(),
                        env={"FABRICSCOPE_CONFIG": str(path)})
    assert cfg.influx_api == "v2"


@pytest.mark.parametrize("argv,env,yaml_text,message", [
    ([], {"FABRICSCOPE_COLLECTOR_METRICS_PORT": "abc"}, None,
     "FABRICSCOPE_COLLECTOR_METRICS_PORT: 'abc' is not a valid int"),
    (["--influx-timeout-s", "-1"], {}, None, "influx_timeout_s must be positive"),
    (["--max-message-bytes", "0"], {}, None, "max_message_bytes must be positive"),
    (["--influx-batch-lines", "1.5"], {}, None, "--influx-batch-lines: '1.5' is not a valid int"),
    (["--listen", "nohost"], {}, None, "listen address 'nohost' is not host:port"),
    (["--listen", "h:99999"], {}, None, "is not host:port"),
    (["--metrics-port", "70000"], {}, None, "metrics_port 70000 is not a port"),
    (["--influx-url", "127.0.0.1:8086"], {}, None, "is not an http(s) URL"),
    (["--influx-db", ""], {}, None, "influx_db is empty"),
    ([], {}, "collector:\n  influx_api: v3\n", "influx_api must be v1 or v2"),
    ([], {}, "collector:\n  no_such_key: 1\n", "unknown key 'no_such_key' for collector"),
    ([], {}, "collector: [1, 2\n", "is not valid YAML"),
    ([], {}, "- a\n- b\n", "must hold a mapping"),
])
def test_bad_values_are_one_line_user_errors(tmp_path, argv, env, yaml_text, message):
    with pytest.raises(UserError) as err:
        load(argv, env, yaml_text, tmp_path)
    assert message in err.value.cause
    line = err.value.one_line()
    assert line.startswith("fabricscope: error: ") and "; fix: " in line and "\n" not in line


def test_missing_config_file(tmp_path):
    with pytest.raises(UserError, match="cannot read config file"):
        fsconfig.load(CollectorConfig, "collector", parse("--config", str(tmp_path / "no.yaml")),
                      env={})


def test_listen_host_port_accepts_ipv6():
    assert CollectorConfig(listen="[::]:9470").listen_host_port() == ("[::]", 9470)
    assert CollectorConfig(listen="127.0.0.1:0").listen_host_port() == ("127.0.0.1", 0)


def test_every_config_field_is_documented():
    for _, cls in fsconfig.all_configs():
        for f in cls.__dataclass_fields__.values():
            assert f.metadata.get("doc"), f"{cls.__name__}.{f.name} has no doc"


def test_docs_config_md_is_current():
    path = ROOT / "docs" / "config.md"
    assert path.exists(), "docs/config.md is missing; fix: make docs"
    assert path.read_text() == fsconfig.render_markdown(fsconfig.all_configs()), \
        "docs/config.md is stale (a config dataclass changed); fix: make docs"

