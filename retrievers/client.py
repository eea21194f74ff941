"""Async client of the retrieval server (``/retrieve``, ``/health``): timeouts, retries, a concurrency cap.

It speaks Search-R1's ``/retrieve`` shape, so it also works against a Search-R1 retrieval server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp

from chatgym.retrievers.base import Passage, check_queries
from chatgym.retrievers.server import document_to_passage, dumps, loads

_JSON = {"Content-Type": "application/json"}


class RetrievalError(RuntimeError):
    """The server could not be reached or kept failing after every retry."""


class RetrievalClient:
    """Search a retrieval server as if it were an in-process retriever (but ``async``).

    Args:
        url: server base URL, e.g. ``http://127.0.0.1:8000`` (``/retrieve`` is appended).
        timeout_s: wall-clock limit of one HTTP attempt, in seconds.
        retries: extra attempts after a connection error, a timeout or an HTTP 5xx/429 answer.
        backoff_s: wait before retry ``i`` is ``backoff_s * 2**i`` seconds.
        max_concurrency: most requests in flight at once from this client.

    The HTTP session belongs to the event loop that first used the client; using the client from
    another loop opens a new session there. Call :meth:`aclose` (or use ``async with``) when done.
    """

    kind = "remote"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        max_concurrency: int = 32,
    ):
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._sem: asyncio.Semaphore | None = None

    def _state(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._loop = loop
            connector = aiohttp.TCPConnector(limit=self.max_concurrency)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
            self._sem = asyncio.Semaphore(self.max_concurrency)
        assert self._sem is not None
        return self._session, self._sem

    async def _request(self, method: str, path: str, payload: Any = None) -> Any:
        session, sem = self._state()
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                data = None if payload is None else dumps(payload)
                async with sem, session.request(method, self.url + path, data=data, headers=_JSON) as resp:
                    if resp.status < 400:
                        return loads(await resp.read())
                    text = await resp.text()
                    if resp.status >= 500 or resp.status == 429:
                        last = RetrievalError(f"{self.url}{path}: HTTP {resp.status}: {text[:500]}")
                        continue
                    try:
                        message = loads(text).get("error", text)
                    except (ValueError, AttributeError):
                        message = text
                    raise ValueError(f"{self.url}{path}: HTTP {resp.status}: {message}")
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
                last = exc
        raise RetrievalError(
            f"{self.url}{path} failed after {self.retries + 1} attempts: {type(last).__name__}: {last}"
        ) from last

    async def search_batch(self, queries: Sequence[str], k: int = 10) -> list[list[Passage]]:
        """Top-``k`` passages per query from the server.

        Raises:
            TypeError / ValueError: bad queries or ``k`` (checked before sending), or the server
                answered 400 (message from the server, naming the field).
            RetrievalError: no answer after every retry.
        """
        check_queries(queries, k)
        if not queries:
            return []
        body = await self._request(
            "POST", "/retrieve", {"queries": list(queries), "topk": k, "return_scores": True}
        )
        result = body["result"]
        if len(result) != len(queries):
            raise RetrievalError(f"server returned {len(result)} result lists for {len(queries)} queries")
        return [[document_to_passage(hit["document"], hit["score"]) for hit in hits] for hits in result]

    async def search(self, query: str, k: int = 10) -> list[Passage]:
        """Top-``k`` passages for one query (see :meth:`search_batch`)."""
        return (await self.search_batch([query], k))[0]

    async def health(self) -> dict[str, Any]:
        """The server's ``/health`` answer. Raises :class:`RetrievalError` if unreachable."""
        return await self._request("GET", "/health")

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> RetrievalClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
