// The TypeScript SDK's client against colony's MCP server: `node sdk_client.mjs SDK_DIR stdio
// COMMAND ARGS...` or `... SDK_DIR http URL [TOKEN]`. Lists the tools, makes the calls named in
// CALLS (a JSON list of [name, arguments]) and prints one JSON object, as sdk_client.py does.
const [sdk, mode, ...rest] = process.argv.slice(2);
const { Client } = await import(`${sdk}/dist/esm/client/index.js`);
const client = new Client({ name: "colony-test", version: "1.0.0" });
let transport;
if (mode === "stdio") {
  const { StdioClientTransport } = await import(`${sdk}/dist/esm/client/stdio.js`);
  transport = new StdioClientTransport({ command: rest[0], args: rest.slice(1), env: process.env, stderr: "inherit" });
} else {
  const { StreamableHTTPClientTransport } = await import(`${sdk}/dist/esm/client/streamableHttp.js`);
  const headers = rest[1] ? { Authorization: `Bearer ${rest[1]}` } : {};
  transport = new StreamableHTTPClientTransport(new URL(rest[0]), { requestInit: { headers } });
}
await client.connect(transport);
const out = { progress: [], calls: [], version: transport.protocolVersion ?? null };
// Progress is recorded as it arrives, not through `onprogress`: the SDK runs a notification's
// handler a microtask later but a response's at once, and the response drops the call's
// progress handler; a progress notification read in the same chunk as the response it precedes
// never reaches `onprogress` (seen under load). `onprogress` is still given, so the SDK sends a
// progress token; only notifications for a token it sent count.
const sent = new Set();
const send = transport.send.bind(transport);
transport.send = (message, options) => {
  const token = message.params?._meta?.progressToken;
  if (token !== undefined) sent.add(token);
  return send(message, options);
};
const receive = transport.onmessage;
transport.onmessage = (message, extra) => {
  if (message.method === "notifications/progress" && sent.has(message.params?.progressToken)) {
    out.progress.push(message.params.message ?? null);
  }
  receive(message, extra);
};
const tools = await client.listTools();
out.tools = tools.tools.map((t) => t.name).sort();
for (const [name, args] of JSON.parse(process.env.CALLS ?? "[]")) {
  const r = await client.callTool({ name, arguments: args }, undefined, {
    onprogress: () => {},
    timeout: 60000,
  });
  const text = r.content.filter((c) => c.type === "text").map((c) => c.text).join("");
  out.calls.push({ name, text, is_error: Boolean(r.isError) });
}
console.log(JSON.stringify(out));
await client.close();
