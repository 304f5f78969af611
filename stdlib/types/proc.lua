---@meta proc
-- LuaLS definitions for colony's `proc` module (also `require("proc")`).
--
-- Runs a command without holding the program: `os.execute` and `io.popen` block the VM's thread
-- (every resident and tool of the program waits with them), `proc.run` suspends only the calling
-- coroutine. In a sandbox it needs `--allow-run`, like `os.execute`.

---@class proc
proc = {}

---@class proc.Spec
---@field cmd string the program (found on PATH); no shell: `{ cmd = "sh", args = { "-c", "..." } }` for one
---@field args? (string|number)[] its arguments
---@field cwd? string the folder it runs in, relative to the script's folder (default: colony's current directory)
---@field env? table<string, string> variables added to (or replacing those of) colony's environment
---@field stdin? string written to its standard input, which is then closed (default: no input)
---@field timeout? number seconds before it is killed (default 60). Its output is read until every process holding it closes it: a command that leaves a process in the background with the same output (`sh -c "daemon &"`) waits for it until the timeout, which says so; give that process its own output (`daemon > /dev/null &`)
---@field max_bytes? integer the most read of stdout, and of stderr (default 32 MiB, or half of `--max-memory` when less); past it the command is killed. More than `--max-memory` is refused

---@class proc.Result
---@field status? integer the exit status (absent when a signal ended it)
---@field signal? integer the signal that ended it
---@field ok boolean whether it exited with status 0
---@field stdout string
---@field stderr string

---@class proc.Error
---@field kind "timeout"|"not_found"|"permission_denied"|"too_large"|"io_error"
---@field message string what failed, naming the command

--- Runs a command to its end and returns what it printed. A command that exits with another
--- status is a result (`ok = false`), not an error; `nil, err` when it could not start, outlived
--- its `timeout` or printed more than `max_bytes` (it is killed then).
---@param spec proc.Spec
---@return proc.Result? result, proc.Error? err
function proc.run(spec) end

return proc
