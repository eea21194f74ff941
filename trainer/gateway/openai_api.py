"""The OpenAI chat-completions wire format of the gateway: request checks, errors, response bodies.

Pure functions of JSON values: no engine, session or server here. :func:`parse_request` turns a
``POST /v1/chat/completions`` body into a :class:`ChatRequest` or raises :class:`ApiError` (HTTP 400)
naming the parameter, in OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}``.

What is accepted (everything else in the body is ignored, as an OpenAI-compatible server does):

* ``messages``: roles ``system`` / ``developer`` (read as ``system``) / ``user`` / ``assistant`` /
  ``tool``; ``content`` a string, null (assistant turns with ``tool_calls``) or a list of ``text``
  parts (joined); assistant ``tool_calls`` OpenAI-shaped, ``arguments`` JSON text (an object is
  written as its JSON text); a ``tool`` message needs ``tool_call_id``.
* ``tools`` (``type: function`` schemas) and ``tool_choice``: ``"auto"`` (default), ``"none"`` (the
  tools are not offered: the prompt is rendered without them and the text is not parsed for calls),
  ``"required"`` and a named function: sampling is not constrained, so these are read as ``"auto"``
  (the model may answer without a call; the response says what it wrote).
* ``stop`` (str or list), ``max_tokens`` / ``max_completion_tokens`` (> 0), ``temperature`` (0..2),
  ``top_p`` (0 < p <= 1), ``seed`` (int), ``logprobs`` / ``top_logprobs`` (only the sampled token's
  logprob is known: ``top_logprobs`` lists that one token), ``n`` (1 only), ``stream`` (true answers
  the whole completion as one chunk plus ``[DONE]``).
* Refused with 400: ``n`` > 1, ``response_format`` other than ``text``, non-zero
  ``presence_penalty`` / ``frequency_penalty`` / ``logit_bias`` (the engines do not apply them).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from chatgym.envs.messages import Message, ToolCall
from chatgym.envs.parsers.base import ParsedAction

ROLES_IN = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """An error answered in OpenAI's shape.

    Args:
        status: the HTTP status (400 malformed request, 401 unknown / ended session, 500 engine or
            template failure, 503 the gateway shuts down).
        message: what is wrong, for the agent's developer to read.
        param: the request parameter at fault (``"messages[2].role"``), or None.
        code: OpenAI's machine-readable code (``"invalid_value"``, ``"invalid_api_key"``), or None.
        type: OpenAI's error type; default from the status (``invalid_request_error`` for 4xx,
            ``server_error`` for 5xx).
    """

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    """A 400 :class:`ApiError`."""
    return ApiError(400, message, param, code)


def unauthorized(sid: str | None) -> ApiError:
    """The 401 :class:`ApiError` of a request naming no session, or an unknown or ended one."""
    what = "no session id given" if not sid else "unknown or ended session id"
    return ApiError(401, f"Incorrect API key provided: {what}. Pass the gateway's session id as the API key.",
                    None, "invalid_api_key")


def shutting_down() -> ApiError:
    """The 503 :class:`ApiError` of a new session or chat request once the gateway shuts down."""
    return ApiError(503, "the gateway is shutting down: it opens no new sessions and serves no new requests",
                    None, "shutting_down")


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat-completions request.

    Attributes:
        messages: the conversation, normalised (``content`` always a str, ``developer`` -> ``system``,
            tool-call arguments as JSON text).
        tools: the tool schemas offered (None: none, or ``tool_choice="none"``).
        tool_choice: ``"auto"``, ``"none"``, ``"required"`` or ``"function"`` (a named function).
        stop: stop strings (None: the gateway's default).
        max_tokens: the per-turn token limit asked for (None: the gateway's default).
        temperature, top_p, seed: sampling overrides (None: the gateway's defaults).
        logprobs: return the sampled tokens' logprobs; ``top_logprobs``: how many were asked for.
        stream: answer as server-sent events.
        model: the model name the client asked for (any name is served by the gateway's engine).
    """

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "auto"
    stop: tuple[str, ...] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    model: str = ""


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _content(raw: Any, where: str, allow_none: bool) -> str:
    if isinstance(raw, str):
        return raw
    if raw is None and allow_none:
        return ""
    if isinstance(raw, list):
        texts = []
        for j, part in enumerate(raw):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"{where}.content[{j}]: only text content parts are supported", f"{where}.content[{j}]")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"{where}.content must be a string or a list of text parts", f"{where}.content", "invalid_type")


def _tool_call(raw: Any, where: str) -> ToolCall:
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad(f"{where} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}", where)
    args = fn.get("arguments", "")
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    call_id = raw.get("id")
    if not isinstance(call_id, str):
        raise bad(f"{where}.id must be a string", f"{where}.id", "invalid_type")
    return {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": args}}


def normalise_message(raw: Any, i: int) -> Message:
    """Message ``i`` of a request as a chatgym :class:`Message` (see the module docstring).

    Raises:
        ApiError: 400, naming ``messages[i]...``.
    """
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise bad(f"{where} must be an object", where, "invalid_type")
    role = raw.get("role")
    if role not in ROLES_IN:
        supported = ", ".join(repr(r) for r in ROLES_IN)
        raise bad(f"Invalid value: {role!r}. Supported values are: {supported}.", f"{where}.role")
    role = "system" if role == "developer" else role
    msg: dict[str, Any] = {"role": role, "content": _content(raw.get("content"), where, role == "assistant")}
    if role == "assistant" and raw.get("tool_calls"):
        calls = raw["tool_calls"]
        if not isinstance(calls, list):
            raise bad(f"{where}.tool_calls must be a list", f"{where}.tool_calls", "invalid_type")
        msg["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    if role == "tool":
        if not isinstance(raw.get("tool_call_id"), str):
            raise bad(f"{where}.tool_call_id is required for a tool message", f"{where}.tool_call_id",
                      "missing_required_parameter")
        msg["tool_call_id"] = raw["tool_call_id"]
    if isinstance(raw.get("name"), str) and role != "assistant":
        msg["name"] = raw["name"]
    return msg  # type: ignore[return-value]


def _tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad("tools must be a list of function tools", "tools", "invalid_type")
    for j, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise bad(f"tools[{j}] must be {{'type': 'function', 'function': {{'name', ...}}}}", f"tools[{j}]")
    return list(raw) or None


def _tool_choice(raw: Any) -> str:
    if raw is None:
        return "auto"
    if raw in ("auto", "none", "required"):
        return raw
    fn = raw.get("function") if isinstance(raw, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        return "function"
    raise bad("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name'}}",
              "tool_choice")


def _stop(raw: Any) -> tuple[str, ...] | None:
    if raw is None:
        return None
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad("stop must be a non-empty string or a list of them", "stop")
    return tuple(stops)


def _check_unsupported(body: dict[str, Any]) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise bad(f"n must be 1 (the gateway samples one choice per request), got {n!r}", "n", "unsupported_value")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad("response_format other than 'text' is not supported (sampling is not constrained)",
                  "response_format", "unsupported_value")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise bad(f"{key} is not supported by the gateway's engines; leave it 0", key, "unsupported_value")
    if body.get("logit_bias"):
        raise bad("logit_bias is not supported by the gateway's engines", "logit_bias", "unsupported_value")


def _sampling_numbers(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        if not _is_int(limit) or limit < 1:
            raise bad(f"{param} must be an integer >= 1, got {limit!r}", param)
        out["max_tokens"] = limit
    temperature = body.get("temperature")
    if temperature is not None:
        if not _is_number(temperature) or not 0 <= temperature <= 2:
            raise bad(f"temperature must be a number in [0, 2], got {temperature!r}", "temperature")
        out["temperature"] = float(temperature)
    top_p = body.get("top_p")
    if top_p is not None:
        if not _is_number(top_p) or not 0 < top_p <= 1:
            raise bad(f"top_p must be a number in (0, 1], got {top_p!r}", "top_p")
        out["top_p"] = float(top_p)
    seed = body.get("seed")
    if seed is not None:
        if not _is_int(seed):
            raise bad(f"seed must be an integer, got {seed!r}", "seed", "invalid_type")
        if not SEED_MIN <= seed <= SEED_MAX:  # the engines' generators take a signed 64-bit seed
            raise bad(f"seed must be in [-2**63, 2**63 - 1], got {seed}", "seed")
        out["seed"] = seed
    top = body.get("top_logprobs")
    if top is not None and (not _is_int(top) or not 0 <= top <= 20):
        raise bad(f"top_logprobs must be an integer in [0, 20], got {top!r}", "top_logprobs")
    out["top_logprobs"] = top or 0
    return out


def parse_request(body: Any) -> ChatRequest:
    """A :class:`ChatRequest` from a decoded JSON body (see the module docstring for what is read).

    Raises:
        ApiError: 400 naming the parameter at fault (``messages`` missing or empty, a bad role,
            ``n`` > 1, an out-of-range number, ...).
    """
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_type")
    if "messages" not in body:
        raise bad("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    raw_messages = body["messages"]
    if not isinstance(raw_messages, list) or not raw_messages:
        raise bad("messages must be a non-empty list of messages", "messages")
    _check_unsupported(body)
    messages = [normalise_message(m, i) for i, m in enumerate(raw_messages)]
    tool_choice = _tool_choice(body.get("tool_choice"))
    tools = _tools(body.get("tools"))
    numbers = _sampling_numbers(body)
    model = body.get("model")
    return ChatRequest(
        messages=messages,
        tools=None if tool_choice == "none" else tools,
        tool_choice=tool_choice,
        stop=_stop(body.get("stop")),
        logprobs=bool(body.get("logprobs")) or numbers["top_logprobs"] > 0,
        stream=bool(body.get("stream")),
        model=model if isinstance(model, str) else "",
        **numbers,
    )


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def same_message(sent: Message, expected: Message) -> bool:
    """Whether the client's ``sent`` message is ``expected`` (a message of the segment's history or the
    assistant message the gateway returned), compared structurally: role, content (null = ``""``),
    ``tool_call_id`` and the tool calls (ids, names, and arguments compared as decoded JSON, so a
    client that re-serialises them — other spacing, key order — still matches). Keys a client adds
    (``refusal``, ``annotations``, ``name`` on assistant turns) are ignored."""
    if sent.get("role") != expected.get("role") or (sent.get("content") or "") != (expected.get("content") or ""):
        return False
    if sent.get("tool_call_id") != expected.get("tool_call_id"):
        return False
    a, b = sent.get("tool_calls") or [], expected.get("tool_calls") or []
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x["id"] != y["id"] or x["function"]["name"] != y["function"]["name"]:
            return False
        if _arguments(x["function"]["arguments"]) != _arguments(y["function"]["arguments"]):
            return False
    return True


def returned_message(parsed: ParsedAction | None, text: str) -> dict[str, Any]:
    """The assistant message answered for a turn whose decoded text is ``text``.

    ``parsed`` (None: tools not offered) gives ``tool_calls`` (its valid calls, ids ``call_<n>``, ``n``
    counting the session's call attempts, past any id it used:
    :meth:`~chatgym.envs.parsers.ParsedAction.numbered_from`) and
    ``content`` (the text outside them, stripped; null when empty and there are calls). A malformed
    call is no ``tool_call``: its parse error is appended to ``content`` as
    ``[tool call not parsed: <error>]`` lines, so the agent can read what went wrong, and listed in
    ``tool_call_errors``.
    """
    if parsed is None:
        return {"role": "assistant", "content": text}
    content = parsed.content
    if parsed.errors:
        notes = "\n".join(f"[tool call not parsed: {e}]" for e in parsed.errors)
        content = f"{content}\n\n{notes}" if content else notes
    msg: dict[str, Any] = {"role": "assistant", "content": content or (None if parsed.calls else "")}
    if parsed.calls:
        msg["tool_calls"] = [dict(c) for c in parsed.calls]
    if parsed.errors:
        msg["tool_call_errors"] = list(parsed.errors)
    return msg


def as_history_message(msg: dict[str, Any]) -> Message:
    """The returned message as a :class:`Message` to compare the next request's against."""
    out: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
    if msg.get("tool_calls"):
        out["tool_calls"] = msg["tool_calls"]
    return out  # type: ignore[return-value]


def token_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float], top: int) -> dict[str, Any]:
    """``choice.logprobs``: one entry per sampled id (``token``, ``logprob``, ``bytes``,
    ``top_logprobs``: the sampled token alone when ``top`` > 0, the only one the engine reports)."""
    content = []
    for tid, lp in zip(ids, logprobs, strict=True):
        token = tokenizer.decode([tid], skip_special_tokens=False)
        entry = {"token": token, "logprob": lp, "bytes": list(token.encode("utf-8"))}
        entry["top_logprobs"] = [dict(entry)] if top > 0 else []
        content.append(entry)
    return {"content": content, "refusal": None}


def completion_body(
    *, model: str, message: dict[str, Any], finish_reason: str, prompt_tokens: int, completion_tokens: int,
    logprobs: dict[str, Any] | None, extra: dict[str, Any],
) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice; ``extra`` goes under the ``chatgym`` key."""
    return {
        "id": "chatcmpl-" + secrets.token_hex(12),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": logprobs}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "system_fingerprint": None,
        "chatgym": extra,
    }


def stream_chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a finished completion ``body``: one delta with the
    whole message, then the finish reason with the usage."""
    choice = body["choices"][0]
    message = {k: v for k, v in choice["message"].items() if k in ("role", "content", "tool_calls")}
    if "tool_calls" in message:
        message["tool_calls"] = [{"index": j, **c} for j, c in enumerate(message["tool_calls"])]
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    first = {**base, "choices": [{"index": 0, "delta": message, "finish_reason": None,
                                  "logprobs": choice["logprobs"]}]}
    last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            "usage": body["usage"], "chatgym": body["chatgym"]}
    return [first, last]


SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
_SESSION_FIELDS = {"task_id": None, "meta": None, "group_id": int, "sample_index": int, "sampling_seed": int}


def session_fields(body: Any) -> dict[str, Any]:
    """``open_session`` keyword arguments of a ``POST /v1/sessions`` body.

    Raises:
        ApiError: 400 naming the field (not an object, an unknown field, a bad int).
    """
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object (or empty)", None)
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key not in _SESSION_FIELDS:
            raise bad(f"unknown field {key!r}; allowed: {sorted(_SESSION_FIELDS)}", key)
        low = 0 if key != "sampling_seed" else None  # a seed may be negative; an index may not
        bad_int = isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low)
        if _SESSION_FIELDS[key] is int and value is not None and bad_int:
            raise bad(f"{key} must be an int{' >= 0' if low is not None else ''}, got {value!r}", key)
        if key == "sampling_seed" and value is not None and not SEED_MIN <= value <= SEED_MAX:
            raise bad(f"sampling_seed must be in [-2**63, 2**63 - 1], got {value}", key)
        if value is not None:
            out[key] = value
    return out
