-- watcher.lua: a source watches a folder and mails its AI about new files; the AI decides which
-- ones a person should hear about and says so through a `notify` tool.
--
-- Shows: a resident with a source (a Lua function forked when the watch starts, `self` being the
-- AI's name), one mail per scan listing every new file, waiting for the AI to be idle again with
-- ai.residents() before the next scan (so the AI never has two mails in flight), a tool the AI
-- reports through, deliver_to printing its closing line, and ai.stop ending the watch.
--
-- The first scan counts every file already in the folder as new. A file changed in the last
-- QUIET seconds is still being written (a copy, a download): it is left for a later scan, so the
-- AI reads it whole, not the start it had when the scan came by. The watch ends after SCANS
-- scans, one second apart (default 2; 0 watches until Ctrl-C). FOLDER is relative to this
-- script's folder (default `watched`, three sample files).
--
-- It keeps what it knows across restarts: the AI's conversation (`persist_conversation`) and the
-- files already announced (`store`), in the program's state directory (`colony state
-- examples/watcher.lua` prints it; `--state DIR` picks another). Stop it, start it again: the AI
-- carries on its conversation and only files that are new since are mailed.
--
-- Offline, on its bundled cassette:
--   colony run --replay examples/watcher.jsonl examples/watcher.lua
-- Live (any configured provider), watching a folder of your own until Ctrl-C:
--   colony run examples/watcher.lua /path/to/inbox 0

local folder = arg[1] or "watched"
local scans = math.tointeger(tonumber(arg[2] or "2"))
if not scans or scans < 0 then
  io.stderr:write(("watcher.lua: SCANS must be a whole number, 0 or more (0 watches until "
    .. "Ctrl-C), not %q\n"):format(arg[2]))
  os.exit(2)
end
local INTERVAL_MS = 1000
local QUIET = 2 -- seconds a file must go unchanged before it is read
local EXCERPT = 600 -- characters of each new file the AI sees

local notify = ai.tool{
  name = "notify",
  description = "Tell the person who owns the folder about something that needs their attention.",
  parameters = {
    type = "object",
    properties = {
      file = { type = "string", description = "The file this is about" },
      urgency = { type = "string", enum = { "low", "normal", "high" } },
      message = { type = "string", description = "One or two sentences: what it is and what to do" },
    },
    required = { "file", "urgency", "message" },
  },
  handler = function(args)
    print(("notify (%s) %s: %s"):format(args.urgency, args.file, args.message))
    return "notified"
  end,
}

-- The plain files in the folder that nothing has written to for QUIET seconds, by name (sorted),
-- hidden ones left out.
local function files_in(dir)
  local names, err = fs.list(dir)
  if not names then error(tostring(err)) end
  local out = {}
  for _, name in ipairs(names) do
    if name:sub(1, 1) ~= "." then
      local st = fs.stat(dir .. "/" .. name)
      local quiet = not st or not st.modified or os.time() - st.modified >= QUIET
      if st and not st.is_dir and quiet then out[#out + 1] = name end
    end
  end
  return out
end

-- What the AI reads about a file: its name and the start of its text. No sizes, times or
-- absolute paths: the mail must read the same on every run for the cassette to answer it.
local function describe(dir, name)
  local text = fs.read(dir .. "/" .. name) or "(unreadable)"
  if #text > EXCERPT then text = text:sub(1, EXCERPT) .. "\n[...]" end
  text = text:gsub("%s+$", "")
  return ("### %s\n%s"):format(name, text)
end

local function state_of(name)
  for _, r in ipairs(ai.residents()) do
    if r.name == name then return r end
  end
end

-- Waits until the AI has served everything mailed to it: idle, nothing held, and its
-- conversation longer than it was before the mail.
local function settled(name, before)
  while true do
    local r = state_of(name)
    if not r or r.state == "stopped" then return end
    if r.state == "idle" and r.held == 0 and r.conversation > before then return end
    ai.sleep(20)
  end
end

local function watch_folder(self)
  local seen, n = store.get("seen") or {}, 0
  while scans == 0 or n < scans do
    if n > 0 then ai.sleep(INTERVAL_MS) end
    n = n + 1
    local new = {}
    for _, name in ipairs(files_in(folder)) do
      if not seen[name] then new[#new + 1] = name end
    end
    if #new == 0 then
      print(("scan %d: nothing new"):format(n))
    else
      print(("scan %d: %d new file(s): %s"):format(n, #new, table.concat(new, ", ")))
      local parts = { ("%d new file(s) in %s/:"):format(#new, folder) }
      for _, name in ipairs(new) do parts[#parts + 1] = describe(folder, name) end
      local before = state_of(self).conversation
      -- The id makes a repeat after a crash (mail accepted, `seen` not yet saved) harmless.
      assert(ai.mail{ to = self, source = "folder", content = table.concat(parts, "\n\n"), hop = 0,
                      id = table.concat(new, "|") })
      for _, name in ipairs(new) do seen[name] = true end
      store.set("seen", seen)
      settled(self, before)
    end
  end
  ai.stop(("%d scans done"):format(n))
end

ai.spawn{
  name = "watcher",
  system = "You watch a shared folder for its owner. You are mailed the new files that appear in "
    .. "it. Call notify once for each file that needs the owner's attention (a bill to pay, "
    .. "something broken, a deadline), with a fitting urgency; leave routine files alone. Then "
    .. "reply with one line saying what you did.",
  tools = { notify },
  max_steps = 4,
  persist_conversation = true,
  deliver_to = function(reply, info) print(("[%s] %s"):format(info.ai, reply)) end,
  sources = { watch_folder },
}

print(("watch ended: %s"):format(ai.watch{}))
