---@meta term
-- LuaLS definitions for colony's `term` module (also `require("term")`): the terminal, for
-- front ends such as `colony chat` (`colony scripts cat chat` shows them in use).

---@class term
term = {}

--- Whether a standard stream is a terminal.
---@param stream? "stdout"|"stdin"|"stderr" default "stdout"
---@return boolean
function term.is_tty(stream) end

--- Whether output may carry colour and layout: stdout is a terminal, `NO_COLOR` is not set, and
--- `TERM` is not `dumb`.
--- A front end prints plain text otherwise.
---@return boolean
function term.styled() end

--- The width in columns of the terminal stdout writes to (80 when stdout is not a terminal).
---@return integer
function term.width() end

---@class term.RenderOptions
---@field width? integer columns (default: the terminal's)

--- Markdown laid out for the terminal, with ANSI styles: headings, emphasis, lists, fenced code
--- blocks and tables (columns aligned). Returns the text; the caller writes it. Control
--- characters in `markdown` (but tabs and newlines) are left out: a model's reply cannot send
--- the terminal escape sequences of its own.
---@param markdown string
---@param opts? term.RenderOptions
---@return string
function term.render(markdown, opts) end

--- Takes back `text` that was just written to stdout from the start of a line: moves the cursor
--- to where it began and clears the screen below, so a rendering can be written over it. Returns
--- false (and does nothing) when `text` is taller than the screen.
---@param text string
---@return boolean erased
function term.erase(text) end

--- Reads a line with a line editor (arrows, history of this run's lines, Ctrl-R). Only the
--- calling coroutine waits. `nil, "interrupted"` on Ctrl-C, `nil, "eof"` on Ctrl-D or the end
--- of piped input.
---@param prompt? string
---@return string? line, "interrupted"|"eof"|string? why
function term.readline(prompt) end

---@class term.Spinner
local Spinner = {}

--- Clears the spinner (also done when it is collected).
function Spinner:stop() end

--- A spinner with the seconds elapsed, on stderr while stderr is a terminal not `TERM=dumb` (nothing otherwise),
--- until `:stop()`.
---@param label? string default "waiting"
---@return term.Spinner
function term.spinner(label) end

--- Runs `f(...)` so that Ctrl-C cancels it instead of ending the program: the call is dropped
--- where it waits (a model call, a tool) and `false, "interrupted", "SIGINT"` comes back;
--- otherwise `true` and what `f` returned. Under `colony chat`, SIGTERM and SIGHUP cancel it
--- the same way, naming their signal (`false, "interrupted", "SIGTERM"`): the script then has 3 s
--- to keep what it had and end. Under `colony run`, a call that does not give way within a second
--- (code that spins, or is blocked outside Lua) leaves the Ctrl-C to the program, which it ends.
--- Outside such a call Ctrl-C ends the program as usual (`colony run` ends it where it waits and
--- closes its store). Under a host that leaves signals to the script
--- (`colony chat`), Ctrl-C outside such a call is ignored after the first: the front end ends on
--- its own terms (at its prompt).
---@param f fun(...): ...
---@return boolean ok, ... results, or "interrupted" and the signal ("SIGINT", "SIGTERM", "SIGHUP")
function term.interruptible(f, ...) end

return term
