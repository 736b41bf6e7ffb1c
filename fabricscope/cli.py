"""The single entry point: `fabricscope <command> ...`.

Each command lives in its own module exposing `register(subparsers)`, which adds
its parser and sets `func(args) -> int`, and is found by registration: an entry
point in the group `fabricscope.commands` (pyproject.toml), so this shared core
names no component above it. Modules import heavy dependencies (BCC, torch, grpc
servers) inside `func`, so `fabricscope --help` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from fabricscope.errors import UserError

from fabricscope.plugins import load_group

#: entry-point group of the subcommands' `register(subparsers)` functions
COMMANDS_GROUP = "fabricscope.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fabricscope",
        description="Network observability and bottleneck diagnosis for distributed training.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in load_group(COMMANDS_GROUP).values():
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`... | head`): nothing more to say, and Python's
        # flush at exit must not complain either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
