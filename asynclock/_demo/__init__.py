"""``asynclock demo``: a live timeline of workers contending for one lock.

The coordinator (the ``asynclock demo`` process) starts the workers, prints
what they report in time order, and stages the accidents a lock service exists
for. Each part lives in a module of its own:

- ``_scenario``: the coordinator and its story (:func:`run_demo`);
- ``_workers``: a worker, as a process (:func:`run_worker_process`, the body of
  ``asynclock demo-worker``) or as a thread, and the coordinator's handle on it;
- ``_timeline``: the terminal rendering and the closing summary;
- ``_server``: the throwaway redis-server used when no ``--url`` is given.
"""

from ._scenario import run_demo as run_demo
from ._workers import run_worker_process as run_worker_process

__all__ = ["run_demo", "run_worker_process"]
