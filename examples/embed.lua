-- examples/embed.lua: the Lua half of examples/embed.rs, a Rust application embedding colony.
--
-- The application registers a native tool, `stock.count` (an async Rust closure), loads this
-- program, mails the clerk and reads the clerk's reply from a channel. This program adds a Lua
-- tool beside the native one and hires the clerk, who answers the host (`deliver_to = "host"`).
--
--   cargo run --example embed -- --replay examples/embed.jsonl      (offline, on its cassette)
--   cargo run --example embed                                       (live, with a key set)

local dozens = ai.tool{
  name = "units.dozens",
  description = "Splits a count into dozens and the rest",
  parameters = { count = "integer" },
  handler = function(args)
    return { dozens = args.count // 12, left_over = args.count % 12 }
  end,
}

ai.spawn{
  name = "clerk",
  system = "You are a shop clerk. Look numbers up with your tools; answer in one sentence.",
  tools = { "stock.count", dozens },
  deliver_to = "host",
}

print("the clerk's watch ended: " .. ai.watch{})
