-- examples/service/pager.lua: an on-call pager run as a service (`colony serve`): its AI
-- decides whom to page and pages them through a tool that takes a while.
--
-- Shows: a resident with a small mailbox (`mailbox = 2`: past it the API answers `429` with
-- `Retry-After`), a tool call a stop lets finish (SIGTERM drains: turns in flight get the
-- watch's grace), and a program's arguments (`[[serve.programs]] args = { LOG, MS }` in the
-- config): the file the last page is written to (default `pages.log` beside this file) and how
-- long a page takes to go out, in milliseconds (default 0).

local log = arg[1] or "pages.log"
local takes_ms = tonumber(arg[2] or "0")

local page = ai.tool{
  name = "page",
  description = "Pages a person on call with a short message",
  parameters = { who = "string", message = "string" },
  handler = function(args)
    fs.write(log, ("%s: %s\n"):format(args.who, args.message))
    if takes_ms > 0 then ai.sleep(takes_ms) end
    return "paged " .. args.who
  end,
}

ai.spawn{
  name = "pager",
  system = "You are the on-call pager. Page whoever a report concerns; answer with whom you paged.",
  tools = { page },
  mailbox = 2,
  deliver_to = "host",
}

print("the pager stops: " .. ai.watch{ grace_ms = 30000 })
