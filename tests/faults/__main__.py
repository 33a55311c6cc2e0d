"""The torture command: run every fault scenario that applies, over and over.

    python -m tests.faults --minutes 5                       # own redis-server(s)
    python -m tests.faults --url redis://127.0.0.1:6379/0 --minutes 5
    python -m tests.faults --url zk://127.0.0.1:2181 --url postgresql://me@127.0.0.1/db
    python -m tests.faults --own redlock --own sentinel --scenario redlock-majority --scenario failover
    python -m tests.faults --own zookeeper --workload election   # candidates of one election

Without ``--url`` it starts a redis-server of its own (it needs
``redis-server`` on PATH) and runs every scenario, server faults included;
``--own KIND`` starts other lock services of its own instead (five Redlock
nodes, a Sentinel setup, ZooKeeper, PostgreSQL, etcd), whose server faults then
apply too (nodes killed, failover, restart with data kept).
With ``--url`` it only injects faults into what it owns: its worker
processes (kill, freeze, cancel) and, for a server on 127.0.0.1, a TCP proxy
in front of it (partition, latency); on Redis it also kills pub/sub
connections and flushes the script cache (harmless to correct clients, but
use a server of your own). The fenced store is a redis-server of its own
unless ``--store`` names one. It prints one line per scenario run and the
totals; the exit status is 1 if any violation was found. With ``--workload
election`` the workers are candidates of one election (each critical section
a term) on the targets that have elections, and every round also runs the
in-process memory:// election (faults at the leader).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.faults.checker import Verdict
from tests.faults.election import memory_election
from tests.faults.runner import RedlockTarget, SentinelTarget, Target, target_for
from tests.faults.scenarios import SCENARIOS, Outcome, Settings
from tests.servers import RedisServer

#: lock services the command can start itself (``--own``)
OWN = ("redis", "redlock", "sentinel", "zookeeper", "postgres", "etcd", "mysql")
#: target kinds that have leader elections (``--workload election``)
ELECTS = ("zookeeper", "etcd", "redis", "sentinel", "postgres", "mysql")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", action="append", default=[], help="lock service to torture (repeatable)")
    parser.add_argument(
        "--own",
        action="append",
        default=[],
        choices=OWN,
        help="start a lock service of this kind of our own (repeatable; default: redis when no --url is given)",
    )
    parser.add_argument("--store", help="redis URL for the fenced store (default: a redis-server of its own)")
    parser.add_argument("--minutes", type=float, default=5.0, help="total running time (default 5)")
    parser.add_argument("--workers", type=int, default=6, help="worker processes per scenario (default 6)")
    parser.add_argument("--ttl", type=float, default=1.0, help="lease ttl in seconds (default 1)")
    parser.add_argument("--round", type=float, default=20.0, help="seconds per scenario run (default 20)")
    parser.add_argument(
        "--scenario",
        action="append",
        default=[],
        choices=[scenario.name for scenario in SCENARIOS],
        help="only these scenarios (repeatable)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random choices (default 0)")
    parser.add_argument(
        "--workload",
        choices=("lock", "election"),
        default="lock",
        help="what the workers contend for: one lock, or one election (default lock)",
    )
    return parser.parse_args(argv)


async def torture(args: argparse.Namespace) -> int:
    owned: list[Any] = []
    targets: list[Target] = []
    try:
        if args.store:
            store_url = args.store
        else:
            store = RedisServer()
            store.start()
            owned.append(store)
            store_url = store.url
        targets = [target_for(url) for url in args.url]
        for kind in args.own or ([] if args.url else ["redis"]):
            targets.append(_own(kind, owned))
        return await _rounds(args, targets, store_url)
    finally:
        for target in targets:
            with contextlib.suppress(Exception):
                await target.aclose()
        for server in reversed(owned):
            server.cleanup()


def _own(kind: str, owned: list[Any]) -> Target:
    """Start a lock service of ``kind`` of our own (so every server fault applies)."""
    if kind == "redis":
        redis = RedisServer()
        owned.append(redis)
        redis.start()
        return target_for(redis.url, redis)
    if kind == "redlock":
        from tests.servers.redis_topologies import RedisNodes

        nodes = RedisNodes(5)
        owned.append(nodes)
        nodes.start()
        return RedlockTarget(nodes.url, nodes)
    if kind == "sentinel":
        from tests.servers.redis_topologies import SentinelSetup

        setup = SentinelSetup()
        owned.append(setup)
        setup.start()
        return SentinelTarget(setup.url, setup)
    if kind == "zookeeper":
        from tests.servers.zookeeper import ZooKeeperServer

        zookeeper = ZooKeeperServer()
        owned.append(zookeeper)
        zookeeper.start()
        return target_for(zookeeper.url, zookeeper)
    if kind == "etcd":
        from tests.servers.etcd import EtcdServer

        etcd = EtcdServer()
        owned.append(etcd)
        etcd.start()
        return target_for(etcd.url, etcd)
    if kind == "mysql":
        from tests.servers.mysql import MariaDBServer

        mysql = MariaDBServer(extra=["--innodb-flush-log-at-trx-commit=1"])  # (a crash must not lose commits)
        owned.append(mysql)
        mysql.start(timeout=60)
        return target_for(mysql.url, mysql)
    from tests.servers.postgres import PostgresServer

    postgres = PostgresServer(extra=["-c", "synchronous_commit=on"])  # (a crash must not lose commits)
    owned.append(postgres)
    postgres.start()
    return target_for(postgres.url, postgres)


async def _rounds(args: argparse.Namespace, targets: list[Target], store_url: str) -> int:
    settings = Settings(
        workers=args.workers,
        duration=args.round,
        ttl=args.ttl,
        faults=10_000,
        seed=args.seed,
        margin=1.0,
        workload=args.workload,
    )
    plan = [
        (target, scenario)
        for scenario in SCENARIOS
        for target in targets
        if scenario.applies(target)
        and (not args.scenario or scenario.name in args.scenario)
        and (args.workload == "lock" or (target.kind in ELECTS and scenario.name != "pubsub-killed"))
    ]
    if not plan and args.workload == "lock":
        print("no scenario applies", file=sys.stderr)
        return 2
    total = Verdict()
    stalled = Verdict()
    faults = 0
    runs = 0
    started = time.monotonic()
    end = started + args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="asynclock-torture-") as workdir:
        while time.monotonic() < end:
            for target, scenario in plan:
                if time.monotonic() >= end:
                    break
                settings.seed += 1
                outcome: Outcome = await scenario.run(target, store_url, Path(workdir), settings)
                runs += 1
                faults += outcome.faults
                total.merge(outcome.verdict)
                if outcome.stalled:
                    stalled.merge(outcome.verdict)
                print(outcome.line(), flush=True)
                for starved in outcome.verdict.starvation:
                    print(f"    starved (not fair, not a violation): {starved}", flush=True)
                for violation in outcome.verdict.violations:
                    print(f"    VIOLATION {violation}", flush=True)
            if args.workload == "election" and time.monotonic() < end:
                settings.seed += 1
                outcome = await memory_election(store_url, Path(workdir), settings)
                runs += 1
                faults += outcome.faults
                total.merge(outcome.verdict)
                print(outcome.line(), flush=True)
                for violation in outcome.verdict.violations:
                    print(f"    VIOLATION {violation}", flush=True)
    minutes = (time.monotonic() - started) / 60
    print(
        f"\n{runs} scenario runs in {minutes:.1f} min: {total.operations} operations "
        f"({total.sections} critical sections, {total.cancelled_ops} cancelled), {faults} faults injected, "
        f"{total.losses} leases lost, {total.overlaps_allowed} overlaps with a stale holder, "
        f"{total.refused} stale operations refused, {total.fenced} fenced writes applied "
        f"({total.fenced_refused} refused by the store, {total.fenced_lost} before any I/O), "
        f"{total.starved} waiters starved past the bound, "
        f"{len(total.violations)} violations; stalled renewals: {stalled.renewal_losses} leases lost, "
        f"{stalled.unwarned} of them without an earlier at_risk"
    )
    return 1 if total.violations else 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(torture(parse(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
