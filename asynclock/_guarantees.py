"""What each backend guarantees, as configured: the one table behind ``locks.guarantees``,
``connect(url, require=...)`` and the guarantees table of the documentation.

Each row is one configuration (a backend, and for Redis whether ``replicas=``
is set); each backend's ``guarantees`` reads its row. A word a row claims
names the tests that back it (checked by ``tests/test_guarantees.py``), and
a note says why where the answer is not obvious; the notes go under the
table in the documentation.

``python -m asynclock._guarantees`` prints the documentation's table;
``python -m asynclock._guarantees --write docs/testing.md`` writes it into
that page, between its markers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BEGIN", "END", "TABLE", "WORDS", "Configuration", "check_words", "main", "missing", "render", "replace_in"]

#: Every word, with what it promises (API.md's words), in the table's order.
WORDS: dict[str, str] = {
    "fencing": "tokens that never regress",
    "fifo": "a fair lock is offered",
    "reentrant": "the owner may acquire again",
    "notifications": "waiters are woken, never poll",
    "survives_failover": "a promoted replica cannot grant a held lock again",
    "session": "the lease is a server session",
    "interop": "another ecosystem's client shares the locks",
}

#: The lines around the generated table in the documentation.
BEGIN = (
    "<!-- guarantees table: generated from asynclock/_guarantees.py by"
    " `python -m asynclock._guarantees --write docs/testing.md`; edit that table, not this one -->"
)
END = "<!-- end of the generated guarantees table -->"


@dataclass(frozen=True, slots=True)
class Configuration:
    """One row: a backend as configured, the words it claims, and why."""

    #: what the documentation's table shows in its first column
    title: str
    #: the words claimed
    words: frozenset[str]
    #: why, for a word claimed or not, where the answer needs saying
    notes: Mapping[str, str] = field(default_factory=dict)
    #: for each word claimed: the tests that back it (``tests/<module>.py::[<Class>::]<test>``)
    tests: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def _words(*words: str) -> frozenset[str]:
    unknown = [word for word in words if word not in WORDS]
    assert not unknown, unknown
    return frozenset(words)


# The tests several rows cite.
_CONTRACT = "tests/test_contract.py::TestContract::"
_TOKENS = _CONTRACT + "test_two_clients_exclude_each_other_with_increasing_tokens"
_REENTRY = _CONTRACT + "test_reentry_counts_holds_and_keeps_token"
_FAIR = "tests/test_primitives.py::test_fair_lock_hands_over_in_the_order_waiters_queued"
_CLAIMS = "tests/test_guarantees.py::test_"
_FENCING, _FIFO = _CLAIMS + "fencing_claim", _CLAIMS + "fifo_claim"
_REENTRANT, _NOTIFIED = _CLAIMS + "reentrant_claim", _CLAIMS + "notifications_claim"
_SENTINEL = "tests/test_sentinel.py::TestContract::"
_SENTINEL_HANDOVER = "tests/test_redis_primitives.py::test_fair_lock_queue_and_hand_over_survive_a_sentinel_failover"

# The notes several rows share.
_REDIS_TOKENS = (
    "A token is max(last token + 1, the server's time in µs): tokens keep increasing across a restart"
    " without data, an eviction or a failover to a replica that missed the last grants, as long as the"
    " server's clock does not step back by more than a day."
)
_REDIS_QUEUE = (
    "A release hands the lock to the head waiter inside the release and tells that waiter's client"
    " alone; if the holder dies, the waiters know when its lease ends. A waiter refreshes its place in"
    " the queue every ttl/3 (which also catches a lost message)."
)
_REDIS_ASYNC = (
    "Replication is asynchronous: a replica promoted after an acquire that had not reached it can grant"
    " the lock again (the old holder loses its lease at its next renewal; the new token is higher)."
    " Set `replicas=` to close that window."
)
_REDIS_WAIT = (
    "Every acquire and renewal waits (`WAIT`) until that many replicas have it, and a hand-over is"
    " confirmed the same way, so a replica that confirmed cannot grant the lock again. It holds when"
    " every replica that can be promoted is among those that confirm (`replicas=` counts them all, or"
    " the failover promotes the most up-to-date one) and while the servers' clocks agree: a failover to"
    " a replica that did not confirm still loses locks."
)
_REDIS_FIFO_REPLICAS = (
    "The plain lock is the fair lock, FIFO; with `replicas=` the read-write lock and the semaphore are"
    " refused (their hand-overs are not confirmed)."
)

#: Every configuration, in the documentation's order; the key is what backends ask for.
TABLE: dict[str, Configuration] = {
    "memory": Configuration(
        "`memory://`",
        _words("fencing", "fifo", "reentrant", "notifications"),
        notes={
            "fencing": "One counter for the process: tokens increase within it and mean nothing outside it.",
            "survives_failover": "Nothing to fail over: the locks live in the process that took them.",
        },
        tests={
            "fencing": (_TOKENS, _FENCING),
            "fifo": (_FAIR, _FIFO),
            "reentrant": (_REENTRY, _REENTRANT),
            "notifications": (_NOTIFIED,),
        },
    ),
    "redis": Configuration(
        "`redis://` (one server)",
        _words("fencing", "fifo", "reentrant", "notifications"),
        notes={"fencing": _REDIS_TOKENS, "notifications": _REDIS_QUEUE, "survives_failover": _REDIS_ASYNC},
        tests={
            "fencing": (_TOKENS, "tests/test_redis.py::test_tokens_keep_increasing_after_a_restart_with_no_data"),
            "fifo": (_FAIR, "tests/test_redis.py::test_the_plain_and_the_fair_lock_of_a_name_are_one_lock"),
            "reentrant": (_REENTRY,),
            "notifications": (
                "tests/test_redis.py::test_a_release_wakes_the_waiter_long_before_the_holders_ttl",
                "tests/test_redis.py::test_a_release_hands_over_without_another_request_from_the_waiter",
                _NOTIFIED,
            ),
        },
    ),
    "redis+replicas": Configuration(
        "`redis://…?replicas=N`",
        _words("fencing", "fifo", "reentrant", "notifications", "survives_failover"),
        notes={
            "fencing": _REDIS_TOKENS,
            "fifo": _REDIS_FIFO_REPLICAS,
            "notifications": _REDIS_QUEUE,
            "survives_failover": _REDIS_WAIT,
        },
        tests={
            "fencing": (_FENCING,),
            "fifo": (_FIFO,),
            "reentrant": (_REENTRANT,),
            "notifications": (_NOTIFIED,),
            "survives_failover": (
                "tests/test_redis_replicas.py::test_an_acquire_confirmed_by_a_replica_survives_promoting_it",
                "tests/test_redis_replicas.py::test_renewals_a_replica_cannot_confirm_lose_the_lease",
            ),
        },
    ),
    "redis+sentinel": Configuration(
        "`redis+sentinel://`",
        _words("fencing", "fifo", "reentrant", "notifications"),
        notes={"fencing": _REDIS_TOKENS, "notifications": _REDIS_QUEUE, "survives_failover": _REDIS_ASYNC},
        tests={
            "fencing": (_SENTINEL + "test_two_clients_exclude_each_other_with_increasing_tokens",),
            "fifo": (
                "tests/test_redis_primitives.py::test_fair_lock_and_semaphore_through_sentinel",
                _SENTINEL_HANDOVER,
            ),
            "reentrant": (_SENTINEL + "test_reentry_counts_holds_and_keeps_token",),
            "notifications": (_SENTINEL_HANDOVER,),
        },
    ),
    "redis+sentinel+replicas": Configuration(
        "`redis+sentinel://…?replicas=N`",
        _words("fencing", "fifo", "reentrant", "notifications", "survives_failover"),
        notes={
            "fencing": _REDIS_TOKENS,
            "fifo": _REDIS_FIFO_REPLICAS,
            "notifications": _REDIS_QUEUE,
            "survives_failover": _REDIS_WAIT,
        },
        tests={
            "fencing": (_SENTINEL + "test_two_clients_exclude_each_other_with_increasing_tokens", _FENCING),
            "fifo": ("tests/test_redis_primitives.py::test_fair_lock_and_semaphore_through_sentinel", _FIFO),
            "reentrant": (_SENTINEL + "test_reentry_counts_holds_and_keeps_token", _REENTRANT),
            "notifications": (_SENTINEL_HANDOVER, _NOTIFIED),
            "survives_failover": (
                "tests/test_sentinel.py::test_with_replicas_an_acquire_survives_a_failover_right_after_it",
            ),
        },
    ),
    "redis+cluster": Configuration(
        "`redis+cluster://`",
        _words("fencing", "reentrant", "notifications"),
        notes={
            "fencing": _REDIS_TOKENS,
            "fifo": "No fair lock, read-write lock or semaphore on a Cluster: woken waiters race for the lock.",
            "notifications": "A release is announced on the lock's shard channel to every waiting client.",
            "survives_failover": "A primary's failover to its replica can lose locks, as with Sentinel.",
        },
        tests={
            "fencing": (
                "tests/test_cluster.py::TestContract::test_two_clients_exclude_each_other_with_increasing_tokens",
                _FENCING,
            ),
            "reentrant": ("tests/test_cluster.py::TestContract::test_reentry_counts_holds_and_keeps_token", _REENTRANT),
            "notifications": ("tests/test_cluster.py::test_a_waiter_is_woken_by_a_sharded_release", _NOTIFIED),
        },
    ),
    "redlock": Configuration(
        "`redlock://`",
        _words("reentrant", "notifications"),
        notes={
            "fencing": (
                "`lease.token` is None: independent nodes give no number sure to exceed every earlier"
                " holder's (a node restarted empty has never seen it)."
            ),
            "fifo": "Only the plain lock; woken waiters race for it.",
            "notifications": "A release message from any node wakes the waiters; one that loses the race waits again.",
            "survives_failover": (
                "No replicas: a minority of nodes may die, but a node restarted empty within a ttl can let a"
                " second holder in."
            ),
        },
        tests={
            "reentrant": (_REENTRY,),
            "notifications": (
                "tests/test_redlock.py::test_a_waiter_is_woken_by_the_release_not_by_the_holders_ttl",
                _NOTIFIED,
            ),
        },
    ),
    "zookeeper": Configuration(
        "`zk://`",
        _words("fencing", "fifo", "reentrant", "notifications", "survives_failover", "session", "interop"),
        notes={
            "fencing": "The czxid of the holder's node: it grows with every transaction of the ensemble.",
            "notifications": "Each waiter watches the node just before its own.",
            "survives_failover": "The locks are the ensemble's replicated state: a new leader has every lock.",
            "interop": 'Apache Curator\'s `InterProcessMutex`, and kazoo with `extra_lock_patterns=["-lock-"]`.',
        },
        tests={
            "fencing": (
                _TOKENS,
                "tests/test_zookeeper.py::test_node_is_named_like_curator_protected_mode_and_token_is_czxid",
            ),
            "fifo": (_FAIR, "tests/test_zookeeper_primitives.py::test_fair_lock_is_the_plain_lock_on_the_same_path"),
            "reentrant": (_REENTRY,),
            "notifications": ("tests/test_zookeeper.py::test_each_waiter_watches_only_its_predecessor", _NOTIFIED),
            "survives_failover": (
                "tests/test_zookeeper.py::test_ensemble_leader_fault_no_overlap_no_spurious_loss",
                "tests/test_zookeeper.py::test_ensemble_survives_repeated_leader_kills_without_overlap",
            ),
            "session": (
                "tests/test_zookeeper.py::test_cut_connection_the_holder_is_cancelled_before_the_successor_acquires",
            ),
            "interop": (
                "tests/test_zookeeper.py::test_curator_and_asynclock_exclude_each_other",
                "tests/test_zookeeper.py::test_kazoo_and_asynclock_exclude_each_other",
            ),
        },
    ),
    "etcd": Configuration(
        "`etcd://`",
        _words("fencing", "fifo", "reentrant", "notifications", "survives_failover", "session", "interop"),
        notes={
            "fencing": "The create revision of the holder's key: etcd's revision never goes back.",
            "notifications": "Each waiter watches the key created just before its own.",
            "survives_failover": "The locks are the cluster's replicated state: a new leader has every lock.",
            "session": "One etcd lease per client carries all its keys.",
            "interop": "etcd's Go `concurrency.Mutex` and `etcdctl lock`.",
        },
        tests={
            "fencing": (_TOKENS, _FENCING),
            "fifo": (_FAIR, _FIFO),
            "reentrant": (_REENTRY,),
            "notifications": (
                "tests/test_etcd.py::test_a_holder_gone_between_the_waiters_check_and_its_watch_still_lets_the_waiter_in",
                _NOTIFIED,
            ),
            "survives_failover": ("tests/test_etcd.py::test_leader_killed_while_locks_are_held_and_waited_for",),
            "session": (
                "tests/test_etcd.py::test_aclose_revokes_the_lease_and_with_it_every_key",
                "tests/test_etcd.py::test_a_lease_not_confirmed_within_the_lease_time_is_gone_and_a_new_one_serves",
            ),
            "interop": (
                "tests/test_etcd.py::test_etcdctl_holds_and_asynclock_waits_until_its_command_ends",
                "tests/test_etcd.py::test_asynclock_holds_and_etcdctl_waits_until_the_release",
            ),
        },
    ),
    "postgres": Configuration(
        "`postgresql://`",
        _words("fencing", "fifo", "reentrant", "session"),
        notes={
            "fencing": (
                "From an unlogged sequence (PostgreSQL 15+), reseeded from the server's time in µs after a"
                " crash or a failover: tokens keep increasing while the servers' clocks agree."
            ),
            "notifications": (
                "A release NOTIFYs the first waiter's client, but a holder whose session ends sends nothing:"
                " the first waiter looks again every request window (at most 1 s), the others every ttl."
            ),
            "survives_failover": "Advisory locks are not replicated: a promoted standby knows no locks.",
            "session": (
                "A session-level advisory lock; a client's holds share a few sessions, and a session that ends"
                " loses exactly its holds."
            ),
            "interop": (
                "A session of any client that takes the same advisory key excludes asynclock's holders, but no"
                " other library's lock uses these keys."
            ),
        },
        tests={
            "fencing": (_TOKENS, "tests/test_postgres.py::test_tokens_keep_increasing_after_a_server_crash"),
            "fifo": (
                _FAIR,
                "tests/test_postgres_primitives.py::test_fair_waiters_of_many_clients_get_it_in_queue_order",
            ),
            "reentrant": (_REENTRY,),
            "session": (
                "tests/test_postgres.py::test_terminated_holder_connection_loses_the_lease_at_once",
                "tests/test_postgres.py::test_holds_share_sessions_and_a_sessions_end_loses_exactly_its_holds",
            ),
        },
    ),
    "mysql": Configuration(
        "`mysql://`, `mariadb://`",
        _words("fencing", "fifo", "reentrant", "notifications", "session", "interop"),
        notes={
            "fencing": (
                "Counted in an InnoDB table in the statement that takes the lock: committed with the grant, so"
                " tokens keep increasing across clients and restarts of the server."
            ),
            "fifo": (
                "A client's waiters form a line, and the server serves the waiting sessions in the order their"
                " GET_LOCK reached it. A wait statement lasts the line's longest ttl (1 to 30 s): one sent again"
                " after that joins the server's queue behind sessions that asked meanwhile."
            ),
            "notifications": (
                "A waiter blocks in the server's GET_LOCK, which the release or the end of the holder's session"
                " wakes at once."
            ),
            "survives_failover": "Named locks are not replicated: a promoted replica knows no locks.",
            "session": (
                "A named lock of a session; a client's holds share a few sessions, and a session that ends"
                " (KILL, a restart, its wait_timeout) loses exactly its holds; the holder finds out at its next"
                " ping, within a third of the ttl."
            ),
            "interop": "The lock's key is the exact GET_LOCK name: any MySQL client's GET_LOCK on it is excluded.",
        },
        tests={
            "fencing": (_TOKENS, "tests/test_mysql.py::test_tokens_keep_increasing_after_a_server_crash"),
            "fifo": (_FAIR, "tests/test_mysql.py::test_twenty_waiters_wait_on_one_session_and_get_it_in_line_order"),
            "reentrant": (_REENTRY,),
            "notifications": ("tests/test_mysql.py::test_the_next_waiter_is_woken_by_the_release_at_once",),
            "session": ("tests/test_mysql.py::test_holds_share_sessions_and_a_killed_session_loses_exactly_its_holds",),
            "interop": ("tests/test_mysql.py::test_the_mariadb_client_and_asynclock_exclude_each_other_on_info_key",),
        },
    ),
}


def check_words(words: Iterable[str], what: str = "require") -> frozenset[str]:
    """``words`` as a frozenset; TypeError for a bare string, ValueError naming every valid word
    for an unknown one (no I/O)."""
    if isinstance(words, (str, bytes)):
        raise TypeError(f"{what} takes a set of words, e.g. {{'fencing'}}, not a single {type(words).__name__}")
    chosen = frozenset(words)
    for word in chosen:
        if not isinstance(word, str):
            raise TypeError(f"{what} takes words (str), not {type(word).__name__}")
    unknown = sorted(chosen - WORDS.keys())
    if unknown:
        raise ValueError(
            f"unknown guarantee{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} in {what};"
            f" the words are: {', '.join(WORDS)}"
        )
    return chosen


def missing(required: frozenset[str], offered: frozenset[str]) -> list[str]:
    """The required words not offered, in the table's order."""
    return [word for word in WORDS if word in required and word not in offered]


def render() -> str:
    """The documentation's table, between its markers: one row per configuration, a note
    number where a note says why, the notes below it."""
    notes: list[str] = []
    header = "| configuration | " + " | ".join(f"`{word}`" for word in WORDS) + " |"
    lines = [BEGIN, "", header, "| --- |" + " :-: |" * len(WORDS)]
    for row in TABLE.values():
        cells = []
        for word in WORDS:
            cell = "yes" if word in row.words else "no"
            note = row.notes.get(word)
            if note is not None:
                if note not in notes:
                    notes.append(note)
                cell += f" ({notes.index(note) + 1})"
            cells.append(cell)
        lines.append(f"| {row.title} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"{number}. {note}" for number, note in enumerate(notes, 1)]
    lines += ["", END]
    return "\n".join(lines)


def replace_in(text: str, table: str) -> str:
    """``text`` with what lies between the markers (them included) replaced by ``table``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError("the page has no guarantees table markers")
    return text[:start] + table + text[end + len(END) :]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m asynclock._guarantees", description="Print (or write into a page) the guarantees table."
    )
    parser.add_argument("--write", metavar="PAGE", type=Path, help="write the table into PAGE, between its markers")
    args = parser.parse_args(argv)
    table = render()
    if args.write is None:
        print(table)
        return 0
    page: Path = args.write
    page.write_text(replace_in(page.read_text(encoding="utf-8"), table), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
