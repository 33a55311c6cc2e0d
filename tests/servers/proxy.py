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

    async def _set_open(self, on: bool) -> None:
        assert self._open is not None
        if on:
            self._open.set()
        else:
            self._open.clear()

    async def _reset(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
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
        await asyncio.gather(
            self._pump(client_reader, server_writer),
            self._pump(server_reader, client_writer),
            return_exceptions=True,
        )
        for writer in (client_writer, server_writer):
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._open is not None
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if self._delay:
                    await asyncio.sleep(self._delay)
                await self._open.wait()
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.transport.abort()
