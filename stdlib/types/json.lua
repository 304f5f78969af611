---@meta json
-- LuaLS definitions for colony's `json` module (also `require("json")` and `require("data").json`).

---@class json
json = {}

--- The JSON `null`, distinct from `nil` (which cannot sit in a table).
---@type lightuserdata
json.null = nil

--- Encodes a Lua value as JSON text. Object keys come out sorted. An empty table encodes as `{}`
--- unless it came from a JSON array or was marked with `json.array`.
--- Raises an error for values JSON cannot hold, naming what and where (`items[2].score: ...`):
--- functions, NaN and the infinities, strings that are not UTF-8, a list with other keys
--- (`{ 1, 2, x = 3 }`, or an item past the list's end), number keys that are not a list from 1,
--- tables nested more than 127 deep.
--- `store.set`, `http`'s `json =` and a tool's result follow the same rules.
---@param value any
---@param opts? { pretty?: boolean }
---@return string
function json.encode(value, opts) end

--- Decodes JSON text. Arrays stay marked as arrays, so they encode back as arrays; `null`
--- becomes `json.null`.
---@param text string
---@return any value, { kind: "parse_error", message: string }? err
function json.decode(text) end

--- Marks a table (a new one when omitted) as a JSON array, so an empty one encodes as `[]`.
---@param t? table
---@return table
function json.array(t) end

return json
