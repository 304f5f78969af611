"""The MCP test server (official Python SDK): `server.py stdio` or `server.py http PORT`.

Tools: echo, add (structured), fail (isError), sleep (records its cancellation in $CANCEL_LOG),
roots (what our roots/list answers), and with $FILLER_TOOLS=N that many more, listed
$PAGE_SIZE at a time (the SDK does not page by itself). With $GROWING set, `grow` adds a tool of
the name it is given, takes `fail` away, and sends `notifications/tools/list_changed`.
"""

import asyncio
import os
import sys

from pydantic import BaseModel

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ListToolsResult

PAGE_SIZE = int(os.environ.get("PAGE_SIZE", "0"))
FILLER = int(os.environ.get("FILLER_TOOLS", "0"))


class Paged(MCPServer):
    async def _handle_list_tools(self, ctx, params):
        tools = await self.list_tools()
        if PAGE_SIZE <= 0:
            return ListToolsResult(tools=tools)
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + PAGE_SIZE
        page = tools[start:end]
        return ListToolsResult(tools=page, next_cursor=str(end) if end < len(tools) else None)


server = Paged("colony-test")


class Sum(BaseModel):
    sum: float


@server.tool(description="Echo the text back")
def echo(text: str) -> str:
    return text


@server.tool(description="Add two numbers")
def add(a: float, b: float) -> Sum:
    return Sum(sum=a + b)


@server.tool(description="Always fails")
def fail(message: str) -> str:
    raise ToolError(message)


@server.tool(description="Sleep for a while")
async def sleep(seconds: float) -> str:
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        log = os.environ.get("CANCEL_LOG")
        if log:
            with open(log, "a") as f:
                f.write("cancelled\n")
        raise
    return "slept"


_arrived = 0
_all_here = asyncio.Event()


@server.tool(description="Wait until n calls of meet are running at once (10 s at most)")
async def meet(n: int) -> str:
    global _arrived
    _arrived += 1
    if _arrived >= n:
        _all_here.set()
    try:
        await asyncio.wait_for(_all_here.wait(), 10)
        return "met"
    except asyncio.TimeoutError:
        return "alone"


@server.tool(description="Exit the process at once (a crash)")
def die() -> str:
    os._exit(3)


@server.tool(description="The client's roots")
async def roots(ctx: Context) -> str:
    result = await ctx.session.list_roots()
    return ",".join(str(r.uri) for r in result.roots) or "none"


if os.environ.get("GROWING"):
    @server.tool(description="Add a tool named `name`, take `fail` away, and say the tools changed")
    async def grow(name: str, ctx: Context) -> str:
        def grown() -> str:
            return f"grown {name}"
        server.add_tool(grown, name=name, description="A tool grow added")
        server.remove_tool("fail")
        await ctx.session.send_tool_list_changed()
        return f"added {name}"


for i in range(FILLER):
    def make(i):
        def filler() -> str:
            return f"filler {i}"
        return filler
    server.tool(name=f"filler_{i:03}", description=f"Filler {i}")(make(i))


if __name__ == "__main__":
    print("colony-test server starting", file=sys.stderr, flush=True)
    # ECHO_ENV names a variable whose value the server logs, as careless servers do with tokens.
    if os.environ.get("ECHO_ENV"):
        print("token is " + os.environ.get(os.environ["ECHO_ENV"], ""), file=sys.stderr, flush=True)
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
