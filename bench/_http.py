"""A small HTTP/1.1 load client for the gateway bench: keep-alive connections over asyncio.

Python's full clients spend more CPU per request than the gateway under test, on a
machine whose two cores also run the gateway and the engines; this one does only what
the bench needs (POST a JSON body, read a Content-Length or chunked answer, note when
the first SSE data event arrives), so the load costs little.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Answer", "Connection", "Pool"]


@dataclass
class Answer:
    """One response: status, headers (lower-case names), body, and times from the send."""

    status: int
    headers: dict[str, str]
    body: bytes
    first: float  # seconds to the first body byte (the first SSE data event when streamed)
    total: float  # seconds to the last byte


class Connection:
    """One keep-alive connection to ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> Answer:
        reused = self.writer is not None
        try:
            return await self._post(path, body, headers)
        except (ConnectionError, asyncio.IncompleteReadError):
            if not reused:
                raise
            # The server closed the idle connection (its keep-alive timeout): once more,
            # on a new one, as every HTTP client does.
            self.close()
            return await self._post(path, body, headers)

    async def _post(self, path: str, body: bytes, headers: dict[str, str] | None) -> Answer:
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
        )
        started = time.perf_counter()
        self.writer.write(head.encode() + body)
        reader = self.reader
        status_line = await reader.readline()
        if not status_line:
            self.writer = None
            msg = "connection closed"
            raise ConnectionError(msg)
        status = int(status_line.split()[1])
        headers_out: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers_out[name.strip().lower()] = value.strip()
        first = 0.0
        if headers_out.get("transfer-encoding") == "chunked":
            parts = []
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    break
                chunk = await reader.readexactly(size + 2)
                if not first and b"data:" in chunk:
                    first = time.perf_counter() - started
                parts.append(chunk[:-2])
            data = b"".join(parts)
        else:
            data = await reader.readexactly(int(headers_out.get("content-length", "0")))
        total = time.perf_counter() - started
        if headers_out.get("connection") == "close":
            self.close()
        return Answer(status, headers_out, data, first or total, total)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class Pool:
    """Up to ``size`` connections to ``url``, each used by one request at a time."""

    def __init__(self, url: str, size: int) -> None:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        self._idle: asyncio.Queue[Connection] = asyncio.Queue()
        for _ in range(size):
            self._idle.put_nowait(Connection(parts.hostname, parts.port))
        self._all = list(self._idle._queue)  # type: ignore[attr-defined]

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> Answer:
        conn = await self._idle.get()
        try:
            return await conn.post(path, body, headers)
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            conn.close()
            raise
        finally:
            self._idle.put_nowait(conn)

    def close(self) -> None:
        for conn in self._all:
            conn.close()
