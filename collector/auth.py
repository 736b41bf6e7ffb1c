"""Who may send: bearer tokens bound to node names (collector config `tokens_file`).

The file is YAML, one `token: node` entry per agent:

    3f9c1c0e5b7a4d21a8e6d0b1c2f3e4a5: node0
    7d2e...: node1

Every stream must present `authorization: Bearer <token>`; an absent or unknown
token ends it UNAUTHENTICATED before any batch is read, and a batch whose
`node` is not the token's ends it PERMISSION_DENIED (nothing of that batch is
written). A token thus authenticates one node and authorizes writes for that
node only: a stolen token cannot forge another node's data.

Only SHA-256 digests of the tokens stay in memory, and no token ever reaches a
log line or a metric label. The file is re-read when its modification time
changes (checked when a stream opens), so tokens rotate without a restart; a
file that became unreadable keeps the last good table and logs why.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass

import yaml

from fabricscope.errors import UserError
from fabricscope.tls import token_from_metadata

log = logging.getLogger("collector")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class Verdict:
    node: str = ""          # the token's node when accepted
    reason: str = ""        # no_token | bad_token when refused

    @property
    def ok(self) -> bool:
        return not self.reason


def parse_tokens(text: str, path: str) -> dict[bytes, str]:
    """{sha256(token): node}. Raise UserError naming the entry (by position, never the token)."""
    fix = f"make {path} a YAML mapping of token: node"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        raise UserError(f"tokens file {path} is not valid YAML", fix) from None
    if not isinstance(data, dict) or not data:
        raise UserError(f"tokens file {path} holds no token: node entries", fix)
    table: dict[bytes, str] = {}
    for index, (token, node) in enumerate(data.items(), 1):
        if not isinstance(token, str) or len(token) < 16 or any(c.isspace() for c in token):
            raise UserError(f"tokens file {path}: entry {index}: a token must be a string of "
                            "at least 16 characters without spaces", fix)
        if not isinstance(node, str) or not node:
            raise UserError(f"tokens file {path}: entry {index}: node must be a non-empty "
                            "string", fix)
        table[_digest(token)] = node
    return table


class TokenTable:
    """Maps presented tokens to nodes; `check(metadata)` per stream."""

    def __init__(self, path: str):
        self.path = path
        self._mtime = None
        self._table: dict[bytes, str] = {}
        self.reload(strict=True)

    def reload(self, strict: bool = False) -> None:
        try:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime == self._mtime:
                return
            with open(self.path, encoding="utf-8", errors="replace") as f:
                table = parse_tokens(f.read(), self.path)
        except OSError as exc:
            if strict:
                raise UserError(f"cannot read tokens file {self.path}: {exc.strerror}",
                                "point --tokens-file at a readable YAML file") from None
            log.warning("tokens file %s unreadable (%s); keeping the previous tokens",
                        self.path, exc.strerror)
            return
        except UserError as exc:
            if strict:
                raise
            log.warning("tokens file changed but is invalid (%s); keeping the previous "
                        "tokens", exc.cause)
            return
        self._mtime, self._table = mtime, table
        log.info("tokens file %s: %d agent tokens", self.path, len(table))

    def __len__(self) -> int:
        return len(self._table)

    def check(self, metadata) -> Verdict:
        self.reload()
        token = token_from_metadata(metadata)
        if token is None:
            return Verdict(reason="no_token")
        # A lookup by digest: its timing tells at most how close a guess's SHA-256 came
        # to a stored one, which says nothing about any token.
        node = self._table.get(_digest(token))
        return Verdict(node=node) if node else Verdict(reason="bad_token")
