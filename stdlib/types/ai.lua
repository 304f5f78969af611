---@meta ai
-- LuaLS definitions for colony's `ai` module. Point your editor's Lua language server at
-- stdlib/types/ (workspace.library) to get completion and checks in colony scripts.
--
-- Every function here that talks to a model waits without blocking other coroutines: the call
-- looks synchronous. Lua cannot wait in two places, because the C functions that call back into
-- Lua there cannot yield: inside a `table.sort` comparator and inside a `string.gsub` callback.
-- Calling `ai.ask` (or any waiting function) there fails with "attempt to yield across a C-call
-- boundary": gather what you need first, then sort or substitute.

---@class ai
ai = {}

---@alias ai.Role "system"|"user"|"assistant"|"tool"

---@class ai.ToolCall
---@field id string the call's id, to answer with a `tool` message
---@field name string the tool's name
---@field args string the arguments as the JSON text the model sent
---@field arguments? table the arguments decoded (absent when the text is not valid JSON)
---@field opaque? table provider data that must travel back with the call (keep it as is)

---@class ai.Message
---@field role ai.Role
---@field content? string|table text (a table is sent as JSON); may be absent beside tool_calls
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
---@field base_url? string any OpenAI-compatible endpoint works with provider `openai`
---@field timeout? number seconds (default 600)
---@field max_tokens? integer Anthropic requires one: 4096 when unset
---@field temperature? number
---@field system? string system prompt
---@field tools? ai.Tool[]
---@field tool_choice? "auto"|"none"|"required"|string|{ name: string } a string other than the three words names a tool
---@field extra? table fields merged over the provider's request body
---@field stream? fun(delta: string)|boolean called with each text delta as it arrives
---@field stop? string|string[] stop sequences

---@class ai.Error
---@field kind "config_error"|"auth_error"|"api_error"|"fetch_error"|"parse_error"|"provider_error"|"cassette_miss"
---@field message string
---@field transient boolean worth retrying unchanged
---@field status? integer the HTTP status, when there was one
---@field retry_after? number seconds the provider asked to wait

--- Asks a model. `history` is a string (one user message) or a list of messages.
--- Returns the reply text; on failure `nil, err`. The third value lists the calls the model asked
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
---@param opts string|{ provider: string, key?: string, base_url?: string, use?: string }
---@return string[]? models, ai.Error? err
function ai.models(opts) end

--- Alias of `ai.models`.
ai.fetchModels = ai.models

return ai
