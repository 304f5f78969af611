"""The Python SDK's own client making the bench's calls: `bench_client.py URL CALLS WARMUP`.
Prints one JSON line of per-call latencies (milliseconds), measured exactly as the Rust side does."""

import asyncio
import json
import sys
import time

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url: str, calls: int, warmup: int) -> None:
    async with streamable_http_client(url) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await session.initialize()
            for _ in range(warmup):
                await session.call_tool("echo", {"text": "warm"})
            times = []
            for i in range(calls):
                start = time.perf_counter()
                result = await session.call_tool("echo", {"text": f"call {i}"})
                times.append((time.perf_counter() - start) * 1000)
                assert not result.is_error
            print(json.dumps(times))


asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
