"""Redis behind Sentinel (``redis+sentinel://``): see ``asynclock.backends.redis.sentinel``."""

from .redis.sentinel import SentinelBackend as SentinelBackend

__all__ = ["SentinelBackend"]
