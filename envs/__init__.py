"""Chat environments: messages, the ChatEnv contract and its checker, tools, tool-call parsers, and the envs."""

from .core import AssistantTurn, ChatEnv, StepOutcome
from .env_checker import ChatEnvCheckError, check_chat_env
from .messages import Message, ToolCall
from .parsers import ParsedAction, ToolCallParser, get_parser
from .tools import Tool, ToolResult, register_tool, run_tool_calls, tool

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
