"""User-facing errors: one line with the cause and the fix, exit code 2, no traceback."""

from __future__ import annotations

import sys
from typing import Callable


class UserError(Exception):
    """An error the user can fix. The CLI prints `fabricscope: <cause>; fix: <fix>`."""

    exit_code = 2

    def __init__(self, cause: str, fix: str = ""):
        super().__init__(cause)
        self.cause = cause
        self.fix = fix

    def one_line(self) -> str:
        text = f"fabricscope: error: {self.cause}"
        if self.fix:
            text += f"; fix: {self.fix}"
        return text.replace("\n", " ")


def exit_code_of(run: Callable[[], int]) -> int:
    """run() for a `python -m` entry point: a UserError becomes its one line on stderr
    and its exit code, never a traceback."""
    try:
        return run()
    except UserError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
