"""A model of the exclusive lock's Lua scripts, run against a real redis-server.

Hypothesis drives random steps straight at the scripts (``_scripts/
exclusive_*.lua``): acquires (new holds, with and without queueing), polls
of queued holds, releases (by the holder, by a queued hold, by a hold the
server never saw; with the token known or not), renewals, a holder's key
expiring, a queue entry's deadline passing, a client going away (its
hand-over channel loses its listener), and the data being lost. A model
predicts every answer and every hand-over message; after every step the
server's keys must say what the model says, and:

* exclusion: the one holder the model knows is the one in the lock key;
* FIFO: a hand-over goes to the first queued hold that is alive (deadline
  not passed, its client listening), never to one behind it;
* tokens: every grant's token is higher than every earlier one, also after
  the data is lost (the server clock's floor);
* a lock that is free, or held with flag ``-``, has nobody queued.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from asynclock.backends.redis._exclusive import ACQUIRE, RELEASE, RENEW
from tests.servers import RedisServer

TTL_MS = 60_000
KEEP_MS = 86_400_000
CLIENTS = 3
#: A message published by the test after each step: every hand-over message before it has arrived.
MARK = b"mark"


@dataclasses.dataclass
class Entry:
    hold: str
    client: int
    text: bytes  # as the server wrote it (and answered it)
    expired: bool = False


class ExclusiveScripts(RuleBasedStateMachine):
    """One lock, ``CLIENTS`` clients (each with its hand-over channel), many holds."""

    server: RedisServer

    def __init__(self) -> None:
        super().__init__()
        self.redis = redis.Redis(host="127.0.0.1", port=self.server.port)
        prefix = f"m{secrets.token_hex(4)}"
        self.x, self.q = f"{prefix}:{{lock}}:x", f"{prefix}:{{lock}}:x:q"
        self.channels = [f"{prefix}:handover:{i}" for i in range(CLIENTS)]
        self.listeners: list[Any] = []
        for channel in self.channels:
            listener = self.redis.pubsub()
            listener.subscribe(channel)
            self._until_mark(listener, channel)
            self.listeners.append(listener)
        self.alive = set(range(CLIENTS))
        self.seq = 0
        # the model
        self.holder: str | None = None
        self.queue: list[Entry] = []
        self.held_tokens: dict[str, int] = {}  # holds that were granted (their token), until released
        self.lost: dict[str, int] = {}  # holds whose hold ended behind their back (their token)
        self.top = 0  # the highest token seen
        self.expected: dict[int, list[str]] = {i: [] for i in range(CLIENTS)}  # hand-overs to announce

    def teardown(self) -> None:
        for listener in self.listeners:
            listener.close()
        self.redis.delete(self.x, self.q)
        self.redis.close()

    # -- talking to the server -------------------------------------------------

    def _until_mark(self, listener: Any, channel: str) -> list[bytes]:
        """Every message of ``channel`` before the mark published now, in order."""
        self.redis.publish(channel, MARK)
        got: list[bytes] = []
        for _ in range(1000):
            message = listener.get_message(timeout=1.0)
            if message is None:
                raise AssertionError(f"the mark never arrived on {channel}")
            if message["type"] != "message":
                continue
            if message["data"] == MARK:
                return got
            got.append(message["data"])
        raise AssertionError("too many messages")

    def _hold(self, client: int) -> str:
        self.seq += 1
        return f"c{client}:h{self.seq}"

    def _acquire(self, hold: str, client: int, *, enqueue: bool, fresh: bool, entry: bytes) -> int | bytes:
        """The token (held now) or ``b"<ms until the holder's lease ends (-1: not queued)> <entry>"``."""
        args = [hold, TTL_MS, int(enqueue), self.channels[client], int(fresh), entry]
        answer = self.redis.eval(ACQUIRE.text, 2, self.x, self.q, *args)
        assert isinstance(answer, (int, bytes)), answer
        return answer

    def _granted(self, hold: str, token: int) -> None:
        assert token > self.top, f"token {token} after {self.top}"
        self.top = token
        self.held_tokens[hold] = token

    # -- the model of serve() ------------------------------------------------------

    def _serve(self, caller: str | None) -> str | None:
        """What the script does with the queue when the lock is free: the first live
        entry gets it (by message, or directly if it is ``caller``); dead ones are dropped."""
        while self.queue:
            head = self.queue.pop(0)
            if head.expired:
                continue
            if head.hold == caller:
                self.holder = head.hold
                return head.hold
            if head.client in self.alive:
                self.holder = head.hold
                self.expected[head.client].append(head.hold)
                return head.hold
        return None

    def _queued(self, hold: str) -> Entry | None:
        return next((entry for entry in self.queue if entry.hold == hold), None)

    # -- steps -----------------------------------------------------------------------

    @rule(client=st.integers(0, CLIENTS - 1), enqueue=st.booleans())
    def acquire(self, client: int, enqueue: bool) -> None:
        if client not in self.alive:
            return
        hold = self._hold(client)
        answer = self._acquire(hold, client, enqueue=enqueue, fresh=True, entry=b"")
        self._answered(hold, client, answer, enqueue)

    @precondition(lambda self: any(entry.client in self.alive for entry in self.queue))
    @rule(data=st.data(), known=st.booleans())
    def poll(self, data: st.DataObject, known: bool) -> None:
        entry = data.draw(st.sampled_from([entry for entry in self.queue if entry.client in self.alive]))
        answer = self._acquire(entry.hold, entry.client, enqueue=True, fresh=False, entry=entry.text if known else b"")
        self._answered(entry.hold, entry.client, answer, True)

    def _answered(self, hold: str, client: int, answer: int | bytes, enqueue: bool) -> None:
        """Check the answer to an acquire (or poll) of ``hold`` against the model, and update it."""
        if self.holder is None:
            if self.queue:
                self._serve(hold)
            if self.holder is None:
                self.holder = hold
                self.queue = [entry for entry in self.queue if entry.hold != hold]
        if self.holder == hold:
            assert isinstance(answer, int), answer
            token = answer
            if hold in self.held_tokens:  # a retry or a poll of a hold already granted
                assert token == self.held_tokens[hold]
            else:
                self._granted(hold, token)
            self.queue = [entry for entry in self.queue if entry.hold != hold]
            return
        assert isinstance(answer, bytes), answer
        hint, _, text = answer.partition(b" ")
        if not enqueue:
            assert answer == b"-1 "
            return
        entry = self._queued(hold)
        if entry is None:
            entry = Entry(hold, client, b"")
            self.queue.append(entry)
        entry.text = text
        entry.expired = False
        # Every queued hold, at the head or not, is told when the holder's lease ends.
        assert self.holder is not None and hold in [entry.hold for entry in self.queue]
        assert 0 <= int(hint) <= TTL_MS, (answer, self.queue)

    @precondition(lambda self: self.holder is not None or self.queue)
    @rule(data=st.data(), known=st.booleans())
    def release(self, data: st.DataObject, known: bool) -> None:
        choices = ([self.holder] if self.holder is not None else []) + [entry.hold for entry in self.queue]
        hold = data.draw(st.sampled_from(choices))
        self._release(hold, known)

    @rule(known=st.booleans())
    def release_unknown_hold(self, known: bool) -> None:
        """A hold the server never saw (an acquire cut short before it was sent) is given back."""
        self._release("never:seen", known)

    @precondition(lambda self: self.lost)
    @rule(data=st.data())
    def release_lost_hold(self, data: st.DataObject) -> None:
        """A hold that expired (or vanished with the data) is released by its client, token and all."""
        self._release(data.draw(st.sampled_from(sorted(self.lost))), True)

    def _release(self, hold: str, known: bool) -> None:
        token = self.held_tokens.get(hold, self.lost.get(hold)) if known else None
        entry = self._queued(hold)
        args = [hold, KEEP_MS, token if token is not None else "", entry.text if entry is not None and known else b""]
        answer = self.redis.eval(RELEASE.text, 2, self.x, self.q, *args)
        if self.holder == hold:
            assert answer == 1
            self.holder = None
            self._serve(None)
        else:
            assert answer == 0
            self.queue = [entry for entry in self.queue if entry.hold != hold]
            if entry is not None and self.holder is None and self.queue:
                self._serve(None)  # no live holder: the next in line goes now
        self.held_tokens.pop(hold, None)
        self.lost.pop(hold, None)

    @precondition(lambda self: self.holder is not None)
    @rule(ours=st.booleans())
    def renew(self, ours: bool) -> None:
        assert self.holder is not None
        hold = self.holder if ours else "someone:else"
        answer = self.redis.eval(RENEW.text, 1, self.x, hold, TTL_MS)
        assert answer == (b"1" if ours else b"0")

    @precondition(lambda self: self.holder is not None)
    @rule()
    def holder_expires(self) -> None:
        """The holder's lease runs out on the server (nobody is told)."""
        self.redis.delete(self.x)
        assert self.holder is not None
        self.lost[self.holder] = self.held_tokens.pop(self.holder)
        self.holder = None

    @precondition(lambda self: any(not entry.expired for entry in self.queue))
    @rule(data=st.data())
    def entry_expires(self, data: st.DataObject) -> None:
        """A queued hold stopped polling: its entry's deadline passes (written as 1 ms after the epoch)."""
        entry = data.draw(st.sampled_from([entry for entry in self.queue if not entry.expired]))
        at = self.queue.index(entry)
        _, ttl, rest = entry.text.split(b" ", 2)
        dead = b"1 " + ttl + b" " + rest
        assert self.redis.lindex(self.q, at) == entry.text
        self.redis.lset(self.q, at, dead)
        entry.text, entry.expired = dead, True

    @precondition(lambda self: len(self.alive) > 1)
    @rule(client=st.integers(0, CLIENTS - 1))
    def client_gone(self, client: int) -> None:
        """A client dies: its channel has no listener any more; its holds and entries stay."""
        if client not in self.alive:
            return
        self.alive.discard(client)
        self.listeners[client].unsubscribe(self.channels[client])

    @rule()
    def data_lost(self) -> None:
        """A restart without data (or a failover that lost it): the lock and its queue are gone."""
        self.redis.delete(self.x, self.q)
        if self.holder is not None:
            self.lost[self.holder] = self.held_tokens.pop(self.holder)
        self.holder = None
        self.queue = []

    # -- what must hold after every step ----------------------------------------------

    @invariant()
    def the_server_agrees_with_the_model(self) -> None:
        for client in sorted(self.alive):
            seen = self._until_mark(self.listeners[client], self.channels[client])
            expected = self.expected[client]
            holds = [message.rpartition(b" ")[0].decode() for message in seen]
            assert holds == expected, f"hand-over messages to client {client}: {holds}, expected {expected}"
            for message in seen:
                hold, _, token = message.decode().rpartition(" ")
                self._granted(hold, int(token))
            expected.clear()
        for client in set(range(CLIENTS)) - self.alive:
            self.expected[client].clear()
        value = self.redis.get(self.x)
        entries = [bytes(entry) for entry in self.redis.lrange(self.q, 0, -1)]
        assert entries == [entry.text for entry in self.queue], (entries, self.queue)
        if self.holder is None:
            assert value is None or b" " not in value, f"{value!r} held, the model says free"
            if value is not None:
                assert not entries, "a free lock with holds queued"
            return
        assert value is not None, "the model's holder holds nothing on the server"
        token, count, flag, expiry, holder = value.decode().split(" ", 4)
        assert holder == self.holder and int(token) == self.held_tokens[holder]
        assert flag in ("q", "-") and int(count) >= 1
        if flag == "-":
            assert not entries, "held with flag '-' while holds are queued"
        assert self.redis.pexpiretime(self.x) == int(expiry), "the key's expiry is not the one in its value"


@pytest.fixture(scope="module")
def scripts_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.cleanup()


def test_the_exclusive_locks_scripts_keep_exclusion_fifo_and_token_order(scripts_server: RedisServer) -> None:
    ExclusiveScripts.server = scripts_server
    runner = ExclusiveScripts.TestCase
    runner.settings = settings(
        max_examples=80, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
    )
    runner().runTest()
