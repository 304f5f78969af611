---@meta mcp
-- LuaLS definitions for colony's `mcp` module (also `require("mcp")`): tools that live in MCP
-- servers, over Streamable HTTP or stdio (revisions 2025-03-26, 2025-06-18, 2025-11-25).
--
-- A connection's tools are `ai.tool` values: they go into `tools = {...}` of `ai.take_turn`,
-- `ai.run`, `ai.spawn` and `ai.ask` like any other. A server the script named (`mcp.connect(url,
-- { name = "docs" })`, a table with `name`, `mcp.connect_named`) offers them as `<server>__<tool>`;
-- one connected without a name offers them under their own names. Failures are `nil, err`
-- (an `mcp.Error`).

--- `kind`: `connect_error` (the server could not be reached or started, or its handshake
--- failed), `unsupported_version` (it speaks no MCP revision colony does), `rpc_error` (it
--- answered a request with a JSON-RPC error), `timeout` (no answer within the deadline; the
--- server was told to cancel), `closed` (the session ended: the child died, the connection
--- dropped), `config` (a server named but not configured, or a spec colony cannot use), and, from
--- `mcp.call`, `tool_error` (the server flagged the result `isError`); from `ctx.sample` and
--- `ctx.elicit`, `unsupported` (no client that can be asked). Concatenates and prints as
--- `kind: message`.
---@class mcp.Error
---@field kind "connect_error"|"unsupported_version"|"rpc_error"|"timeout"|"closed"|"config"|"tool_error"|"unsupported"
---@field message string

---@class mcp
mcp = {}

---@class mcp.ServerSpec
---@field name? string prefixes its tools (`<name>__<tool>`) and labels its log lines (default: the URL's host or the command's file name, which labels the log but, for `mcp.connect`, prefixes nothing)
---@field url? string Streamable HTTP endpoint, e.g. "http://127.0.0.1:8000/mcp"
---@field headers? table<string, string> sent on every request (a bearer token, say)
---@field command? string a program speaking MCP on stdin/stdout (its stderr goes to the log)
---@field args? string[]
---@field env? table<string, string> variables for the server; it inherits only HOME, LOGNAME, PATH, SHELL, TERM, USER, LANG and TMPDIR of colony's environment (as the MCP SDKs do), so a key it needs goes here
---@field cwd? string
---@field roots? string[] what `roots/list` answers (URIs such as "file:///home/me/project")
---@field on_elicit? fun(req: mcp.ElicitRequest): mcp.ElicitAnswer answers the server's `elicitation/create` (none: declined)
---@field auth? mcp.Auth OAuth settings for a remote server
---@field resources? boolean a turn offers the server's resources as read-only tools (`<server>__read_<resource>`, or `<server>__read_resource{ uri }` for many); default false
---@field sampling? string the use-type whose model answers the server's `sampling/createMessage` (none: refused, and not offered)

--- What a server asks the user (`elicitation/create`).
---@class mcp.ElicitRequest
---@field server string
---@field mode "form"|"url"
---@field message string
---@field schema? table the form's JSON Schema (`requestedSchema`)
---@field url? string the page to open, for "url"

--- `"accept"`, `"decline"`, `"cancel"`, or `{ action, content }` (a table without `action` is
--- the accepted form); an accepted form gets the schema's defaults for the fields left out.
---@alias mcp.ElicitAnswer "accept"|"decline"|"cancel"|{ action?: "accept"|"decline"|"cancel", content?: table }

--- OAuth 2.1 for a remote server (`[mcp.NAME.auth]` in the config). Tokens are kept in the state
--- directory (0600) for every program; `colony mcp login NAME` signs in through the browser.
---@class mcp.Auth
---@field client_id? string a client registered beforehand
---@field client_secret? string
---@field client_metadata_url? string an HTTPS client ID metadata document
---@field client_name? string the name colony registers under (default "colony")
---@field scopes? string[] default: those the server's challenge or metadata name
---@field grant? "authorization_code"|"client_credentials"|"enterprise" a person signs in (default); a service's own credentials; the enterprise's identity provider vouches for the person
---@field private_key? string `client_credentials` without a secret: the client's private key (PEM), which signs a JWT for each token request
---@field signing_algorithm? "RS256"|"RS384"|"RS512"|"ES256"|"ES384" the private key's algorithm
---@field idp_issuer? string `enterprise`: the identity provider's issuer
---@field idp_token_endpoint? string `enterprise`: its token endpoint
---@field idp_client_id? string `enterprise`: colony's client there
---@field idp_client_secret? string `enterprise`: that client's secret, if it has one
---@field id_token? string `enterprise`: the person's ID token from the identity provider
---@field authorize? "headless" colony opens the page itself and takes its redirect (servers that approve without a person)
---@field on_authorize? fun(url: string): string sends the person to `url`; answers the URL the browser came back to
---@field redirect_uri? string where the authorization server sends the browser back (with `on_authorize`)

--- A resource or a resource template the server lists.
---@class mcp.Resource
---@field uri? string
---@field uri_template? string for a template
---@field name string
---@field title? string
---@field description? string
---@field mime_type? string

--- One part of a read resource: its text, or its bytes as a file.
---@class mcp.ResourceContents
---@field uri string
---@field mime_type? string
---@field text? string
---@field file? ai.File

---@class mcp.Prompt
---@field name string
---@field title? string
---@field description? string
---@field arguments? { name: string, description?: string, required?: boolean }[]

---@class mcp.PromptMessage
---@field role "user"|"assistant"
---@field content table the content block as the server sent it
---@field text string the block's text (other blocks as JSON)

---@class mcp.PromptResult
---@field description? string
---@field messages mcp.PromptMessage[]

---@class mcp.Connection
---@field name string

---@class mcp.ServerReport
---@field name string
---@field phase "ready"|"error"
---@field version? string the MCP revision the server answered
---@field error? mcp.Error why it is not offered (any kind but `tool_error`)
---@field tools string[] the names its tools are offered under
---@field dropped string[] its tools left out: the name was over 64 characters or clashed

---@class mcp.LiveServer
---@field name string
---@field server string the URL or configured name it was connected as
---@field version? string
---@field tools string[]
---@field dropped string[]

---@class mcp.CallResult
---@field text string what a model reads: `structuredContent` as JSON when present, else the content blocks joined by newlines
---@field content string what a person reads: the content blocks joined by newlines (text as it is, other blocks as JSON)
---@field structured? any the `structuredContent` value
---@field is_error boolean the server flagged the result as an error
---@field files? ai.File[] the images, audio and embedded resources of the result, as files

---@class mcp.CallOptions
---@field conn mcp.Connection
---@field name string the tool's own name, or the `<server>__<tool>` name `mcp.tools` gave it
---@field args? table
---@field timeout? number seconds (default 120, plus the call's own `timeoutMs` / `waitMs` up to 600 more)

---@class mcp.ServerEntry
---@field name string
---@field url? string
---@field command? string
---@field args? string[]

--- Connects (handshake included): a URL, or a table `{ command, args, env, cwd }`. In a sandbox
--- a URL needs `--allow-net` for its host and a command `--allow-run` (a configured server,
--- `mcp.connect_named`, needs neither).
---@param target string|mcp.ServerSpec
---@param opts? { name?: string, headers?: table<string, string>, roots?: string[], on_elicit?: fun(req: mcp.ElicitRequest): mcp.ElicitAnswer, auth?: mcp.Auth, resources?: boolean, sampling?: string }
---@return mcp.Connection? conn, mcp.Error? err
function mcp.connect(target, opts) end

--- Connects to a server configured by name (`colony mcp add`).
---@param name string
---@return mcp.Connection? conn, mcp.Error? err
function mcp.connect_named(name) end

--- The server's tools (every page), as `ai.tool` values: named `<server>__<tool>` when the script
--- named the server, else under their own names; `opts.prefix` decides instead (`true`: the
--- prefix, `<host>__<tool>` for a URL given without a name; `false`: none). A name that is not
--- a word is offered sanitised (`bad name!` as `bad_name_`; its value calls `bad name!`, and
--- `mcp.call` takes the server's own name); one that cannot be offered is left out.
---@param conn mcp.Connection
---@param opts? { prefix?: boolean }
---@return ai.ToolValue[]? tools, mcp.Error? err
function mcp.tools(conn, opts) end

--- Calls a tool by its own name or by the name `mcp.tools(conn)` offered it under (so a model's
--- call can be passed on as it came: `mcp.call(conn, call.name, call.arguments)`).
--- `mcp.call(conn, name, args)` returns the content blocks' text, what a person reads (the structured value as JSON when there are no blocks; an
--- `isError` result is `nil, { kind = "tool_error" }`); `mcp.call{ conn, name, args, timeout? }`
--- returns the table form, with `structured`.
---@overload fun(opts: mcp.CallOptions): mcp.CallResult?, mcp.Error?
---@param conn mcp.Connection
---@param name string
---@param args? table
---@return string? text, mcp.Error? err
function mcp.call(conn, name, args) end

--- Ends the session after answers in flight (stdio: stdin closed, then SIGTERM, then SIGKILL).
---@param conn mcp.Connection
function mcp.close(conn) end

--- The servers in the config file.
---@return mcp.ServerEntry[]
function mcp.servers() end

--- The tools of `colony tools refresh`'s cache, ready for `tools = {...}`; each server starts on
--- the first call of one of its tools. An empty list when there is no cache. `on_elicit` answers
--- these servers' questions (as `colony chat` asks the person at the terminal).
---@param opts? { on_elicit?: fun(req: mcp.ElicitRequest): mcp.ElicitAnswer }
---@return ai.ToolValue[]
function mcp.cached_tools(opts) end

-- colony as an MCP server (`colony mcp serve FILE.lua`, `/mcp` on `colony serve`): what the
-- program exports. Tools: `ai.tool{ ..., exportable = true }`; residents:
-- `ai.spawn{ ..., export = true | { description?: string, timeout?: number } }`. In a handler
-- called over MCP, `ctx.progress(n, total?, message?)` and `ctx.log(level, data)` tell the client
-- (each answers whether it was told; both are nil in a call that did not come over MCP), and
-- `ctx.sample{...}` / `ctx.elicit{...}` ask it (see `ai.ToolContext`).

---@class mcp.SampleMessage
---@field role "user"|"assistant"
---@field content string|table text, or a content block as MCP spells it (`{ type = "image", data = base64, mimeType = "image/png" }`)

---@class mcp.ModelPreferences
---@field hints? (string|{ name: string })[] model names the client may match
---@field cost_priority? number 0 to 1
---@field speed_priority? number 0 to 1
---@field intelligence_priority? number 0 to 1

---@class mcp.SampleSpec
---@field prompt? string one user message (give it or `messages`)
---@field messages? mcp.SampleMessage[]
---@field system? string the system prompt
---@field max_tokens? integer default 1024
---@field temperature? number
---@field stop_sequences? string[]
---@field model_preferences? mcp.ModelPreferences
---@field include_context? "none"|"this_server"|"all_servers"
---@field metadata? table passed to the client as it is

--- What the client's model answered. `err.kind` is `unsupported` (the client declared no
--- sampling capability, or the call did not come over MCP), `rpc_error` (the client refused:
--- its user said no, say) or `closed` (the session ended).
---@class mcp.SampleResult
---@field text string the text of its text blocks
---@field role string
---@field content table the content as MCP spells it
---@field model? string the model the client used
---@field stop_reason? string

---@class mcp.ElicitSpec
---@field message string what the user is asked
---@field schema table a flat JSON Schema object (`type = "object"` may be left out): `properties` of strings, numbers, integers, booleans and enums (`enum`, `oneOf` of `{ const, title }`, arrays of them), each with `default`, `title`, `description`; `required`

--- The user's answer: `action` is `"accept"` (with `content`), `"decline"` or `"cancel"`.
---@class mcp.ElicitResult
---@field action "accept"|"decline"|"cancel"
---@field content? table the form's values, by property

---@class mcp.ResourceSpec
---@field uri string a `{placeholder}` makes it a template (RFC 6570 level 1)
---@field name? string
---@field description? string
---@field mime_type? string
---@field read fun(args: { uri: string, [string]: string }, ctx: table): string|{ text?: string, blob?: string, mime_type?: string } the text, or `{ text }` / `{ blob = base64, mime_type }`

--- Offers a resource (or a template) to MCP clients.
---@param spec mcp.ResourceSpec
function mcp.resource(spec) end

---@class mcp.PromptArgument
---@field name string
---@field description? string
---@field required? boolean

---@class mcp.PromptSpec
---@field name string
---@field description? string
---@field arguments? mcp.PromptArgument[]
---@field get fun(args: table<string, string>, ctx: table): string|{ role: string, content: string|table }[]|{ messages: { role: string, content: string|table }[], description?: string } text (one user message) or messages
---@field complete? fun(args: { argument: string, value: string }): string[] completions of an argument's value

--- Offers a prompt to MCP clients.
---@param spec mcp.PromptSpec
function mcp.prompt(spec) end

--- The server's resources and resource templates (every page).
---@param conn mcp.Connection
---@return mcp.Resource[]? resources, mcp.Error? err
function mcp.resources(conn) end

--- Reads a resource: text as text, binary contents as files.
---@param conn mcp.Connection
---@param uri string
---@return mcp.ResourceContents[]? contents, mcp.Error? err
function mcp.read(conn, uri) end

--- The server's prompts (every page).
---@param conn mcp.Connection
---@return mcp.Prompt[]? prompts, mcp.Error? err
function mcp.prompts(conn) end

--- Gets a prompt with its arguments (strings; other values are sent as their JSON).
---@param conn mcp.Connection
---@param name string
---@param args? table<string, string>
---@return mcp.PromptResult? prompt, mcp.Error? err
function mcp.get_prompt(conn, name, args) end
