"""The generated parts of docs/DIAGNOSIS.md, rendered where they live in code.

    python -m fabricscope.diagnosis.docs            # writes the generated blocks into docs/DIAGNOSIS.md
    python -m fabricscope.diagnosis.docs --check    # exit 2 naming the stale blocks, writes nothing

Each block sits between two marker comments, and only its text is rewritten:

    <!-- BEGIN generated causes: python -m fabricscope.diagnosis.docs -->
    ...
    <!-- END generated causes -->

- causes: diagnosis/causes.py (MEANING, SEVERITY_RULE, EVIDENCE, RULES_OUT), each
  `name` in backquotes shown with its value (a threshold, or `module.NAME` of a
  diagnosis module), so that a renamed threshold fails here rather than in a reader;
- thresholds: diagnosis/thresholds.py's table;
- space: bench/scenario_space.py's kinds, ranges and seed ranges;
- accuracy-dev, accuracy-eval: bench/results/diagnosis-{dev,eval}.json as
  `python -m fabricscope.bench.diagnosis_matrix --render` prints them, or the command that
  measures them where a file is absent.
The prose around the blocks is written by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import sys
from pathlib import Path

from fabricscope.diagnosis.causes import EVIDENCE, MEANING, RULES_OUT, SEVERITY_RULE, Cause
from fabricscope.diagnosis.thresholds import DEFAULT, render_markdown
from fabricscope.errors import UserError, exit_code_of

COMMAND = "python -m fabricscope.diagnosis.docs"
ROOT = Path(__file__).resolve().parents[1]
DOC = "docs/DIAGNOSIS.md"
RESULTS = "bench/results/diagnosis-{}.json"
#: runs per set the accuracy tables are measured over
SET_RUNS = 60
_NAME = re.compile(r"`(?:(\w+)\.)?([A-Za-z_]\w*)`")
#: units a cause's text says itself, or that a bare number reads as
_UNSHOWN = {"", "fraction", "x", "segments", "steps"}


def value_of(module: str | None, name: str) -> str:
    """What a name in backquotes stands for: a threshold's value and unit, or the value
    of a diagnosis module's constant (`evaluation.UNEXPLAINED_AFTER_S`)."""
    if module is None:
        fields = {f.name: f for f in dataclasses.fields(DEFAULT)}
        if name not in fields:
            raise UserError(f"`{name}` in diagnosis/causes.py is no threshold",
                            "name a field of diagnosis/thresholds.py, or `module.NAME`")
        unit = fields[name].metadata.get("unit", "")
        shown = f"{getattr(DEFAULT, name):g}"
        return shown if unit in _UNSHOWN else f"{shown} {unit}"
    try:
        value = getattr(importlib.import_module(f"diagnosis.{module}"), name)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"`{module}.{name}` in diagnosis/causes.py names nothing in "
                        f"diagnosis/{module}.py", "name a constant that exists") from exc
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def with_values(text: str) -> str:
    """The text with each `name` followed by its value."""
    return _NAME.sub(lambda m: f"`{m.group(2)}` ({value_of(m.group(1), m.group(2))})", text)


def causes_table() -> str:
    out = ["| cause | severity | evidence | rules out |", "|---|---|---|---|"]
    for cause in Cause:
        missing = [d for d, table in (("SEVERITY_RULE", SEVERITY_RULE), ("EVIDENCE", EVIDENCE),
                                      ("RULES_OUT", RULES_OUT), ("MEANING", MEANING))
                   if cause not in table]
        if missing:
            raise UserError(f"cause {cause} has no entry in {', '.join(missing)}",
                            "describe it in diagnosis/causes.py")
        out.append(f"| `{cause}`: {MEANING[cause]} | {with_values(SEVERITY_RULE[cause])} | "
                   f"{with_values(EVIDENCE[cause])} | {with_values(RULES_OUT[cause])} |")
    return "\n".join(out) + "\n"


def space_table() -> str:
    """The scenario space's kinds with their drawn values, and its seed ranges."""
    from fabricscope.bench import scenario_space as sp
    from fabricscope.bench.scenarios import MIN_FAULT_S, SENSITIVITY

    def span(lo_hi, unit: str) -> str:
        return f"{lo_hi[0]:g}-{lo_hi[1]:g} {unit}"
    kinds = {
        "loss": ("random loss at a place", span(sp.LOSS_PCT, "%")),
        "shape": ("a shallow token bucket (TBF) at a place",
                  f"{span(sp.RATE_MBIT, 'Mbit/s')}, burst {span(sp.BURST_KB, 'kB')}"),
        "cpu": ("a CFS quota on one node's rank", span(sp.QUOTA_PCT, "% of a CPU")),
        "storage": ("the data server paced", span(sp.STORAGE_MBIT, "Mbit/s")),
        "two": ("loss or shape at a place, and cpu, storage or loss elsewhere; the "
                "first must be named, the second may be", "as above"),
        "cleared": (f"loss or shape at a place, cleared after {sp.CLEARED_STEPS} steps, "
                    "then as many steps more", "as above"),
    }
    if set(kinds) != set(sp.KINDS):
        raise UserError(f"bench/scenario_space.py's kinds {sorted(sp.KINDS)} differ from the "
                        f"ones diagnosis/docs.py describes {sorted(kinds)}",
                        "describe each kind in diagnosis/docs.py space_table")
    out = ["| kind | fault | values |", "|---|---|---|",
           f"| healthy | none: every {sp.HEALTHY_EVERY}th seed | - |"]
    out += [f"| {k} | {kinds[k][0]} | {kinds[k][1]} |" for k in sp.KINDS]
    places = ", ".join(e.value for e in sp.Element)
    sets = "; ".join(f"run i of the {s.value} set is seed {sp.SET_BASE[s]} + i"
                     for s in sp.SetName)
    out += ["", f"Places: {places}. Models of {' or '.join(map(str, sp.MODEL_SIZES_MB))} MB. "
            f"Faults go on after step {span(sp.ONSET_STEPS, '').strip()} and stay "
            f"{sp.FAULT_STEPS} steps and {MIN_FAULT_S:g} s at least. A fault must be named "
            f"when it cost {SENSITIVITY * 100:g} % of the step time or more. "
            f"{sets[0].upper()}{sets[1:]}."]
    return "\n".join(out) + "\n"


def accuracy(set_name: str, root: Path) -> str:
    from fabricscope.bench.diagnosis_matrix import markdown, read_results
    rel = RESULTS.format(set_name)
    if (root / rel).is_file():
        return markdown(read_results(str(root / rel)), rel)
    return (f"Not measured yet: `python -m fabricscope.bench.diagnosis_matrix --set {set_name} --runs "
            f"{SET_RUNS} --json {rel}` (as root: it runs real labs), then `{COMMAND}`.\n")


def blocks(root: Path = ROOT) -> dict[str, str]:
    return {"causes": causes_table(), "thresholds": render_markdown(),
            "space": space_table(), "accuracy-dev": accuracy("dev", root),
            "accuracy-eval": accuracy("eval", root)}


def _marked(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- BEGIN generated {re.escape(name)}\b[^\n]*-->\n)(.*?)"
                      rf"(<!-- END generated {re.escape(name)} -->)", re.S)


def rendered(text: str, generated: dict[str, str]) -> str:
    """The document with each block's text between its markers replaced."""
    for name, body in generated.items():
        pattern = _marked(name)
        if not pattern.search(text):
            raise UserError(f"{DOC} lacks the markers of the generated block {name!r}",
                            f"put `<!-- BEGIN generated {name}: {COMMAND} -->` and "
                            f"`<!-- END generated {name} -->` on lines of their own")
        text = pattern.sub(lambda m: m.group(1) + body + m.group(3), text, count=1)
    return text


def _read(root: Path) -> str:
    path = root / DOC
    if not path.is_file():
        raise UserError(f"{path} does not exist", "give --root the repository")
    return path.read_text()


def stale(root: Path = ROOT) -> list[str]:
    """The names of the blocks whose text in the document is not what the code renders."""
    text, generated = _read(root), blocks(root)
    return [name for name, body in generated.items()
            if rendered(text, {name: body}) != text]


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="write nothing; fail naming the blocks that are stale")
    p.add_argument("--root", type=Path, default=ROOT,
                   help="the repository (default: this one)")
    args = p.parse_args(argv)
    if args.check:
        if bad := stale(args.root):
            raise UserError(f"stale generated blocks in {DOC}: {', '.join(bad)}",
                            f"run `{COMMAND}`")
        return 0
    text = _read(args.root)
    new = rendered(text, blocks(args.root))
    if new != text:
        (args.root / DOC).write_text(new)
        print(f"wrote {DOC}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return exit_code_of(lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
