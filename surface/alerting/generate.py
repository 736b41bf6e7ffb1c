"""Write every file made from the alert catalog, or check that they are current.

    python -m fabricscope.surface.alerting            # writes the files below under the repository
    python -m fabricscope.surface.alerting --check    # exit 2 naming the stale ones, writes nothing
    python -m fabricscope.surface.alerting --runbook-base https://wiki.example/fabricscope-runbooks

Output is deterministic: the same catalog renders the same bytes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fabricscope.errors import UserError, exit_code_of
from fabricscope.surface.alerting.alertmanager import EXAMPLE_FILE, render_example
from fabricscope.surface.alerting.catalog import RUNBOOK_BASE
from fabricscope.surface.alerting.promtool_tests import TESTS_FILE, render_tests
from fabricscope.surface.alerting.rules import RULES_FILE, render_prometheus_example, render_rules
from fabricscope.surface.alerting.runbooks import RUNBOOKS_FILE, render_runbooks

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = "deploy/prometheus"
ALERTMANAGER_DIR = "deploy/alertmanager"
COMMAND = "python -m fabricscope.surface.alerting"


def outputs(base: str = RUNBOOK_BASE) -> dict[str, str]:
    """path relative to the repository -> its text"""
    return {
        f"{PROMETHEUS_DIR}/{RULES_FILE}": render_rules(base),
        f"{PROMETHEUS_DIR}/{TESTS_FILE}": render_tests(base),
        f"{PROMETHEUS_DIR}/prometheus.example.yaml": render_prometheus_example(),
        f"{ALERTMANAGER_DIR}/{EXAMPLE_FILE}": render_example(),
        RUNBOOKS_FILE: render_runbooks(),
    }


def stale(root: Path, base: str = RUNBOOK_BASE) -> list[str]:
    """The generated files under root that are missing or differ from the catalog."""
    out = []
    for rel, text in outputs(base).items():
        path = root / rel
        if not path.is_file() or path.read_text() != text:
            out.append(rel)
    return out


def write(root: Path, base: str = RUNBOOK_BASE) -> list[str]:
    """Write what changed; the paths written."""
    changed = stale(root, base)
    texts = outputs(base)
    for rel in changed:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(texts[rel])
    return changed


def _check_args(args: argparse.Namespace) -> None:
    if not args.root.is_dir():
        raise UserError(f"--root {args.root} is not a directory",
                        "give the repository (or an empty directory) to write into")
    base = args.runbook_base
    if not base.startswith(("http://", "https://")) or "#" in base:
        raise UserError(f"--runbook-base {base!r} is not an http(s) URL without a fragment",
                        "give the published docs/runbooks.md, e.g. " + RUNBOOK_BASE)


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail naming the files that are stale")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="directory the paths are relative to (default: this repository)")
    parser.add_argument("--runbook-base", default=RUNBOOK_BASE,
                        help="URL of the published runbooks (default: %(default)s)")
    args = parser.parse_args(argv)
    _check_args(args)
    if args.check:
        if bad := stale(args.root, args.runbook_base):
            raise UserError(f"stale generated files: {', '.join(bad)}", f"run `{COMMAND}`")
        return 0
    for rel in write(args.root, args.runbook_base):
        print(f"wrote {rel}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return exit_code_of(lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
