"""Smoke test of ``python -m benchmarks --quick`` on memory and Redis (no peers).

It checks the shape of what a run produces, and that no two workers ever held
the lock at once; it asserts nothing about timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import redis_server_binary
from tests.servers.etcd import etcd_binary
from tests.servers.mysql import mariadb_binaries
from tests.servers.postgres import postgres_bin_dir

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(redis_server_binary() is None, reason="redis-server not installed")
def test_quick_run_writes_table_and_json(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--backends", "memory,redis", "--no-peers", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    for heading in (
        "Uncontended acquire+release",
        "Contended handoff",
        "Herd",
        "Watchdog scale",
        "Leader hand-over",
        "Targets",
    ):
        assert heading in proc.stdout
    assert "| asynclock redis:// |" in proc.stdout

    results = json.loads((out / "latest.json").read_text())
    assert (out / "latest.md").read_text().strip() in proc.stdout
    assert results["quick"] is True
    assert {"cpus", "cpu_model", "python"} <= results["machine"].keys()
    assert results["servers"]["redis"].startswith("Redis ")
    assert results["skipped"] == {}

    unc = results["uncontended"]
    assert set(unc) == {"asynclock-memory", "raw-redis", "asynclock-redis", "asynclock-redis-fair"}
    for row in unc.values():
        assert row["samples"] > 0
        assert row["median_us"] > 0
        assert row["p99_us"] >= row["median_us"]
    assert unc["raw-redis"]["ratio_to_floor"] == 1.0
    # the raw floor is SET + EVALSHA: two round trips; GET and DEL run inside the script
    assert unc["raw-redis"]["round_trips_per_acq"] == 2.0
    assert unc["raw-redis"]["commands"] == {"set": 1.0, "evalsha": 1.0, "get": 1.0, "del": 1.0}
    assert unc["asynclock-redis"]["commands_per_acq"] > 0

    con = results["contended"]
    assert set(con) == {"asynclock-memory", "asynclock-redis", "asynclock-redis-fair"}
    for row in con.values():
        assert row["overlaps"] == 0, "two workers held the lock at once"
        assert row["stuck"] == 0 and row["errors"] == []
        assert row["acquisitions"] > 0 and row["handoffs"] > 0
        assert len(row["counts"]) == results["plan"]["workers"]
        assert 0 <= row["share_min"] <= 1 <= row["share_max"]
    assert con["asynclock-redis"]["round_trips_per_acq"] > 0

    herd = results["herd"]["asynclock-redis"]
    for size in (herd["small"], herd["large"]):
        assert herd[str(size)]["cost_per_handoff"] > 0

    watchdog = results["watchdog"]
    assert {"asynclock-memory:1000", "asynclock-redis:1000"} <= watchdog.keys()
    for row in watchdog.values():
        assert row["held_after"] == row["leases"], "a lease was lost while only the watchdog ran"
        assert row["renew_calls_per_period"] > 0
    assert watchdog["asynclock-redis:1000"]["server_commands_per_period"] > 0

    handover = results["election"]
    row = handover["asynclock-memory:2"]
    assert row["handovers"] == 20 and 0 < row["median_ms"] <= row["p99_ms"]
    assert row["p99_share_of_ttl"] == row["p99_ms"] / 1000 / row["ttl"]
    # and the hand-overs by a drained close, each from the aclose call to the next term's start
    for key in ("asynclock-memory:2", "asynclock-redis:2"):
        row = handover[key]
        assert row["closes"] == results["plan"]["closes"] == 10 and row["drain"] == 5.0
        assert 0 < row["close_median_ms"] <= row["close_p99_ms"]
        assert row["close_p99_ms"] < row["drain"] * 1000, "a hand-over waited for the drain to run out"
    assert "| crash: lease ms |" in proc.stdout and "aclose(drain=5)" in proc.stdout
    # a backend without elections gets a row that says so (one with them, its measured rows)
    assert handover.get("asynclock-redis") == {"elections": False} or "asynclock-redis:2" in handover

    targets = {t["target"]: t for t in results["targets"]}
    assert targets["asynclock redis://: uncontended acquire+release / raw floor"]["met"] in (True, False)
    assert targets["ZooKeeper uncontended acquire+release / raw floor"]["met"] is None  # not run here
    gap = "leaderless gap of a hand-over by aclose(drain), p99"
    assert targets[f"asynclock redis://: {gap}"]["value"] == handover["asynclock-redis:2"]["close_p99_ms"]
    assert targets[f"asynclock zk://: {gap}"]["met"] is None  # not run here


@pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL not installed")
def test_quick_postgres_run_counts_round_trips_and_connections(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks", "--quick", "--backends", "postgres"),
            *("--scenarios", "uncontended,connections", "--out", str(out)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "latest.json").read_text())
    assert results["skipped"] == {}
    unc = results["uncontended"]
    # the raw floor is pg_advisory_lock then pg_advisory_unlock: two round trips
    assert unc["raw-postgres"]["round_trips_per_acq"] == 2.0
    assert unc["asynclock-postgres"]["round_trips_per_acq"] >= 2.0
    # and the server's work of a pair: it assigns no transaction id and writes no WAL record
    assert unc["raw-postgres"]["xids_per_acq"] == 0.0
    for row in unc.values():
        assert row["wal_bytes_per_acq"] >= 0 and row["server_cpu_us_per_acq"] >= 0 and row["client_cpu_us_per_acq"] > 0
    assert "transaction ids" in proc.stdout
    conns = results["connections"]
    many, waits = conns["hold_many"], conns["wait_one"]
    assert many["asked"] == 1000 and 0 < many["held"] <= 1000 and many["connections"] >= 1
    assert waits["waiters"] == waits["queued"] == 20 and waits["connections"] >= 1
    assert "Connections" in proc.stdout
    assert any(t["target"] == "PostgreSQL connections for 1,000 held locks" for t in results["targets"])


@pytest.mark.skipif(etcd_binary() is None, reason="etcd not installed")
def test_quick_run_measures_etcd_against_its_raw_floor(tmp_path: Path) -> None:
    """``--backends etcd`` starts an etcd, measures the raw Put+Delete floor and
    asynclock next to it (two round trips each when uncontended), runs the
    contended workers without overlap, and checks the target against the floor."""
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--backends", "etcd", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| asynclock etcd:// |" in proc.stdout
    results = json.loads((out / "latest.json").read_text())
    assert results["servers"]["etcd"].startswith("etcd 3.")
    assert results["skipped"] == {}

    unc = results["uncontended"]
    assert set(unc) == {"raw-etcd", "asynclock-etcd"}
    assert unc["raw-etcd"]["ratio_to_floor"] == 1.0
    assert unc["raw-etcd"]["round_trips_per_acq"] == 2.0
    # the Mutex's create transaction reads the first contender too: one request, and the delete
    assert unc["asynclock-etcd"]["round_trips_per_acq"] == 2.0
    assert unc["asynclock-etcd"]["ratio_to_floor"] > 0

    row = results["contended"]["asynclock-etcd"]
    assert row["overlaps"] == 0, "two workers held the lock at once"
    assert row["stuck"] == 0 and row["errors"] == []
    assert row["acquisitions"] > 0 and row["handoffs"] > 0

    (watchdog,) = results["watchdog"].values()
    assert watchdog["held_after"] == watchdog["leases"], "a lease was lost while only the watchdog ran"
    assert watchdog["round_trips_per_period"] > 0

    targets = {t["target"]: t for t in results["targets"]}
    assert targets["etcd uncontended acquire+release / raw floor"]["met"] in (True, False)


def test_verdict_fails_the_run_only_on_a_measured_miss() -> None:
    from benchmarks import report

    unc = {"raw-redis": {"median_us": 100.0}, "asynclock-redis": {"ratio_to_floor": 1.02, "commands_per_acq": 6.0}}
    checks = report.targets({"uncontended": unc})
    by_name = {c["target"]: c for c in checks}
    assert by_name["asynclock redis://: uncontended acquire+release / raw floor"]["met"] is True
    assert by_name["asynclock redis://: server commands per uncontended pair"]["met"] is True
    assert by_name["PostgreSQL uncontended acquire+release / raw floor"]["met"] is None
    status, summary = report.verdict(checks)
    assert status == 0 and summary.startswith("targets: 0 missed, ")

    unc["asynclock-redis"]["ratio_to_floor"] = 1.2
    status, summary = report.verdict(report.targets({"uncontended": unc}))
    assert status == 1
    assert "1 missed (asynclock redis://: uncontended acquire+release / raw floor)" in summary

    # a health-check PING is not a command of the pairs; every other command is
    unc["asynclock-redis"]["commands"] = {"evalsha": 2.0, "set": 2.0, "get": 1.0, "time": 1.0, "ping": 0.001}
    by_name = {c["target"]: c for c in report.targets({"uncontended": unc})}
    assert by_name["asynclock redis://: server commands per uncontended pair"]["value"] == 6.0
    unc["asynclock-redis"]["commands"]["del"] = 0.5
    by_name = {c["target"]: c for c in report.targets({"uncontended": unc})}
    assert by_name["asynclock redis://: server commands per uncontended pair"]["met"] is False

    # the leaderless gap of a drained close: the worst p99 of a backend's ttls, 50 ms at most
    gap = "asynclock postgresql://: leaderless gap of a hand-over by aclose(drain), p99"
    election = {"asynclock-postgres:2": {"close_p99_ms": 12.0}, "asynclock-postgres:10": {"close_p99_ms": 9.0}}
    by_name = {c["target"]: c for c in report.targets({"election": election})}
    assert (by_name[gap]["value"], by_name[gap]["met"]) == (12.0, True)
    election["asynclock-postgres:10"]["close_p99_ms"] = 1000.0  # (a hand-over that waited for a poll)
    status, summary = report.verdict(report.targets({"election": election}))
    assert status == 1 and gap in summary

    # connections count only when every lock was held: a refused hold takes none, so it cannot pass
    partial = {"connections": {"hold_many": {"asked": 1000, "held": 990, "connections": 2}}}
    status, summary = report.verdict(report.targets(partial))
    assert status == 1 and "PostgreSQL connections for 1,000 held locks" in summary


def test_before_after_compares_each_backend_of_the_earlier_revision() -> None:
    from benchmarks import report

    results = {
        "uncontended": {
            "before-redis": {"median_us": 300.0, "p99_us": 400.0},
            "asynclock-redis": {"median_us": 190.0, "p99_us": 410.0},
            "asynclock-etcd": {"median_us": 900.0, "p99_us": 1000.0},  # no earlier figure: not compared
        },
        "contended": {
            "before-redis": {"per_s": 700.0, "handoff_p99_ms": 0.3, "handoff_median_ms": 0.001},
            "asynclock-redis": {"per_s": 500.0, "handoff_p99_ms": 2.2, "handoff_median_ms": 0.004},
        },
    }
    rows = {row["figure"]: row for row in report.before_after(results)}
    assert {row["backend"] for row in rows.values()} == {"redis"}
    assert rows["uncontended pair, median µs"]["verdict"] == "better"
    assert rows["uncontended pair, p99 µs"]["verdict"] == "same"  # within the noise band
    assert rows["contended acquisitions/s"]["verdict"] == "**worse**"  # higher is better
    assert rows["hand-over p99 ms"]["verdict"] == "**worse**"
    assert rows["hand-over median ms"]["verdict"] == "same"  # too small a difference to count
    assert "client CPU ms per acquisition" not in rows  # measured by neither
    table = report.markdown(
        {  # (only the comparison: the other tables want a whole run's fields)
            "machine": {"cpus": 2, "cpu_model": "x", "python": "3", "load_avg": [0.0], "libraries": {}},
            "when": "now",
            "quick": False,
            "before": "abc1234",
            "before_after": report.before_after(results),
        }
    )
    assert "**Before and after** (asynclock at abc1234" in table
    assert "| redis | contended acquisitions/s | 700.00 | 500.00 | **worse** |" in table


@pytest.mark.skipif(mariadb_binaries() is None, reason="MariaDB not installed")
def test_quick_mysql_run_counts_round_trips_and_connections(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks", "--quick", "--backends", "mysql"),
            *("--scenarios", "uncontended,connections", "--out", str(out)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "latest.json").read_text())
    assert results["skipped"] == {}
    unc = results["uncontended"]
    # the raw floor is GET_LOCK then RELEASE_LOCK, and so is an uncontended asynclock pair
    assert unc["raw-mysql"]["round_trips_per_acq"] == 2.0
    assert unc["asynclock-mysql"]["round_trips_per_acq"] == 2.0
    conns = results["connections"]["mysql"]
    many, waits = conns["hold_many"], conns["wait_one"]
    # a thousand holds share the client's sessions; twenty waiters of one lock wait on one session
    assert many == {"asked": 1000, "held": 1000, "connections": many["connections"]} and many["connections"] <= 3
    assert waits["queued"] == waits["waiters"] == 20 and waits["connections"] <= 2
    assert "| MySQL | hold different locks |" in proc.stdout
