"""Parse tc-style rates, sizes and times (pure logic, no root needed).

The units follow tc(8), case-insensitively:

* rates  -> bits per second: a bare number or `bit` is bit/s; `kbit mbit gbit tbit`
  (SI, x1000) and `kibit mibit gibit tibit` (IEC, x1024); `bps kbps mbps gbps tbps`
  and `kibps mibps gibps tibps` are BYTES per second, as in tc.
* sizes  -> bytes: a bare number or `b` is bytes; `k kb kib`, `m mb mib`, `g gb gib`
  are x1024 powers; `kbit mbit gbit` are bits.
* times  -> seconds: `s sec secs`, `ms msec msecs`, `us usec usecs`; a bare number is
  microseconds, as in tc.

Bad strings raise UserError (exit code 2 at the CLI).
"""

from __future__ import annotations

import re

from fabricscope.errors import UserError

_NUMBER = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")

RATE_UNITS = {
    "": 1, "bit": 1,
    "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40,
    "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9, "tbps": 8 * 10**12,
    "kibps": 8 * 2**10, "mibps": 8 * 2**20, "gibps": 8 * 2**30, "tibps": 8 * 2**40,
}
SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kb": 2**10, "kib": 2**10,
    "m": 2**20, "mb": 2**20, "mib": 2**20,
    "g": 2**30, "gb": 2**30, "gib": 2**30,
    "kbit": 2**10 / 8, "mbit": 2**20 / 8, "gbit": 2**30 / 8,
}
TIME_UNITS = {
    "": 1e-6, "us": 1e-6, "usec": 1e-6, "usecs": 1e-6,
    "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3,
    "s": 1.0, "sec": 1.0, "secs": 1.0,
}


def _parse(text, units: dict, what: str, example: str) -> float:
    if isinstance(text, bool):
        raise UserError(f"{what} {text!r} is not valid", f"give e.g. {example}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _NUMBER.match(str(text))
        unit = match.group(2).lower() if match else None
        if not match or unit not in units:
            raise UserError(f"{what} {text!r} is not valid",
                            f"give a number with a unit, e.g. {example}")
        value = float(match.group(1)) * units[unit]
    if value <= 0:
        raise UserError(f"{what} {text!r} must be positive", f"give e.g. {example}")
    return value


def parse_rate(text) -> int:
    """'1gbit' -> 1_000_000_000 (bit/s). An int/float is taken as bit/s already."""
    return int(round(_parse(text, RATE_UNITS, "rate", "100mbit or 1gbit")))


def parse_size(text) -> int:
    """'32kb' -> 32768 (bytes). An int/float is taken as bytes already."""
    return int(round(_parse(text, SIZE_UNITS, "size", "32kb or 1500b")))


def parse_time(text) -> float:
    """'5ms' -> 0.005 (seconds). An int/float is taken as seconds already."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text <= 0:
            raise UserError(f"time {text!r} must be positive", "give e.g. 5ms")
        return float(text)
    return _parse(text, TIME_UNITS, "time", "5ms or 200us")


def format_rate(bps: int | None) -> str:
    """1_000_000_000 -> '1gbit' (exact when possible, else 3 significant digits)."""
    if bps is None:
        return "-"
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= scale:
            value = bps / scale
            return f"{value:g}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return f"{bps}bit"
