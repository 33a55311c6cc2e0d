"""OpenTelemetry metrics for asynclock (``pip install 'asynclock[otel]'``).

::

    from asynclock.otel import OtelMetrics

    locks = asynclock.connect(url, on_event=OtelMetrics())

Records, per lock name (attribute ``lock.name``, leave it out with
``by_name=False`` if your names are unbounded):

* ``asynclock.acquisitions``, ``asynclock.timeouts``, ``asynclock.losses``
  (with a ``reason`` attribute: a :class:`~asynclock.LossReason` value),
  ``asynclock.releases`` and ``asynclock.abandoned`` (holds whose owner task
  ended still holding them) (counters);
* ``asynclock.wait.duration`` (seconds from calling acquire to holding, or
  to timing out) and ``asynclock.hold.duration`` (seconds from holding to
  release or loss) (histograms);
* for singleton jobs (``locks.singleton``): ``asynclock.jobs.ran`` (with an
  ``outcome`` attribute: ``ok``, or ``failed`` when the job raised, was cut
  off by ``at_most`` or lost its lock) and ``asynclock.jobs.skipped``
  (counters), and ``asynclock.job.duration`` (seconds a run took; histogram).
"""

from __future__ import annotations

from typing import Any

try:
    from opentelemetry import metrics
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("asynclock.otel needs OpenTelemetry: pip install 'asynclock[otel]'") from exc

from ._values import LockEvent

__all__ = ["OtelMetrics"]


class OtelMetrics:
    """An ``on_event`` callback that records lock metrics on a meter provider.

    ``meter_provider`` defaults to the global one.
    """

    def __init__(self, meter_provider: Any = None, *, by_name: bool = True) -> None:
        meter = metrics.get_meter("asynclock", meter_provider=meter_provider)
        self._by_name = by_name
        self._acquisitions = meter.create_counter("asynclock.acquisitions", unit="1", description="locks acquired")
        self._releases = meter.create_counter("asynclock.releases", unit="1", description="locks released")
        self._timeouts = meter.create_counter("asynclock.timeouts", unit="1", description="acquires that timed out")
        self._losses = meter.create_counter("asynclock.losses", unit="1", description="leases lost while held")
        self._abandoned = meter.create_counter(
            "asynclock.abandoned", unit="1", description="holds released because their owner task ended holding them"
        )
        self._wait = meter.create_histogram(
            "asynclock.wait.duration", unit="s", description="time from acquire() to holding or timing out"
        )
        self._hold = meter.create_histogram(
            "asynclock.hold.duration", unit="s", description="time from holding to release or loss"
        )
        self._ran = meter.create_counter("asynclock.jobs.ran", unit="1", description="singleton job runs")
        self._skipped = meter.create_counter(
            "asynclock.jobs.skipped", unit="1", description="singleton job calls skipped: it ran or runs elsewhere"
        )
        self._job = meter.create_histogram("asynclock.job.duration", unit="s", description="time a job run took")

    def __call__(self, event: LockEvent) -> None:
        attributes = {"lock.name": event.name} if self._by_name else {}
        if event.kind == "acquired":
            self._acquisitions.add(1, attributes)
            if event.wait_s is not None:
                self._wait.record(event.wait_s, attributes)
        elif event.kind == "timeout":
            self._timeouts.add(1, attributes)
            if event.wait_s is not None:
                self._wait.record(event.wait_s, attributes)
        elif event.kind == "released":
            self._releases.add(1, attributes)
            if event.held_s is not None:
                self._hold.record(event.held_s, attributes)
        elif event.kind == "lost":
            self._losses.add(1, {**attributes, "reason": event.loss.value if event.loss else "other"})
            if event.held_s is not None:
                self._hold.record(event.held_s, attributes)
        elif event.kind == "abandoned":
            self._abandoned.add(1, attributes)
            if event.held_s is not None:
                self._hold.record(event.held_s, attributes)
        elif event.kind == "ran":
            self._ran.add(1, {**attributes, "outcome": "ok" if event.reason is None else "failed"})
            if event.held_s is not None:
                self._job.record(event.held_s, attributes)
        elif event.kind == "skipped":
            self._skipped.add(1, attributes)
