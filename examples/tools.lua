-- tools.lua: two Lua tools and one turn that uses them.
--
-- Shows: ai.tool with the parameter shorthand and with a full JSON Schema, a handler that calls
-- another tool, ai.take_turn running the calls the model asks for (a step's calls run at once),
-- and what the turn hands back: the reply, the stop reason, usage and one event per tool call.
--
-- Offline, on its bundled cassette:
--   colony run --replay examples/tools.jsonl examples/tools.lua
-- Live (any configured provider):
--   colony run examples/tools.lua "Plan a picnic in Lyon on Saturday."

local forecast = ai.tool{
  name = "weather.forecast",
  description = "The forecast for a city, a number of days ahead (0 is today).",
  parameters = { city = "string", days_ahead = "integer?" },
  handler = function(args)
    local days = args.days_ahead or 0
    return { city = args.city, days_ahead = days, sky = days > 3 and "rain" or "sun", celsius = 19 }
  end,
}

local packing = ai.tool{
  name = "picnic.packing_list",
  description = "What to pack for a picnic, given the city and how many days ahead it is.",
  parameters = {
    type = "object",
    properties = {
      city = { type = "string" },
      days_ahead = { type = "integer", minimum = 0 },
      people = { type = "integer", minimum = 1 },
    },
    required = { "city", "people" },
  },
  handler = function(args)
    -- A tool may call another tool (or ai.ask): here, the forecast decides the list.
    local weather = forecast({ city = args.city, days_ahead = args.days_ahead })
    local list = { "blanket", ("%d sandwiches"):format(args.people * 2), "water" }
    if weather.sky == "rain" then list[#list + 1] = "umbrellas" else list[#list + 1] = "sun cream" end
    return { items = list }
  end,
}

local request = arg[1] or "Plan a picnic for 4 people in Lyon in 2 days: check the weather and what to pack."
local turn = ai.take_turn{
  system = "You plan outings. Use the tools, then answer in two sentences.",
  prompt = request,
  tools = { forecast, packing },
  max_steps = 4,
}

for _, e in ipairs(turn.tool_events) do
  print(("tool %s: %s (%s)"):format(e.name, e.kind, e.outcome))
end
print(turn.reply)
print(("stop=%s steps=%d tokens in=%d out=%d"):format(turn.stop, turn.steps, turn.usage.input, turn.usage.output))
if turn.error then error(turn.error) end
