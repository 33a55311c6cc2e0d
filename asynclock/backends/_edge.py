"""The backends' error edge: what a client library raises becomes asynclock's error.

Each backend writes one ``translate`` function (a client error in, the
exception asynclock raises out) and enters one :class:`MapErrors` around
every request it sends::

    edge = MapErrors(translate, catch=(OSError, redis.RedisError))
    with edge:
        reply = await connection.send(request)

A translated error keeps the original as ``__cause__``; an error that
``translate`` returns unchanged passes through as it is. ``MapErrors`` is a
plain class, not a generator-based context manager: it sits on every
request's path, and entering it costs no allocation.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

__all__ = ["MapErrors", "Translate"]

#: A client error in, the exception asynclock raises out (the same object: leave it as it is).
Translate = Callable[[BaseException], BaseException]


class MapErrors:
    """``with edge:`` or ``async with edge:`` raises ``translate(exc)`` for a ``catch`` error raised inside."""

    __slots__ = ("catch", "translate")

    def __init__(self, translate: Translate, catch: tuple[type[BaseException], ...]) -> None:
        self.translate = translate
        self.catch = catch

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and isinstance(exc, self.catch):
            translated = self.translate(exc)
            if translated is not exc:
                raise translated from exc

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)
