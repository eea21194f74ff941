"""Chat environments: messages, the ChatEnv contract and its checker, tools, tool-call parsers, and the envs."""

from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome
from chatgym.envs.env_checker import ChatEnvCheckError, check_chat_env
from chatgym.envs.messages import Message, ToolCall
from chatgym.envs.parsers import ParsedAction, ToolCallParser, get_parser
from chatgym.envs.tools import Tool, ToolResult, register_tool, run_tool_calls, tool

__all__ = [
    "AssistantTurn",
    "ChatEnv",
    "ChatEnvCheckError",
    "Message",
    "ParsedAction",
    "StepOutcome",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolResult",
    "check_chat_env",
    "get_parser",
    "register_tool",
    "run_tool_calls",
    "tool",
]
