"""The gateway's HTTP client to its engines: pooled keep-alive connections (aiohttp).

Why aiohttp and not httpx: on the measurement machine (a shared 2-core VM) a request to
a stand-in engine costs the client process 1.1-1.4 ms of CPU through
``httpx.AsyncClient`` and 0.3-0.4 ms through ``aiohttp.ClientSession``, and with 32 in
flight httpx passes 190-280 requests/s where aiohttp passes 1,460-1,840
(``bench/gateway_client.py``; docs/gateway.md has the table). The gateway's budget for
everything it adds is 1 ms at p50. Both are pooled keep-alive clients; aiohttp's parser
is in C and its pool is a dict per host.

:class:`Upstream` owns one session for every engine (its pool is keyed by host), opened
and closed on the gateway's event loop. A failure before the engine's first byte is an
:class:`UpstreamError` naming its kind (``connect``, ``timeout``, ``transport``), which the
gateway counts and may retry on another engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp

__all__ = ["MID_STREAM_ERRORS", "Upstream", "UpstreamError"]

# What reading an answer may raise once its headers came: the engine died, hung or cut
# the connection.
MID_STREAM_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, asyncio.TimeoutError)


class UpstreamError(Exception):
    """An engine failed before its first byte (no answer at all).

    Attributes
    ----------
    kind : str
        ``"connect"`` (refused, unreachable, connect timeout), ``"timeout"`` (no
        answer within the request timeout) or ``"transport"`` (the connection broke).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _kind(exc: BaseException) -> str:
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)):
        return "connect"
    if isinstance(exc, asyncio.TimeoutError):  # ServerTimeoutError is one too
        return "timeout"
    return "transport"


class Upstream:
    """One pooled aiohttp session for all engines.

    Parameters
    ----------
    request_timeout : float
        Seconds to wait for an answer's first byte, and between its bytes.
    connect_timeout : float
        Seconds to open a connection.
    """

    def __init__(self, request_timeout: float, connect_timeout: float) -> None:
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The session, opened on first use (on the running event loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # No cap on connections: each stream holds one; engines queue themselves.
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self.connect_timeout, sock_read=self.request_timeout
                ),
                auto_decompress=False,  # bytes pass through as the engine wrote them
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str]
    ) -> aiohttp.ClientResponse:
        """Send a request; returns once the answer's headers came (its body unread).

        Raises
        ------
        UpstreamError
            No answer: the connection failed or the engine said nothing in time.
        """
        try:
            return await self.session.post(url, data=body, headers=headers)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise UpstreamError(_kind(exc), message) from exc

    async def get(self, url: str, timeout: float) -> tuple[int, bytes]:
        """``GET url`` within ``timeout`` seconds in all: its status and body.

        Raises
        ------
        UpstreamError
            No answer in time, or the connection failed.
        """
        try:
            limit = aiohttp.ClientTimeout(total=timeout)
            async with self.session.get(url, timeout=limit) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise UpstreamError(_kind(exc), f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        """Close the session and its connections (idempotent)."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
