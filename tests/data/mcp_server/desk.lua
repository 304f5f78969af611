-- A program served over MCP by the tests (tests/mcp_server.rs): two exportable tools, one that
-- is not, and a resident offered as a tool. `add` counts its runs in the store, so a test can
-- see that a call refused for its arguments never reached the handler.
ai.tool{
  name = "add", description = "Adds two numbers", exportable = true,
  parameters = { a = "number", b = "number" },
  handler = function(args, ctx)
    store.set("add_runs", (store.get("add_runs") or 0) + 1)
    if ctx.progress then ctx.progress(1, 2, "half way") end
    if ctx.log then ctx.log("info", { adding = { args.a, args.b } }) end
    print("this line must not reach the client")
    return { sum = args.a + args.b }
  end,
}
ai.tool{
  name = "add_runs", description = "How often add ran", exportable = true, parameters = {},
  handler = function() return tostring(store.get("add_runs") or 0) end,
}
ai.tool{
  name = "wipe", description = "Not for callers outside", parameters = {},
  handler = function() store.set("wiped", true) return "wiped" end,
}
ai.spawn{
  name = "helper", system = "You answer questions in one line.",
  export = { description = "Ask the helper a question" },
  deliver_to = function(text) io.stderr:write("delivered elsewhere: " .. text .. "\n") end,
}
print("this line must not reach the client either")
ai.watch()
