"""A tiny MCP server (stdio) for the MCP tools test: integer arithmetic."""

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("calc")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    if b == 0:
        raise ToolError("division by zero")  # an expected failure: its message reaches the model
    return a / b


if __name__ == "__main__":
    server.run("stdio")
