"""The fault harness: worker processes contend for one lock through a fenced store,
faults are injected while they run, and a checker proves what must hold.

* ``worker.py``: one worker process (its own client, its own JSONL journal);
* ``store.py``: the fenced counter that refuses stale tokens;
* ``checker.py``: the invariants, checked over the journals and the store;
* ``runner.py``: targets (the service under test) and runs of worker processes;
* ``scenarios.py``: one function per fault;
* ``__main__.py``: the torture command (``python -m tests.faults --help``).
"""
