-- ask.lua: the helper; one question about colony, answered from this machine's facts (`colony ask`).
--
-- Usage (through the binary): colony ask [--use=USE] [--provider=P] [--model=M] -- QUESTION
-- The model is grounded with what colony knows of itself here: its commands, the scripts and
-- examples shipped in the binary, the providers and which keys are set, the use-types
-- configured, and the MCP servers and cached tools. One-shot and not persisted; use-type
-- `helper` unless --use says otherwise.
local opts = { use = "helper" }
local question
for i = 1, #arg do
  local a = arg[i]
  if a == "--" then
    question = table.concat(arg, " ", i + 1)
    break
  end
  local k, v = a:match("^%-%-(%w+)=(.*)$")
  if k then
    opts[k] = v
  elseif a:sub(1, 1) ~= "-" then
    -- A copy run as `colony run mine.lua "question"` takes it as `colony ask` does.
    question = table.concat(arg, " ", i)
    break
  end
end
assert(question and question ~= "", "colony ask: no question given")

-- An example's opening comment (up to its first blank comment line) and the tools it defines.
local function describe(example)
  local lines = {}
  for line in (example.source .. "\n"):gmatch("(.-)\n") do
    local text = line:match("^%-%-%s?(.*)$")
    if not text or text == "" then break end
    lines[#lines + 1] = text
  end
  local about = table.concat(lines, " "):gsub("^[%w_%./]+%.lua:%s*", "")
  local tools = {}
  for name in example.source:gmatch('name%s*=%s*"([^"]+)"%s*,%s*description%s*=') do
    tools[#tools + 1] = name
  end
  return about, tools
end

local function world()
  local out = {}
  local function add(s) out[#out + 1] = s end
  add("colony " .. colony.version .. ": a runtime in which Lua programs host AIs.")
  add("")
  add("Commands (`colony COMMAND --help` for each):")
  for _, c in ipairs(colony.commands()) do
    add("- colony " .. c.name .. ": " .. c.about)
  end
  add("")
  add("Front-end scripts compiled in (`colony scripts cat NAME` prints one to copy and change):")
  for _, s in ipairs(colony.scripts()) do
    add("- " .. s.name .. ": " .. s.summary)
  end
  add("")
  add("Example programs shipped in examples/ (each runs offline on its cassette, e.g. "
    .. "`colony run --replay examples/NAME.jsonl examples/NAME.lua`; its opening comment says how):")
  for _, e in ipairs(colony.examples()) do
    local about, tools = describe(e)
    local line = "- " .. e.file .. ": " .. about
    if #tools > 0 then
      line = line .. " Tools it defines: " .. table.concat(tools, ", ") .. "."
    else
      line = line .. " It defines no Lua tools."
    end
    add(line)
  end
  add("")
  add("Providers (a key in the environment, or in the config):")
  for _, p in ipairs(ai.providers()) do
    local key = "no key needed"
    if p.key_env and p.key_env ~= "" then
      key = os.getenv(p.key_env) and (p.key_env .. " is set") or (p.key_env .. " is not set")
    end
    add("- " .. p.id .. " (" .. p.name .. ", default model " .. p.default_model .. "): " .. key)
  end
  add("")
  local uses = colony.config()
  if #uses == 0 then
    add("Configured use-types: none (`colony config` walks through setting them).")
  else
    add("Configured use-types (`colony config list`):")
    for _, u in ipairs(uses) do
      local key = ""
      if u.key_stored then
        key = ", key stored in the config"
      elseif u.key_env then
        key = ", key from " .. u.key_env
      end
      add("- " .. u.use .. ": provider " .. (u.provider or "(default)") .. ", model "
        .. (u.model or "(default)") .. key)
    end
  end
  add("")
  local servers = (mcp and mcp.servers) and mcp.servers() or {}
  local cached = (mcp and mcp.cached_tools) and mcp.cached_tools() or {}
  if #servers == 0 then
    add("MCP servers: none configured.")
  else
    add("MCP servers:")
    for _, s in ipairs(servers) do add("- " .. tostring(s.name or s)) end
  end
  if #cached == 0 then
    add("Cached MCP tools: none.")
  else
    add("Cached MCP tools:")
    for _, t in ipairs(cached) do add("- " .. tostring(t.name) .. ": " .. tostring(t.description or "")) end
  end
  return table.concat(out, "\n")
end

--- Writes to stdout. A reader that went away (`| head -c1`) ends the command quietly, status 0,
--- at once rather than at the answer's end; any other failure (a full disk) is said, status 1.
local function out(...)
  local ok, err, code = io.write(...)
  if ok then ok, err, code = io.flush() end
  if ok then return end
  if code == 32 then os.exit(0) end
  io.stderr:write("colony ask: cannot write to stdout: ", tostring(err), "\n")
  os.exit(1)
end

local streamed = false
opts.stream = function(delta)
  streamed = true
  out(delta)
end
opts.system = "You are colony's helper, answering a user of colony on their own machine. "
  .. "Answer briefly and concretely from the facts below first, naming the exact commands, "
  .. "scripts and example files; say so when something is not among them.\n\n" .. world()

-- With a tool cache (`colony tools refresh`), the cached MCP tools are offered: the answer is a
-- turn that may call them (each server starts on its first call); without, one plain call.
-- A use-type whose model takes no tools (`tools = "none"`) is not offered them.
local function takes_tools(use)
  local by = {}
  for _, row in ipairs(colony.config()) do by[row.use] = row end
  local row = by[use] or by.general
  return not (row and row.tools == "none")
end
local cached = (mcp and mcp.cached_tools and takes_tools(opts.use)) and mcp.cached_tools() or {}
-- One try, a turn (one plain call without tools): the reply and why the model stopped, or nil,
-- the error (a table) and the text that tells it.
local called = false
opts.prompt = question
if #cached > 0 then
  opts.tools = cached
  opts.on_tool = function(event)
    called = true
    io.stderr:write("[tool] ", event.name, " ", event.ok and "ok" or ("error: " .. tostring(event.outcome)), "\n")
  end
end
local function attempt()
  local turn = ai.take_turn(opts)
  if turn.error then
    return nil, turn.error, tostring(turn.error)
  end
  return turn.reply, nil, nil, turn.stop
end

-- An answer the model did not finish, said after it (it printed as if whole).
local cut_short = {
  max_tokens = "the answer was cut off at the model's output limit (max_tokens)",
  refusal = "the model refused to answer",
  content_filter = "the provider's content filter stopped the answer",
}

-- A failure that passes (a 429, a 503, a dropped connection) before any text arrived and before
-- any tool ran is tried twice more, after what the provider asks to wait (10 s at most), or
-- 1 s, then 3 s. Not a timeout: each try would wait the whole of it again.
local reply, err, told, stop
local waits = { 1, 3 }
for try = 1, #waits + 1 do
  reply, err, told, stop = attempt()
  if reply or streamed or called or try > #waits or type(err) ~= "table" or not err.transient
    or tostring(err.message):find("timed out after", 1, true) then
    break
  end
  local wait = math.min(err.retry_after or waits[try], 10)
  io.stderr:write(("colony ask: %s; trying again in %g s\n"):format(told, wait))
  ai.sleep(wait * 1000)
end
if not reply then
  -- Text that streamed before the failure ends its line first.
  if streamed then out("\n") end
  io.stderr:write("colony ask: ", told, "\n")
  os.exit(1)
end
if not streamed then out(reply) end
out("\n")
if cut_short[stop] then io.stderr:write("colony ask: ", cut_short[stop], "\n") end
