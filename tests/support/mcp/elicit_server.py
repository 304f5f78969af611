"""A hand-written MCP server on stdio (no SDK) whose one tool, `signup`, asks the client's user
for a form (`elicitation/create`: a name, an age, a plan from a list, and whether to subscribe,
false by default) whatever capabilities the client declared, and answers with what came back
as JSON text."""

import json
import sys

FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name"},
        "age": {"type": "integer", "description": "Your age in years"},
        "plan": {"type": "string", "enum": ["basic", "pro"]},
        "subscribe": {"type": "boolean", "default": False},
    },
    "required": ["name", "age"],
}


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


calls = {}
while True:
    line = sys.stdin.readline()
    if not line:
        break
    message = json.loads(line)
    method = message.get("method")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": message["id"], "result": {
            "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
            "serverInfo": {"name": "signup", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": message["id"], "result": {"tools": [
            {"name": "signup", "description": "signs the user up",
             "inputSchema": {"type": "object"}}]}})
    elif method == "tools/call":
        asked = "elicit-%s" % message["id"]
        calls[asked] = message["id"]
        send({"jsonrpc": "2.0", "id": asked, "method": "elicitation/create", "params": {
            "mode": "form", "message": "Who are you?", "requestedSchema": FORM}})
    elif message.get("id") in calls:
        answer = message.get("result", message.get("error"))
        send({"jsonrpc": "2.0", "id": calls.pop(message["id"]), "result": {
            "content": [{"type": "text", "text": json.dumps(answer, sort_keys=True)}]}})
