//===- ToolCalls.h - OpenAI tools in Qwen3's (ChatML) tool-call syntax -*- C++
//-*-===//
//
// `tools` and `tool_choice` for the ChatML family (Qwen3), written the way
// Qwen3's chat template writes them:
//  - the tools go into the system message: "# Tools ... <tools>" then each
//    tool as `tojson` writes it (Python's json.dumps: ", " and ": "
//    separators, members in the request's order), then "</tools>" and the
//    instructions for <tool_call> blocks;
//  - an assistant message's tool_calls become "<tool_call>\n{"name": ...,
//    "arguments": ...}\n</tool_call>" after its content; tool messages
//    become one user turn of "<tool_response>\n...\n</tool_response>"
//    blocks (consecutive ones together);
//  - under tool_choice "required" or a named function the answer is
//    constrained to one "<tool_call>\n{"name": NAME, "arguments": ARGS}\n
//    </tool_call>" with NAME one of the allowed tools and ARGS valid for
//    that tool's `parameters` (JsonGrammar's schema subset), and parsed
//    back into message.tool_calls (AnswerParser.h);
//  - under "auto" (the default when tools are given) the answer is free
//    until the model writes "<tool_call>"; from there the same grammars
//    hold it to one well-formed call (TokenChooser's trigger), parsed back
//    with the text before it as the content.
//
// DeepSeek's syntax (DeepSeek-V3.1's template, for a DeepSeek checkpoint
// whose own chat template reads `tools` and writes them): a call is
// "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS
// <｜tool▁call▁end｜><｜tool▁calls▁end｜>" (no whitespace anywhere), one
// call a block here. Each marker that is one token of the vocabulary is
// written in the grammar as one byte that no UTF-8 text has
// (kMarkerByte + its index), which TokenChooser feeds for that token only
// (ChooserOptions::markers): the markers are those tokens, never spelled
// in pieces.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_SERVE_TOOLCALLS_H
#define DUCK_RUNTIME_SERVE_TOOLCALLS_H

#include "duck/runtime/serve/JsonGrammar.h"
#include "duck/runtime/text/ChatTemplate.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace duck::runtime {

struct ToolProblem {
  std::string param, message;
};

struct ToolRequest {
  enum class Choice { kNone, kAuto, kRequired, kNamed };
  std::vector<nlohmann::ordered_json> tools; // as sent, in order
  std::vector<std::string> names;
  Choice choice = Choice::kNone;
  std::string named; // kNamed: the function
};

/// `tools` and `tool_choice` from the request body (in its order);
/// ToolProblem names the field. No tools and no choice: kNone, empty.
std::optional<ToolProblem> ParseTools(const nlohmann::ordered_json &body,
                                      ToolRequest *out);

/// What Qwen3's template writes into the system message for `tools`.
std::string ToolsSystemText(const ToolRequest &r);

/// The grammars one tool call follows under "required" (one a tool) or a
/// named function; a problem names `tools` and the keyword.
std::optional<ToolProblem>
ToolCallGrammars(const ToolRequest &r,
                 std::vector<std::shared_ptr<const JsonGrammar>> *out);

/// DeepSeek-V3.1's tool-call markers, in the order a call writes them.
enum DeepSeekMarker {
  kCallsBegin,
  kCallBegin,
  kToolSep,
  kCallEnd,
  kCallsEnd,
  kDeepSeekMarkers
};
/// The marker's text ("<｜tool▁calls▁begin｜>", ...).
std::string_view DeepSeekMarkerText(int marker);
/// The byte standing for marker m's token in a grammar: kMarkerByte + m.
constexpr unsigned char kMarkerByte = 0xF8;
/// How a grammar writes each marker: its text, or its token's byte.
using MarkerSpelling = std::vector<std::string>;

/// The grammars of one DeepSeek tool call (as ToolCallGrammars), the
/// markers spelt as `spelling` says (kDeepSeekMarkers entries).
std::optional<ToolProblem>
DeepSeekToolCallGrammars(const ToolRequest &r, const MarkerSpelling &spelling,
                         std::vector<std::shared_ptr<const JsonGrammar>> *out);

/// `messages` as ChatML messages, the tool calls and tool results written
/// as Qwen3's template does, the tools' system text (if any) first.
std::optional<ToolProblem> ChatMlMessages(const nlohmann::json &messages,
                                          const std::string &tools_text,
                                          std::vector<ChatMessage> *out);

/// Python's json.dumps of `v` (Jinja's tojson in Hugging Face templates).
std::string PyJson(const nlohmann::ordered_json &v);

} // namespace duck::runtime

#endif
