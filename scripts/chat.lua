-- chat.lua: a multi-turn chat client with tools, streaming and Markdown (`colony chat`).
--
-- Usage (through the binary): colony chat [--use=USE] [--provider=P] [--model=M] [--new]
--   [--history] [--clear] [--file=PATH]... [--tool=NAME]... [[--] QUESTION]
-- The binary gives it a store of its own ($XDG_STATE_HOME/colony/chat): one conversation per
-- use-type (`conversation/<use>`) and the tools the user enabled (`tools`). Everything here is
-- the public Lua API: copy it (`colony scripts cat chat > mine.lua`) and change what you like.

local settings = { use = "chat" } -- provider and model may join
local new, show_history, clear = false, false, false
local attachments, enable = {}, {}
local question
for i = 1, #arg do
  local a = arg[i]
  if a == "--" then
    question = table.concat(arg, " ", i + 1)
    break
  end
  local k, v = a:match("^%-%-(%w+)=(.*)$")
  if k == "file" then
    attachments[#attachments + 1] = v
  elseif k == "tool" then
    enable[#enable + 1] = v
  elseif k then
    settings[k] = v
  elseif a == "--new" then
    new = true
  elseif a == "--history" then
    show_history = true
  elseif a == "--clear" then
    clear = true
  elseif a:sub(1, 1) ~= "-" then
    -- A copy run as `colony run mine.lua "question"` takes it as `colony chat` does (it was
    -- dropped without a word, and the copy ended at once).
    question = table.concat(arg, " ", i)
    break
  else
    io.stderr:write("chat.lua: unknown option ", a, " (the question goes last, or after --)\n")
    os.exit(2)
  end
end

local styled = term.styled()
local SYSTEM = "You are a helpful assistant in a terminal chat. Be concise; use Markdown "
  .. "(lists, tables, fenced code) when it makes an answer clearer."

-- Styles for the lines the client itself writes (tool calls, notes); plain when not styled.
local function dim(s) return styled and ("\27[2m" .. s .. "\27[0m") or s end
local function note(s) io.stderr:write(s, "\n") end

-- Set while a reply streams: keeps the exchange so far, for a chat that ends mid-reply.
local keep_partial = nil

--- Writes a streamed delta to stdout. A reader that went away (`| head -c1`) ends the chat
--- quietly, status 0, at once rather than at the answer's end, the question and what had
--- arrived kept in the conversation (as Ctrl-C keeps them); any other failure (a full disk)
--- is said, status 1.
-- On a terminal, the model's text is shown without its control characters (tabs and newlines
-- kept): an escape sequence in a reply (which text from an attached file can put there) set
-- the clipboard (OSC 52), the window's title, or cleared the screen.
local to_terminal = term.is_tty("stdout")
local function without_controls(text) return (text:gsub("[%z\1-\8\11-\31\127]", "")) end
local function shown_safely(text)
  if not to_terminal then return text end
  return without_controls(text)
end

local function show(text)
  local ok, err, code = io.write(shown_safely(text))
  if ok then ok, err, code = io.flush() end
  if ok then return end
  if code == 32 then
    if keep_partial then keep_partial() end
    os.exit(0)
  end
  note("colony chat: cannot write to stdout: " .. tostring(err))
  os.exit(1)
end

-- The conversation, kept in the store. A calls list may carry the model's reasoning under a
-- string key, which JSON cannot hold beside the list: it is kept beside it instead.
local function conversation_key(use) return "conversation/" .. use end

local function load(use)
  local saved, err = store.get(conversation_key(use))
  if err then error("colony chat: cannot read the conversation: " .. tostring(err), 0) end
  saved = saved or {}
  for _, m in ipairs(saved) do
    if m.tool_calls and m.reasoning then
      m.tool_calls.reasoning, m.reasoning = m.reasoning, nil
    end
  end
  return saved
end

-- The most of one file any model's API takes (a larger one is refused before it is read).
local MOST_SENT = 75000000

--- An attachment as the conversation keeps it: its path, and its size and time when attached
--- (nil for one that names no path). Kept ones pass as they are; a path is looked at now.
local function attachment_record(f)
  if type(f) == "table" and type(f.path) == "string" and f.size then return f end
  local path = type(f) == "string" and f or (type(f) == "table" and f.path)
  if type(path) ~= "string" then return nil end
  local st = fs.stat(path)
  return { path = path, size = st and st.size, modified = st and st.modified }
end

--- The path to send for a kept attachment, or nil and why it cannot be sent.
local function sendable(rec)
  local st = fs.stat(rec.path)
  if not st or st.is_dir then return nil, "no longer available" end
  if not st.is_file then return nil, "no longer a regular file" end
  if rec.size and (st.size ~= rec.size or st.modified ~= rec.modified) then
    return nil, "changed since it was attached, not sent"
  end
  if st.size > MOST_SENT then return nil, "too large to send" end
  return rec.path
end

-- Only attachments named by path are kept: a file table a turn hands back refers to this
-- run's copy of the file, which the next run does not have.
local function by_path(files)
  local kept = {}
  for _, f in ipairs(files) do
    kept[#kept + 1] = attachment_record(f)
  end
  return #kept > 0 and kept or nil
end

local function save(use, messages)
  local out = {}
  for i, m in ipairs(messages) do
    local copy = {}
    for k, v in pairs(m) do copy[k] = v end
    if m.files then copy.files = by_path(m.files) end
    if m.tool_calls and m.tool_calls.reasoning then
      local calls = {}
      for j, c in ipairs(m.tool_calls) do calls[j] = c end
      copy.tool_calls, copy.reasoning = calls, m.tool_calls.reasoning
    end
    out[i] = copy
  end
  local ok, err = store.set(conversation_key(use), out)
  if not ok then note("colony chat: the conversation could not be saved: " .. tostring(err)) end
end

-- Tools the user may enable. They are off until asked for (`--tool NAME`, `/tools on NAME`),
-- since each lets the model reach something on this machine or the network.
local LIMIT = 20000
local function capped(text)
  if #text > LIMIT then return text:sub(1, LIMIT) .. "\n[truncated]" end
  return text
end

local builtin = {
  read_file = ai.tool{
    name = "read_file",
    description = "Read a text file on the user's machine (a path relative to where the chat started, or absolute).",
    parameters = { path = "string" },
    handler = function(args)
      local text, err = fs.read(args.path)
      if not text then return nil, tostring(err) end
      return capped(text)
    end,
  },
  list_dir = ai.tool{
    name = "list_dir",
    description = "List the names in a folder on the user's machine.",
    parameters = { path = "string" },
    handler = function(args)
      local names, err = fs.list(args.path)
      if not names then return nil, tostring(err) end
      return table.concat(names, "\n")
    end,
  },
  fetch = ai.tool{
    name = "fetch",
    description = "Fetch a URL over HTTP(S) and return its status and body.",
    parameters = { url = "string" },
    handler = function(args)
      local resp, err = http.get(args.url, { timeout = 20 })
      if not resp then return nil, tostring(err) end
      return "HTTP " .. resp.status .. "\n" .. capped(resp.body or "")
    end,
  },
}
local builtin_names = { "read_file", "list_dir", "fetch" }

local enabled = {}
for _, name in ipairs(store.get("tools") or {}) do enabled[name] = true end

local function set_tool(name, on)
  if not builtin[name] then
    return false, "no tool " .. name .. " (tools: " .. table.concat(builtin_names, ", ") .. ")"
  end
  enabled[name] = on or nil
  local list = {}
  for _, n in ipairs(builtin_names) do
    if enabled[n] then list[#list + 1] = n end
  end
  store.set("tools", json.array(list))
  return true
end

for _, name in ipairs(enable) do
  local ok, err = set_tool(name, true)
  if not ok then error("colony chat: --tool " .. err, 0) end
end

-- Whether the use-type's model takes tools: `tools = "none"` in its config (or general's) says not.
local function takes_tools(use)
  local by = {}
  for _, row in ipairs(colony.config()) do by[row.use] = row end
  local row = by[use] or by.general
  return not (row and row.tools == "none")
end

-- A turn's spinner, stopped while a server asks the person something.
local pause_spinner = function() end

-- A field's answer as its schema types it: nil and why when it does not read as one.
local function typed(text, field)
  local kind = field.type
  if field.enum then
    for _, choice in ipairs(field.enum) do
      if text == tostring(choice) then return choice end
    end
    return nil, "one of: " .. table.concat(field.enum, ", ")
  elseif kind == "number" or kind == "integer" then
    local n = tonumber(text)
    if not n or (kind == "integer" and math.type(n) ~= "integer") then
      return nil, "a" .. (kind == "integer" and "n integer" or " number")
    end
    return n
  elseif kind == "boolean" then
    local t = text:lower()
    if t == "y" or t == "yes" or t == "true" then return true end
    if t == "n" or t == "no" or t == "false" then return false end
    return nil, "yes or no"
  end
  return text
end

-- A server asks the person at the terminal (elicitation): its message, then each field of its
-- form, typed as the schema says (in the order of their names; an empty line leaves a field
-- out, which its default fills). Ctrl-D declines, Ctrl-C cancels. On a terminal the questions
-- go beside the reply; piped, on stderr, and the answers come from the next lines of input.
local function ask_person(req)
  pause_spinner()
  local out = styled and io.stdout or io.stderr
  out:write(dim("[" .. req.server .. "] asks: ") .. (req.message or "") .. "\n")
  out:flush()
  local function read(prompt)
    local line, why = term.readline(prompt)
    if line then return line end
    return nil, why == "interrupted" and "cancel" or "decline"
  end
  if req.mode == "url" then
    out:write("  open " .. tostring(req.url) .. "\n")
    out:flush()
    local _, gave_up = read("  press Enter when done (Ctrl-D declines) ")
    return gave_up or "accept"
  end
  local props = (req.schema or {}).properties or {}
  local required = {}
  for _, name in ipairs((req.schema or {}).required or {}) do required[name] = true end
  local names = {}
  for name in pairs(props) do names[#names + 1] = name end
  table.sort(names)
  local content = {}
  for _, name in ipairs(names) do
    local field = props[name]
    local label = field.title or name
    local hint = field.enum and (" (" .. table.concat(field.enum, "/") .. ")")
      or field.type == "boolean" and " (y/n)" or ""
    if field.default ~= nil then hint = hint .. " [" .. tostring(field.default) .. "]" end
    if field.description then out:write(dim("  " .. field.description) .. "\n") end
    while true do
      -- The line editor shows its prompt on a terminal only.
      if not term.is_tty("stdin") then out:write("  " .. label .. hint .. ":\n"); out:flush() end
      local line, gave_up = read("  " .. label .. hint .. ": ")
      if not line then return gave_up end
      if line == "" and (not required[name] or field.default ~= nil) then break end
      local value, why = typed(line, field)
      if value ~= nil then
        content[name] = value
        break
      end
      out:write("  " .. label .. " is " .. (why or "required") .. "\n")
      out:flush()
    end
  end
  return { action = "accept", content = content }
end

-- MCP tools come from the MCP client's cache once it is there (not for a model without tools);
-- their servers' questions are asked at the terminal.
local function cached_tools(use)
  if not takes_tools(use) then return {} end
  if mcp and mcp.cached_tools then return mcp.cached_tools{ on_elicit = ask_person } or {} end
  return {}
end

local function offered_tools(use)
  local list = {}
  for _, name in ipairs(builtin_names) do
    if enabled[name] then list[#list + 1] = builtin[name] end
  end
  for _, t in ipairs(cached_tools(use)) do list[#list + 1] = t end
  return list
end

local function short(text, n)
  text = (text or ""):gsub("%s+", " ")
  if #text > n then return text:sub(1, n - 1) .. "…" end
  return text
end

-- One line per call as it ends: its name, its arguments (shortened) and how it went.
local function show_call(event)
  local outcome = event.ok and "ok" or (event.kind .. ": " .. short(event.outcome, 60))
  -- The arguments and the outcome are the model's and the tool's words: no escapes pass.
  local said = event.name .. " " .. short(event.arguments, 60) .. " → " .. outcome
  local line = dim("  ⚙ " .. without_controls(said)) .. "\n"
  -- On a terminal beside the reply; piped, on stderr, so stdout is the answer alone.
  local out = term.styled() and io.stdout or io.stderr
  out:write(line)
  out:flush()
end

local function print_history(messages)
  if #messages == 0 then
    print("(no conversation yet)")
    return
  end
  for _, m in ipairs(messages) do
    if m.role == "user" then
      print("> " .. (m.content or ""):gsub("\n", "\n> "))
      for _, f in ipairs(m.files or {}) do print(dim("  [attached " .. (type(f) == "table" and (f.path or f.name) or f) .. "]")) end
    elseif m.role == "assistant" then
      if m.content and m.content ~= "" then print(m.content) end
      for _, c in ipairs(m.tool_calls or {}) do print(dim("  ⚙ " .. c.name .. " " .. short(c.args, 60))) end
    end
    if m.role ~= "tool" then print() end
  end
end

local function transcript(use, messages)
  local out = { "# colony chat (" .. use .. ")", "" }
  for _, m in ipairs(messages) do
    if m.role == "user" then
      out[#out + 1] = "## You"
      out[#out + 1] = ""
      out[#out + 1] = m.content or ""
      for _, f in ipairs(m.files or {}) do
        out[#out + 1] = "*attached: " .. (type(f) == "table" and (f.path or f.name) or f) .. "*"
      end
      out[#out + 1] = ""
    elseif m.role == "assistant" then
      for _, c in ipairs(m.tool_calls or {}) do
        out[#out + 1] = "> tool `" .. c.name .. "` " .. short(c.args, 200)
        out[#out + 1] = ""
      end
      if m.content and m.content ~= "" then
        out[#out + 1] = "## Assistant"
        out[#out + 1] = ""
        out[#out + 1] = m.content
        out[#out + 1] = ""
      end
    end
  end
  return table.concat(out, "\n")
end

-- One exchange: the question goes out with the whole history; the reply streams in, then is
-- rendered as Markdown over what streamed. Ctrl-C cancels it; the history keeps the question
-- and what had arrived, marked as interrupted.
local function exchange(use, messages, text, files)
  local entry = { role = "user", content = text }
  if files and #files > 0 then entry.files = files end
  -- Attachments are kept by path, with the size and time each had when attached: one that has
  -- gone since, or changed, or is no longer a file that can be sent, is sent as a line saying
  -- so (by its name), so the conversation goes on without it. A changed file was sent as if it
  -- were the one asked about; a path that had become a pipe failed every later message.
  local history, records = {}, {}
  for i, m in ipairs(messages) do
    local kept, present, gone = {}, {}, {}
    for _, f in ipairs(m.files or {}) do
      local rec = attachment_record(f)
      if rec then
        local path, why = sendable(rec)
        if path then
          kept[#kept + 1], present[#present + 1] = rec, path
        else
          gone[#gone + 1] = (rec.path:match("[^/]+$") or rec.path) .. ": " .. why
        end
      elseif type(f) == "table" then
        -- A file given by its bytes (a copy of the script that attaches data): as it was.
        kept[#kept + 1], present[#present + 1] = f, f
      end
    end
    records[i] = #kept > 0 and kept or nil
    if m.files then
      local copy = {}
      for k, v in pairs(m) do copy[k] = v end
      copy.files = #present > 0 and present or nil
      if #gone > 0 then
        copy.content = (m.content or "") .. "\n\n[attached " .. table.concat(gone, "; ") .. "]"
      end
      history[i] = copy
    else
      history[i] = m
    end
  end
  history[#history + 1] = entry
  if entry.files then
    local kept = {}
    for _, f in ipairs(entry.files) do kept[#kept + 1] = attachment_record(f) or f end
    records[#history] = kept
  end

  -- What streamed since the last tool call, kept in pieces: joining each delta onto a string
  -- made a long answer cost its length squared.
  local pieces, spinner = {}, term.spinner("thinking")
  local function shown() return table.concat(pieces) end
  local function ends_line() return pieces[#pieces]:sub(-1) == "\n" end
  local function stop_spinner()
    if spinner then spinner:stop(); spinner = nil end
  end
  pause_spinner = stop_spinner
  local opts = {
    messages = history, system = SYSTEM, tools = offered_tools(use),
    use = use, provider = settings.provider, model = settings.model,
    stream = function(delta)
      stop_spinner()
      if delta ~= "" then pieces[#pieces + 1] = delta end
      show(delta)
    end,
    on_tool = function(event)
      stop_spinner()
      if #pieces > 0 then
        if not ends_line() then io.write("\n") end
        pieces = {}
      end
      show_call(event)
    end,
    on_step = function(report)
      stop_spinner()
      -- A step that called tools is followed by another: wait for it as for the first.
      if #(report.calls or {}) > 0 then spinner = term.spinner("thinking") end
    end,
  }
  -- A misuse the turn raises (an attached file that has since gone, say) is reported like a
  -- failed call rather than ending the chat.
  -- What is saved of the exchange so far keeps the attachments as they were kept.
  local function kept_files()
    for i, m in ipairs(history) do
      if m.files then m.files = records[i] end
    end
  end
  keep_partial = function()
    kept_files()
    history[#history + 1] = { role = "assistant", content = shown() .. "\n\n[interrupted: stdout closed]" }
    save(use, history)
  end
  local ok, done, turn = term.interruptible(function() return pcall(ai.take_turn, opts) end)
  keep_partial = nil
  stop_spinner()
  -- A reply that failed after some of it was shown (the connection dropped mid-answer) keeps
  -- the question and what was shown, marked: the person read it, and it was lost.
  local function failed(why)
    if #pieces > 0 then
      -- Flushed before the note: on a terminal (stdout and stderr on one screen) the note
      -- came first and ran on from the reply's last word.
      io.write("\n")
      io.stdout:flush()
      kept_files()
      history[#history + 1] = { role = "assistant", content = shown() .. "\n\n[cut short: " .. why .. "]" }
      note("colony chat: " .. why .. " (the question and the part shown are kept in the conversation)")
      return history, "cut"
    end
    note("colony chat: " .. why .. " (the question was not added to the conversation)")
    return messages, "error"
  end
  if ok and not done then
    -- The message alone: Lua's traceback says nothing to a person chatting.
    return failed((tostring(turn):gsub("\nstack traceback:.*$", "")))
  end
  if not ok then
    kept_files()
    if #pieces > 0 then io.write("\n") end
    -- Ctrl-C cancels this reply; SIGTERM or SIGHUP (`turn` names it) ends the chat, this
    -- exchange kept as far as it went.
    local by = turn ~= "SIGINT" and turn or "the user"
    history[#history + 1] = { role = "assistant", content = shown() .. "\n\n[interrupted by " .. by .. "]" }
    if turn ~= "SIGINT" then
      note("colony chat: ended by " .. turn .. " (the conversation is kept)")
      return history, turn
    end
    if question and question ~= "" then
      note(dim("[interrupted: the conversation is kept]"))
    else
      note(dim("[interrupted: the conversation is kept; Ctrl-C at the prompt exits]"))
    end
    return history, "interrupted"
  end
  if turn.error then
    return failed(tostring(turn.error))
  end
  local all = shown()
  if styled and turn.reply ~= "" and all == turn.reply and term.erase(all) then
    io.write(term.render(turn.reply))
  elseif all == "" then
    io.write(shown_safely(turn.reply))
  end
  if not (all ~= "" and all:sub(-1) == "\n") then io.write("\n") end
  io.flush()
  -- An answer the model did not finish is said to be so (it printed as if whole, and an empty
  -- refusal as nothing at all).
  local cut = ({
    max_tokens = "[the answer was cut off at the model's output limit (max_tokens)]",
    refusal = "[the model refused to answer]",
    content_filter = "[the provider's content filter stopped the answer]",
  })[turn.stop]
  if cut then note(dim(cut)) end
  -- The messages sent keep their attachments as they were kept (by path, with their size and
  -- time), whatever the transcript the turn hands back carries for them.
  local out = turn.messages
  for i, sent in ipairs(history) do
    local back = out[i]
    if back and back.role == sent.role and back.content == sent.content then
      back.files = records[i]
    end
  end
  return out
end

local use = settings.use
if clear then
  -- Said of a conversation that was never there too (a misspelt --use), it read as done.
  local existed, err = store.delete(conversation_key(use))
  if err then error("colony chat: " .. tostring(err), 0) end
  print(existed and ("conversation " .. use .. " cleared") or ("no conversation " .. use .. " to clear"))
  return
end
local messages = load(use)
if show_history then
  print_history(messages)
  return
end
if new then
  messages = {}
  save(use, messages)
end

-- The status a chat ended by a signal exits with (128 + its number, as a shell reports it).
local SIGNAL_STATUS = { interrupted = 130, SIGHUP = 129, SIGTERM = 143 }

local pending = attachments
if question and question ~= "" then
  local updated, failed = exchange(use, messages, question, pending)
  if failed ~= "error" then save(use, updated) end
  if failed then os.exit(SIGNAL_STATUS[failed] or 1) end
  return
end

-- Interactive.
local HELP = [[
/new          start a new conversation      /use NAME     switch use-type (and conversation)
/model NAME   use another model             /tools [on|off NAME]  list or switch tools
/attach PATH  attach a file to the next message
/save FILE    write the conversation as Markdown
/history      print the conversation        /exit         leave (so do Ctrl-C and Ctrl-D)]]
local errors = 0
if term.is_tty("stdin") then
  note(dim("colony chat (" .. use .. ", " .. #messages .. " messages so far): /help for commands"))
end
local unreadable = 0
while true do
  local line, why = term.readline(use .. "> ")
  if not line then
    if why == "interrupted" or why == "eof" then break end
    -- Input that is not UTF-8 text, say (a stray byte in a paste): that line is left out and
    -- the chat goes on; it ended the session. A reader that keeps failing ends it.
    unreadable = unreadable + 1
    note("colony chat: cannot read that line: " .. tostring(why):gsub("^io_error: ", "")
      .. " (colony chat reads UTF-8 text); it was left out")
    if unreadable >= 10 then os.exit(1) end
    goto next_line
  end
  unreadable = 0
  local command, rest = line:match("^/(%S+)%s*(.-)%s*$")
  if command == "exit" or command == "quit" then
    break
  elseif command == "help" then
    print(HELP)
  elseif command == "new" then
    messages = {}
    save(use, messages)
    print(dim("new conversation (" .. use .. ")"))
  elseif command == "use" then
    if rest == "" then
      print(use)
    else
      use = rest
      messages = load(use)
      -- The model and provider chosen for the old use-type are not the new one's.
      settings.model, settings.provider = nil, nil
      print(dim("use-type " .. use .. " (" .. #messages .. " messages so far)"))
    end
  elseif command == "model" then
    if rest == "" then
      print(settings.model or "(the use-type's model)")
    else
      settings.model = rest
      print(dim("model " .. rest))
    end
  elseif command == "tools" then
    local switch, name = rest:match("^(%a+)%s+(%S+)$")
    if switch == "on" or switch == "off" then
      local ok, err = set_tool(name, switch == "on")
      print(ok and dim(name .. " " .. switch) or err)
    else
      for _, n in ipairs(builtin_names) do
        print((enabled[n] and "[on]  " or "[off] ") .. n .. "  " .. builtin[n].description)
      end
      for _, t in ipairs(cached_tools(use)) do
        print("[mcp] " .. (t.name or "?") .. "  " .. short(t.description, 60))
      end
    end
  elseif command == "attach" then
    -- No shell reads this line: `~/` is expanded here, as a shell would have.
    local home = os.getenv("HOME")
    if home and (rest == "~" or rest:sub(1, 2) == "~/") then rest = home .. rest:sub(2) end
    local st = rest ~= "" and fs.stat(rest)
    if rest == "" then
      print("/attach PATH")
    elseif not st then
      print("no such file: " .. rest)
    elseif st.is_dir then
      print(rest .. ": a folder, not a file")
    elseif not st.is_file then
      print(rest .. ": not a regular file (a device or a pipe)")
    else
      pending[#pending + 1] = fs.absolute(rest)
      print(dim("attached " .. rest .. " to the next message"))
    end
  elseif command == "save" then
    if rest == "" then
      print("/save FILE")
    else
      local ok, err = fs.write(rest, transcript(use, messages))
      print(ok and dim("saved to " .. rest) or tostring(err))
    end
  elseif command == "history" then
    print_history(messages)
  elseif command then
    print("unknown command /" .. command .. " (/help lists them)")
  elseif line:match("%S") then
    local updated, failed = exchange(use, messages, line, pending)
    if failed ~= "error" then
      messages = updated
      save(use, messages)
      pending = {}
      -- A signal that cut the reply short ends the chat, as it would have at the prompt.
      if SIGNAL_STATUS[failed] and failed ~= "interrupted" then os.exit(SIGNAL_STATUS[failed]) end
      if failed == "cut" then errors = errors + 1 end
    else
      errors = errors + 1
      -- A file that cannot be sent (too large, unreadable) would fail every message after:
      -- the attachments go with the failed message, and the user is told how to send them.
      if #pending > 0 then
        note(dim("the files attached to that message were dropped: /attach them again to send them"))
        pending = {}
      end
    end
  end
  ::next_line::
end
-- Fed from a pipe, a failed exchange is the run's failure too.
if errors > 0 and not term.is_tty("stdin") then os.exit(1) end
