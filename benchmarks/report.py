"""Tables (Markdown), target checks and the chart, from one run's results."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .subjects import BY_KEY, SUBJECTS


def _f(value: Any, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def _label(key: str) -> str:
    return BY_KEY[key].label if key in BY_KEY else key


def _floor_us(results: dict[str, Any], backend: str) -> float | None:
    floor = next((s.key for s in SUBJECTS if s.floor and s.backend == backend), None)
    row = results.get("uncontended", {}).get(floor or "")
    return row["median_us"] if row else None


# -- targets ------------------------------------------------------------------------

#: The backends whose next candidate is woken by the server's own news of a hand-over, not by
#: a timer: memory://'s table sets the waiter's event, Redis's release script publishes to the
#: next candidate's client, the next candidate watches the node or key ahead of it on ZooKeeper
#: and etcd, PostgreSQL's release NOTIFYs the first in line. (Each polls only for a leader that
#: vanished without a word.) On these a graceful hand-over must not cost more than this:
PUSHES = ("memory", "redis", "zookeeper", "postgres", "etcd")
LEADERLESS_GAP_MS = 50.0


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the issue: the measured ratio or value, the limit, met or not (None: not measured)."""
    unc = results.get("uncontended", {})
    con = results.get("contended", {})
    herd = results.get("herd", {})
    wd = results.get("watchdog", {})
    checks: list[dict[str, Any]] = []

    def check(what: str, value: float | None, limit: float, *, at_least: bool = False, unit: str = "") -> None:
        met = None if value is None or math.isnan(value) else (value >= limit if at_least else value <= limit)
        checks.append({"target": what, "value": value, "limit": limit, "at_least": at_least, "met": met, "unit": unit})

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def get(table: dict[str, Any], key: str, field: str) -> float | None:
        value = table.get(key, {}).get(field)
        return float(value) if value is not None else None

    redis_floor = _floor_us(results, "redis")
    prl = "python-redis-lock"
    # -- the common path (issue: the uncontended lock must be the fastest in Python)
    for key in ("asynclock-redis", "asynclock-redis-fair"):
        check(
            f"{_label(key)}: uncontended acquire+release / raw floor", get(unc, key, "ratio_to_floor"), 1.05, unit="x"
        )
    # (a pub/sub connection's health-check PING comes with time, not with the pairs: not counted)
    per_command = unc.get("asynclock-redis", {}).get("commands")
    check(
        "asynclock redis://: server commands per uncontended pair",
        sum(n for name, n in per_command.items() if name != "ping")
        if per_command
        else get(unc, "asynclock-redis", "commands_per_acq"),
        6.0,
    )
    check(
        "Redis contended throughput / python-redis-lock's",
        ratio(get(con, "asynclock-redis", "per_s"), get(con, prl, "per_s")),
        1.2,
        at_least=True,
        unit="x",
    )
    handoff = get(con, "asynclock-redis", "handoff_median_ms")
    p99 = get(con, "asynclock-redis", "handoff_p99_ms")
    check(
        "Redis contended hand-over median / raw floor",
        ratio(handoff * 1000 if handoff is not None else None, redis_floor),
        0.5,
        unit="x",
    )
    check(
        "Redis contended hand-over p99 / raw floor",
        ratio(p99 * 1000 if p99 is not None else None, redis_floor),
        1.5,
        unit="x",
    )
    check(
        "Redis contended server commands per acquisition / python-redis-lock's",
        ratio(get(con, "asynclock-redis", "commands_per_acq"), get(con, prl, "commands_per_acq")),
        1.0,
        unit="x",
    )
    check(
        "Redis client CPU per contended acquisition / python-redis-lock's",
        ratio(get(con, "asynclock-redis", "client_cpu_ms_per_acq"), get(con, prl, "client_cpu_ms_per_acq")),
        1.0,
        unit="x",
    )
    check(
        "PostgreSQL uncontended acquire+release / raw floor",
        get(unc, "asynclock-postgres", "ratio_to_floor"),
        1.3,
        unit="x",
    )
    many = results.get("connections", {}).get("hold_many")
    if many is not None:
        # Met only if every lock was held: connections for the holds that were refused do not count.
        used = float(many["connections"]) if many["held"] == many["asked"] else math.inf
        check(f"PostgreSQL connections for {many['asked']:,} held locks", used, 4)
    waiting = results.get("connections", {}).get("wait_one")
    if waiting is not None:
        # Met only if every waiter was queued: a waiter that never reached the queue takes no connection.
        used = float(waiting["connections"]) if waiting["queued"] == waiting["waiters"] else math.inf
        check(f"PostgreSQL connections while {waiting['waiters']} wait for one lock", used, 4)
    check(
        "ZooKeeper uncontended acquire+release / raw floor",
        get(unc, "asynclock-zookeeper", "ratio_to_floor"),
        1.05,
        unit="x",
    )
    check(
        "ZooKeeper hand-over median / aiozk's",
        ratio(get(con, "asynclock-zookeeper", "handoff_median_ms"), get(con, "aiozk", "handoff_median_ms")),
        0.9,
        unit="x",
    )
    check("etcd uncontended acquire+release / raw floor", get(unc, "asynclock-etcd", "ratio_to_floor"), 1.2, unit="x")
    big = wd.get("asynclock-redis:10000", {})
    share = big.get("cpu_share")
    check("watchdog, 10,000 Redis leases, ttl 3 s: client CPU", None if share is None else share * 100, 3.0, unit=" %")
    check(
        "watchdog, 10,000 Redis leases: round trips per period",
        get(wd, "asynclock-redis:10000", "round_trips_per_period"),
        10.0,
    )
    # -- what earlier work won and must keep
    for key in ("asynclock-memory", "asynclock-redis", "asynclock-zookeeper", "asynclock-postgres", "asynclock-etcd"):
        if key in con:
            check(f"{_label(key)}: smallest worker share / mean", get(con, key, "share_min"), 0.5, at_least=True)
    for key in ("asynclock-redis", "asynclock-zookeeper"):
        if key in herd:
            row = herd[key]
            what = f"{_label(key)}: herd cost per acquisition, {row['large']} / {row['small']} waiters"
            check(what, row["growth"], 1.5, unit="x")
    # -- a service's whole life: a leader that stops gracefully leaves no gap worth a lease
    for backend in PUSHES:
        gaps = [
            row["close_p99_ms"]
            for key, row in results.get("election", {}).items()
            if key.startswith(f"asynclock-{backend}:") and row.get("close_p99_ms") is not None
        ]
        check(
            f"{_label(f'asynclock-{backend}')}: leaderless gap of a hand-over by aclose(drain), p99",
            max(gaps) if gaps else None,
            LEADERLESS_GAP_MS,
            unit=" ms",
        )
    return checks


#: What ``--before REV`` compares: (table, field, what it is, higher is better, a difference too small to count).
_COMPARED = (
    ("uncontended", "median_us", "uncontended pair, median µs", False, 1.0),
    ("uncontended", "p99_us", "uncontended pair, p99 µs", False, 1.0),
    ("contended", "per_s", "contended acquisitions/s", True, 0.0),
    ("contended", "handoff_median_ms", "hand-over median ms", False, 0.01),
    ("contended", "handoff_p99_ms", "hand-over p99 ms", False, 0.01),
    ("contended", "client_cpu_ms_per_acq", "client CPU ms per acquisition", False, 0.005),
    ("contended", "commands_per_acq", "server commands per acquisition", False, 0.05),
)
#: A change smaller than this share of the earlier figure is within the machine's noise.
NOISE = 0.10


def before_after(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each figure of asynclock at an earlier revision (``before-X``) beside this tree's (``asynclock-X``)."""
    rows: list[dict[str, Any]] = []
    backends = sorted(
        {
            k.removeprefix("before-")
            for t in ("uncontended", "contended")
            for k in results.get(t, {})
            if k.startswith("before-")
        }
    )
    for backend in backends:
        for table, field, what, higher, least in _COMPARED:
            old = results.get(table, {}).get(f"before-{backend}", {}).get(field)
            new = results.get(table, {}).get(f"asynclock-{backend}", {}).get(field)
            if old is None or new is None:
                continue
            gain = (new - old) if higher else (old - new)  # > 0: better
            if abs(gain) <= least or abs(gain) <= NOISE * abs(old):
                verdict = "same"
            else:
                verdict = "better" if gain > 0 else "**worse**"
            rows.append({"backend": backend, "figure": what, "before": old, "after": new, "verdict": verdict})
    return rows


def verdict(checks: list[dict[str, Any]]) -> tuple[int, str]:
    """``--check``'s exit status (1 when a target measured in the run is missed) and its one-line summary."""
    missed = [c["target"] for c in checks if c["met"] is False]
    unmeasured = sum(c["met"] is None for c in checks)
    detail = f" ({'; '.join(missed)})" if missed else ""
    return (1 if missed else 0), f"targets: {len(missed)} missed{detail}, {unmeasured} not measured"


def _context(results: dict[str, Any]) -> list[tuple[str, str, float, str, str]]:
    """The throughput target's yardstick applied to memory://, the in-process ceiling."""
    con = results.get("contended", {})
    prl = con.get("python-redis-lock", {}).get("per_s")
    memory = con.get("asynclock-memory")
    if memory is None or not prl:
        return []
    ceiling = memory["per_s"] / prl
    return [("throughput / python-redis-lock", _label("asynclock-memory"), ceiling, "x", "≥ 1.2x")]


# -- Markdown ---------------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    lines: list[str] = []
    m = results["machine"]
    servers = ", ".join(results.get("servers", {}).values()) or "none"
    libs = ", ".join(f"{k} {v}" for k, v in m["libraries"].items() if v)
    lines += [
        f"Run {results['when']}{' (--quick: smoke run, numbers not meaningful)' if results['quick'] else ''}: "
        f"{m['cpus']} CPUs ({m['cpu_model']}), load average {m['load_avg'][0]:.1f} at the start "
        f"and {results.get('load_avg_end', [float('nan')])[0]:.1f} at the end, "
        f"Python {m['python']}, {servers}; {libs}.",
        "",
    ]
    unc = results.get("uncontended")
    if unc:
        lines += [
            "**1. Uncontended acquire+release** (one client, one free lock; microseconds)",
            "",
            "| subject | median µs | p99 µs | x raw floor | server cmds/acq | round trips/acq |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for key, row in unc.items():
            cost = row.get("commands_per_acq", row.get("requests_per_acq"))
            lines.append(
                f"| {_label(key)} | {_f(row['median_us'], 0)} | {_f(row['p99_us'], 0)} | "
                f"{_f(row['ratio_to_floor'])} | {_f(cost, 1)} | {_f(row.get('round_trips_per_acq'), 1)} |"
            )
        lines.append("")
        pg = {key: row for key, row in unc.items() if "xids_per_acq" in row}
        if pg:
            lines += [
                "**1b. PostgreSQL: the work of one pair** (counts first: they do not depend on the machine's load; "
                "CPU is the server's backends and the benchmark process, per pair)",
                "",
                "| subject | round trips | transaction ids | WAL bytes | server CPU µs | client CPU µs |",
                "| --- | ---: | ---: | ---: | ---: | ---: |",
            ]
            for key, row in pg.items():
                lines.append(
                    f"| {_label(key)} | {_f(row['round_trips_per_acq'], 1)} | {_f(row['xids_per_acq'])} | "
                    f"{_f(row['wal_bytes_per_acq'], 1)} | {_f(row['server_cpu_us_per_acq'], 0)} | "
                    f"{_f(row['client_cpu_us_per_acq'], 0)} |"
                )
            lines.append("")
    con = results.get("contended")
    if con:
        plan = results["plan"]
        lines += [
            f"**2-4. Contended handoff, fairness, server cost** ({plan['workers']} workers on one lock, "
            f"spread over {plan['procs']} processes (memory: 1), each holding {plan['hold'] * 1000:g} ms, "
            f"{plan['window']:g} s window, best of {plan.get('repeats', 1)} runs by throughput)",
            "",
            "| subject | acq/s | handoff median ms | handoff p99 ms | longest run | share min / max "
            "| server cmds/acq | round trips/acq | client CPU ms/acq |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for key, row in con.items():
            cost = row.get("commands_per_acq", row.get("requests_per_acq"))
            lines.append(
                f"| {_label(key)} | {_f(row['per_s'], 0)} | {_f(row['handoff_median_ms'])} | "
                f"{_f(row['handoff_p99_ms'])} | {row['longest_run']} | "
                f"{_f(row['share_min'])} / {_f(row['share_max'])} | {_f(cost, 1)} | "
                f"{_f(row.get('round_trips_per_acq'), 1)} | {_f(row['client_cpu_ms_per_acq'])} |"
            )
        bad = [k for k, r in con.items() if r["overlaps"] or r["stuck"] or r["errors"]]
        for key in bad:
            row = con[key]
            lines.append(
                f"\n{_label(key)}: {row['overlaps']} overlapping holds, {row['stuck']} stuck workers, "
                f"errors {row['errors']}"
            )
        lines.append("")
    herd = results.get("herd")
    if herd:
        some = next(iter(herd.values()))
        small, large = some["small"], some["large"]
        lines += [
            f"**5. Herd** (server commands (Redis) or requests (ZooKeeper) per acquisition, {small} vs {large} "
            f"waiters over {results['plan']['procs']} processes)",
            "",
            f"| subject | per acq, {small} | per acq, {large} | growth | acq/s, {small} | acq/s, {large} |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for key, row in herd.items():
            a, b = row[str(small)], row[str(large)]
            lines.append(
                f"| {_label(key)} | {_f(a['cost_per_handoff'], 1)} | {_f(b['cost_per_handoff'], 1)} | "
                f"{_f(row['growth'])}x | {_f(a['per_s'], 0)} | {_f(b['per_s'], 0)} |"
            )
        lines.append("")
    wd = results.get("watchdog")
    if wd:
        lines += [
            "**6. Watchdog scale** (leases held by one asynclock client, renewed every ttl/3; per renewal period)",
            "",
            "| backend, leases | renew calls | round trips | server cmds or requests | client CPU ms "
            "| CPU share | still held |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for key, row in wd.items():
            subject, size = key.split(":")
            server = row.get("server_commands_per_period", row.get("server_requests_per_period"))
            lines.append(
                f"| {_label(subject)}, {int(size):,} | {_f(row['renew_calls_per_period'], 1)} | "
                f"{_f(row.get('round_trips_per_period'), 1)} | {_f(server, 0)} | "
                f"{_f(row['cpu_ms_per_period'], 1)} | {_f(row['cpu_share'] * 100, 0, '%')} | "
                f"{row['held_after']:,} |"
            )
        lines.append("")
    conns = results.get("connections")
    if conns:
        lines += [
            "**7. Connections** (one asynclock client; holds asked with timeout=0)",
            "",
            "| backend | what | asked | held or queued | server connections |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        for name, figures in (("PostgreSQL", conns), ("MySQL", conns.get("mysql", {}))):
            if "hold_many" in figures:
                row = figures["hold_many"]
                lines.append(
                    f"| {name} | hold different locks | {row['asked']:,} | {row['held']:,} | {row['connections']} |"
                )
            if "wait_one" in figures:
                row = figures["wait_one"]
                lines.append(
                    f"| {name} | wait for one held lock | {row['waiters']} | {row['queued']} | {row['connections']} |"
                )
        lines.append("")
    handovers = results.get("election")
    if handovers:
        drain = next((row["drain"] for row in handovers.values() if "drain" in row), None)
        lines += [
            "**8. Leader hand-over** (3 candidates with a client each take turns, each leading 1 ms and until"
            " another waits behind it. By resign: from the leader's `resign()` to the next leader's start."
            f" By close: the leader's body is told to stop and its client closed with `aclose(drain={_f(drain, 0)})`"
            " at once, as a service stops; from the `aclose` call to the next leader's start (the closed candidate"
            " comes back with a new client). A leader that stops without closing (frozen, cut off, or killed:"
            " PostgreSQL alone ends a dead process's sessions at once) leads on the server until its lease"
            " runs out: the last column is that lease, the configured ttl, not measured)",
            "",
            "| backend | ttl s | resigns | median ms | p99 ms | p99 / ttl | closes | median ms | p99 ms "
            "| crash: lease ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for key, row in handovers.items():
            if not row.get("elections", True):
                lines.append(
                    f"| {_label(key)} | - | - | - | - | - | - | - | - | no leader election on this backend yet |"
                )
                continue
            subject, _ = key.split(":")
            lines.append(
                f"| {_label(subject)} | {row['ttl']:g} | {row['handovers']} | {_f(row['median_ms'])} | "
                f"{_f(row['p99_ms'])} | {_f(row['p99_share_of_ttl'] * 100, 2, '%')} | {row.get('closes', '-')} | "
                f"{_f(row.get('close_median_ms'))} | {_f(row.get('close_p99_ms'))} | {_f(row['ttl'] * 1000, 0)} |"
            )
        lines.append("")
    checks = results.get("targets") or []
    if checks:
        lines += [
            "**Targets** (ratios within this run)",
            "",
            "| target | measured | limit | met |",
            "| --- | ---: | ---: | :-: |",
        ]
        for c in checks:
            met = {True: "yes", False: "**no**", None: "not measured"}[c["met"]]
            sign = "≥" if c["at_least"] else "≤"
            lines.append(f"| {c['target']} | {_f(c['value'])}{c['unit']} | {sign} {c['limit']:g}{c['unit']} | {met} |")
        lines.append("")
    compared = results.get("before_after") or []
    if compared:
        rev = results.get("before", "an earlier revision")
        lines += [
            f"**Before and after** (asynclock at {rev} and this tree, in the same run; a change within "
            f"{NOISE:.0%} is noise)",
            "",
            "| backend | figure | before | after | |",
            "| --- | --- | ---: | ---: | --- |",
        ]
        for r in compared:
            lines.append(f"| {r['backend']} | {r['figure']} | {_f(r['before'])} | {_f(r['after'])} | {r['verdict']} |")
        lines.append("")
    context = _context(results)
    if context:
        lines += [
            "**The throughput target measured on memory://** (not a target: a lock that never "
            "leaves the process, the ceiling of the event loop on this machine)",
            "",
            "| measure | subject | measured | the target's limit |",
            "| --- | --- | ---: | ---: |",
        ]
        lines += [f"| {what} | {who} | {_f(value)}{unit} | {limit} |" for what, who, value, unit, limit in context]
        lines.append("")
    skipped = results.get("skipped") or {}
    if skipped:
        lines += ["**Not measured**", ""]
        lines += [
            f"- {_label(k.split(':', 1)[-1]) if ':' in k else _label(k)} ({k}): {why}" for k, why in skipped.items()
        ]
        lines.append("")
    return "\n".join(lines)


# -- chart ---------------------------------------------------------------------------------


def chart(results: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels = []
    unc = results.get("uncontended") or {}
    con = results.get("contended") or {}
    herd = results.get("herd") or {}
    if unc:
        panels.append(("Uncontended acquire+release, median µs", {_label(k): r["median_us"] for k, r in unc.items()}))
    if con:
        panels.append(("Contended: acquisitions/s (8 workers)", {_label(k): r["per_s"] for k, r in con.items()}))
        panels.append(("Contended: handoff median ms", {_label(k): r["handoff_median_ms"] for k, r in con.items()}))
    if herd:
        panels.append(
            (
                "Herd: growth of server cost per acquisition (many / few waiters)",
                {_label(k): r["growth"] for k, r in herd.items()},
            )
        )
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.2 + 0.32 * sum(len(p[1]) for p in panels)))
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (title, values) in zip(axes, panels, strict=True):
        labels = list(values)
        data = [v if v is not None and math.isfinite(v) else 0.0 for v in values.values()]
        colors = [
            "tab:blue" if label.startswith("asynclock") else ("tab:gray" if "raw" in label else "tab:orange")
            for label in labels
        ]
        ax.barh(labels, data, color=colors)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10, loc="left")
        ax.tick_params(labelsize=8)
        for y, v in enumerate(data):
            ax.text(v, y, f" {v:.3g}", va="center", fontsize=7)
    m = results["machine"]
    fig.suptitle(f"asynclock vs peers, {results['when'][:16]} ({m['cpus']} CPUs, Python {m['python']})", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.985))  # (room at the top for the title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
