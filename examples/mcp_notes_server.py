"""An example MCP server (stdio) built with the mcp SDK: a small note store plus a word counter.

Run by chatgym through ``MCPToolset`` or a tool configuration file (examples/tools.yaml)::

    python examples/mcp_notes_server.py        # speaks MCP on stdin/stdout

Needs ``pip install 'chatgym[mcp]'``. The notes live in this process, so they last as long as the
server: one episode when each env starts its own server.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("notes", log_level="WARNING")
NOTES: dict[str, str] = {}


@server.tool()
def save_note(key: str, text: str) -> str:
    """Save a note under a key (replacing any note with that key).

    Args:
        key: The note's key, for example "groceries" or "12345".
        text: The note's text.
    """
    NOTES[key] = text
    return f"saved note {key!r} ({len(text)} characters)"


@server.tool()
def read_note(key: str) -> str:
    """Read the note saved under a key.

    Args:
        key: The note's key.
    """
    if key not in NOTES:  # ToolError: the message reaches the model (other exceptions are hidden)
        raise ToolError(f"no note with key {key!r}; keys: {sorted(NOTES)}")
    return NOTES[key]


@server.tool()
def count_words(text: str) -> int:
    """Count the whitespace-separated words of a text.

    Args:
        text: The text to count.
    """
    return len(text.split())


if __name__ == "__main__":
    server.run()  # stdio transport
