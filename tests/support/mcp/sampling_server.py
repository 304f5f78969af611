"""A hand-written MCP server on stdio (no SDK) whose one tool, `ask`, sends the client a
`sampling/createMessage` whatever capabilities the client declared, and answers with what came
back (the result, or the error) as JSON text: for a client that must refuse sampling it was not
allowed, as well as one that answers."""

import json
import sys


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


capabilities = {}
calls = {}
while True:
    line = sys.stdin.readline()
    if not line:
        break
    message = json.loads(line)
    method = message.get("method")
    if method == "initialize":
        capabilities = message["params"].get("capabilities", {})
        send({"jsonrpc": "2.0", "id": message["id"], "result": {
            "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
            "serverInfo": {"name": "sampler", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": message["id"], "result": {"tools": [
            {"name": "ask", "description": "asks the client's model",
             "inputSchema": {"type": "object", "properties": {"question": {"type": "string"}}}}]}})
    elif method == "tools/call":
        asked = "sample-%s" % message["id"]
        calls[asked] = message["id"]
        question = message["params"].get("arguments", {}).get("question", "?")
        send({"jsonrpc": "2.0", "id": asked, "method": "sampling/createMessage", "params": {
            "messages": [{"role": "user", "content": {"type": "text", "text": question}}],
            "systemPrompt": "Answer in one word.", "maxTokens": 20}})
    elif message.get("id") in calls:
        answer = {"offered": "sampling" in capabilities}
        answer.update({k: message[k] for k in ("result", "error") if k in message})
        send({"jsonrpc": "2.0", "id": calls.pop(message["id"]), "result": {
            "content": [{"type": "text", "text": json.dumps(answer)}]}})
