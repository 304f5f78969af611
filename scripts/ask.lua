-- colony ask: one question, one answer, streamed as it arrives.
-- Usage (through the binary): colony ask [--use=USE] [--provider=P] [--model=M] -- QUESTION
local opts = { use = "helper" }
local question
for i = 1, #arg do
  local a = arg[i]
  if a == "--" then
    question = table.concat(arg, " ", i + 1)
    break
  end
  local k, v = a:match("^%-%-(%w+)=(.*)$")
  if k then opts[k] = v end
end
assert(question and question ~= "", "colony ask: no question given")

local streamed = false
opts.stream = function(delta)
  streamed = true
  io.write(delta)
  io.flush()
end
opts.system = "You are colony's helper. Answer briefly and concretely."

local reply, err = ai.ask({ { role = "user", content = question } }, opts)
if not reply then
  io.stderr:write("colony ask: ", tostring(err), "\n")
  os.exit(1)
end
if not streamed then io.write(reply) end
io.write("\n")
