"""A hand-written MCP server on stdio (no SDK), for wire details: before its initialize result it
sends a notification and progress for a token nobody holds; it answers with $ANSWER_VERSION; after
`notifications/initialized` it asks the client `roots/list` (with id 0, as some servers do) and
`ping`; its one tool, `received`, answers with every message the client sent, once the client has
answered both.
With $CURSOR_AGAIN set, every tools/list and resources/list page says there is a next page, under
the cursor "again"."""

import json
import os
import sys

VERSION = os.environ.get("ANSWER_VERSION", "2025-03-26")
AGAIN = {"nextCursor": "again"} if os.environ.get("CURSOR_AGAIN") else {}
received = []


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answered(request_id):
    return any(m.get("id") == request_id and "method" not in m for m in received)


pending_call = None
while True:
    line = sys.stdin.readline()
    if not line:
        break
    message = json.loads(line)
    received.append(message)
    method = message.get("method")
    if method == "initialize":
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        send({"jsonrpc": "2.0", "method": "notifications/progress",
              "params": {"progressToken": "nobody-holds-this", "progress": 1}})
        send({"jsonrpc": "2.0", "id": message["id"], "result": {
            "protocolVersion": VERSION, "capabilities": {"tools": {}, "resources": {}},
            "serverInfo": {"name": "raw", "version": "0"}}})
    elif method == "notifications/initialized":
        send({"jsonrpc": "2.0", "id": 0, "method": "roots/list"})
        send({"jsonrpc": "2.0", "id": "server-ping", "method": "ping"})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": message["id"], "result": {"tools": [
            {"name": "received", "description": "what the client sent", "inputSchema": {"type": "object"}}],
            **AGAIN}})
    elif method == "resources/list":
        send({"jsonrpc": "2.0", "id": message["id"], "result": {"resources": [
            {"uri": "file:///one", "name": "one"}], **AGAIN}})
    elif method == "tools/call":
        pending_call = message["id"]
    if pending_call is not None and answered(0) and answered("server-ping"):
        send({"jsonrpc": "2.0", "id": pending_call, "result": {
            "content": [{"type": "text", "text": json.dumps(received)}]}})
        pending_call = None

# A client that shuts down in order closes stdin, then waits for the server to exit: say so
# where the test can see it, a moment later (a client that only killed us, or left us behind,
# has exited by then).
if os.environ.get("EOF_LOG"):
    import time
    time.sleep(1)
    with open(os.environ["EOF_LOG"], "w") as log:
        log.write("stdin closed\n")
