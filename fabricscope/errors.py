"""User-facing errors: one line with the cause and the fix, exit code 2, no traceback."""

from __future__ import annotations


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
