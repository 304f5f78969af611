"""The Python SDK's client against colony's MCP server: `sdk_client.py stdio COMMAND ARGS...` or
`sdk_client.py http URL [TOKEN]`. Lists the tools, then makes the calls named in the CALLS
environment variable (a JSON list of [name, arguments]) and prints one JSON object: the tool
names, each call's text and isError, and the progress messages heard.

With ANSWERS (a JSON object with `sampling`: the text its model answers, and/or `elicitation`:
the result its user gives), it declares those capabilities and answers the server's requests;
each request's params are reported under `asked`."""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client


def callbacks(out):
    """The sampling and elicitation callbacks ANSWERS asks for (none without it)."""
    answers = json.loads(os.environ.get("ANSWERS", "{}"))
    kw = {}
    if "sampling" in answers:

        async def sampling(context, params):
            out["asked"].append(
                {"sampling": params.model_dump(mode="json", exclude_none=True, by_alias=True)}
            )
            return types.CreateMessageResult(
                role="assistant",
                content=types.TextContent(type="text", text=answers["sampling"]),
                model="py-model",
                stopReason="endTurn",
            )

        kw["sampling_callback"] = sampling
    if "elicitation" in answers:

        async def elicitation(context, params):
            out["asked"].append(
                {"elicitation": params.model_dump(mode="json", exclude_none=True, by_alias=True)}
            )
            return types.ElicitResult(**answers["elicitation"])

        kw["elicitation_callback"] = elicitation
    return kw


async def session_run(read, write):
    out = {"progress": [], "calls": [], "asked": []}
    async with ClientSession(read, write, **callbacks(out)) as session:
        init = await session.initialize()
        out["version"] = str(init.protocol_version)
        tools = await session.list_tools()
        out["tools"] = sorted(t.name for t in tools.tools)

        for name, args in json.loads(os.environ.get("CALLS", "[]")):

            async def progress(p, total, message):
                out["progress"].append(message)

            r = await session.call_tool(name, args, progress_callback=progress)
            text = "".join(c.text for c in r.content if getattr(c, "type", "") == "text")
            out["calls"].append({"name": name, "text": text, "is_error": bool(r.is_error)})
    print(json.dumps(out), flush=True)


async def main(argv):
    if argv[0] == "stdio":
        params = StdioServerParameters(command=argv[1], args=argv[2:], env=dict(os.environ))
        async with stdio_client(params) as streams:
            await session_run(streams[0], streams[1])
    else:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        headers = {"Authorization": f"Bearer {argv[2]}"} if len(argv) > 2 else {}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as client:
            async with streamable_http_client(argv[1], http_client=client) as streams:
                await session_run(streams[0], streams[1])


asyncio.run(main(sys.argv[1:]))
