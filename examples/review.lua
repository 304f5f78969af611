-- review.lua: an AI checks a quarterly report (a PDF) against the figures it was written from
-- (a CSV), both attached to the mail that asks for the review.
--
-- Shows: files on ai.mail (paths relative to this script's folder), each recorded once and sent
-- in the form the provider's API documents: Anthropic gets the PDF as a document block and the
-- CSV as inlined text; Gemini the PDF as inline data; OpenAI chat the CSV as text and an honest
-- note that the PDF's content is absent. Then a tool the AI reports through, and deliver_to
-- printing its verdict.
--
-- Offline, on its bundled cassette:
--   colony run --replay examples/review.jsonl examples/review.lua
-- Live, with any configured provider (one that reads PDFs sees the report itself):
--   colony run examples/review.lua

local flag = ai.tool{
  name = "flag",
  description = "Record a figure in the report that the data does not support.",
  parameters = { figure = "string", report_says = "string", data_says = "string" },
  handler = function(args)
    print(("flagged %s: the report says %s, the data says %s"):format(
      args.figure, args.report_says, args.data_says))
    return "recorded"
  end,
}

ai.spawn{
  name = "reviewer",
  system = "You check reports against the data they were written from. Call flag once for each "
    .. "figure in the report that the data does not support; then reply with a short verdict.",
  tools = { flag },
  max_steps = 4,
  deliver_to = function(reply, info)
    if info.kind == "reply" then
      print("[reviewer] " .. reply)
      ai.stop("reviewed")
    end
  end,
  sources = { function(self)
    assert(ai.mail{
      to = self, source = "desk", hop = 0,
      content = "Please review the Q3 report before it goes to the board.",
      files = { "review/q3-report.pdf", "review/q3-figures.csv" },
    })
  end },
}

print(ai.watch{})
