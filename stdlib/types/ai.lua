---@meta ai
-- LuaLS definitions for colony's `ai` module. Point your editor's Lua language server at
-- stdlib/types/ (workspace.library) to get completion and checks in colony scripts.
--
-- Every function here that talks to a model waits without blocking other coroutines: the call
-- looks synchronous. Lua cannot wait in two places, because the C functions that call back into
-- Lua there cannot yield: inside a `table.sort` comparator and inside a `string.gsub` callback.
-- Calling `ai.ask` (or any waiting function) there fails with "attempt to yield across a C-call
-- boundary": gather what you need first, then sort or substitute. Nor can a coroutine the script
-- creates itself carry a wait (`coroutine.resume` then answers false with a message): use
-- `ai.parallel` for concurrent work.

---@class ai
ai = {}

---@alias ai.Role "system"|"user"|"assistant"|"tool"

---@class ai.ToolCall
---@field id string the call's id, to answer with a `tool` message
---@field name string the tool's name
---@field args string the arguments as the JSON text the model sent
---@field arguments? table the arguments decoded (absent when the text is not valid JSON)
---@field opaque? table provider data that must travel back with the call (keep it as is)

--- A file to attach: a path (relative to the script's folder), `{ path, name?, content_type? }`,
--- `{ name, data, content_type? }` (the bytes in a string), or a file table colony gave back
--- (`{ ref = ... }`). The content type is the caller's, else sniffed from the bytes, else read
--- from the name; each provider gets the file in the form its API documents, or a one-line
--- note that its content is absent. Only the newest file-bearing message inlines its files;
--- older ones become a reference line the model can follow with the `view_file` tool.
--- A field not listed here or on `ai.File` is refused, naming it (a misspelt one would drop the file),
--- and so is a table with both `path` and `data` (give one; `data` needs a `name`), and a
--- `content_type` that is not `type/subtype` (`"png"` would have gone as an unknown blob).
---@alias ai.FileSpec string|{ path?: string, name?: string, content_type?: string, data?: string, ref?: string }

---@class ai.File a recorded file, as colony gives it back
---@field name string
---@field content_type string normalised (`image/jpeg`, `text/csv`...)
---@field kind "image"|"pdf"|"text"|"audio"|"video"|"other"
---@field size integer bytes
---@field ref string the short reference (12 hex digits of the hash) `view_file` takes
---@field sha256 string
---@field data? string the bytes (from ai.view_file)
---@field text? string the bytes as text, for a text file (from ai.view_file)
---@field shed? string why the provider refused it (it travels as a note saying it was removed)

---@class ai.Message a history entry; a field not listed here is refused, naming it
---@field role ai.Role
---@field content? string|table text (a table is sent as JSON); may be absent beside tool_calls
---@field files? ai.FileSpec[] on a user entry, attached to it; on a tool entry, carried by that result; given back as ai.File tables (plain data: they encode and store, and a decoded copy finds its file by ref while the program holds it)
---@field tool_calls? ai.ToolCall[] on an assistant entry: the calls it made (pass the list `ai.ask` returned)
---@field tool_call_id? string on a tool entry: the call it answers
---@field name? string on a tool entry: the tool's name (found from the call when omitted)
---@field is_error? boolean on a tool entry: the result is an error

---@class ai.Tool
---@field name string may contain dots (`notes.search`): reshaped on the wire and mapped back
---@field description? string
---@field parameters? table a JSON Schema object (default: no parameters)

---@class ai.Options
---@field use? string use-type whose settings apply (`chat`, `code`, `helper`, `general`...)
---@field provider? string `anthropic`, `openai`, `groq`, `ollama`, `kimi`, `gemini`, `replay`
---@field model? string
---@field key? string the API key (prefer the environment or the config's key_env)
---@field base_url? string any OpenAI-compatible endpoint works with provider `openai`; set by the script, it is the script reaching that host (under --sandbox and in colony serve it needs --allow-net for it)
---@field timeout? number seconds (default 600; at most 31536000, a year: `math.huge` or a negative value raises an error)
---@field max_tokens? integer Anthropic requires one: 4096 when unset
---@field temperature? number
---@field system? string system prompt
---@field tools? (ai.Tool|ai.ToolValue)[] specs only: ai.ask never runs a handler
---@field tool_choice? "auto"|"none"|"required"|string|{ name: string } a string other than the three words names a tool
---@field extra? table fields merged over the provider's request body
---@field stream? fun(delta: string)|boolean called with each text delta as it arrives; true streams the request without a function (the answer arrives in pieces, which keeps a long one alive past a proxy's idle timeout) and returns the same reply
---@field stop? string|string[] stop sequences

--- What went wrong with a call. `kind` is one of: `config_error` (no provider, no key, a bad
--- base URL, tools offered to a use-type with `tools = "none"`), `auth_error` (401/403),
--- `api_error` (the provider refused the request: 400, 404, 422...), `fetch_error` (the request
--- did not complete: refused, reset, timed out), `parse_error` (an answer colony could not read;
--- also `json.decode`), `provider_error` (the provider failed: 429, 5xx, 529, overloaded, an open
--- breaker; `transient` says whether to retry), `cassette_miss` (replay: the cassette does not hold
--- the request), `budget` (over a resident's budget), `content_filter` (`ai.ask`: a content
--- filter withheld the whole answer), `schema` and `invalid_output` (`ai.infer_structured`), and, as a turn's
--- `error`: `cancelled` (the program ended while the step's tools ran) and `store` (a step's
--- progress could not be saved). Concatenates and prints as `kind: message`
--- (`"error: " .. err`, `tostring(err)`).
---@class ai.Error
---@field kind "config_error"|"auth_error"|"api_error"|"fetch_error"|"parse_error"|"provider_error"|"cassette_miss"|"budget"|"content_filter"|"schema"|"invalid_output"|"cancelled"|"store"
---@field message string
---@field transient boolean worth retrying unchanged
---@field status? integer the HTTP status, when there was one
---@field retry_after? number seconds the provider asked to wait (its `retry-after` in seconds or as an HTTP date, `retry-after-ms`, or a wait named in the body); a long one leaves the error transient

--- Asks a model. `history` is a string (one user message) or a list of messages.
--- Returns the reply text; on failure `nil, err` (kind `content_filter` when a content filter
--- withheld the whole answer). The third value lists the calls the model asked
--- for (nil when none): append `{ role = "assistant", content = reply, tool_calls = calls }`, then one
--- `{ role = "tool", tool_call_id = call.id, content = ... }` per call, and ask again.
---@param history string|ai.Message[]
---@param opts? ai.Options
---@return string? reply, ai.Error? err, ai.ToolCall[]? tool_calls
function ai.ask(history, opts) end

--- `ai.ask` with one prompt; returns only the reply and the error.
---@param prompt string
---@param opts? ai.Options
---@return string? reply, ai.Error? err
function ai.ask_simple(prompt, opts) end

--- Alias of `ai.ask_simple`.
ai.askSimple = ai.ask_simple

---@class ai.Provider
---@field id string
---@field name string
---@field style "anthropic"|"openai"|"gemini"|"replay"
---@field base_url string
---@field default_model string
---@field key_env string the environment variable the key is read from ("" when none is needed)
---@field tools "native"|"text"|"none"

--- The providers colony knows.
---@return ai.Provider[]
function ai.providers() end

--- The model ids an account can reach, asked over the network.
---@param opts string|{ provider: string, key?: string, base_url?: string, use?: string } a base_url needs --allow-net for its host under --sandbox
---@return string[]? models, ai.Error? err
function ai.models(opts) end

--- Alias of `ai.models`.
ai.fetchModels = ai.models

--- Alias of `ai.ask_simple` (kept for older scripts): one prompt, the reply text or `nil, err`.
---@param prompt string
---@param opts? ai.Options
---@return string? reply, ai.Error? err
function ai.infer(prompt, opts) end

--- Waits `ms` milliseconds; other coroutines (tools, sources) run meanwhile. A negative, NaN or
--- absurd `ms` (more than a year, `math.huge`) raises an error.
---@param ms number
function ai.sleep(ms) end

--- Runs each function in its own coroutine, all at once, and returns each one's first result in
--- order (return a table to keep more, e.g. `return { http.get(url) }` to keep `nil, err`). An
--- error raised in any is raised once all have finished.
---@param ... fun(): any
---@return any ...
function ai.parallel(...) end

---@class ai.ToolValue
---@field name string
---@field description string
---@field parameters table the expanded JSON Schema
---@field timeout number seconds
---@field exportable boolean
---@field idempotent boolean
--- Calling a tool value runs its handler directly (arguments checked against the schema first),
--- within its timeout: past it, a handler that waits ends with an error (`deadline: ...`) the
--- caller may catch; one that spins is stopped as in a turn.
---@overload fun(args: table): any

--- A tool handler's `ctx`. `ai`, `origin`, `hop` and `workspace` are there in a resident's turn;
--- `progress` and `log` only in a call that came over MCP (colony's MCP server), where `sample`
--- and `elicit` ask the client that called. Outside MCP (a model's turn, the program) `sample`
--- and `elicit` answer `nil, { kind = "unsupported" }`.
---@class ai.ToolContext
---@field call_id string
---@field name string
---@field step integer
---@field ai? string
---@field origin? string
---@field hop? integer
---@field workspace? string
---@field progress? fun(n: number, total?: number, message?: string): boolean tells the client how far the call is (true when it was told)
---@field log? fun(level: "debug"|"info"|"notice"|"warning"|"error"|"critical"|"alert"|"emergency", data: any): boolean `notifications/message` (true when it was told)
---@field close_stream? fun(retry?: number): boolean?, mcp.Error? only over MCP: closes this call's SSE stream mid-call (SSE polling), asking the client to resume it after `retry` seconds (1 by default); the answer reaches it there. `nil, { kind = "unsupported" }` over stdio
---@field sample fun(spec: mcp.SampleSpec): mcp.SampleResult?, mcp.Error? asks the client's model (`sampling/createMessage`)
---@field elicit fun(spec: mcp.ElicitSpec): mcp.ElicitResult?, mcp.Error? asks the client's user (`elicitation/create`); a decline or cancel is a result, not an error

---@class ai.ToolDef
---@field name string may contain dots (`notes.search`): reshaped on the wire and mapped back
---@field description? string
---@field parameters? table a JSON Schema, or the shorthand `{ city = "string", days = "integer?" }`: each value one of "string", "integer", "number", "boolean", "object", "array", "null", with `?` for optional (a table with `type`, `properties`, `required`, `$schema`, `$ref`, `anyOf`, `oneOf` or `allOf` is read as a schema)
---@field handler fun(args: table, ctx: ai.ToolContext): any returns a string, a table (sent as JSON), `{ text = "...", files = { ai.FileSpec... } }` (text with files attached to the result; `text` may be left out), or `nil, err`; may wait (ai.ask, ai.sleep, other tools)
---@field timeout? number seconds before the call is abandoned (default 120; at most a year); a handler that never waits is stopped then too (`deadline`)
---@field exportable? boolean served by `colony mcp serve` and `/mcp` on `colony serve` (a tool without it is neither listed nor run there)
---@field rate? string how often it may be called, `"10/min"`, `"5/s"`, `"100/hour"`, `"1000/day"` (a token bucket shared by every turn that offers it: that many at once, then one more each period/count); a call over it is answered `rate_limited` without running
---@field idempotent? boolean running it twice is harmless: a call cut off by a restart runs again (otherwise it is answered "interrupted by a restart")

--- Makes a tool. Its arguments are validated against `parameters` before the handler runs; a
--- handler that raises, returns `nil, err` or overruns `timeout` fails the call, not the turn.
---@param def ai.ToolDef
---@return ai.ToolValue
function ai.tool(def) end

---@class ai.TurnOptions: ai.Options
---@field messages? ai.Message[] the conversation so far (yours: nothing is kept between calls)
---@field prompt? string appended as a user message
---@field files? ai.FileSpec[] attached to the prompt
---@field tools? (ai.ToolValue|ai.ToolDef|string)[] a string names a tool the embedding application registered
---@field max_steps? integer model calls allowed (default 8; `ai.run`: 9). The last one may not call tools.
---@field allow? string|string[] offer only tools matching these names or globs (`notes.*`)
---@field deny? string|string[] never offer tools matching these
---@field pin? table arguments overwritten before any handler runs, for every tool whose schema has them
---@field on_step? fun(step: { step: integer, text: string, calls: table[], results: table[], usage: ai.Usage }) `results` are whole; the model reads each cut to 100,000 characters, with a marker
---@field on_tool? fun(event: ai.ToolCallEnded) called as each tool call ends (a step's calls run at once, so in any order), before the step's `on_step`
---@field compact? "client"|"off" summarise the transcript when it nears the window (default "client"), judged by the larger of the provider's reported count and colony's own estimate of the request (3 bytes a token)
---@field context_window? integer tokens, a whole number from 1 (default 200000)
---@field compact_at? number fraction of the window (default 0.8)
---@field compact_prompt? string
---@field mcp? (mcp.ServerSpec|string)[] MCP servers opened (all at once) for this turn, their tools offered as `<server>__<tool>`; a string names a configured server. Closed when the turn ends.
---@field dynamic_mcp? string[] URL prefixes and configured server names the model may connect itself, through the `mcp_connect{ name, server }` and `mcp_disconnect{ name }` tools (new tools from the next step on)
---@field on_elicit? fun(req: mcp.ElicitRequest): mcp.ElicitAnswer answers `elicitation/create` for each of the turn's `mcp` servers that has no hook of its own
---@field middleware? ai.Middleware[] wrap this turn's model calls as a resident's are (`ai.with_retries`, `ai.with_breaker`, `ai.with_context`; outermost first); a breaker here keeps its state for every turn of the script

---@class ai.Usage
---@field input integer every prompt token, cached ones included
---@field output integer every generated token, reasoning included
---@field cache_read integer
---@field cache_write integer
---@field reasoning integer

---@class ai.ToolEvent
---@field step integer
---@field name string
---@field call_id string
---@field kind "ok"|"error"|"thrown"|"bad_arguments"|"schema"|"deadline"|"unknown_tool"|"interrupted"|"cancelled"|"not_run"|"rate_limited" `error`: the handler raised a string (`error("it broke")`) or returned `nil, err`, and the model reads that message; `thrown`: it raised a value that is not a string (`error({ code = 7 })`), and the model reads the value as JSON; `not_run`: left unanswered when the turn's max_steps ran out; `rate_limited`: over the tool's `rate`, not run (the model reads when to try again); `deadline`: past its `timeout`
---@field ok boolean
---@field outcome string what the model got back (first 500 characters); a Lua error reads `file:line: message`
---@field duration_ms number

---@class ai.ToolCallEnded: ai.ToolEvent
---@field arguments string the arguments as the model sent them (JSON text)

---@class ai.TurnResult
---@field reply string the final text
---@field stop "end_turn"|"tool_use"|"max_tokens"|"stop_sequence"|"refusal"|"content_filter"|"max_steps"|"error"
---@field steps integer model calls made
---@field usage ai.Usage summed over every step (and every summary request)
---@field tool_events ai.ToolEvent[]
---@field messages ai.Message[] the whole transcript, valid to send again (built when first read, so `pairs` lists it only after)
---@field compactions integer
---@field error? ai.Error why the turn ended early (with stop = "error")
---@field servers? mcp.ServerReport[] with `mcp`: how each server fared (one that failed has phase "error" and the turn went on without it)
---@field dynamic_mcp? mcp.LiveServer[] with `dynamic_mcp`: the servers the model had connected when the turn ended

--- One model turn: infer, run the calls the model asks for (a step's calls at once), feed the
--- results back, repeat until it answers without calls or `max_steps` is reached.
---@param opts ai.TurnOptions
---@return ai.TurnResult
function ai.take_turn(opts) end

--- Alias of `ai.take_turn` (kept for older scripts): the same turn, the same options and result.
---@param opts ai.TurnOptions
---@return ai.TurnResult
function ai.infer_with_tools(opts) end

---@class ai.RunResult
---@field text string the final text
---@field stop string
---@field steps integer
---@field usage ai.Usage
---@field compactions integer
---@field tools ai.ToolEvent[]
---@field messages ai.Message[] built when first read
---@field error? ai.Error
---@field servers? mcp.ServerReport[] with `mcp`
---@field dynamic_mcp? mcp.LiveServer[] with `dynamic_mcp`

--- The agent loop as one call (max_steps 9 by default).
---@param opts ai.TurnOptions
---@return ai.RunResult
function ai.run(opts) end

---@class ai.StructuredOptions: ai.Options
---@field schema table the JSON Schema the answer must match
---@field prompt? string
---@field messages? ai.Message[]
---@field name? string the schema's name (OpenAI wants one; default "response")

--- An answer as a Lua value that validates against `schema`: native structured output where the
--- provider has it (OpenAI, Gemini), a forced tool otherwise (Anthropic). An answer that breaks
--- the schema is sent back once with the validator's message; a second failure is
--- `nil, { kind = "invalid_output" }`. A schema that does not compile is `{ kind = "schema" }`.
---@param opts ai.StructuredOptions
---@return any? value, ai.Error? err
function ai.infer_structured(opts) end

--- The closed kind of a content type (normalised first: case and parameters dropped,
--- `image/jpg` read as `image/jpeg`): what each provider's file rules are written against.
---@param content_type string
---@return "image"|"pdf"|"text"|"audio"|"video"|"other"
function ai.classify_file(content_type) end

--- A file this program attached (or a resident's restored conversation holds), by the `ref` its
--- table or reference line shows: `file` with `data` (and `text` for a text file), or `nil, err`.
---@param ref string at least 8 hex digits of the file's hash
---@return ai.File|nil file
---@return string? err
function ai.view_file(ref) end

-- ---------------------------------------------------------------------------------------------
-- Residents: the route, spawn, mail, sources, supervision, middleware
-- ---------------------------------------------------------------------------------------------

---@class ai.Middleware a layer made by ai.with_retries, ai.with_breaker or ai.with_context

---@class ai.RouteOptions: ai.Options
---@field stream? nil not a route setting (an error): each resident's replies go to its `deliver_to`
---@field middleware? ai.Middleware[] outermost first: { ai.with_context{...}, ai.with_breaker{...}, ai.with_retries{...} }
---@field budget? ai.Budget the program's: what all its residents together may use per window

--- Opens the composition: the settings every resident starts from (each field a resident sets
--- wins) and the middleware residents without their own share (one breaker for all of them).
--- Once, before the first `ai.spawn`; optional.
---@param opts? ai.RouteOptions
function ai.route(opts) end

---@alias ai.Restart "permanent"|"transient"|"temporary"

---@class ai.SourceSpec
---@field [1] fun(self: string) the source
---@field restart? ai.Restart default "transient": restarted only after a crash, after a wait (250 ms, doubling, at most the window's share of its restarts)
---@field max_restarts? integer default 3
---@field restart_window_ms? number default 5000

---@class ai.DeliveryInfo
---@field ai string the resident
---@field kind "reply"|"outage"|"recovered"|"blocked" a reply; a notice on the way into / out of an outage; or a notice that the resident is blocked by a failure retrying cannot fix (its mail is held until its settings change)
---@field origin? string the sender of the mail the turn served (the newest, if several)
---@field hop integer
---@field stop? string
---@field steps integer
---@field usage ai.Usage
---@field error? string|ai.BlockedError for an outage notice, why the model cannot be called (a string); for a blocked one, the error as a table
---@field held integer arrivals held (outage, blocked), or held and now being served (recovered)
---@field dropped integer older arrivals the bound of 24 discarded

---@class ai.SpawnOptions: ai.Options
---@field name string unique; the address mail is sent to
---@field stream? nil not a resident setting (an error): its replies go to `deliver_to`
---@field tools? (ai.ToolValue|ai.ToolDef|string)[] Lua tools, inline tables, or names of tools the embedding application registered
---@field sources? (fun(self: string)|ai.SourceSpec)[] forked when the AI registers, as `<name>/source/<n>`
---@field deliver_to? fun(reply: string, info: ai.DeliveryInfo)|"host" where replies and outage notices go; nil: the AI speaks only through its tools; "host": the embedding application's channel (under `colony run`, printed as `[name] reply`)
---@field max_steps? integer per turn, default 8
---@field max_hop? integer mail whose hop is higher is refused with `hop_limit: ...` (default 8)
---@field mailbox? integer the most mails that may wait for it (default 10000); past it `ai.mail` answers `nil, "mailbox_full"`
---@field middleware? ai.Middleware[] replaces the route's for this AI
---@field restart? ai.Restart default "permanent"
---@field max_restarts? integer default 3
---@field restart_window_ms? number default 5000
---@field compact? "client"|"off"
---@field context_window? integer
---@field compact_at? number
---@field compact_prompt? string
---@field workspace? string the store namespace its tools and sources see (its deliver_to, the program's own code, sees the global space)
---@field persist_conversation? boolean keep its conversation, backlog and the turn in flight in the store across restarts
---@field mcp? (mcp.ServerSpec|string)[] MCP servers opened before the AI is hired; their tools join its own for the life of the program, listed again before its next step when a server says they changed
---@field budget? ai.Budget what it may use per window (its turns, and the model calls its tools and sources make); over it, it is blocked with kind "budget" until the window resets (its mail kept), and its sources' and tools' model calls answer nil, err of kind "budget"
---@field export? boolean|{ description?: string, timeout?: number } offered over MCP as a tool of its name taking `{ message }`: mails it and answers its reply (timeout in seconds, 300 by default; without a description the tool's quotes the first 200 characters of `system` to every client)
---@field on_elicit? fun(req: mcp.ElicitRequest): mcp.ElicitAnswer answers `elicitation/create` for each of its `mcp` servers that has no hook of its own

---@class ai.Budget usage kept in the store (a restart does not reset it); a turn that starts under it runs to its end
---@field tokens? integer input, output and cache tokens summed; blocks when the server reports no usage (it cannot be counted)
---@field cost? number in the price table's currency (the config's [prices], else the shipped US dollar prices); blocks when the model has no price
---@field per? "hour"|"day"|"month" the window, aligned in UTC; default "day"

--- Hires an AI as a resident: its own conversation and mailbox, each mail a user turn labelled
--- with its source ("[mail from SOURCE] content"), each turn a `take_turn`, a non-empty reply to
--- `deliver_to`. Spawned before `ai.watch`, it registers when the watch comes up; during the
--- watch, at once.
---@param opts ai.SpawnOptions
---@return string name
---@return mcp.ServerReport[]? servers with `mcp`: how each server fared
function ai.spawn(opts) end

---@class ai.MailOptions
---@field to string
---@field source string who or what sends it: the label the AI reads
---@field content string
---@field hop integer required: 0 from a person or a clock; one more than the mail that led to it when relaying: `ai.inbound_provenance().hop + 1` (or `ctx.hop + 1`) from a resident's tool, `info.hop + 1` from a `deliver_to` that passes a reply on
---@field files? ai.FileSpec[] attached to the user turn the mail becomes (a resident that keeps its conversation stores their bytes with the mail)
---@field id? string the sender's name for this mail: a resident that keeps its conversation accepts an id once, so a sender that restarted can post it again safely

--- Posts a mail: `true`, or `nil, err` where `err` starts with the refusal's name and says what
--- it concerns: `no_recipient: "wroker"` (nobody of that name, it has died, or the watch is not
--- up yet), `hop_limit: hop 9 to "b" is above its max_hop of 8`, `not_saved` (the recipient
--- keeps its conversation and the store could not write the mail), `mailbox_full` (as many mails
--- wait for it as its `mailbox` capacity; nothing was saved: send again once it has served some),
--- `stopping: no mail is taken for "b", the program is stopping (<reason>)` (after a stop, during
--- its grace). Test it with `err:match("^no_recipient")`. A refusal once the watch runs is also
--- logged. At most once. `to`, `source` and `content` are UTF-8 text. A mail whose `id` the
--- recipient accepted before answers `true, "duplicate"`: the first is served, this one is not.
---@param opts ai.MailOptions
---@return true? posted
---@return string? err "no_recipient: ..."|"hop_limit: ..."|"not_saved"|"mailbox_full"|"stopping: ..."|"duplicate"
function ai.mail(opts) end

---@class ai.Provenance
---@field origin string the sender: the `source` of the mail being served
---@field ai string the AI serving it, whose tool is running (the `source` to give a mail it relays)
---@field to string the same as `ai` (the mail's recipient)
---@field hop integer the served mail's hop count (a relayed mail gets `hop + 1`)

--- Inside a tool running in a resident's turn: where the mail being served came from (`origin`)
--- and who serves it (`ai`); else nil.
---@return ai.Provenance?
function ai.inbound_provenance() end

--- Ends an AI through its nursery (a turn in flight with it) and frees its name. Its waiting
--- mail is dropped (logged with how many) and its saved conversation cleared.
---@param name string
---@return true? dismissed
---@return string? err `no_recipient: "name"`
function ai.dismiss(name) end

---@class ai.ResidentInfo
---@field name string
---@field state "idle"|"busy"|"outage"|"blocked"|"restarting"|"stopped"|"pending"|"elsewhere"|"unplaced" `elsewhere`: on another node of the cluster; `unplaced`: no node runs it now (it is moving)
---@field conversation integer messages in its stored conversation
---@field held integer arrivals waiting (all of them kept while blocked)
---@field dropped integer older arrivals discarded in the current outage
---@field restarts integer
---@field error? ai.BlockedError while blocked: why
---@field refused integer mails refused with "mailbox_full"
---@field served integer mails its turns have served
---@field node? string in a cluster (`colony serve --cluster`), the node it runs on

---@return ai.ResidentInfo[]
function ai.residents() end

--- Why a resident is blocked: a failure that waiting cannot cure. `tostring(err)` reads
--- `kind: message` (in `on_blocked` and `ai.residents()`; `deliver_to`'s `info.error` is a plain table).
---@class ai.BlockedError
---@field kind "auth_error"|"api_error"|"config_error"|"cassette_miss"|"budget"|"parse_error" a key refused (401/403), a request refused as it stands (400, 404 ...), no provider or key configured, a cassette without the request, a budget spent (until its window resets), an answer that did not read as the API's three times in a row
---@field message string
---@field status? integer the HTTP status, when there was one
---@field transient false

--- Lets a blocked resident try again now (after the script fixed what blocked it some way the
--- config file does not show). A blocked resident also tries again by itself when the config
--- file changes on disk. Blocked again before a turn went through, its next unblock waits 1 s
--- before the try, the one after 2 s, doubling up to 60 s (an `on_blocked` that unblocks at
--- once does not call a model that refuses it in a tight loop).
---@param name string
---@return boolean? was_blocked true: it tries again; false: it was not blocked; nil, "no_recipient": no such resident (or the watch is not up)
---@return "no_recipient"? err
function ai.unblock(name) end

---@class ai.WatchOptions
---@field on_crash? fun(id: string, name: string, message: string) a resident (id = its name; its `deliver_to` raised) or a source (id = "<name>/source/<n>") raised; `message` is `file:line: message` (the log has the traceback)
---@field on_fail? fun(id: string, name: string, err: string) past its restart intensity: not started again. Without it, `colony run` ends with status 1 naming each such failure
---@field on_blocked? fun(name: string, err: ai.BlockedError) a resident is blocked (after its notice went to deliver_to); it may call ai.unblock(name)
---@field grace_ms? number how long turns in flight may finish after a stop (default 10000; past a day, `math.huge` included, is a day)
---@field until_idle? boolean default true: end once every resident is idle or blocked, every source has finished and no turn is in flight; false: run until a stop (an application that mails in from outside)

--- Registers the spawned residents, forks their sources, and runs them until `ai.stop(reason)`,
--- every resident is gone, SIGINT/SIGTERM, or (`until_idle`) the program has settled: every
--- resident idle or blocked, every source finished, no turn in flight. Then no new turn starts,
--- sources end, turns in flight get `grace_ms` to finish. Returns the reason: `ai.stop`'s,
--- "idle", "blocked: <name>: <kind>: <message>" (`colony run` then exits with status 3),
--- "max-time" (`colony run --max-time`), "SIGTERM", "every resident is gone", "there are no
--- residents" (none was spawned, or all were dismissed before the watch), ...
---@param opts? ai.WatchOptions
---@return string reason
function ai.watch(opts) end

--- Stops the watch with `reason` (the first reason given wins).
---@param reason? string
function ai.stop(reason) end

--- The stop's reason once the program is stopping, else nil: a tool finishing during the grace
--- period can wrap up.
---@return string?
function ai.stopping() end

---@class ai.RetriesOptions
---@field attempts? integer calls in all (a whole number from 1), default 6
---@field base_ms? number the first wait's ceiling, default 2000 (full jitter, doubling)
---@field cap_ms? number no wait is longer, default 60000 (a provider's retry-after is a floor up to this); not below base_ms

--- Middleware: a transient failure is tried again with exponential backoff; a fatal one returns at once.
--- A wait is logged as a warning (at most one line every 10 s for the process). A streamed attempt
--- that failed after some text reached the stream is not tried again (the text would repeat).
---@param opts? ai.RetriesOptions
---@return ai.Middleware
function ai.with_retries(opts) end

---@class ai.BreakerInfo
---@field failures integer
---@field last_error? string
---@field next_probe_ms? integer when opening: until the next probe
---@field at_ms integer

---@class ai.BreakerOptions
---@field threshold? integer consecutive failed steps that open it (a whole number from 1), default 3
---@field first_probe_ms? number the wait after the first failed probe (the first probe goes at once), default 30000
---@field max_probe_ms? number the waits double up to this, default 600000; not below first_probe_ms
---@field on_transition? fun(from: "closed"|"open"|"half_open", to: "closed"|"open"|"half_open", info: ai.BreakerInfo)

--- Middleware: stops calling a provider that keeps failing; one probe per interval tests for recovery.
---@param opts? ai.BreakerOptions
---@return ai.Middleware
function ai.with_breaker(opts) end

---@class ai.ContextOptions
---@field system_suffix? string appended to every step's system prompt
---@field before_step? fun(info: { model: string, system?: string, messages: integer }): string? its answer is appended too

--- Middleware: adds context to every step without storing it in the conversation.
---@param opts ai.ContextOptions
---@return ai.Middleware
function ai.with_context(opts) end

return ai
