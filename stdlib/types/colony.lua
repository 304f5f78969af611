---@meta colony
-- LuaLS definitions for colony's `colony` module (also `require("colony")`): what a script can
-- know about colony itself, so a front end can ground a model in this machine's facts
-- (`colony ask` does).

---@class colony
---@field version string colony's version
colony = {}

---@class colony.Command
---@field name string e.g. "chat"
---@field about string its one-line description, as `colony --help` shows it

--- colony's commands, in `colony --help` order.
---@return colony.Command[]
function colony.commands() end

---@class colony.Shipped
---@field name string without `.lua`
---@field file string e.g. "chat.lua"
---@field summary string the opening comment's first line, after its `file:` prefix
---@field source string the whole file

--- The front-end scripts compiled into the binary (`colony scripts`).
---@return colony.Shipped[]
function colony.scripts() end

--- The example programs shipped in `examples/`, compiled into the binary.
---@return colony.Shipped[]
function colony.examples() end

---@class colony.UseType
---@field use string the use-type's name
---@field provider? string
---@field model? string
---@field base_url? string
---@field key_env? string
---@field tools? "native"|"text"|"none" how its model takes tools, when set
---@field key_stored boolean whether the file holds a key (its text is never given)

--- The use-types set in the config file, by name.
---@return colony.UseType[]
function colony.config() end

return colony
