-- The bench-peers agent in colony: one `add` tool, the calculator instructions, a fresh
-- conversation per turn (`ai.run` with a prompt), two model calls a turn, and `ai.parallel` for
-- the turns in flight. The timed loop lives here; colony_client.rs (the harness) times it from
-- outside, through two pipes: this script writes a line at each mark and, at "start" and "end",
-- waits for the harness's "go" (Lua has no wall clock of its own yet).
--
--   colony_agent.lua TURNS CONCURRENT WARMUP PORT [MARK_FD ACK_FD]
--
-- Without the two file descriptors it also runs under `colony run` and prints its counts.

local turns, concurrent, warmup, port, mark_fd, ack_fd = ...
turns = math.tointeger(tonumber(turns or 300))
concurrent = math.tointeger(tonumber(concurrent or 0))
warmup = math.tointeger(tonumber(warmup or 5))
port = port or os.getenv("FAKE_PORT") or "8765"

local PROMPT = "What is 2+3? Use the add tool."
local INSTRUCTIONS = "You are a calculator. Always use the add tool for arithmetic."
local MODEL = "fake-model"
local BASE_URL = "http://127.0.0.1:" .. port .. "/v1"

local marks, acks
if mark_fd and ack_fd then
  marks = assert(io.open("/proc/self/fd/" .. mark_fd, "w"))
  acks = assert(io.open("/proc/self/fd/" .. ack_fd, "r"))
end

--- Tells the harness where the script is; with `wait`, blocks until it answers (the harness
--- reads the fake server's counter and the clocks meanwhile, with nothing in flight).
local function mark(line, wait)
  if not marks then return end
  marks:write(line, "\n")
  marks:flush()
  if wait then assert(acks:read("l") == "go", "the harness did not answer") end
end

mark("ready")

local tool_calls = 0 -- every run of add's handler
local runs_by_call = {} -- call id -> runs of add's handler for it (a turn collects its own)

local add = ai.tool({
  name = "add",
  description = "Add two integers.",
  parameters = {
    type = "object",
    properties = { a = { type = "integer" }, b = { type = "integer" } },
    required = { "a", "b" },
  },
  handler = function(args, ctx)
    tool_calls = tool_calls + 1
    runs_by_call[ctx.call_id] = (runs_by_call[ctx.call_id] or 0) + 1
    return args.a + args.b
  end,
})
local TOOLS = { add }

--- One fresh conversation to its end: the final text, and how often add ran for this turn's calls.
local function turn()
  local r = ai.run({
    prompt = PROMPT,
    system = INSTRUCTIONS,
    tools = TOOLS,
    provider = "openai",
    base_url = BASE_URL,
    key = "x",
    model = MODEL,
    max_steps = 5, -- the peers' cap (stepCountIs(5), max_turns=5)
  })
  if r.error then error(tostring(r.error), 0) end
  local ran = 0
  for _, e in ipairs(r.tools) do
    ran = ran + (runs_by_call[e.call_id] or 0)
    runs_by_call[e.call_id] = nil
  end
  return r.text, ran
end

local failures = {}

--- 1 for a good turn (nothing raised, the text holds "5", add ran once), else 0 and a note.
local function one()
  local ok, text, ran = pcall(turn)
  if not ok then
    failures[#failures + 1] = tostring(text):sub(1, 300)
    return 0
  end
  if string.find(text, "5", 1, true) and ran == 1 then return 1 end
  failures[#failures + 1] = string.format("bad turn: text=%q tool_calls=%d", text:sub(1, 80), ran)
  return 0
end

local function run_turns(n, c)
  local ok = 0
  if c <= 1 then
    for _ = 1, n do
      ok = ok + one()
    end
    return ok
  end
  local remaining = n
  local function worker()
    while remaining > 0 do
      remaining = remaining - 1
      local good = one() -- not `ok = ok + one()`: that may read ok before the turn waits
      ok = ok + good
    end
  end
  local workers = {}
  for i = 1, c do
    workers[i] = worker
  end
  ai.parallel(table.unpack(workers))
  return ok
end

if warmup > 0 then run_turns(1, 1) end
mark("first")
run_turns(math.max(0, warmup - 1), concurrent)
local warmup_failures = #failures

local calls_before = tool_calls
mark("start", true)
local ok = run_turns(turns, concurrent)
local report = {
  ok_turns = ok,
  tool_calls = tool_calls - calls_before,
  warmup_failures = warmup_failures,
  first_error = failures[1],
}
mark("end " .. json.encode(report), true)
if not marks then print(json.encode(report)) end
