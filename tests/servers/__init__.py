"""Real servers for the tests: started as child processes on free loopback
ports or unix sockets in a temp dir, stopped by their own pid.

Each class starts one server, waits for it to be ready with a deadline, dumps
its log when it fails, and can pause (SIGSTOP), resume, kill and restart it.
Nothing here ever signals a process it did not start.
"""

from .base import ServerProcess, free_port, scaled
from .redis import RedisServer, redis_server_binary

__all__ = ["RedisServer", "ServerProcess", "free_port", "redis_server_binary", "scaled"]
