-- A program served over MCP whose tools ask the client that called them (tests/mcp_server.rs):
-- `ask_model` samples the client's model (ctx.sample), `ask_user` asks the client's user
-- (ctx.elicit). Each answers what it heard, or the error's kind and message, so a test reads both.
ai.tool{
  name = "ask_model", description = "Asks the client's model", exportable = true,
  parameters = { question = "string" },
  handler = function(args, ctx)
    local r, err = ctx.sample{
      messages = { { role = "user", content = args.question } },
      system = "Answer in one word.", max_tokens = 20, temperature = 0.5,
      model_preferences = { hints = { "small" }, speed_priority = 0.75 },
    }
    if not r then return { error = err.kind, message = err.message } end
    return { text = r.text, model = r.model, role = r.role, stop_reason = r.stop_reason }
  end,
}
ai.tool{
  name = "ask_user", description = "Asks the client's user", exportable = true,
  parameters = { who = "string" },
  handler = function(args, ctx)
    local r, err = ctx.elicit{
      message = "Which city, " .. args.who .. "?",
      schema = { properties = {
        city = { type = "string", description = "A city" },
        days = { type = "integer", default = 3 },
      }, required = { "city" } },
    }
    if not r then return { error = err.kind, message = err.message } end
    return { action = r.action, content = r.content }
  end,
}
ai.tool{
  name = "close_stream", description = "Closes its SSE stream (not over stdio)", exportable = true,
  parameters = {},
  handler = function(_, ctx)
    local closed, err = ctx.close_stream()
    return { closed = closed or false, error = err and err.kind, message = err and err.message }
  end,
}
