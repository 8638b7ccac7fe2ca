//===- ToolCalls.cpp - OpenAI tools in Qwen3's (ChatML) tool-call syntax --===//
#include "duck/runtime/serve/ToolCalls.h"

#include "absl/strings/str_cat.h"

#include <algorithm>

namespace duck::runtime {
namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

constexpr char kCallOpen[] = "<tool_call>\n";
constexpr char kCallClose[] = "\n</tool_call>";

bool GoodName(const std::string &n) {
  return !n.empty() && n.size() <= 64 &&
         std::all_of(n.begin(), n.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  (c >= '0' && c <= '9') || c == '_' || c == '-';
         });
}

std::optional<ToolProblem> ParseChoice(const ojson &body, ToolRequest *out) {
  const bool has = body.contains("tool_choice") && !body["tool_choice"].is_null();
  const ojson &c = has ? body["tool_choice"] : ojson();
  out->choice = out->tools.empty() ? ToolRequest::Choice::kNone
                                   : ToolRequest::Choice::kAuto;
  if (!has)
    return std::nullopt;
  if (c == "none") {
    out->choice = ToolRequest::Choice::kNone;
  } else if (c == "auto") {
    out->choice = ToolRequest::Choice::kAuto;
  } else if (c == "required") {
    out->choice = ToolRequest::Choice::kRequired;
  } else if (c.is_object() && c.value("type", "") == "function" &&
             c.contains("function") && c["function"].is_object() &&
             c["function"].contains("name") &&
             c["function"]["name"].is_string()) {
    out->choice = ToolRequest::Choice::kNamed;
    out->named = c["function"]["name"].get<std::string>();
    if (std::find(out->names.begin(), out->names.end(), out->named) ==
        out->names.end())
      return ToolProblem{"tool_choice",
                         absl::StrCat("'tool_choice' names the function '",
                                      out->named, "', which 'tools' lacks")};
  } else {
    return ToolProblem{"tool_choice",
                       "'tool_choice' must be \"none\", \"auto\", "
                       "\"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}"};
  }
  if (out->choice != ToolRequest::Choice::kNone && out->tools.empty())
    return ToolProblem{"tool_choice", "'tool_choice' asks for a tool call "
                                      "but 'tools' lists none"};
  return std::nullopt;
}

} // namespace

std::optional<ToolProblem> ParseTools(const ojson &body, ToolRequest *out) {
  if (body.contains("tools") && !body["tools"].is_null()) {
    const ojson &t = body["tools"];
    if (!t.is_array() || t.size() > 128)
      return ToolProblem{"tools", "'tools' must be a list of at most 128 "
                                  "functions"};
    for (size_t i = 0; i < t.size(); ++i) {
      const ojson &f = t[i].is_object() ? t[i].value("function", ojson())
                                        : ojson();
      const std::string name =
          f.is_object() && f.contains("name") && f["name"].is_string()
              ? f["name"].get<std::string>()
              : "";
      if (t[i].value("type", "") != "function" || !GoodName(name) ||
          (f.contains("parameters") && !f["parameters"].is_object()))
        return ToolProblem{
            "tools",
            absl::StrCat("tools[", i, "] must be {\"type\": \"function\", "
                                      "\"function\": {\"name\": ...}} with a "
                                      "name of 1-64 letters, digits, _ or -, "
                                      "and 'parameters' an object")};
      if (std::find(out->names.begin(), out->names.end(), name) !=
          out->names.end())
        return ToolProblem{"tools", absl::StrCat("tools[", i, "]: the name '",
                                                 name, "' is used twice")};
      out->names.push_back(name);
      out->tools.push_back(t[i]);
    }
  }
  return ParseChoice(body, out);
}

std::string PyJson(const ojson &v) {
  std::string out;
  if (v.is_object()) {
    out = "{";
    for (auto it = v.begin(); it != v.end(); ++it)
      absl::StrAppend(&out, it == v.begin() ? "" : ", ", ojson(it.key()).dump(),
                      ": ", PyJson(it.value()));
    return out + "}";
  }
  if (v.is_array()) {
    out = "[";
    for (size_t i = 0; i < v.size(); ++i)
      absl::StrAppend(&out, i ? ", " : "", PyJson(v[i]));
    return out + "]";
  }
  return v.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string ToolsSystemText(const ToolRequest &r) {
  if (r.tools.empty())
    return "";
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the "
      "user query.\n\nYou are provided with function signatures within "
      "<tools></tools> XML tags:\n<tools>";
  for (const ojson &t : r.tools)
    absl::StrAppend(&out, "\n", PyJson(t));
  out += "\n</tools>\n\nFor each function call, return a json object with "
         "function name and arguments within <tool_call></tool_call> XML "
         "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
         "<args-json-object>}\n</tool_call>";
  return out;
}

namespace {

/// One grammar a tool the choice allows: `make` gives its schema and
/// affixes from the tool's name and parameters.
template <typename Make>
std::optional<ToolProblem>
EachToolGrammar(const ToolRequest &r, const Make &make,
                std::vector<std::shared_ptr<const JsonGrammar>> *out) {
  for (size_t i = 0; i < r.tools.size(); ++i) {
    if (r.choice == ToolRequest::Choice::kNamed && r.names[i] != r.named)
      continue;
    const ojson &f = r.tools[i]["function"];
    const ojson params = f.contains("parameters") ? f["parameters"]
                                                  : ojson{{"type", "object"}};
    std::string prefix, suffix;
    const ojson schema = make(r.names[i], params, &prefix, &suffix);
    auto g = JsonGrammar::FromSchema(schema.dump());
    if (!g.ok())
      return ToolProblem{"tools",
                         absl::StrCat("tools[", i, "].function.parameters: ",
                                      g.status().message())};
    g->SetAffixes(std::move(prefix), std::move(suffix));
    out->push_back(std::make_shared<JsonGrammar>(std::move(*g)));
  }
  return std::nullopt;
}

} // namespace

std::optional<ToolProblem>
ToolCallGrammars(const ToolRequest &r,
                 std::vector<std::shared_ptr<const JsonGrammar>> *out) {
  auto make = [](const std::string &name, const ojson &params,
                 std::string *prefix, std::string *suffix) {
    *prefix = kCallOpen, *suffix = kCallClose;
    return ojson{
        {"type", "object"},
        {"properties", {{"name", {{"const", name}}}, {"arguments", params}}},
        {"required", {"name", "arguments"}},
        {"additionalProperties", false}};
  };
  return EachToolGrammar(r, make, out);
}

std::string_view DeepSeekMarkerText(int marker) {
  static constexpr std::string_view kText[kDeepSeekMarkers] = {
      "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
      "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"};
  return kText[marker];
}

std::optional<ToolProblem>
DeepSeekToolCallGrammars(const ToolRequest &r, const MarkerSpelling &spelling,
                         std::vector<std::shared_ptr<const JsonGrammar>> *out) {
  auto make = [&](const std::string &name, const ojson &params,
                  std::string *prefix, std::string *suffix) {
    *prefix = absl::StrCat(spelling[kCallsBegin], spelling[kCallBegin], name,
                           spelling[kToolSep]);
    *suffix = spelling[kCallEnd] + spelling[kCallsEnd];
    return params;
  };
  return EachToolGrammar(r, make, out);
}

/// An assistant message's tool calls as Qwen3's template writes them
/// after its content.
std::optional<ToolProblem> AppendToolCalls(const json &calls, size_t at,
                                           std::string *content) {
  const std::string where = absl::StrCat("messages[", at, "].tool_calls");
  if (!calls.is_array())
    return ToolProblem{"messages", where + " must be a list"};
  for (size_t k = 0; k < calls.size(); ++k) {
    const json &c = calls[k].is_object() && calls[k].contains("function")
                        ? calls[k]["function"]
                        : calls[k];
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string() ||
        !c.contains("arguments"))
      return ToolProblem{"messages", absl::StrCat(where, "[", k, "] needs a "
                                                  "function name and "
                                                  "arguments")};
    if ((k == 0 && !content->empty()) || k > 0)
      *content += "\n";
    const json &a = c["arguments"];
    absl::StrAppend(content, "<tool_call>\n{\"name\": \"",
                    c["name"].get<std::string>(), "\", \"arguments\": ",
                    a.is_string() ? a.get<std::string>()
                                  : PyJson(ojson::parse(a.dump())),
                    "}\n</tool_call>");
  }
  return std::nullopt;
}

std::optional<ToolProblem> ChatMlMessages(const json &messages,
                                          const std::string &tools_text,
                                          std::vector<ChatMessage> *out) {
  // `out` holds each message's role and text content already; this
  // rewrites them the way Qwen3's template does.
  std::vector<ChatMessage> in = std::move(*out);
  out->clear();
  if (!tools_text.empty()) {
    if (!in.empty() && in[0].role == "system")
      in[0].content += "\n\n" + tools_text;
    else
      out->push_back({"system", tools_text});
  }
  std::string prev;
  for (size_t i = 0; i < in.size(); ++i) {
    const json &m = messages[i];
    const std::string role = in[i].role;
    if (in[i].role == "assistant" && m.contains("tool_calls") &&
        !m["tool_calls"].is_null())
      if (auto e = AppendToolCalls(m["tool_calls"], i, &in[i].content))
        return e;
    const bool after_tool = prev == "tool";
    prev = role;
    if (role != "tool") {
      out->push_back(std::move(in[i]));
      continue;
    }
    const std::string block =
        absl::StrCat("<tool_response>\n", in[i].content, "\n</tool_response>");
    if (after_tool)
      out->back().content += "\n" + block;
    else
      out->push_back({"user", block});
  }
  return std::nullopt;
}

} // namespace duck::runtime
