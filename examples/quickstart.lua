-- quickstart.lua: one question, one tool, and the round trip run by hand with ai.ask.
--
-- Shows: offering a tool, reading the calls the model asked for, answering each with a `tool`
-- message, and asking again for the final answer.
--
-- Offline, on its bundled cassette:
--   colony run --replay examples/quickstart.jsonl examples/quickstart.lua
-- Live (any configured provider, e.g. ANTHROPIC_API_KEY set in the environment):
--   colony run examples/quickstart.lua "What's the weather in Lisbon?"

local weather = {
  name = "weather.current",
  description = "The current weather in a city.",
  parameters = {
    type = "object",
    properties = { city = { type = "string", description = "City name" } },
    required = { "city" },
  },
}

-- A stand-in for a real weather service.
local function current_weather(args)
  return { city = args.city, sky = "clear", celsius = 21 }
end

local question = arg[1] or "What's the weather in Paris right now? Use the tool."
local history = { { role = "user", content = question } }
local opts = { tools = { weather }, system = "Answer in one short sentence." }

local reply, err, calls = ai.ask(history, opts)
if not reply then error(err) end

if calls then
  history[#history + 1] = { role = "assistant", content = reply, tool_calls = calls }
  for _, call in ipairs(calls) do
    print(("tool call: %s %s"):format(call.name, call.args))
    local result = current_weather(call.arguments or {})
    history[#history + 1] = { role = "tool", tool_call_id = call.id, content = json.encode(result) }
  end
  reply, err = ai.ask(history, opts)
  if not reply then error(err) end
end

print(reply)
