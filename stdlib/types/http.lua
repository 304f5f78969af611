---@meta http
-- LuaLS definitions for colony's `http` module (also `require("http")`).
--
-- Every call waits without blocking other coroutines, on the Lua thread's own connection pool. A
-- response of any status is a response: only a failure to get one (a refused connection, a
-- timeout, a bad URL, a body past `max_bytes`) is `nil, err` with `err.kind == "fetch_error"`.
--
-- Redirects (at most 10) are followed; one that leaves the origin (another scheme, host or port)
-- drops every header the script set, and no `Referer` is ever sent. Requests carry
-- `user-agent: colony/VERSION` unless the script sets its own. A URL or header value that is not
-- UTF-8 text is refused, not changed.

---@class http
http = {}

---@class http.Options
---@field headers? table<string, string|number> request headers (UTF-8 text); the framing ones (`content-length`, `transfer-encoding`, `connection` ...) are refused: the client sets them
---@field body? string the request body as is
---@field json? any a Lua value sent as a JSON body, with `content-type: application/json`
---@field timeout? number seconds for the whole exchange, redirects and body included (default 30; 0 times out at once; at most 31536000, a year; `math.huge` is an error)
---@field max_bytes? integer the most of the body read, in bytes (default 33554432, 32 MiB, or half of `--max-memory` when less); past it the call is a `fetch_error` naming the limit. More than `--max-memory` is refused

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
---@field message string the method and URL (credentials redacted: a URL's password, `key`, `api_key`, `token`, `sig` and like parameters) and what went wrong (`timed out after 30 s`, `the answer is larger than the limit of 33554432 bytes (32 MiB); pass max_bytes to read more`)
---@field url string the URL, credentials redacted

--- A GET request. `opts` takes `headers`, `body`, `json`, `timeout` and `max_bytes`.
---@param url string
---@param opts? http.Options
---@return http.Response? resp, http.Error? err
function http.get(url, opts) end

--- A POST request. `opts` takes `headers`, `body`, `json`, `timeout` and `max_bytes`.
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
