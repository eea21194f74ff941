"""The grading program that runs INSIDE the sandbox (as ``__main__``); nothing here runs on the host.

Protocol (see ``chatgym.envs.code.grader``): stdin carries one line with a per-run random nonce,
one line with the UTF-8 byte lengths of four fields, then the fields back to back: ``prelude``,
``solution``, ``test`` and ``entry_point`` (length-prefixed raw text rather than JSON because
importing ``json`` — and with it ``re`` — costs more than the rest of a typical run). The program

1. reads all of stdin and points fd 0 at ``/dev/null`` before any untrusted code runs, so the
   solution can neither read the nonce from stdin nor print it;
2. keeps private copies of the real stdout/stderr fds and points fds 1 and 2 at ``/dev/null``, so
   the solution's output (however large, from Python or C) cannot hide or delay the verdict;
3. runs ``prelude`` (the problem's own imports and helpers) and then the solution in one namespace
   (``__name__ == "solution"``, so ``if __name__ == "__main__":`` demo code does not run);
4. runs ``prelude`` and the test in a SECOND namespace with a copy of the builtins taken before the
   solution ran, and calls ``check(candidate)``, where ``candidate`` wraps the solution's function
   and records any return value that is not plain builtin data (int, float, complex, str, bytes,
   bool, None, and list/tuple/set/frozenset/dict of those, exact types only) — an object with an
   always-true ``__eq__`` therefore fails even if the test swallows the error;
5. writes the nonce to the private stdout only after ``check`` returned with no violation, then
   ``os._exit(0)`` (no ``atexit`` hook of the solution runs). A failure writes
   ``chatgym-grade: <category>`` and the traceback to the private stderr and exits 1.

Limits (honest): the solution runs in this same interpreter, so code written *on purpose* to attack
the grader can still forge a pass: finding the nonce in memory (this program's own ``main`` frame
holds it; ``sys._getframe()`` / ``gc`` reach it) and writing it to the private stdout fd (listed in
``/proc/self/fd``), patching this module through ``sys.modules["__main__"]``, or monkeypatching a
shared module such as ``math`` that the test uses. What it does close is the cheap route: copies of
stdin the sandbox itself left reachable (see :func:`_scrub_request_copies`). Closing the rest needs
the solution and the test in separate processes exchanging plain data.
"""

import os
import sys


def _plain_data_violation(
    value,
    _type=type,
    _id=id,
    _scalars=(int, float, complex, str, bytes, bool, type(None)),
    _seqs=(list, tuple, set, frozenset),
):
    """The type name of the first non-builtin-data object inside ``value``, or None.

    The builtins it needs are bound as defaults when this module loads, before untrusted code runs,
    so a solution that rebinds ``builtins.type`` does not change the check.
    """
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        t = _type(v)
        if t in _scalars:
            continue
        if t in _seqs or t is dict:
            if _id(v) in seen:  # cycles and shared sub-objects are checked once
                continue
            seen.add(_id(v))
            if t is dict:
                stack.extend(dict.keys(v))
                stack.extend(dict.values(v))
            else:
                stack.extend(v)
            continue
        return f"{t.__module__}.{t.__qualname__}"
    return None


def _scrub_request_copies(nonce):
    """Blank copies of our stdin that the sandbox left reachable from Python.

    A fork-server sandbox can still hold the request that carried stdin in a caller's frame (the
    local ``LocalSandbox`` child does), where ``sys._getframe()`` or ``gc`` would find the nonce.
    Every dict or list slot holding that text is set to ``""`` before untrusted code runs.
    """
    import gc

    prefix = nonce.decode("ascii", "replace")
    found = []
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            text = value.get("stdin") if type(value) is dict else None
            if type(text) in (str, bytes) and text[: len(prefix)] in (prefix, nonce):
                found.append(text)
        frame = frame.f_back
    for text in found:
        for ref in gc.get_referrers(text):
            if type(ref) is dict:
                for key, value in list(ref.items()):
                    if value is text:
                        ref[key] = ""
            elif type(ref) is list and ref is not found:
                for i, value in enumerate(ref):
                    if value is text:
                        ref[i] = ""
    found.clear()


def main():
    # Everything the verdict depends on is bound here, before the solution can rebind it.
    write, exit_now, dup2 = os.write, os._exit, os.dup2
    run, compile_ = exec, compile
    raw = sys.stdin.buffer.read()
    null = os.open(os.devnull, os.O_RDWR)
    dup2(null, 0)
    out, err = os.dup(1), os.dup(2)
    dup2(null, 1)
    dup2(null, 2)
    nonce, _, rest = raw.partition(b"\n")
    header, _, rest = rest.partition(b"\n")
    job, pos = {}, 0
    for key, size in zip(("prelude", "solution", "test", "entry_point"), header.split(), strict=True):
        job[key] = rest[pos : pos + int(size)].decode("utf-8")
        pos += int(size)
    raw = rest = None
    _scrub_request_copies(nonce)

    import builtins

    clean_builtins = dict(builtins.__dict__)
    entry_point = job["entry_point"]
    violations = []

    def fail(category, exc=None):
        lines = [f"chatgym-grade: {category}\n"]
        if exc is not None:
            import traceback

            lines += traceback.format_exception(type(exc), exc, exc.__traceback__)
        text = "".join(lines)
        write(err, text[-4000:].encode("utf-8", "replace"))
        exit_now(1)

    solution_ns = {"__name__": "solution"}
    try:
        run(compile_(job["prelude"], "<prompt>", "exec"), solution_ns)
        run(compile_(job["solution"], "<solution>", "exec"), solution_ns)
    except BaseException as exc:  # SystemExit too: leaving early is a failure, not a pass
        fail("solution_error", exc)
    fn = solution_ns.get(entry_point)
    if not callable(fn):
        write(err, f"chatgym-grade: missing_entry_point\nno function named {entry_point!r}\n".encode())
        exit_now(1)

    def candidate(*args, **kwargs):
        result = fn(*args, **kwargs)
        bad = _plain_data_violation(result)
        if bad is not None:
            violations.append(bad)
            raise TypeError(f"{entry_point} returned {bad}; only builtin data types are accepted")
        return result

    test_ns = {"__name__": "check", "__builtins__": clean_builtins}
    try:
        run(compile_(job["prelude"], "<prompt>", "exec"), test_ns)
        run(compile_(job["test"], "<test>", "exec"), test_ns)
        test_ns[entry_point] = candidate
        test_ns["check"](candidate)
    except BaseException as exc:
        fail("not_plain_data" if violations else "test_failed", exc)
    if violations:
        write(err, f"chatgym-grade: not_plain_data\n{entry_point} returned {violations[0]}\n".encode())
        exit_now(1)
    write(out, nonce + b"\n")
    exit_now(0)


if __name__ == "__main__":
    main()
