"""Check chatgym's tau2 tools (``chatgym.envs.usersim``) against tau2's own, call by call.

tau2's package cannot be imported with chatgym's dependencies, so this is a one-off check, not a
test. Its tools import once a few of its dependencies are put in a side directory (not the venv):

    .venv/bin/pip install -q --target /tmp/tau2deps loguru toml
    .venv/bin/pip install -q --no-deps --target /tmp/tau2deps addict deepdiff orderly-set cachebox
    PYTHONPATH=/tmp/tau2deps .venv/bin/python scripts/tau2_fidelity.py

It replays every shipped task's expected actions twice (the second pass hits the error and
state-dependent branches: cancelling twice, modifying a non-pending order, ...) through both
implementations on fresh databases, plus direct / one-stop flight searches over 30 routes x 3 dates
and a few other read calls, and compares every tool output (JSON parsed; keys whose value is null
dropped and numbers compared as floats, since tau2 dumps pydantic defaults and coerces ints) and
every final database.
"""

from __future__ import annotations

import itertools
import json

from loguru import logger
from tau2.data_model.message import ToolCall
from tau2.domains.airline.environment import get_environment as airline_env
from tau2.domains.retail.environment import get_environment as retail_env

from chatgym.envs.usersim import data
from chatgym.envs.usersim.env import _TOOLKITS, expected_actions
from chatgym.envs.usersim.toolkit import as_text

logger.remove()


def norm(x):
    if isinstance(x, dict):
        return {k: norm(v) for k, v in x.items() if v is not None}
    if isinstance(x, (list, tuple)):
        return [norm(v) for v in x]
    if isinstance(x, bool):
        return x
    if isinstance(x, (int, float)):
        return float(x)
    return x


def parse(text: str):
    try:
        return norm(json.loads(text))
    except ValueError:
        return text


def call_both(env, ours, name: str, args: dict, i: int) -> tuple[str, str]:
    theirs = env.get_response(ToolCall(id=str(i), name=name, arguments=args)).content
    try:
        mine = as_text(getattr(ours, name)(**args))
    except Exception as exc:
        mine = f"Error: {exc}"
    return mine, theirs


def main() -> None:
    for domain, make in (("airline", airline_env), ("retail", retail_env)):
        cls, _ = _TOOLKITS[domain]
        calls, bad_outputs, bad_dbs = 0, [], []
        for task in data.load_tasks(domain, "base"):
            env, ours = make(), cls(data.fresh_db(domain))
            actions = expected_actions(task) * 2
            for i, a in enumerate(actions):
                calls += 1
                mine, theirs = call_both(env, ours, a["name"], a["arguments"], i)
                if parse(mine) != parse(theirs):
                    bad_outputs.append((task["id"], a["name"], mine[:200], theirs[:200]))
            if norm(env.tools.db.model_dump()) != norm(ours.db):
                bad_dbs.append(task["id"])
        print(
            f"{domain}: {calls} calls, {len(bad_outputs)} output mismatches, final-DB mismatches: {bad_dbs}"
        )
        for row in bad_outputs[:10]:
            print("   ", row)

    env, ours = airline_env(), _TOOLKITS["airline"][0](data.fresh_db("airline"))
    reads = [
        ("list_all_airports", {}),
        ("calculate", {"expression": "1/0"}),
        ("calculate", {"expression": "(3+4)*2.5"}),
        ("get_flight_status", {"flight_number": "HAT001", "date": "2024-05-03"}),
        ("get_flight_status", {"flight_number": "HAT001", "date": "2030-01-01"}),
    ]
    for o, d in itertools.permutations(["JFK", "SFO", "LAX", "ORD", "DFW", "SEA"], 2):
        for date in ("2024-05-16", "2024-05-20", "2024-05-09"):
            reads += [
                (n, {"origin": o, "destination": d, "date": date})
                for n in ("search_direct_flight", "search_onestop_flight")
            ]
    bad = [
        (n, a)
        for i, (n, a) in enumerate(reads)
        if len({repr(parse(t)) for t in call_both(env, ours, n, a, i)}) > 1
    ]
    print(f"airline reads: {len(reads)} calls, {len(bad)} output mismatches {bad[:5]}")


if __name__ == "__main__":
    main()
