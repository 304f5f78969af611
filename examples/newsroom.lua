-- newsroom.lua: an editor AI and two reporter AIs, each a resident, mailing each other.
--
-- Shows: ai.spawn with tools, a source that posts the first mail, a `tell` tool that relays
-- mail between AIs (the sender from ai.inbound_provenance(), the hop count raised by one), a
-- `file_story` tool that gathers the reporters' work in a Lua table and mails the editor once
-- every assigned story is in, and a deliver_to that prints the front page and ends the program
-- with ai.stop. Replies the editor writes to other mail are not printed; the reporters have no
-- deliver_to and speak only through their tools.
--
-- On the cassette the editor gives the festival to ines; ines asks how late the trams run; the
-- editor brings in tom, who tells ines the times and files a piece of his own.
--
-- Offline, on its bundled cassette:
--   colony run --replay examples/newsroom.jsonl examples/newsroom.lua
-- Live (any configured provider, e.g. ANTHROPIC_API_KEY set in the environment), with the
-- publisher's brief as an optional argument:
--   colony run examples/newsroom.lua "Tomorrow's front page: the city council's budget vote."

local REPORTERS = { "ines", "tom" }

local brief = arg[1] or "The harbour festival is tonight. It leads tomorrow's front page."

-- Keeps a line of the transcript readable: the first line of a text, cut after a word near 70
-- characters.
local function short(text)
  local line = text:match("^[^\n]*")
  if #line > 72 then line = line:sub(1, 71):match("^(.*%S)%s") or line:sub(1, 70) end
  if line ~= text then line = line .. "..." end
  return line
end

-- The reporters the editor has told something (their stories are awaited), and the stories filed.
local assigned, filed, sent_to_editor = {}, {}, false

-- `tell`: one AI mails another. The mail carries the sender's name and one more hop than the
-- mail the sender is serving, so a loop of AIs relaying to each other runs out (max_hop).
local tell = ai.tool{
  name = "tell",
  description = "Send a short message to another person in the newsroom: editor, ines or tom.",
  parameters = { to = "string", text = "string" },
  handler = function(args)
    local from = ai.inbound_provenance()
    local ok, err = ai.mail{ to = args.to, source = from.ai, content = args.text, hop = from.hop + 1 }
    if not ok then return nil, ("could not reach %s: %s"):format(args.to, err) end
    if from.ai == "editor" then assigned[args.to] = true end
    print(("%s -> %s: %s"):format(from.ai, args.to, short(args.text)))
    return "sent"
  end,
}

-- `file_story`: a reporter hands in a story. The desk waits until every reporter the editor has
-- told something has filed, then mails the editor one message holding all the stories, in a
-- fixed order: the editor never has two mails in flight at once, whichever reporter is last.
local file_story = ai.tool{
  name = "file_story",
  description = "File your finished story with the desk; it goes to the editor with the others.",
  parameters = { headline = "string", text = "string" },
  handler = function(args)
    local from = ai.inbound_provenance()
    if sent_to_editor then return nil, "the edition has already gone to the editor" end
    filed[from.ai] = args
    for _, name in ipairs(REPORTERS) do
      if assigned[name] and not filed[name] then
        return "filed; the desk passes it on when every story is in"
      end
    end
    sent_to_editor = true
    local parts, names = { "Every story is in. Put the front page together." }, {}
    for _, name in ipairs(REPORTERS) do
      local story = filed[name]
      if story then
        parts[#parts + 1] = ("## %s (by %s)\n%s"):format(story.headline, name, story.text)
        names[#names + 1] = name
      end
    end
    assert(ai.mail{ to = "editor", source = "desk", content = table.concat(parts, "\n\n"), hop = from.hop + 1 })
    print(("desk -> editor: %d stories filed (%s)"):format(#names, table.concat(names, ", ")))
    return "filed; the desk passes it on when every story is in"
  end,
}

-- Every resident starts from the route: retry a failed model call a few times (live runs only).
ai.route{ middleware = { ai.with_retries{ attempts = 3 } } }

ai.spawn{
  name = "editor",
  system = "You are the editor of the Quayside Gazette, a small city paper. Your reporters are "
    .. "ines and tom; you reach them only with the tell tool, and they can tell each other. Give "
    .. "each story to one reporter. When a reporter needs something a colleague can find out, "
    .. "give that colleague the job with tell instead of guessing. When the desk sends the filed "
    .. "stories, reply with the front page: a one-line title for the edition, then each story "
    .. "under its headline, lightly edited. Otherwise keep your replies to one line.",
  tools = { tell },
  deliver_to = function(reply, info)
    -- Only the reply to the desk's mail is the front page; the rest is the editor thinking aloud.
    if info.origin ~= "desk" then return end
    print(("[editor] %s"):format(reply))
    ai.stop("the edition is out")
  end,
  sources = { function(self)
    print(("publisher -> %s: %s"):format(self, short(brief)))
    assert(ai.mail{ to = self, source = "publisher", content = brief, hop = 0 })
  end },
}

for _, name in ipairs(REPORTERS) do
  ai.spawn{
    name = name,
    system = ("You are %s, a reporter on a small city paper. The editor assigns you a story by "
      .. "mail. The newsroom is the editor, ines and tom; reach them with the tell tool. If you "
      .. "need a fact you do not have, ask the editor and wait for the answer; if a colleague "
      .. "needs a fact you have, tell them. Write two or three plain sentences, invent no "
      .. "quotes, and hand your story in with file_story."):format(name),
    tools = { tell, file_story },
  }
end

print(("newsroom closed: %s"):format(ai.watch{}))
