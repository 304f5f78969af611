---@meta store

--- The program's durable store: a key-value space kept in the state directory (SQLite), so it
--- survives a restart. The top level of a program sees the global space; a resident spawned with
--- `workspace = "name"` has its tools and sources see that workspace alone. Any value JSON can
--- hold round-trips exactly (integers stay integers, `json.array({})` stays an empty array).
store = {}

---@class store.Error
---@field kind "io_error"|"value_error"|"locked"|"damaged"|"too_new"|"fenced"|"refused" `fenced`: in a cluster, this node no longer holds the resident; `refused`: the database refused the login (a wrong password, no such database)
---@field message string

--- The value at `key`, or nil.
---@param key string
---@return any? value, store.Error? err
function store.get(key) end

--- Stores `value` at `key` (nil deletes).
---@param key string
---@param value any
---@return true? ok, store.Error? err
function store.set(key, value) end

--- Whether the key existed.
---@param key string
---@return boolean? existed, store.Error? err
function store.delete(key) end

--- The keys starting with `prefix` (all when nil), in byte order.
---@param prefix? string
---@return string[]? keys, store.Error? err
function store.list(prefix) end

--- Atomic read-modify-write: `fn(old)` returns the new value (nil deletes); no other write lands
--- in between. `fn` runs inside the store's transaction, so it cannot wait (no `ai.*`, no sleep:
--- waiting raises, naming `store.update`), and it cannot use the store or mail (`store.*`,
--- `ai.mail`, `ai.spawn`, `ai.dismiss` raise there: read what it needs first). What `fn` throws
--- is raised as it was thrown. A new value JSON cannot hold raises, as in `store.set`.
--- Keys (and a `prefix`) are UTF-8 text.
---@param key string
---@param fn fun(old: any?): any?
---@return any? new, store.Error? err
function store.update(key, fn) end

return store
