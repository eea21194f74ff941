"""Check chatgym's tau2 tools (``chatgym.envs.usersim``) against tau2's own, call by call.

tau2's package cannot be imported with chatgym's dependencies, so this is a script, not a test (a
recorded sample of it is: ``tests/test_usersim_tau2_fidelity.py``). tau2's tools import once a few
of its dependencies are put in a side directory (not the venv):

    .venv/bin/pip install -q --target /tmp/tau2deps loguru toml
    .venv/bin/pip install -q --no-deps --target /tmp/tau2deps addict deepdiff orderly-set cachebox
    PYTHONPATH=/tmp/tau2deps .venv/bin/python scripts/tau2_fidelity.py [--record tests/data/tau2_fidelity_sample.json]

What it compares, exactly (tool output text character for character; databases by tau2's own hash,
``get_db_hash()``, against :func:`chatgym.envs.usersim.toolkit.db_hash`):

1. the fresh database of each domain (our ``fresh_db`` vs tau2's ``get_environment()``);
2. every shipped task's expected actions, replayed twice (the second pass hits the error and
   state-dependent branches: cancelling twice, modifying a non-pending order, ...);
3. the same action sequences with one action's arguments mutated: numeric strings, floats and
   fractional numbers for integers, bools, ``None``, a missing argument, an unknown argument,
   upper-cased enum values, and inside list arguments (``flights``, ``passengers``,
   ``payment_methods``, ``item_ids``) the same per item plus extra / missing item keys;
4. direct / one-stop flight searches over 30 routes x 3 dates and a few other reads (full database).

Our calls go through the env's own path (``bind_tools`` -> ``run_tool_call`` with the arguments as
JSON text), tau2's through ``Environment.get_response``. Items 2-3 run on the part of the database a
task's actions refer to (its users, reservations / orders, flights / products; the same part for
both), because validating tau2's full 7 MB airline database per sequence takes about a second.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import functools
import hashlib
import itertools
import json
import re
import sys
from collections import Counter
from typing import Any

from loguru import logger
from tau2.data_model.message import ToolCall
from tau2.domains.airline.data_model import FlightDB
from tau2.domains.airline.environment import get_environment as airline_env
from tau2.domains.retail.data_model import RetailDB
from tau2.domains.retail.environment import get_environment as retail_env

from chatgym.envs import messages as M
from chatgym.envs.tools import run_tool_call
from chatgym.envs.usersim import data
from chatgym.envs.usersim.env import _TOOLKITS, expected_actions
from chatgym.envs.usersim.toolkit import bind_tools, db_hash

logger.remove()
TAU2 = {"airline": (airline_env, FlightDB), "retail": (retail_env, RetailDB)}


def output_digest(text: str) -> str:
    """SHA-256 of a tool output, with the pydantic version in error URLs blanked (the recorded
    sample then survives a pydantic upgrade that changes no message)."""
    return hashlib.sha256(
        re.sub(r"errors\.pydantic\.dev/[^/]+/", "errors.pydantic.dev/*/", text).encode()
    ).hexdigest()


# ---- the part of a database a task refers to ------------------------------------------------------


def _strings(x: Any) -> set[str]:
    if isinstance(x, str):
        return {x}
    if isinstance(x, dict):
        return set().union(*map(_strings, x.values()))
    if isinstance(x, list):
        return set().union(*map(_strings, x))
    return set()


def referred_keys(domain: str, db: dict[str, Any], actions: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Keys per collection that ``actions`` refer to, closed over owners and their records."""
    s = _strings([a["arguments"] for a in actions])
    if domain == "airline":
        users, res = s & db["users"].keys(), s & db["reservations"].keys()
        users |= {db["reservations"][r]["user_id"] for r in res}
        res |= {r for u in users for r in db["users"][u]["reservations"] if r in db["reservations"]}
        flights = (s & db["flights"].keys()) | {
            f["flight_number"] for r in res for f in db["reservations"][r]["flights"]
        }
        return {"flights": sorted(flights), "users": sorted(users), "reservations": sorted(res)}
    lower = {x.lower() for x in s}
    users = (s & db["users"].keys()) | {
        u for u, rec in db["users"].items() if rec["email"].lower() in lower or rec["address"]["zip"] in s
    }
    orders = s & db["orders"].keys()
    users |= {db["orders"][o]["user_id"] for o in orders}
    orders |= {o for u in users for o in db["users"][u]["orders"] if o in db["orders"]}
    owner = {v: p for p, rec in db["products"].items() for v in rec["variants"]}
    products = (s & db["products"].keys()) | {owner[v] for v in s if v in owner}
    products |= {i["product_id"] for o in orders for i in db["orders"][o]["items"]}
    return {"products": sorted(products), "users": sorted(users), "orders": sorted(orders)}


def sub_db(db: dict[str, Any], keys: dict[str, list[str]]) -> str:
    """The part of ``db`` under ``keys``, as JSON text (parsed once per run: a private copy; JSON
    keeps the types of a dumped database)."""
    return json.dumps({coll: {k: db[coll][k] for k in ks} for coll, ks in keys.items()})


# ---- mutated arguments ----------------------------------------------------------------------------


def _value_mutations(v: Any) -> list[tuple[str, Any]]:
    if isinstance(v, bool):
        return [("'true'", str(v).lower()), ("1", int(v))]
    if isinstance(v, int):
        return [("str", str(v)), ("float", float(v)), ("+0.5", v + 0.5), ("str .0", f"{v}.0"),
                ("bool", bool(v)), ("words", "fifty")]  # fmt: skip
    if isinstance(v, float):
        return [("str", str(v)), ("int", int(v))]
    if isinstance(v, str):
        out = [("int", 123), ("list", [v])]
        if v.isdigit():
            out.append(("as int", int(v)))
        if v.islower() and v.replace("_", "").isalpha():
            out.append(("upper", v.upper()))
        return out
    return []


def mutations(args: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(label, mutated arguments)`` pairs for one call's arguments."""
    out: list[tuple[str, dict[str, Any]]] = [("+extra", {**args, "extra": 1})]
    for k, v in args.items():
        out += [(f"{k}=None", {**args, k: None}), (f"-{k}", {a: b for a, b in args.items() if a != k})]
        out += [(f"{k}:{label}", {**args, k: m}) for label, m in _value_mutations(v)]
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            first = v[0]
            out += [(f"{k}=[]", {**args, k: []}), (f"{k}=dict", {**args, k: first}),
                    (f"{k}[0]=str", {**args, k: [json.dumps(first), *v[1:]]}),
                    (f"{k}[0]+extra", {**args, k: [{**first, "extra": "x"}, *v[1:]]})]  # fmt: skip
            for f, fv in first.items():
                out.append((f"{k}[0]-{f}", {**args, k: [{a: b for a, b in first.items() if a != f}, *v[1:]]}))
                out += [
                    (f"{k}[0].{f}:{label}", {**args, k: [{**first, f: m}, *v[1:]]})
                    for label, m in [("None", None), *_value_mutations(fv)]
                ]
        elif isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            out += [(f"{k}=[]", {**args, k: []}), (f"{k}=joined", {**args, k: ",".join(v)}),
                    (f"{k}[0]=None", {**args, k: [None, *v[1:]]})]  # fmt: skip
            if v[0].isdigit():
                out.append((f"{k}[0]:int", {**args, k: [int(v[0]), *v[1:]]}))
    return out


# ---- running both ---------------------------------------------------------------------------------


_LOOP = asyncio.new_event_loop()


@functools.cache
def _ours(domain: str) -> tuple[Any, dict[str, Any]]:
    # One toolkit and its tools per domain (building a Tool checks its schema against the
    # metaschema: most of a second per domain here); each sequence swaps in its own database.
    cls, specs = _TOOLKITS[domain]
    toolkit = cls()
    return toolkit, {t.name: t for t in bind_tools(toolkit, specs)}


def run_ours(domain: str, db: dict[str, Any], calls: list[dict[str, Any]]) -> tuple[list[str], str]:
    """Outputs of ``calls`` through the env's path (bind_tools + run_tool_call), and the db hash."""
    toolkit, tools = _ours(domain)
    toolkit.db = db

    async def go() -> list[str]:
        out = []
        for i, c in enumerate(calls):
            outcome = await run_tool_call(M.make_tool_call(c["name"], c["arguments"], f"c{i}"), tools)
            out.append(outcome.message["content"])
        return out

    return _LOOP.run_until_complete(go()), db_hash(toolkit.db)


def run_tau2(domain: str, db: dict[str, Any] | None, calls: list[dict[str, Any]]) -> tuple[list[str], str]:
    make, model = TAU2[domain]
    env = make() if db is None else make(db=model.model_validate(db))
    outputs = [
        env.get_response(
            ToolCall(id=f"c{i}", name=c["name"], arguments=copy.deepcopy(c["arguments"]))
        ).content
        for i, c in enumerate(calls)
    ]
    return outputs, env.get_db_hash()


def compare(domain: str, label: str, keys, text: str, calls, index, cases: list, bad: list) -> None:
    """Run ``calls`` (``calls[index]`` the mutated one, None for none) on both; note tau2's results."""
    mine = run_ours(domain, json.loads(text), calls)
    theirs = run_tau2(domain, json.loads(text), calls)
    cases.append(
        {
            "domain": domain,
            "label": label,
            "keys": keys,
            "calls": calls,
            "index": index,
            "outputs_sha256": [output_digest(o) for o in theirs[0]],
            "outputs_head": [o[:160] for o in theirs[0]],
            "db_sha256": theirs[1],
        }
    )
    if mine != theirs:
        diffs = [
            (i, a[:300], b[:300])
            for i, (a, b) in enumerate(zip(*[mine[0], theirs[0]], strict=True))
            if a != b
        ]
        bad.append((domain, label, diffs, mine[1] == theirs[1]))


def write_sample(path: str, fresh_hashes: dict[str, str], cases: list[dict[str, Any]]) -> None:
    """Record tau2's results on a sample of ``cases`` for ``tests/test_usersim_tau2_fidelity.py``.

    The sample: one case per (domain, tool, kind of mutation) and the unmutated replay of every
    tenth task: every kind of argument handling of every tool, a few hundred cases that replay in
    seconds. A case names its task and the mutated call's index and arguments (the test rebuilds
    the sequence from the shipped task); ``outputs_sha256`` is the SHA-256 of the outputs' digests
    (:func:`output_digest`) joined by newlines, ``db_sha256`` tau2's final database hash.
    """
    seen, keys, sample = set(), {}, []
    for c in cases:
        task_id, rest = c["label"].split(" ", 1)
        kind = re.sub(r"\[\d+\]", "[i]", rest)
        if (c["domain"], kind) in seen and not (rest == "expected x2" and int(task_id) % 10 == 0):
            continue
        seen.add((c["domain"], kind))
        tid, i = f"{c['domain']}/{task_id}", c["index"]
        keys[tid] = c["keys"]
        sample.append(
            {
                "task_id": tid,
                "label": rest,
                "index": i,
                "arguments": None if i is None else c["calls"][i]["arguments"],
                "outputs_sha256": hashlib.sha256("\n".join(c["outputs_sha256"]).encode()).hexdigest(),
                "output_head": c["outputs_head"][-1 if i is None else i][:120],
                "db_sha256": c["db_sha256"],
            }
        )
    with open(path, "w", encoding="utf-8") as fh:  # one case per line: reviewable diffs
        head = {"tau2": data.TAU2_VERSION, "fresh_db_sha256": fresh_hashes, "keys": keys}
        fh.write(json.dumps(head)[:-1] + ', "cases": [\n')
        fh.write(",\n".join(json.dumps(c) for c in sample) + "\n]}\n")
    print(f"recorded {len(sample)} cases ({Counter(c['task_id'].split('/')[0] for c in sample)}) to {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--record", help="write a sample of the compared cases (tau2's results) to this JSON file"
    )
    ap.add_argument("--tasks", type=int, default=None, help="only the first N tasks per domain")
    args = ap.parse_args()

    fresh_hashes, cases, bad = {}, [], []
    for domain in ("airline", "retail"):
        base = data.fresh_db(domain)
        fresh_hashes[domain] = theirs = run_tau2(domain, None, [])[1]
        print(f"{domain}: fresh database hash {'==' if db_hash(base) == theirs else '!='} tau2's")
        if db_hash(base) != theirs:
            bad.append((domain, "fresh database", [], False))
        n_before = len(cases)
        for task in data.load_tasks(domain, "base")[: args.tasks]:
            actions = [{"name": a["name"], "arguments": a["arguments"]} for a in expected_actions(task)]
            if not actions:
                continue
            keys = referred_keys(domain, base, actions)
            text = sub_db(base, keys)
            compare(domain, f"{task['id']} expected x2", keys, text, actions * 2, None, cases, bad)
            for i, action in enumerate(actions):
                for label, mutated in mutations(action["arguments"]):
                    calls = [*actions[:i], {"name": action["name"], "arguments": mutated}, *actions[i + 1 :]]
                    compare(
                        domain, f"{task['id']} {action['name']} {label}", keys, text, calls, i, cases, bad
                    )
        print(f"{domain}: {len(cases) - n_before} sequences compared")

    # Reads over the full airline database (searches see every flight).
    env, (ours, tools) = airline_env(), _ours("airline")
    ours.db = data.fresh_db("airline")
    reads = [
        ("list_all_airports", {}),
        ("calculate", {"expression": "1/0"}),
        ("calculate", {"expression": "(3+4)*2.5"}),
        ("get_flight_status", {"flight_number": "HAT001", "date": "2024-05-03"}),
        ("get_flight_status", {"flight_number": "HAT001", "date": "2030-01-01"}),
        ("search_direct_flight", {"origin": "JFK", "destination": "SFO", "date": 20240516}),
        ("search_direct_flight", {"origin": "NOPE", "destination": "SFO", "date": ["x"]}),
    ]
    for o, d in itertools.permutations(["JFK", "SFO", "LAX", "ORD", "DFW", "SEA"], 2):
        for date in ("2024-05-16", "2024-05-20", "2024-05-09"):
            reads += [
                (n, {"origin": o, "destination": d, "date": date})
                for n in ("search_direct_flight", "search_onestop_flight")
            ]
    read_bad = []
    for i, (n, a) in enumerate(reads):
        theirs = env.get_response(ToolCall(id=str(i), name=n, arguments=a)).content
        mine = _LOOP.run_until_complete(run_tool_call(M.make_tool_call(n, a, str(i)), tools)).message[
            "content"
        ]
        if mine != theirs:
            read_bad.append((n, a, mine[:200], theirs[:200]))
    print(
        f"airline reads (full database): {len(reads)} calls, {len(read_bad)} output mismatches {read_bad[:3]}"
    )

    print(f"mismatching sequences: {len(bad)} of {len(cases)}")
    for row in bad[:20]:
        print("   ", row)
    if args.record:
        write_sample(args.record, fresh_hashes, cases)
    return 1 if bad or read_bad else 0


if __name__ == "__main__":
    sys.exit(main())
