"""Chat environments: messages, the ChatEnv contract, tools, tool-call parsers, and the envs."""

from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome
from chatgym.envs.messages import Message, ToolCall
from chatgym.envs.parsers import ParsedAction, ToolCallParser, get_parser
from chatgym.envs.tools import Tool, ToolResult, register_tool, run_tool_calls, tool

__all__ = [
    "AssistantTurn",
    "ChatEnv",
    "Message",
    "ParsedAction",
    "StepOutcome",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolResult",
    "get_parser",
    "register_tool",
    "run_tool_calls",
    "tool",
]
