-- The fixture the official conformance suite's SERVER scenarios run against
-- (tests/mcp_server_conformance.rs): the tools, resources and prompts each scenario names,
-- exported by a colony program and served by `colony serve` at /mcp.
local PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
local WAV = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA="

local function tool(name, description, handler, parameters)
  ai.tool{ name = name, description = description, exportable = true,
           parameters = parameters or {}, handler = handler }
end

tool("test_simple_text", "Returns simple text", function()
  return "This is a simple text response for testing."
end)
tool("test_image_content", "Returns an image", function()
  return { content = { { type = "image", data = PNG, mimeType = "image/png" } } }
end)
tool("test_audio_content", "Returns audio", function()
  return { content = { { type = "audio", data = WAV, mimeType = "audio/wav" } } }
end)
tool("test_embedded_resource", "Returns an embedded resource", function()
  return { content = { { type = "resource", resource = {
    uri = "test://embedded-resource", mimeType = "text/plain",
    text = "This is an embedded resource content." } } } }
end)
tool("test_multiple_content_types", "Returns text, an image and a resource", function()
  return { content = {
    { type = "text", text = "Multiple content types test:" },
    { type = "image", data = PNG, mimeType = "image/png" },
    { type = "resource", resource = { uri = "test://mixed-content-resource",
      mimeType = "application/json", text = json.encode({ test = "data", value = 123 }) } },
  } }
end)
tool("test_tool_with_logging", "Logs while it runs", function(_, ctx)
  ctx.log("info", "Tool execution started")
  ai.sleep(0.05)
  ctx.log("info", "Tool processing data")
  ai.sleep(0.05)
  ctx.log("info", "Tool execution completed")
  return "Logging test completed"
end)
tool("test_tool_with_progress", "Reports progress", function(_, ctx)
  for i = 0, 100, 50 do
    ctx.progress(i, 100, "step " .. i)
    ai.sleep(0.05)
  end
  return "Progress test completed"
end)
tool("test_error_handling", "Always fails", function()
  error("This tool intentionally returns an error for testing")
end)
ai.tool{
  name = "json_schema_2020_12_tool", description = "Tool with JSON Schema 2020-12 features",
  exportable = true,
  parameters = {
    ["$schema"] = "https://json-schema.org/draft/2020-12/schema",
    type = "object",
    ["$defs"] = { address = { type = "object", properties = {
      street = { type = "string" }, city = { type = "string" } } } },
    properties = { name = { type = "string" }, address = { ["$ref"] = "#/$defs/address" } },
    additionalProperties = false,
  },
  handler = function(args) return "ok: " .. tostring(args.name) end,
}

mcp.resource{ uri = "test://static-text", name = "static-text", description = "A text resource",
  mime_type = "text/plain",
  read = function() return "This is the content of the static text resource." end }
mcp.resource{ uri = "test://static-binary", name = "static-binary", description = "A PNG",
  mime_type = "image/png",
  read = function() return { blob = PNG, mime_type = "image/png" } end }
mcp.resource{ uri = "test://watched-resource", name = "watched-resource",
  description = "A resource to subscribe to", mime_type = "text/plain",
  read = function() return "Watched resource content" end }
mcp.resource{ uri = "test://template/{id}/data", name = "template", description = "Data by id",
  mime_type = "application/json",
  read = function(args)
    return { text = json.encode({ id = args.id, templateTest = true, data = "Data for ID: " .. args.id }) }
  end }

mcp.prompt{ name = "test_simple_prompt", description = "A simple prompt",
  get = function() return "This is a simple prompt for testing." end }
mcp.prompt{ name = "test_prompt_with_arguments", description = "A prompt with arguments",
  arguments = { { name = "arg1", description = "First test argument", required = true },
                { name = "arg2", description = "Second test argument", required = true } },
  get = function(args)
    return string.format("Prompt with arguments: arg1='%s', arg2='%s'", args.arg1, args.arg2)
  end,
  complete = function(args)
    local out = {}
    for _, v in ipairs({ "paris", "park", "party" }) do
      if v:sub(1, #args.value) == args.value then out[#out + 1] = v end
    end
    return out
  end }
mcp.prompt{ name = "test_prompt_with_embedded_resource", description = "Embeds a resource",
  arguments = { { name = "resourceUri", description = "The resource to embed", required = true } },
  get = function(args)
    return { messages = {
      { role = "user", content = { type = "resource", resource = { uri = args.resourceUri,
        mimeType = "text/plain", text = "Embedded resource content for testing." } } },
      { role = "user", content = "Please process the embedded resource above." },
    } }
  end }
mcp.prompt{ name = "test_prompt_with_image", description = "Shows an image",
  get = function()
    return { messages = {
      { role = "user", content = { type = "image", data = PNG, mimeType = "image/png" } },
      { role = "user", content = "Please analyze the image above." },
    } }
  end }

-- Sampling and elicitation: the handler asks the client that called it (ctx.sample, ctx.elicit).
tool("test_sampling", "Asks the client's model", function(args, ctx)
  local r, err = ctx.sample{ prompt = args.prompt, max_tokens = 100 }
  if not r then return nil, err end
  return "LLM response: " .. r.text
end, { prompt = "string" })
tool("test_elicitation", "Asks the client's user", function(args, ctx)
  local r, err = ctx.elicit{ message = args.message, schema = {
    properties = {
      username = { type = "string", description = "User's response" },
      email = { type = "string", description = "User's email address" },
    },
    required = { "username", "email" } } }
  if not r then return nil, err end
  return "User response: action=" .. r.action .. ", content=" .. json.encode(r.content or {})
end, { message = "string" })
tool("test_elicitation_sep1034_defaults", "Asks with a default for each primitive type",
  function(_, ctx)
    local r, err = ctx.elicit{ message = "Please review your details", schema = { properties = {
      name = { type = "string", default = "John Doe" },
      age = { type = "integer", default = 30 },
      score = { type = "number", default = 95.5 },
      status = { type = "string", enum = { "active", "inactive", "pending" }, default = "active" },
      verified = { type = "boolean", default = true },
    } } }
    if not r then return nil, err end
    return "Elicitation completed: action=" .. r.action .. ", content=" .. json.encode(r.content or {})
  end)
tool("test_elicitation_sep1330_enums", "Asks with each kind of enum", function(_, ctx)
  local r, err = ctx.elicit{ message = "Please choose", schema = { properties = {
    untitledSingle = { type = "string", enum = { "option1", "option2", "option3" } },
    titledSingle = { type = "string", oneOf = {
      { const = "value1", title = "First Option" },
      { const = "value2", title = "Second Option" },
      { const = "value3", title = "Third Option" } } },
    legacyEnum = { type = "string", enum = { "opt1", "opt2", "opt3" },
      enumNames = { "Option One", "Option Two", "Option Three" } },
    untitledMulti = { type = "array", items = { type = "string", enum = { "option1", "option2", "option3" } } },
    titledMulti = { type = "array", items = { anyOf = {
      { const = "value1", title = "First Choice" },
      { const = "value2", title = "Second Choice" },
      { const = "value3", title = "Third Choice" } } } },
  } } }
  if not r then return nil, err end
  return "Elicitation completed: action=" .. r.action .. ", content=" .. json.encode(r.content or {})
end)

-- SSE polling (SEP-1699): the tool closes its stream mid-call; the client resumes it with
-- Last-Event-ID and the answer comes on the resumed stream.
tool("test_reconnection", "Closes its SSE stream mid-call", function(_, ctx)
  local closed, err = ctx.close_stream(0.1)
  if not closed then return nil, err end
  ai.sleep(0.1)
  return "Reconnection test completed successfully"
end)
