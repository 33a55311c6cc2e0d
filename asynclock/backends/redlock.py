"""Redlock over N independent Redis primaries (``redlock://``): see ``asynclock.backends.redis.redlock``."""

from .redis.redlock import RedlockBackend as RedlockBackend
from .redis.redlock import quorum as quorum

__all__ = ["RedlockBackend", "quorum"]
