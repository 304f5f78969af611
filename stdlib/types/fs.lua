---@meta fs
-- LuaLS definitions for colony's `fs` module (also `require("fs")`).
--
-- A relative path resolves against the folder of the running script (the current directory for
-- sources that are not files). Every call waits without blocking other coroutines. Failures are
-- `nil, err` with `err.kind` one of `not_found`, `permission_denied`, `io_error`, `too_large`
-- (`fs.read` of a file past the program's memory limit, `--max-memory`). A path the sandbox
-- does not allow (`colony run --sandbox` without its `--allow-read`/`--allow-write`) raises an
-- error naming the flag, in every call. Paths and names are bytes: one that is not UTF-8 is
-- used as it is.

---@class fs
fs = {}

---@class fs.Error
---@field kind "not_found"|"permission_denied"|"io_error"|"too_large"
---@field message string what failed, with the path
---@field path string the path as resolved

---@class fs.Stat
---@field size integer bytes
---@field modified number seconds since the epoch (fractional)
---@field is_dir boolean
---@field is_file boolean a regular file (not a folder, a device, a pipe or a socket)

--- The whole file as a string (bytes as they are); `too_large` past the memory limit.
---@param path string
---@return string? text, fs.Error? err
function fs.read(path) end

--- Replaces the file's contents: written beside it under a temporary name, then renamed over it,
--- so a reader sees the old file or the new one, never half of one. The folder must exist. A
--- symlink stays a link (the file it ends at is written) and the file keeps its mode and owner.
--- What is not a plain file (a device, a named pipe) or has other hard links is written in place.
---@param path string
---@param text string
---@return true? ok, fs.Error? err
function fs.write(path, text) end

--- The names in a folder (not paths), sorted.
---@param dir string
---@return string[]? names, fs.Error? err
function fs.list(dir) end

---@param path string
---@return fs.Stat? stat, fs.Error? err
function fs.stat(path) end

--- Whether something exists at `path` (false when it cannot be checked; a path the sandbox
--- does not allow raises).
---@param path string
---@return boolean
function fs.exists(path) end

--- `path` resolved as the other calls resolve it, made absolute (symlinks are not followed and
--- the file need not exist): for handing a path to something that does not share this folder,
--- such as a file attached to a message (`files = { fs.absolute("notes.csv") }`).
---@param path string
---@return string
function fs.absolute(path) end

return fs
