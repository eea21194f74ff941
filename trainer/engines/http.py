"""A small JSON-over-HTTP client for the server engines: aiohttp, timeouts, retries with backoff.

Retried: connection errors, timeouts, HTTP 408/429/5xx (a server restarting or overloaded). Not
retried: other 4xx — the request itself is wrong, and the server's message is raised as is.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chatgym.trainer.config.loader import ConfigError

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})

# Where each server engine finds its server when not given a base_url: (environment variable, default).
SERVER_URLS = {
    "vllm-server": ("CHATGYM_VLLM_URL", "http://127.0.0.1:8000"),
    "sglang": ("CHATGYM_SGLANG_URL", "http://127.0.0.1:30000"),
}


def server_url(engine: str, base_url: str | None = None) -> str:
    """The root of server engine ``engine``'s server: ``base_url``, else its variable's, else the default."""
    variable, default = SERVER_URLS[engine]
    return base_url or os.environ.get(variable, default)


class ServerError(RuntimeError):
    """A server answered with an error (after any retries). ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class JSONClient:
    """POST/GET JSON to one server.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000`` (no trailing path).
        api_key: sent as ``Authorization: Bearer <key>`` when set.
        timeout_s: total seconds for one attempt of one request.
        retries: extra attempts after the first for retryable failures.
        backoff_s: first wait between attempts; doubles each time.
    """

    base_url: str
    api_key: str | None = None
    timeout_s: float = 600.0
    retries: int = 3
    backoff_s: float = 0.5
    _sessions: dict[int, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _session(self) -> Any:
        import aiohttp

        # aiohttp sessions belong to one event loop; keep one per loop.
        loop = asyncio.get_running_loop()
        session = self._sessions.get(id(loop))
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                headers=self._headers(), timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
            self._sessions[id(loop)] = session
        return session

    async def request(self, method: str, path: str, payload: Any = None) -> Any:
        """Send one request and return the decoded JSON body (plain text as ``str``; ``None`` if empty).

        Raises:
            ServerError: a non-retryable HTTP error, or the last error once retries are spent.
        """
        import aiohttp

        url = f"{self.base_url}{path}"
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                async with self._session().request(method, url, json=payload) as resp:
                    body = await resp.text()
                    if resp.status < 400:
                        return _decode(body)
                    error = ServerError(f"{method} {url} -> HTTP {resp.status}: {body[:2000]}", resp.status)
                    if resp.status not in RETRY_STATUS or last:
                        raise error
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                if last:
                    raise ServerError(f"{method} {url} failed after {attempt + 1} attempts: {exc!r}") from exc
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    async def post(self, path: str, payload: Any) -> Any:
        return await self.request("POST", path, payload)

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    def post_sync(self, path: str, payload: Any, timeout_s: float | None = None) -> Any:
        """Blocking POST (for the synchronous ``update_weights``); no retries: it changes server state.

        Raises:
            ServerError: HTTP error (``status`` set) or no answer (``status`` 0).
        """
        return self._sync("POST", path, json.dumps(payload).encode(), timeout_s)

    def get_sync(self, path: str, timeout_s: float | None = None) -> Any:
        """Blocking GET, one attempt (start-up checks, made outside any event loop's requests).

        Raises:
            ServerError: HTTP error (``status`` set) or no answer (``status`` 0).
        """
        return self._sync("GET", path, None, timeout_s)

    def _sync(self, method: str, path: str, data: bytes | None, timeout_s: float | None) -> Any:
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, headers=self._headers(), method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                body = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise ServerError(
                f"{method} {path} -> HTTP {exc.code}: {exc.read().decode()[:2000]}", exc.code
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ServerError(f"{method} {path} failed: {exc!r}") from exc
        return _decode(body)

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            if not session.closed:
                try:
                    await session.close()
                except RuntimeError:  # a session of an event loop that has since closed
                    pass


def check_server(engine: str, options: Mapping[str, Any], setting: str, engine_setting: str,
                 timeout_s: float = 5.0) -> None:
    """Server engine ``engine``'s server answers ``GET /v1/models`` (vLLM's and SGLang's OpenAI API)
    within ``timeout_s``, one attempt; ``openai`` (any OpenAI-compatible API) answers ``GET
    <base_url>/models`` at all, and not with 401 / 403 (a key it refuses) or 404 (no API there: a
    server's root without ``/v1``, say); other engines pass. Without a server every episode would fail, each stored as a
    failed trajectory or result row, so ``chatgym rollout``, ``eval`` and ``train`` ask at start-up.

    Args:
        options: the engine's keyword arguments (``base_url``, ``api_key`` are read).
        setting: what set them (``--engine-arg``, ``engine.options``), named with ``base_url`` when it
            gave the URL; ``engine_setting``: what named the engine (``--engine``, ``engine.backend``).

    Raises:
        ConfigError: no answer or an HTTP error, naming the setting that gave the URL and the URL.
    """
    if engine not in SERVER_URLS and engine != "openai":
        return
    openai = engine == "openai"
    variable = "OPENAI_BASE_URL" if openai else SERVER_URLS[engine][0]
    option = f"{setting}{'.' if setting.endswith('options') else ' '}base_url"
    if options.get("base_url"):
        where, hint = option, ""
    elif os.environ.get(variable):
        where, hint = f"${variable}", ""
    else:
        where, hint = f"{engine_setting} {engine}", f" (the default; set {option}=... or ${variable})"
    key = options.get("api_key")
    if openai:
        base = options.get("base_url") or os.environ.get(variable) or "https://api.openai.com/v1"
        key, path = (key if key is not None else os.environ.get("OPENAI_API_KEY")), "/models"
    else:
        base, path = server_url(engine, options.get("base_url")), "/v1/models"
    try:
        client = JSONClient(base, api_key=key)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    url = f"{client.base_url}{path}"
    try:
        client.get_sync(path, timeout_s)
    except ServerError as exc:
        if exc.status and openai and exc.status not in (401, 403, 404):
            return  # an API that answers, without a models list for this key's GET (405, ...)
        if exc.status:  # a server, but not one that serves the API (or not with this api_key)
            raise ConfigError(f"{where}: GET {url} answered {str(exc).split(' -> ', 1)[-1][:300]}") from None
        cause = getattr(exc.__cause__, "reason", exc.__cause__)  # URLError wraps the socket's error
        reason = getattr(cause, "strerror", None) or str(cause)
        raise ConfigError(f"{where}: no server answers GET {url} ({reason}){hint}") from None


def _decode(body: str) -> Any:
    """JSON when the body is JSON, else the text itself (some endpoints answer in plain text), None if empty."""
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body
