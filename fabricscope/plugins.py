"""Components register themselves with the shared core through entry points.

The core (this package) depends on nothing above it: the CLI's subcommands and
the components' config sections are declared in pyproject.toml under
`[project.entry-points."fabricscope.<group>"]` and loaded here by name, in the
order they are declared. A component added to the project adds its entry point;
the core does not change.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from fabricscope.errors import UserError


def load_group(group: str) -> dict:
    """name -> loaded object of every entry point in `group`, in declaration order."""
    found = list(entry_points(group=group))
    if not found:
        raise UserError(f"no {group} entry points are installed",
                        "install the project (make setup, or pip install -e .)")
    return {ep.name: ep.load() for ep in found}
