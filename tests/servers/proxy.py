"""A small TCP proxy for fault injection: delay, black-hole, reset, refuse.

It runs its own event loop in a thread, so the faults it injects do not depend
on the test's event loop (which may be the very thing under test) and it can
sit between processes too. Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future

from .base import free_port


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``target_host:target_port``.

    * ``delay(s)``: every chunk in both directions waits ``s`` seconds first;
    * ``blackhole()``: nothing is forwarded, connections stay open (like a
      partition); ``heal()`` forwards again, delivering what was held back,
      as TCP retransmission would;
    * ``blackhole_client(port)``: the same for the one connection whose
      client side is ``127.0.0.1:port`` (a dropped NAT entry), until ``heal()``;
    * ``reset()``: aborts every open connection (RST);
    * ``refuse(True)``: new connections are closed at once.
    """

    def __init__(self, target_host: str, target_port: int, port: int | None = None) -> None:
        assert target_host in ("127.0.0.1", "localhost", "::1"), "loopback only"
        self.target = (target_host, target_port)
        self.port = port or free_port()
        self._delay = 0.0
        self._refuse = False
        self._open: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._silenced: set[int] = set()  # client ports of black-holed connections
        self._gates: dict[int, asyncio.Event] = {}  # client port -> open while forwarded
        self._handlers: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"tcp-proxy-{self.port}", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self.connections = 0

    # -- life cycle -------------------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        self._run(self._start())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._run(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults ---------------------------------------------------------------------

    def delay(self, seconds: float) -> None:
        self._delay = seconds

    def blackhole(self) -> None:
        self._run(self._set_open(False))

    def blackhole_client(self, port: int) -> None:
        self._run(self._silence(port))

    def heal(self) -> None:
        self._delay = 0.0
        self._refuse = False
        self._run(self._set_open(True))

    def reset(self) -> None:
        self._run(self._reset())

    def refuse(self, on: bool = True) -> None:
        self._refuse = on

    # -- internals ------------------------------------------------------------------

    def _run(self, coro: object) -> None:
        future: Future[None] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        future.result(timeout=10)

    async def _start(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset()
        if self._handlers:  # let them finish (and collect their pumps' errors) before the loop stops
            await asyncio.wait(self._handlers, timeout=5)

    async def _set_open(self, on: bool) -> None:
        assert self._open is not None
        if on:
            self._open.set()
            self._silenced.clear()
            for gate in self._gates.values():
                gate.set()
        else:
            self._open.clear()

    async def _silence(self, port: int) -> None:
        assert port in self._gates, f"no connection from 127.0.0.1:{port} through this proxy"
        self._silenced.add(port)
        self._gates[port].clear()

    async def _reset(self) -> None:
        self._silenced.clear()
        for gate in self._gates.values():
            gate.set()  # (nothing is forwarded: every transport is aborted at once)
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        if me is not None:
            self._handlers.add(me)
            me.add_done_callback(self._handlers.discard)
        if self._refuse:
            client_writer.transport.abort()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self.connections += 1
        self._writers.update((client_writer, server_writer))
        client_port = int(client_writer.get_extra_info("peername")[1])
        gate = self._gates[client_port] = asyncio.Event()
        gate.set()
        await asyncio.gather(
            self._pump(client_reader, server_writer, gate),
            self._pump(server_reader, client_writer, gate),
            return_exceptions=True,
        )
        if client_port in self._silenced:
            # A black hole does not pass the close on either: the other side
            # keeps its end open until the proxy stops or heals.
            await gate.wait()
        self._gates.pop(client_port, None)
        for writer in (client_writer, server_writer):
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: asyncio.Event) -> None:
        assert self._open is not None
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if self._delay:
                    await asyncio.sleep(self._delay)
                await self._open.wait()
                await gate.wait()
                writer.write(data)
                await writer.drain()
        finally:
            if not gate.is_set():
                await gate.wait()
            with contextlib.suppress(Exception):
                writer.transport.abort()
