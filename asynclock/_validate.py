"""Argument checks done in the front, before any I/O."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

#: Longest lock name accepted, in characters.
MAX_NAME_LENGTH = 512
#: Shortest ttl accepted, in seconds (the drift allowance alone is 2 ms).
MIN_TTL = 0.01


def check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"lock name must be str, not {type(name).__name__}")
    if not name:
        raise ValueError("lock name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"lock name is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"lock name is not valid unicode text: {exc}") from None
    return name


def check_names(names: Iterable[str]) -> list[str]:
    """A multi-lock's names: an iterable of names (not one string), at least one."""
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise TypeError(f"names must be a list of lock names, not {type(names).__name__}")
    checked = [check_name(name) for name in names]
    if not checked:
        raise ValueError("a multi-lock needs at least one name")
    return checked


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    number = float(value)
    if math.isnan(number):
        raise ValueError(f"{what} must not be NaN")
    return number


def check_ttl(ttl: object) -> float:
    number = _number(ttl, "ttl")
    if math.isinf(number) or number <= 0:
        raise ValueError(f"ttl must be a positive finite number of seconds, got {ttl!r}")
    if number < MIN_TTL:
        raise ValueError(f"ttl must be at least {MIN_TTL}s, got {ttl!r}")
    return number


def check_max_hold(max_hold: object) -> float | None:
    """None (no cap), or a positive finite number of seconds."""
    if max_hold is None:
        return None
    number = _number(max_hold, "max_hold")
    if math.isinf(number) or number <= 0:
        raise ValueError(f"max_hold must be a positive finite number of seconds or None, got {max_hold!r}")
    return number


def check_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    number = _number(timeout, "timeout")
    if number < 0:
        raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
    return None if math.isinf(number) else number
