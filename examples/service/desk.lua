-- examples/service/desk.lua: a front desk run as a service (`colony serve`), whose AI keeps its
-- conversation across restarts and counts what it is told in a ledger.
--
-- Shows: a resident that keeps its conversation (`persist_conversation`: mail the API accepted
-- is saved before the `202`, so a crash or a restart loses none), replying to the host
-- (`deliver_to = "host"`: under `colony serve` every reply is an event on /api/events), and a
-- tool that writes to the program's store.
--
--   colony serve --allow-write=examples/service/pages.log \
--     examples/service/desk.lua examples/service/pager.lua
--   curl -X POST localhost:7878/api/programs/desk/mail -d '{"to":"desk","content":"hello"}'
--   curl -N localhost:7878/api/events

local ledger = ai.tool{
  name = "ledger",
  description = "Counts one note in the desk's ledger and answers how many there are",
  parameters = { note = "string" },
  handler = function(args)
    local n = (store.get("notes") or 0) + 1
    store.set("notes", n)
    return { notes = n, last = args.note }
  end,
}

ai.spawn{
  name = "desk",
  system = "You staff a front desk. Note each request in the ledger, then answer in one sentence.",
  tools = { ledger },
  persist_conversation = true,
  deliver_to = "host",
}

print("the desk closes: " .. ai.watch{})
