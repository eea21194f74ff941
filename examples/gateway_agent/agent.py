"""A tool-using math agent written only against the OpenAI chat API (no chatgym import).

Trained unchanged by `chatgym train examples/configs/gateway_math.yaml`: the gateway gives it a
base_url and an api_key (its session), and scores its last reply with Math-v0's own scorer.
The reward is the answer's alone: a small model (SmolLM2-135M) rarely calls the calculator
(docs/gateway.md, "What the example shows").
Run by hand against any OpenAI-compatible server:
    OPENAI_BASE_URL=... OPENAI_API_KEY=... CHATGYM_TASK='{"prompt": "What is 12 + 30?"}' python agent.py
"""

import ast
import json
import operator
import os

from openai import OpenAI

SYSTEM = (
    "You solve arithmetic problems. Call the calculator tool to evaluate any expression you are not "
    "sure of. Finish with the result in <answer></answer> tags, e.g. <answer>42</answer>."
)
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 12 * (3 + 4)"}},
            "required": ["expression"],
        },
    },
}
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.operand))
        raise ValueError("only numbers and + - * / are allowed")
    try:
        return str(ev(ast.parse(expression, mode="eval").body))
    except Exception as exc:  # the model reads the error and may try again
        return f"error: {exc}"


_CLIENTS: dict[str, OpenAI] = {}


def client_for(base_url: str, api_key: str) -> OpenAI:
    """One OpenAI client per server, copied per session: building a client loads the CA bundle
    (~50-100 ms); with_options(api_key=...) shares its connection pool (~20 us)."""
    if base_url not in _CLIENTS:
        _CLIENTS[base_url] = OpenAI(base_url=base_url, api_key="unset", max_retries=0)
    return _CLIENTS[base_url].with_options(api_key=api_key)


def run(base_url: str, api_key: str, task: dict, max_turns: int = 4) -> None:
    """One episode; returns None: the reward is the env's scorer's (reward: env)."""
    client = client_for(base_url, api_key)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["prompt"]}]
    for _ in range(max_turns):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return None
        for call in message.tool_calls:
            try:
                result = calculate(json.loads(call.function.arguments)["expression"])
            except (ValueError, KeyError, TypeError):
                result = "error: arguments must be JSON with an 'expression' string"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


if __name__ == "__main__":
    run(os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], json.loads(os.environ["CHATGYM_TASK"]))
