"""MCP servers' tools as LangChain tools, over the MCP SDK (stdio transport).

``langchain-mcp-adapters`` does the same for the MCP SDK 1.x; vLLM needs the 2.x SDK, so this
small adapter keeps MCP tools usable in the environment that also runs the vLLM engines.
Each call opens its own session (like the adapters' default), so tools are stateless and
safe to call from concurrent rollouts; a stateful environment wants an `RLTool`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.tools import StructuredTool, ToolException

__all__ = ["load_mcp_tools"]


async def load_mcp_tools(
    command: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> list[StructuredTool]:
    """The tools of the MCP server that ``command args`` starts (stdio), as LangChain tools.

    A tool call that the server reports as an error raises `ToolException`, which
    `sdk.ToolNode` turns into an error message for the model.

    Raises:
        TimeoutError: The server did not list its tools within ``timeout_s``.
    """
    params = _params(command, args, env)

    async def list_tools(session: Any) -> list[Any]:
        return list((await session.list_tools()).tools)

    specs = await asyncio.wait_for(_with_session(params, list_tools), timeout=timeout_s)
    return [_as_tool(params, spec, timeout_s) for spec in specs]


def _params(command: str, args: Sequence[str], env: Mapping[str, str] | None) -> Any:
    from mcp import StdioServerParameters

    return StdioServerParameters(command=command, args=list(args),
                                 env=dict(env) if env is not None else None)


async def _with_session(params: Any, use: Any) -> Any:
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await use(session)


def _as_tool(params: Any, spec: Any, timeout_s: float) -> StructuredTool:
    async def call(**arguments: Any) -> str:
        async def run(session: Any) -> Any:
            return await session.call_tool(spec.name, arguments)

        result = await asyncio.wait_for(_with_session(params, run), timeout=timeout_s)
        text = "\n".join(getattr(part, "text", str(part)) for part in result.content)
        if result.is_error:
            raise ToolException(text)
        return text

    return StructuredTool.from_function(
        coroutine=call, name=spec.name, description=spec.description or spec.name,
        args_schema=spec.input_schema,
    )
