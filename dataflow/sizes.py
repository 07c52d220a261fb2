"""Sizes written by people ("256MB", "1.5GB", "1048576") as bytes: one reader for flags, config and environment."""

from __future__ import annotations

import math

from dataflow.errors import ConfigError

UNITS = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "B": 1}


def parse_size(text: str | int) -> int:
    """'256MB' -> 268435456; plain integers are bytes. A size that is not a positive, finite number of
    bytes (`-1MB`, `1e400GB`, `lots`) is a `ConfigError`."""
    if isinstance(text, int):
        if text <= 0:
            raise ConfigError(f"size {text!r} must be positive")
        return text
    s = text.strip().upper().replace("IB", "B")
    for unit, mult in UNITS.items():
        if s.endswith(unit):
            number = s[: -len(unit)].strip()
            break
    else:
        number, mult = s, 1
    try:
        value = float(number) * mult
    except ValueError:
        raise ConfigError(f"cannot read size {text!r}; write it like 256MB, 1GB or 1048576") from None
    if not math.isfinite(value) or value >= 1 << 62:
        raise ConfigError(f"size {text!r} is too large; write it like 256MB, 1GB or 1048576")
    if int(value) <= 0:
        raise ConfigError(f"size {text!r} must be positive")
    return int(value)


def count(n: int, word: str, plural: str | None = None) -> str:
    """'1 shard', '2 shards', '12,345 documents': a number with its noun, in the right number."""
    return f"{n:,} {word if n == 1 else plural or word + 's'}"
