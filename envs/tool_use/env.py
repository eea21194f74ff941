"""ToolUse-v0: function calling on BFCL (the Berkeley Function-Calling Leaderboard, ``bfcl-eval``).

Pick the category with ``gym.make("ToolUse-v0", category="simple")`` (see
:data:`chatgym.envs.tool_use.bfcl.CATEGORIES`). Each entry brings its own functions; they are offered as OpenAI
tool schemas (BFCL's ``dict``/``float``/``tuple``/``any`` types mapped to JSON Schema) in
``env.tools`` and ``info["tools"]``, and the model's calls are read from its text by ``parser``
(hermes by default) or taken from an OpenAI-style message's ``tool_calls``.

* AST categories (``simple``, ``multiple``, ``parallel``, ``parallel_multiple`` and their ``live_``
  versions): one assistant turn; nothing is executed. Reward 1.0 when the calls match the entry's
  ``possible_answer`` by BFCL's own rules (:mod:`chatgym.envs.tool_use.bfcl.checker`: name, required/unknown
  parameters, type conversion, string normalisation, ``any``, empty values), else 0.0; a reply whose
  calls do not all decode scores 0.0. Parallel calls are matched to the expected calls by BFCL's
  greedy in-order pass (``parallel_matching="bfcl"``, the default, so a score means what a BFCL
  score means); ``parallel_matching="optimal"`` accepts any one-to-one assignment instead (BFCL's
  pass rejects some valid orders, e.g. on ``parallel_178``).
* ``irrelevance`` / ``live_irrelevance``: one turn; reward 1.0 iff the reply holds no function call,
  as BFCL decides it: a reply whose calls do not decode (a malformed call, arguments that are not a
  JSON object) counts as no call, as in BFCL's decoder.
* Multi-turn (``multi_turn_base``, ``_miss_func``, ``_miss_param``, ``_long_context``): the calls run
  on fresh instances of BFCL's Python backends, loaded with the entry's ``initial_config``; results
  come back as ``tool`` messages. A turn without calls ends the user's turn: it is checked against
  the ground truth (backend state, results, see :mod:`chatgym.envs.tool_use.bfcl.multi_turn`) and the next
  user message follows. For ``_miss_func`` the held-back functions are added to the tools when their
  turn comes, and the user message lists them (the chat template's tool list is fixed at reset).
  Reward 1.0 when every turn passes, else 0.0; the episode ends at the first failed turn.
  ``info["reward_components"]["turns_passed"]`` is the fraction of user turns passed.

``reference_action()`` gives the ground-truth calls (the first allowed value of each parameter), so
the scripted reference reaches reward 1.0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from chatgym.envs import messages as M
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome, load_prompt
from chatgym.envs.tool_use.bfcl import check_calls
from chatgym.envs.tool_use.bfcl import multi_turn as mt
from chatgym.envs.tool_use.bfcl.checker import MATCHING
from chatgym.envs.tool_use.bfcl.data import CATEGORIES, canonical_category, load_category, to_openai_tool
from chatgym.envs.tools import Tool, ToolResult, decode_arguments

# BFCL's own wording when held-back functions become available (bfcl_eval.constants.default_prompts).
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
NO_CALL_REPLY = "None of the available functions can be used for this request."


def _not_executed(**_: Any) -> str:
    # AST categories score the calls without running them; react() never reaches a tool.
    raise RuntimeError("ToolUse-v0 does not execute the functions of single-turn BFCL categories")


def _first_allowed(options: list[Any], spec: dict[str, Any]) -> Any:
    """The first non-omitted allowed value, made concrete for dict / list-of-dict parameters."""
    value = next((o for o in options if o != ""), "")
    if spec.get("type") == "dict" and isinstance(value, dict):
        return _concrete_dict(value)
    if spec.get("type") == "array" and spec.get("items", {}).get("type") == "dict" and isinstance(value, list):
        return [_concrete_dict(d) if isinstance(d, dict) else d for d in value]
    return value


def _concrete_dict(allowed: dict[str, Any]) -> dict[str, Any]:
    # Inside possible answers a dict maps each key to its allowed values; "" = the key may be left out.
    out = {}
    for key, options in allowed.items():
        if not isinstance(options, list):
            out[key] = options
        elif "" not in options:
            out[key] = options[0]
    return out


def decode_calls(
    turn: AssistantTurn, wire_calls: list[Any] | None = None
) -> tuple[list[tuple[str, dict[str, Any]]] | None, str]:
    """The turn's calls as ``[(name, arguments)]``, or ``(None, why)`` when the reply does not decode.

    BFCL decodes a reply as a whole (a handler's ``decode_ast``: one ``{name: arguments}`` per call,
    an exception when any fails), and an undecodable reply holds no function call: it fails an AST
    entry and passes an irrelevance entry. Calls that came structured (``wire_calls``, an OpenAI
    message's ``tool_calls``) are decoded as BFCL's function-calling handlers do: ``json.loads`` of
    each ``arguments`` text, which must give an object (a JSON string holding JSON does not). Calls
    written in the text are read by the env's parser; any call it cannot read makes the reply
    undecodable.
    """
    if wire_calls:
        decoded = []
        for n, call in enumerate(wire_calls, 1):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                return None, f"tool call {n}: not an OpenAI function call"
            raw = fn.get("arguments")
            try:
                args = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError as exc:
                return None, f"tool call {n}: arguments are not valid JSON ({exc})"
            if not isinstance(args, dict):
                return None, f"tool call {n}: arguments are not a JSON object"
            decoded.append((fn.get("name"), args))
        return decoded, ""
    if turn.parsed.errors:
        return None, "; ".join(turn.parsed.errors)
    decoded = []
    for call in turn.parsed.calls:
        args, err = decode_arguments(call)
        if err:
            return None, err
        decoded.append((call["function"]["name"], args))
    return decoded, ""


def reference_calls(answer: list[dict[str, Any]], functions: list[dict[str, Any]]) -> list[M.ToolCall]:
    """Tool calls that satisfy a BFCL ``ground_truth`` (omittable parameters left out)."""
    docs = {f["name"]: f for f in functions}
    calls = []
    for i, expected in enumerate(answer):
        (name, allowed), = expected.items()
        params = docs.get(name, {}).get("parameters", {})
        required, props = set(params.get("required", [])), params.get("properties", {})
        args = {
            p: _first_allowed(opts, props.get(p, {}))
            for p, opts in allowed.items()
            if "" not in opts or p in required
        }
        calls.append(M.make_tool_call(name, args, f"call_{i}"))
    return calls


class ToolUseEnv(ChatEnv):
    """ToolUse-v0 (see the module docstring).

    Args:
        category: a BFCL category (``simple``, ``multiple``, ``parallel``, ``parallel_multiple``,
            ``live_*``, ``irrelevance``, ``live_irrelevance``, ``multi_turn_base`` (alias
            ``multi_turn``), ``multi_turn_miss_func``, ``multi_turn_miss_param``,
            ``multi_turn_long_context``).
        split: only ``test`` (BFCL is an evaluation set).
        max_turns: assistant turns per episode; default 1 for single-turn categories and
            ``max_steps_per_turn`` times the number of user turns for multi-turn ones.
        max_steps_per_turn: assistant turns allowed per user turn in multi-turn categories.
        parallel_matching: how several calls are matched to several expected calls: ``"bfcl"``
            (default; BFCL's greedy pass, the official score) or ``"optimal"`` (any one-to-one
            assignment; see :func:`chatgym.envs.tool_use.bfcl.check_calls`).

    Raises:
        ValueError: unknown category, split or ``parallel_matching``, or ``tools`` given (each
            entry brings its own).
        ImportError: bfcl-eval is not installed (at the first reset).
    """

    def __init__(
        self,
        *,
        category: str = "simple",
        split: str = "test",
        max_turns: int | None = None,
        max_steps_per_turn: int = 8,
        parallel_matching: str = "bfcl",
        **kwargs: Any,
    ):
        if split != "test":
            raise ValueError(f"ToolUse-v0: BFCL has only a 'test' split, got {split!r}")
        if kwargs.get("tools") or kwargs.get("tools_config") is not None:
            raise ValueError("ToolUse-v0: tools come from each BFCL entry; do not pass tools= or tools_config=")
        self.category = canonical_category(category)
        self.kind = CATEGORIES[self.category][1]
        if max_steps_per_turn < 1:
            raise ValueError(f"max_steps_per_turn must be >= 1, got {max_steps_per_turn}")
        if parallel_matching not in MATCHING:
            raise ValueError(f"parallel_matching must be one of {MATCHING}, got {parallel_matching!r}")
        self.parallel_matching = parallel_matching
        super().__init__(split=split, max_turns=max_turns or 1, **kwargs)
        self._max_turns_arg = max_turns
        self.max_steps_per_turn = max_steps_per_turn
        self.system_prompt = load_prompt(__package__, "tool_use_system.txt")
        self.backends: dict[str, Any] = {}
        self._static_tools: dict[str, dict[str, Tool]] = {}
        self._wire_calls: list[Any] | None = None
        self._truth_backends: dict[str, Any] = {}
        self._results: list[str] = []
        self._user_turn = 0
        self._calls_this_turn = 0
        self._reference_sent = False

    def load_tasks(self, split: str) -> Sequence[dict[str, Any]]:
        return load_category(self.category)

    # ---- per-episode set-up -----------------------------------------------------------------

    async def on_reset(self, task: dict[str, Any]) -> None:
        self._user_turn = 0
        self._calls_this_turn = 0
        self._reference_sent = False
        self._results = []
        if self.kind != "multi_turn":
            # Never executed, so the same Tool objects serve every episode of the entry (building
            # one checks its schema against the JSON-Schema meta-schema: ~10 ms a function).
            if task["id"] not in self._static_tools:
                self._static_tools[task["id"]] = {
                    f["name"]: Tool(**to_openai_tool(f), fn=_not_executed) for f in task["function"]
                }
            self.tool_map = dict(self._static_tools[task["id"]])
            return
        long_context = self.category == "multi_turn_long_context"
        classes = task["involved_classes"]
        self.backends = mt.make_backends(classes, task["initial_config"], long_context)
        self._truth_backends = mt.make_backends(classes, task["initial_config"], long_context)
        held_back = {n for names in task.get("missed_function", {}).values() for n in names}
        hidden = held_back | set(task.get("excluded_function", []))
        self._docs = {d["name"]: d for d in mt.function_docs(classes)}
        self._methods = mt.methods(self.backends)
        self.tool_map = {name: self._backend_tool(d) for name, d in self._docs.items() if name not in hidden}
        self.max_turns = self._max_turns_arg or self.max_steps_per_turn * len(task["question"])

    def _backend_tool(self, doc: dict[str, Any]) -> Tool:
        method = self._methods[doc["name"]]

        def run(**arguments: Any) -> ToolResult:
            out = mt.call_method(method, (), arguments)
            self._results.append(out)
            return ToolResult(out, is_error=out.startswith("Error during execution"))

        return Tool(**to_openai_tool(doc), fn=run)

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        first = [dict(m) for m in task["question"][0]]
        if first and first[0]["role"] == "system":  # live entries bring their own system prompt
            first[0]["content"] = f"{self.system_prompt}\n\n{first[0]['content']}"
            return first
        return [M.system(self.system_prompt), *first]

    # ---- scoring ----------------------------------------------------------------------------

    def _to_turn(self, action: str | M.Message) -> AssistantTurn:
        # Keep the calls as sent: BFCL decodes the wire arguments itself (see decode_calls).
        self._wire_calls = action.get("tool_calls") if isinstance(action, dict) else None
        return super()._to_turn(action)

    async def react(self, turn: AssistantTurn) -> StepOutcome:
        if self.kind == "irrelevance":
            decoded, _ = decode_calls(turn, self._wire_calls)
            called = bool(decoded)  # undecodable (None) or empty: BFCL's "no function call"
            info = {"reward_components": {"no_call": float(not called)}, "success": not called}
            return StepOutcome(reward=float(not called), terminated=True, info=info)
        if self.kind == "ast":
            return self._score_ast(turn)
        if turn.parsed.calls or turn.parsed.errors:
            self._calls_this_turn += len(turn.parsed.calls)
            return await super().react(turn)
        return self._end_user_turn()

    def _score_ast(self, turn: AssistantTurn) -> StepOutcome:
        decoded, error = decode_calls(turn, self._wire_calls)
        if decoded is not None:
            result = check_calls(decoded, self.task["ground_truth"], self.task["function"], self.parallel_matching)
            error = result.error
        ok = not error
        info = {"reward_components": {"calls_match": float(ok)}, "check_error": error, "success": ok}
        return StepOutcome(reward=float(ok), terminated=True, info=info)

    def _check_user_turn(self, k: int) -> str:
        """Run turn k's ground truth on the truth backends; why the model's turn fails ("" = passes)."""
        truth_calls = self.task["ground_truth"][k]
        truth_methods = mt.methods(self._truth_backends)
        truth_results = []
        for text in truth_calls:
            name, args, kwargs = mt.parse_call(text)
            truth_results.append(mt.call_method(truth_methods[name], args, kwargs))
        if not truth_calls:
            return f"turn {k}: expected no function call, got {self._calls_this_turn}" if self._calls_this_turn else ""
        if not self._calls_this_turn:
            return f"turn {k}: expected function calls, got none"
        diffs = mt.state_differences(self.backends, self._truth_backends)
        if diffs:
            return f"turn {k}: backend state differs from the ground truth in {', '.join(diffs)}"
        missing = mt.missing_results(truth_results, self._results)
        if missing:
            return f"turn {k}: results of ground-truth calls are missing: {json.dumps(missing)[:300]}"
        return ""

    def _end_user_turn(self) -> StepOutcome:
        n = len(self.task["question"])
        k = self._user_turn
        error = self._check_user_turn(k)
        passed = k if error else k + 1
        info = {"reward_components": {"turns_passed": passed / n}, "check_error": error, "user_turn": k}
        if error or k + 1 == n:
            info["success"] = not error
            return StepOutcome(reward=0.0 if error else 1.0, terminated=True, info=info)
        self._user_turn = k = k + 1
        self._calls_this_turn = 0
        self._reference_sent = False
        new = [dict(m) for m in self.task["question"][k]]
        added = self.task.get("missed_function", {}).get(str(k), [])
        if added:
            tools = [self._backend_tool(self._docs[name]) for name in added]
            self.tool_map.update({t.name: t for t in tools})
            listing = json.dumps([t.schema for t in tools], ensure_ascii=False)
            new.append(M.user(f"{listing}\n{ADDED_FUNCTIONS_PROMPT}"))
        return StepOutcome(messages=new, info=info)

    # ---- scripted reference -----------------------------------------------------------------

    def reference_action(self) -> str | M.Message:
        """The ground-truth calls (single-turn categories: all at once; multi-turn: the current user
        turn's calls, then a reply without calls that ends the turn); no call for irrelevance.

        Multi-turn: the reference remembers that it sent the turn's calls, so call it once per step.
        """
        if self.task is None:
            raise RuntimeError("call reset() before reference_action()")
        if self.kind == "irrelevance":
            return NO_CALL_REPLY
        if self.kind == "ast":
            return M.assistant("", reference_calls(self.task["ground_truth"], self.task["function"]))
        truth = self.task["ground_truth"][self._user_turn]
        if self._reference_sent or not truth:
            return "Done." if truth else "I cannot do that with the information and functions I have."
        self._reference_sent = True
        calls = []
        for i, text in enumerate(truth):
            name, args, kwargs = mt.parse_call(text)
            arguments = mt.keyword_arguments(self._methods[name], args, kwargs) if name in self._methods else kwargs
            calls.append(M.make_tool_call(name, arguments, f"call_{i}"))
        return M.assistant("", calls)
