"""The SandboxFusion HTTP API as plain dicts, and its mapping to and from :class:`ExecResult`.

SandboxFusion (ByteDance, https://bytedance.github.io/SandboxFusion/; official client: the
``sandbox-fusion`` package on PyPI, ``sandbox_fusion/models.py``) serves

* ``POST /run_code``: ``{code, language, compile_timeout, run_timeout, memory_limit_MB, stdin,
  files: {path: base64}, fetch_files}`` -> ``{status: Success|Failed|SandboxError, message,
  compile_result, run_result: {status: Finished|Error|TimeLimitExceeded, execution_time, return_code,
  stdout, stderr}, executor_pod_name, files}``;
* ``POST /run_jupyter``: ``{cells, cell_timeout, total_timeout, kernel, files, fetch_files}`` ->
  ``{status, message, driver: CommandRunResult, cells: [{stdout, stderr, display, error}], files}``;
* ``GET /v1/ping`` -> ``"pong"``.

Our service adds one key the official models ignore, ``chatgym``, carrying what the API has no field
for (our status with ``oom``/``killed``, ``truncated``, ``queue_s``); our client uses it when present
and otherwise derives the status from the return code alone (never from stderr text).
"""

from __future__ import annotations

import base64
import binascii

from chatgym.sandboxes.base import ExecResult
from chatgym.sandboxes.local.outputs import classify, decode_capped

SUCCESS, FAILED, SANDBOX_ERROR = "Success", "Failed", "SandboxError"
FINISHED, ERROR, TLE = "Finished", "Error", "TimeLimitExceeded"


class RequestError(ValueError):
    """A request body that does not fit the API; the message names the field (HTTP 400)."""


def _number(body: dict, name: str, default: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{name} must be a number, got {value!r}")
    return float(value)


def decode_files(files: object, field: str = "files") -> dict[str, bytes]:
    """``{path: base64 | None}`` -> ``{path: bytes}`` (None = an empty file).

    Raises:
        RequestError: not a dict of str -> base64 str, naming the path.
    """
    if files is None:
        return {}
    if not isinstance(files, dict):
        raise RequestError(f"{field} must be an object of path -> base64 content")
    out = {}
    for path, b64 in files.items():
        if b64 is None:
            out[path] = b""
            continue
        if not isinstance(b64, str):
            raise RequestError(f"{field}[{path!r}] must be a base64 string")
        try:
            out[path] = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(f"{field}[{path!r}] is not valid base64") from None
    return out


def parse_run_code(body: object) -> dict:
    """Validate a ``/run_code`` body; returns ``code, language, stdin, files, timeout_s,
    compile_timeout_s, memory_mb`` (``memory_mb`` None when ``memory_limit_MB`` is absent or <= 0).

    Raises:
        RequestError: naming the bad field.
    """
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    code, language = body.get("code"), body.get("language")
    if not isinstance(code, str):
        raise RequestError(f"code must be a string, got {type(code).__name__}")
    if not isinstance(language, str):
        raise RequestError(f"language must be a string, got {type(language).__name__}")
    stdin = body.get("stdin") or ""
    if not isinstance(stdin, str):
        raise RequestError("stdin must be a string or null")
    run_timeout = _number(body, "run_timeout", 10.0)
    if run_timeout <= 0:
        raise RequestError(f"run_timeout must be > 0 seconds, got {run_timeout}")
    memory = body.get("memory_limit_MB", -1)
    if memory is None:
        memory = -1
    if isinstance(memory, bool) or not isinstance(memory, (int, float)):
        raise RequestError(f"memory_limit_MB must be a number, got {memory!r}")
    fetch = body.get("fetch_files") or []
    if not isinstance(fetch, list):
        raise RequestError("fetch_files must be a list of paths")
    return {
        "code": code,
        "language": language,
        "stdin": stdin,
        "files": decode_files(body.get("files")),
        "timeout_s": run_timeout,
        "compile_timeout_s": _number(body, "compile_timeout", 10.0),
        "memory_mb": int(memory) if memory > 0 else None,
        "fetch_files": fetch,
    }


def parse_run_jupyter(body: object) -> dict:
    """Validate a ``/run_jupyter`` body; returns ``cells, cell_timeout_s (None = total only),
    total_timeout_s, files, fetch_files``.

    Raises:
        RequestError: naming the bad field.
    """
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    cells = body.get("cells")
    if not isinstance(cells, list) or not all(isinstance(c, str) for c in cells):
        raise RequestError("cells must be a list of strings")
    kernel = body.get("kernel", "python3")
    if kernel != "python3":
        raise RequestError(f"kernel must be 'python3', got {kernel!r}")
    cell_timeout = _number(body, "cell_timeout", 0.0)
    total = _number(body, "total_timeout", 45.0)
    if total <= 0:
        raise RequestError(f"total_timeout must be > 0 seconds, got {total}")
    fetch = body.get("fetch_files") or []
    if not isinstance(fetch, list):
        raise RequestError("fetch_files must be a list of paths")
    return {
        "cells": cells,
        "cell_timeout_s": cell_timeout if cell_timeout > 0 else None,
        "total_timeout_s": total,
        "files": decode_files(body.get("files")),
        "fetch_files": fetch,
    }


def command_result(res: ExecResult) -> dict:
    """An ExecResult as a SandboxFusion ``CommandRunResult``."""
    return {
        "status": TLE if res.status == "timeout" else FINISHED,
        "execution_time": res.duration_s,
        "cpu_time": res.info.get("cpu_s"),
        "return_code": res.exit_code,
        "stdout": res.stdout,
        "stderr": res.stderr,
    }


def extension(res: ExecResult) -> dict:
    """The ``chatgym`` key: what the SandboxFusion models have no field for."""
    return {
        "status": res.status,
        "exit_code": res.exit_code,
        "truncated": res.truncated,
        "queue_s": res.queue_s,
        "info": res.info,
    }


def run_code_response(res: ExecResult, pod: str = "") -> dict:
    """A ``/run_code`` response for one execution (``SandboxError`` when the sandbox itself failed)."""
    if res.info.get("internal"):
        return {"status": SANDBOX_ERROR, "message": res.stderr.strip(), "compile_result": None,
                "run_result": None, "executor_pod_name": pod, "files": {}, "chatgym": extension(res)}  # fmt: skip
    run = command_result(res)
    ok = run["status"] == FINISHED and res.exit_code == 0
    return {
        "status": SUCCESS if ok else FAILED,
        "message": "",
        "compile_result": None,
        "run_result": run,
        "executor_pod_name": pod,
        "files": {},
        "chatgym": extension(res),
    }


def error_response(message: str) -> dict:
    return {"status": SANDBOX_ERROR, "message": message, "compile_result": None, "run_result": None,
            "executor_pod_name": None, "files": {}}  # fmt: skip


def cap(text: str, max_bytes: int) -> tuple[str, bool]:
    """``text`` cut to ``max_bytes`` UTF-8 bytes; and whether it was cut. The local backends' rule
    (``outputs.decode_capped``): cut on a character boundary, lone surrogates become U+FFFD."""
    return decode_capped(text.encode("utf-8", "surrogatepass"), max_bytes)


def exec_result(resp: dict, max_output_bytes: int, queue_s: float = 0.0) -> ExecResult:
    """A ``/run_code`` response (from our service or any SandboxFusion server) as an ExecResult.

    Without our ``chatgym`` key the status is derived: ``TimeLimitExceeded`` -> timeout; a failed
    compile -> error; otherwise from the return code alone (``outputs.classify``: a negative code
    -> killed): such a server reports no memory-limit observation, so its runs are never ``oom``
    (a ``MemoryError`` in stderr is the program's text, not the sandbox's). Output longer than
    ``max_output_bytes`` is cut here and flagged ``truncated``.
    """
    if resp.get("status") == SANDBOX_ERROR:
        return ExecResult("killed", stderr=f"chatgym sandbox: the service failed: {resp.get('message')}\n",
                          queue_s=queue_s, info={"internal": True})  # fmt: skip
    run = resp.get("run_result") or {}
    comp = resp.get("compile_result") or {}
    ext = resp.get("chatgym") or {}
    if not run and comp:  # the compile step failed or timed out: nothing ran
        run = comp
    stdout, cut_out = cap(run.get("stdout") or "", max_output_bytes)
    stderr, cut_err = cap(run.get("stderr") or "", max_output_bytes)
    code = run.get("return_code")
    if ext.get("status"):
        status = ext["status"]
    elif run.get("status") == TLE:
        status = "timeout"
    elif run.get("status") == ERROR and code is None:
        status = "error"
    else:
        status = classify(code, False)
    info = dict(ext.get("info") or {})
    if "queue_s" in ext:
        info["service_queue_s"] = ext["queue_s"]
    return ExecResult(
        status=status,
        stdout=stdout,
        stderr=stderr,
        exit_code=code,
        duration_s=float(run.get("execution_time") or 0.0),
        truncated=bool(ext.get("truncated")) or cut_out or cut_err,
        queue_s=queue_s,
        info=info,
    )


def split_traceback(stderr: str) -> list[dict]:
    """A Jupyter ``error`` list from a Python traceback in stderr (``ename``, ``evalue``, ``traceback``)."""
    lines = stderr.rstrip("\n").splitlines()
    if not lines:
        return []
    last = lines[-1]
    name, _, value = last.partition(": ")
    return [{"ename": name.strip(), "evalue": value, "traceback": lines}]
