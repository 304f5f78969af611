-- The program `cargo bench --bench soak` runs under `colony run` (see benches/soak.rs): many
-- residents, each with a `note` tool its model calls in every turn, and one source mailing them
-- round robin at a steady rate. Every SAMPLE seconds it prints one `sample` line of counts; after
-- SECS seconds it stops mailing, waits for the residents to serve what is waiting, prints a
-- `final` line and stops.
--
--   colony run benches/soak.lua RESIDENTS SECS RATE SAMPLE
local residents = tonumber(arg[1] or "1000")
local secs = tonumber(arg[2] or "600")
local rate = tonumber(arg[3] or "100")         -- mails a second, all residents together
local sample_every = tonumber(arg[4] or "30")
local drain_secs = 120

local stats = { sent = 0, accepted = 0, full = 0, other = 0, outages = 0, recovered = 0, dropped = 0 }
local filler = string.rep("The harbour log for today lists ships, cargo and berths. ", 24)

local note = ai.tool{ name = "note", description = "Write a note about the mail into the log.",
  parameters = { text = "string" },
  handler = function(args)
    return "noted (" .. #args.text .. " characters): " .. string.rep("ok ", 150)
  end }

local function counts()
  local c = { served = 0, waiting = 0, depth = 0, refused = 0, dropped = 0, conversation = 0,
              busy = 0, outage = 0 }
  for _, r in ipairs(ai.residents()) do
    c.served = c.served + r.served
    c.waiting = c.waiting + r.held
    c.refused = c.refused + r.refused
    c.dropped = c.dropped + r.dropped
    c.conversation = c.conversation + r.conversation
    if r.held > c.depth then c.depth = r.held end
    if r.state == "busy" then c.busy = c.busy + 1 end
    if r.state == "outage" then c.outage = c.outage + 1 end
  end
  return c
end

local started = os.time()

local function report(kind)
  local c = counts()
  print(string.format(
    "%s t=%d sent=%d accepted=%d refused=%d served=%d waiting=%d max_depth=%d dropped=%d "
      .. "outages=%d recovered=%d conversation_avg=%.1f busy=%d in_outage=%d",
    kind, os.time() - started, stats.sent, stats.accepted, stats.full, c.served, c.waiting,
    c.depth, stats.dropped + c.dropped, stats.outages, stats.recovered,
    c.conversation / residents, c.busy, c.outage))
  io.stdout:flush()
  return c
end

local function driver()
  local per_tick = rate / 10
  local owed, next_id, next_sample = 0, 1, sample_every
  while os.time() - started < secs do
    owed = owed + per_tick
    while owed >= 1 do
      owed = owed - 1
      local to = "r" .. ((next_id - 1) % residents + 1)
      local ok, err = ai.mail{ to = to, source = "harbour", hop = 0,
        content = "m" .. next_id .. " " .. filler }
      stats.sent = stats.sent + 1
      if ok then stats.accepted = stats.accepted + 1
      elseif err == "mailbox_full" then stats.full = stats.full + 1
      else stats.other = stats.other + 1 end
      next_id = next_id + 1
    end
    ai.sleep(100)
    if os.time() - started >= next_sample then
      report("sample")
      next_sample = next_sample + sample_every
    end
  end
  -- Served, held or waiting: let the residents finish what they accepted.
  local deadline = os.time() + drain_secs
  while os.time() < deadline do
    local c = counts()
    if c.waiting == 0 and c.busy == 0 and c.outage == 0 then break end
    ai.sleep(500)
  end
  report("final")
  ai.stop("soak done")
end

for i = 1, residents do
  ai.spawn{ name = "r" .. i, system = "You keep the harbour log. Note every mail with the note tool.",
    tools = { note }, context_window = 3000, compact_at = 0.8,
    deliver_to = function(_, info)
      if info.kind == "outage" then stats.outages = stats.outages + 1
      elseif info.kind == "recovered" then
        stats.recovered = stats.recovered + 1
        stats.dropped = stats.dropped + (info.dropped or 0)
      end
    end,
    sources = i == 1 and { driver } or nil }
end

print(ai.watch{})
