"""A plain Gymnasium loop over CodeSandbox-v0 with a scripted policy (no model needed).

The policy plays a HumanEval problem the way a tool-using model would: first it tries the
reference solution on the docstring's first example with ``run_python``, then it ``submit``s it.
Replace ``scripted_policy`` with calls to your model (render ``obs`` with its chat template, parse
its reply) to evaluate it.

    python examples/custom_loop.py
"""

from __future__ import annotations

import json

import gymnasium as gym

import chatgym  # noqa: F401  (registers the env ids)


def tool_call(name: str, **arguments: str) -> str:
    """An assistant turn holding one hermes-format (Qwen-style) tool call."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def scripted_policy(task: dict, turn: int) -> str:
    """Turn 0: run the solution on a quick call; turn 1: submit it."""
    solution = task["prompt"] + task["canonical_solution"]
    if turn == 0:
        return tool_call("run_python", code=solution + f"\nprint({task['entry_point']!r}, 'defined')\n")
    return tool_call("submit", code=solution)


def main(n_episodes: int = 3, seed: int = 0) -> None:
    env = gym.make("CodeSandbox-v0", split="test")
    rewards = []
    for episode in range(n_episodes):
        # Seed once; later resets continue the env's random stream (the Gymnasium convention).
        obs, info = env.reset(seed=seed if episode == 0 else None)
        task = env.unwrapped.task
        print(f"episode {episode}: {info['task_id']} ({task['entry_point']})")
        terminated = truncated = False
        turn, total = 0, 0.0
        while not (terminated or truncated):
            action = scripted_policy(task, turn)
            obs, reward, terminated, truncated, info = env.step(action)
            total += reward
            for message in obs:
                print(f"  [{message['role']}] {message['content'].splitlines()[-1]}")
            turn += 1
        print(f"  reward {total:.1f} ({info.get('grade_status')})")
        rewards.append(total)
    env.close()
    print(f"mean reward over {n_episodes} episodes: {sum(rewards) / len(rewards):.2f}")


if __name__ == "__main__":
    main()
