"""A hand-written MCP server on stdio (no SDK) with no tools and two fixed resources (no
templates): `notes` (text) and `logo` (a PNG's bytes, base64), for a client that offers a few
resources as one tool each."""

import base64
import json
import sys

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
RESOURCES = [
    {"uri": "file:///notes.md", "name": "notes", "description": "The team's notes.",
     "mimeType": "text/markdown"},
    {"uri": "file:///logo.png", "name": "logo", "mimeType": "image/png"},
]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


while True:
    line = sys.stdin.readline()
    if not line:
        break
    message = json.loads(line)
    method, mid = message.get("method"), message.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {
            "protocolVersion": "2025-11-25", "capabilities": {"tools": {}, "resources": {}},
            "serverInfo": {"name": "docs", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": []}})
    elif method == "resources/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"resources": RESOURCES}})
    elif method == "resources/templates/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"resourceTemplates": []}})
    elif method == "resources/read":
        uri = message["params"]["uri"]
        if uri == "file:///notes.md":
            contents = [{"uri": uri, "mimeType": "text/markdown", "text": "# Notes\nShip on Friday."}]
        elif uri == "file:///logo.png":
            contents = [{"uri": uri, "mimeType": "image/png",
                         "blob": base64.b64encode(PNG).decode()}]
        else:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32002, "message": "no " + uri}})
            continue
        send({"jsonrpc": "2.0", "id": mid, "result": {"contents": contents}})
    elif mid is not None and method is not None:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": method}})
