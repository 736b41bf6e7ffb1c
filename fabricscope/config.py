"""One typed configuration per component: defaults < YAML file < environment < flags.

Each component declares a dataclass whose fields carry their documentation in
`metadata["doc"]`. From that one declaration come the command-line flags
(`--field-name`), the environment overrides (`FABRICSCOPE_<COMPONENT>_<FIELD>`),
the YAML keys (`field_name`, under a top-level `agent:` or `collector:` section
or at top level) and docs/config.md (`python -m fabricscope.config`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from pathlib import Path

import yaml

from fabricscope.errors import UserError


def doc(text: str, **kw):
    """Field metadata helper: `x: int = field(default=1, metadata=doc("..."))`."""
    return {"doc": text, **kw}


def _field_type(cls, f: dataclasses.Field):
    hints = typing.get_type_hints(cls)
    return hints[f.name]


def _convert(value, typ, where: str):
    origin = typing.get_origin(typ)
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if typ in (int, float, str):
            if typ is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return typ(value)
        if origin is list:
            (item,) = typing.get_args(typ)
            if isinstance(value, str):
                value = [v for v in (s.strip() for s in value.split(",")) if v]
            return [_convert(v, item, where) for v in value]
    except (TypeError, ValueError):
        raise UserError(f"{where}: {value!r} is not a valid {getattr(typ, '__name__', typ)}",
                        "correct the value (see docs/config.md)") from None
    raise TypeError(f"unsupported config type {typ}")


def add_arguments(parser: argparse.ArgumentParser, cls) -> None:
    """Add one `--flag` per config field; unset flags stay None and override nothing."""
    parser.add_argument("--config", metavar="FILE", help="YAML config file")
    for f in dataclasses.fields(cls):
        typ = _field_type(cls, f)
        flag = "--" + f.name.replace("_", "-")
        default = _default_of(f)
        help_text = f"{f.metadata.get('doc', '')} (default: {default!r})"
        if typ is bool:
            parser.add_argument(flag, dest=f.name, default=None,
                                action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(),
                                help=help_text, **({"choices": f.metadata["choices"]}
                                                   if "choices" in f.metadata else {}))


def _default_of(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.metadata.get("default_doc", f.default_factory())  # type: ignore[misc]
    return None


def load(cls, section: str, args: argparse.Namespace | None = None,
         env: typing.Mapping[str, str] | None = None, path: str | None = None):
    """Build `cls` from defaults, then the YAML file, then env, then flags."""
    env = os.environ if env is None else env
    path = path or (getattr(args, "config", None) if args else None) \
        or env.get("FABRICSCOPE_CONFIG")
    values: dict = {}
    names = {f.name: f for f in dataclasses.fields(cls)}
    if path:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise UserError(f"cannot read config file {path}: {exc.strerror}",
                            "pass an existing file with --config") from None
        except yaml.YAMLError as exc:
            raise UserError(f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}",
                            "fix the YAML syntax") from None
        if not isinstance(data, dict):
            raise UserError(f"config file {path} must hold a mapping", "see docs/config.md")
        if isinstance(data.get(section), dict):
            data = data[section]
        else:   # top-level keys; other components' sections are theirs
            data = {k: v for k, v in data.items() if not isinstance(v, dict)}
        for key, value in data.items():
            if key not in names:
                raise UserError(f"config file {path}: unknown key {key!r} for {section}",
                                "remove it or check its spelling in docs/config.md")
            values[key] = _convert(value, _field_type(cls, names[key]), f"{path}: {key}")
    prefix = f"FABRICSCOPE_{section.upper()}_"
    for name, f in names.items():
        var = prefix + name.upper()
        if var in env:
            values[name] = _convert(env[var], _field_type(cls, f), var)
    if args is not None:
        for name, f in names.items():
            value = getattr(args, name, None)
            if value is not None:
                values[name] = _convert(value, _field_type(cls, f), "--" + name.replace("_", "-"))
    cfg = cls(**values)
    check = getattr(cfg, "check", None)
    if check:
        check()
    return cfg


def render_markdown(configs: list[tuple[str, type]]) -> str:
    out = ["# fabricscope configuration", "",
           "Rendered from the config dataclasses by `python -m fabricscope.config`; do not "
           "edit by hand.", "",
           "Precedence: built-in default < YAML file (`--config FILE` or `FABRICSCOPE_CONFIG`) "
           "< environment variable < command-line flag. In the YAML file, keys may stand at top "
           "level or under a section named after the component (`agent:`, `collector:`).", ""]
    for section, cls in configs:
        out += [f"## {section}", "", (cls.__doc__ or "").strip().splitlines()[0], "",
                "| key | flag | environment | default | meaning |", "|---|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            out.append(f"| `{f.name}` | `--{f.name.replace('_', '-')}` | "
                       f"`FABRICSCOPE_{section.upper()}_{f.name.upper()}` | "
                       f"`{_default_of(f)!r}` | {f.metadata.get('doc', '')} |")
        out.append("")
    return "\n".join(out)


#: entry-point group of the components' config dataclasses (section name -> class)
CONFIGS_GROUP = "fabricscope.configs"


def all_configs() -> list[tuple[str, type]]:
    """Every component's config, found by registration (pyproject.toml entry points)."""
    from fabricscope.plugins import load_group
    return list(load_group(CONFIGS_GROUP).items())


if __name__ == "__main__":
    sys.stdout.write(render_markdown(all_configs()))
