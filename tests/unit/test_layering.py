"""The shared core (fabricscope/) depends on nothing above it.

Two checks: importing every module of the core in a fresh interpreter loads no
module of a component above it, and no core module names one in an import
statement at all (a lazy import inside a function is a dependency too). The
components find each other through the core's registration points instead
(fabricscope/plugins.py)."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import fabricscope

ROOT = Path(__file__).resolve().parents[2]
#: the packages above the core (in the repository: agent/, collector/, ...; setup.py)
LEAVES = tuple(f"fabricscope.{c}" for c in
               ("agent", "collector", "lab", "bench", "demo", "diagnosis", "surface"))


def is_leaf(module: str) -> bool:
    return any(module == leaf or module.startswith(leaf + ".") for leaf in LEAVES)


def core_modules() -> list[str]:
    """Every importable module of the core (`__main__` runs the CLI, which loads the
    registered commands by design)."""
    return sorted(m.name for m in pkgutil.walk_packages(fabricscope.__path__, "fabricscope.")
                  if not m.name.endswith(".__main__") and not is_leaf(m.name))


def test_importing_each_core_module_loads_no_leaf():
    script = f"""
import importlib, json, sys
leaves = {LEAVES!r}
found = {{}}
for name in {core_modules()!r}:
    importlib.import_module(name)
    loaded = sorted(m for m in sys.modules
                    if any(m == leaf or m.startswith(leaf + ".") for leaf in leaves))
    if loaded:
        found[name] = loaded
        break
print(json.dumps(found))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out) == {}
    assert "fabricscope.schema" in core_modules() and "fabricscope.cli" in core_modules()


def test_no_core_module_imports_a_leaf():
    offenders = []
    for path in sorted((ROOT / "fabricscope").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                          if is_leaf(n)]
    assert offenders == []
