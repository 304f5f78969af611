-- The client the MCP conformance suite drives (`conformance client --command "colony run THIS"`):
-- it appends its mock server's URL, names the scenario in MCP_CONFORMANCE_SCENARIO and gives
-- what a scenario needs (a pre-registered client's id and secret) in MCP_CONFORMANCE_CONTEXT.
local url = assert(arg[1], "the conformance harness passes the server URL")
local scenario = os.getenv("MCP_CONFORMANCE_SCENARIO") or ""

local context = {}
if os.getenv("MCP_CONFORMANCE_CONTEXT") then
  context = assert(json.decode(os.getenv("MCP_CONFORMANCE_CONTEXT")))
end

local opts = { name = "conformance" }
if scenario:find("^auth/") then
  -- The suite's authorization server approves at once: colony takes its redirect itself.
  opts.auth = {
    authorize = "headless",
    client_metadata_url = "https://conformance-test.local/client-metadata.json",
  }
  if context.client_id then
    opts.auth.client_id = context.client_id
    opts.auth.client_secret = context.client_secret
  end
  if scenario:find("^auth/client%-credentials") then
    opts.auth.grant = "client_credentials"
    opts.auth.client_metadata_url = nil
    if context.private_key_pem then
      opts.auth.private_key = context.private_key_pem
      opts.auth.signing_algorithm = context.signing_algorithm
    end
  end
  if scenario == "auth/cross-app-access-complete-flow" then
    -- The enterprise's identity provider has signed the person in: its ID token is exchanged.
    opts.auth = {
      grant = "enterprise",
      client_id = context.client_id,
      client_secret = context.client_secret,
      idp_issuer = context.idp_issuer,
      idp_token_endpoint = context.idp_token_endpoint,
      idp_client_id = context.idp_client_id,
      id_token = context.idp_id_token,
    }
  end
end
if scenario == "elicitation-sep1034-client-defaults" then
  -- Accept every form as it comes: colony fills in the schema's defaults.
  opts.on_elicit = function(req)
    print("elicit", req.server, req.mode, req.message)
    return "accept"
  end
end

local conn, err = mcp.connect(url, opts)
if not conn then
  io.stderr:write("connect failed: ", tostring(err), "\n")
  os.exit(1)
end
local tools, lerr = mcp.tools(conn)
if not tools then
  io.stderr:write("tools/list failed: ", tostring(lerr), "\n")
  os.exit(1)
end
for _, t in ipairs(tools) do print("tool", t.name) end
if scenario == "tools_call" then
  print("add_numbers", mcp.call(conn, "add_numbers", { a = 5, b = 3 }))
else
  -- Every other scenario: call each tool the server lists, with no arguments.
  for _, t in ipairs(tools) do
    local name = t.name:gsub("^conformance__", "")
    print(name, mcp.call(conn, name, {}))
  end
end
mcp.close(conn)
