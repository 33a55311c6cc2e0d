"""Redis Cluster (``redis+cluster://``): see ``asynclock.backends.redis.cluster``."""

from .redis.cluster import ClusterBackend as ClusterBackend

__all__ = ["ClusterBackend"]
