---@meta http
-- LuaLS definitions for colony's `http` module (also `require("http")`).
--
-- Every call waits without blocking other coroutines, on the program's own connection pool (shared
-- with its model calls). A response of any status is a response: only a failure to get one (a
-- refused connection, a timeout, a bad URL) is `nil, err` with `err.kind == "fetch_error"`.

---@class http
http = {}

---@class http.Options
---@field headers? table<string, string|number> request headers
---@field body? string the request body as is
---@field json? any a Lua value sent as a JSON body, with `content-type: application/json`
---@field timeout? number seconds for the whole exchange (default: none)

---@class http.Request: http.Options
---@field url string
---@field method? string `GET` (the default), `POST`, `PUT`, `DELETE`, ... (any case)

---@class http.Response
---@field status integer the HTTP status (a 404 is a response too)
---@field ok boolean whether the status is 2xx
---@field headers table<string, string> header names lowercased; repeated headers joined with ", "
---@field body string the body's bytes
---@field json fun(self?: http.Response): any, { kind: "parse_error", message: string }? decodes the body (`resp.json()` or `resp:json()`)

---@class http.Error
---@field kind "fetch_error"
---@field message string the method and URL (keys redacted) and what went wrong
---@field url string the URL, keys redacted

--- A GET request. `opts` takes `headers`, `body`, `json` and `timeout`.
---@param url string
---@param opts? http.Options
---@return http.Response? resp, http.Error? err
function http.get(url, opts) end

--- A POST request. `opts` takes `headers`, `body`, `json` and `timeout`.
---@param url string
---@param opts? http.Options
---@return http.Response? resp, http.Error? err
function http.post(url, opts) end

--- Any request: `http.request{ method = "PUT", url = ..., json = {...}, timeout = 5 }`.
--- An unknown option raises an error naming it.
---@param req http.Request
---@return http.Response? resp, http.Error? err
function http.request(req) end

return http
