// A chat answer split into reasoning, content and a tool call
// (serve/AnswerParser.h): the parts for Qwen3's thinking and tool calls,
// what is held back while a marker may be starting, and the same parts
// whether the text comes whole, a byte at a time or in random pieces (what
// a stream sends adds up to the whole answer).
#include "duck/runtime/serve/AnswerParser.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace {

using namespace duck::runtime;
using Calls = AnswerParser::Calls;

struct Whole {
  std::string reasoning, content, name, arguments;
  int names = 0; // Feeds that reported a name
  bool had_reasoning = false, started = false, complete = false;
  bool operator==(const Whole &o) const {
    return reasoning == o.reasoning && content == o.content && name == o.name &&
           arguments == o.arguments && names == o.names &&
           had_reasoning == o.had_reasoning && started == o.started &&
           complete == o.complete;
  }
};

void Add(Whole *w, const AnswerParts &p) {
  w->reasoning += p.reasoning;
  w->content += p.content;
  w->arguments += p.arguments;
  if (p.call_started) {
    w->name = p.call_name;
    ++w->names;
  }
  // Arguments come only after the name.
  EXPECT_TRUE(p.arguments.empty() || w->names == 1);
}

/// Feeds `text` cut at `cuts` (ascending), then ends it.
Whole Parse(AnswerParser::Options o, const std::string &text,
            std::vector<size_t> cuts = {}) {
  AnswerParser p(o);
  Whole w;
  for (size_t c : cuts)
    Add(&w, p.Feed(std::string_view(text).substr(0, c), false));
  Add(&w, p.Feed(text, true));
  w.had_reasoning = p.had_reasoning();
  w.started = p.call_started();
  w.complete = p.call_complete();
  return w;
}

/// The same parts whole, a byte at a time, and in random pieces.
Whole ParseEveryWay(AnswerParser::Options o, const std::string &text) {
  const Whole whole = Parse(o, text);
  std::vector<size_t> bytes;
  for (size_t i = 0; i <= text.size(); ++i)
    bytes.push_back(i);
  EXPECT_EQ(Parse(o, text, bytes), whole) << "byte by byte: " << text;
  std::mt19937 rng(7);
  for (int k = 0; k < 8; ++k) {
    std::vector<size_t> cuts;
    for (size_t i = 0; i < text.size(); i += 1 + rng() % 5)
      cuts.push_back(i);
    EXPECT_EQ(Parse(o, text, cuts), whole) << "pieces: " << text;
  }
  return whole;
}

const AnswerParser::Options kThinking{true, false, Calls::kNone};

TEST(AnswerParser, Qwen3Thinking) {
  Whole w = ParseEveryWay(kThinking,
                          "<think>\nLet me see.\n</think>\n\nHello\n\nthere");
  EXPECT_TRUE(w.had_reasoning);
  EXPECT_EQ(w.reasoning, "\nLet me see.\n");
  EXPECT_EQ(w.content, "Hello\n\nthere"); // leading newlines dropped only
  EXPECT_FALSE(w.started);
  // The prompt opened the block (Qwen3's thinking templates): the answer
  // starts in it.
  w = ParseEveryWay({true, true, Calls::kNone}, "plan</think>\n\nAnswer");
  EXPECT_EQ(w.reasoning, "plan");
  EXPECT_EQ(w.content, "Answer");
  // Thinking cut by max_tokens: all reasoning, a partial marker included.
  w = ParseEveryWay(kThinking, "<think>abc</thi");
  EXPECT_EQ(w.reasoning, "abc</thi");
  EXPECT_EQ(w.content, "");
  // An empty block (enable_thinking=false answers carry none).
  w = ParseEveryWay(kThinking, "<think>\n\n</think>\n\nHi");
  EXPECT_TRUE(w.had_reasoning);
  EXPECT_EQ(w.reasoning, "\n\n");
  EXPECT_EQ(w.content, "Hi");
}

TEST(AnswerParser, ThinkOnlyAtTheStart) {
  Whole w = ParseEveryWay(kThinking, "Hi <think>x</think> y");
  EXPECT_FALSE(w.had_reasoning);
  EXPECT_EQ(w.content, "Hi <think>x</think> y");
  w = ParseEveryWay(kThinking, "<thi");
  EXPECT_FALSE(w.had_reasoning);
  EXPECT_EQ(w.content, "<thi");
  w = ParseEveryWay(kThinking, "</think>x"); // no block opened
  EXPECT_EQ(w.content, "</think>x");
  // Without think tokens in the tokenizer: all content.
  w = ParseEveryWay({false, false, Calls::kNone}, "<think>a</think>b");
  EXPECT_FALSE(w.had_reasoning);
  EXPECT_EQ(w.content, "<think>a</think>b");
}

TEST(AnswerParser, HoldsBackWhatMayBeAMarker) {
  AnswerParser p(kThinking);
  EXPECT_TRUE(p.Feed("<thi", false).content.empty());
  AnswerParts a = p.Feed("<think>ab</th", false);
  EXPECT_EQ(a.reasoning, "ab");
  a = p.Feed("<think>ab</think>\n", false);
  EXPECT_EQ(a.reasoning, "");
  EXPECT_EQ(a.content, "");
  a = p.Feed("<think>ab</think>\nok", false);
  EXPECT_EQ(a.content, "ok");

  AnswerParser q({false, false, Calls::kAuto});
  EXPECT_EQ(q.Feed("Sure \n<tool", false).content, "Sure");
  EXPECT_EQ(q.Feed("Sure \n<tool_ca", false).content, "");
  EXPECT_EQ(q.Feed("Sure \n<tool_cab", false).content, " \n<tool_cab");
  EXPECT_EQ(q.Feed("Sure \n<tool_cab ", false).content, "");
  EXPECT_EQ(q.Feed("Sure \n<tool_cab ", true).content, " ");
}

TEST(AnswerParser, ForcedCall) {
  const std::string call = "<tool_call>\n{\"name\": \"add\", \"arguments\": "
                           "{\"a\": 1,\n  \"b\": \"x y\\\"} [\", \"c\": "
                           "[true, null, -2.5e3]}}\n</tool_call>";
  Whole w = ParseEveryWay({true, false, Calls::kForced}, call);
  EXPECT_TRUE(w.started);
  EXPECT_TRUE(w.complete);
  EXPECT_EQ(w.names, 1);
  EXPECT_EQ(w.name, "add");
  // Compact: the whitespace outside strings dropped, the rest as written.
  EXPECT_EQ(w.arguments,
            "{\"a\":1,\"b\":\"x y\\\"} [\",\"c\":[true,null,-2.5e3]}");
  EXPECT_EQ(w.content, "");
  EXPECT_FALSE(w.had_reasoning);
  // Arguments that are not an object (a schema may say so), and a name
  // with an escape.
  w = ParseEveryWay({false, false, Calls::kForced},
                    "<tool_call>\n{\"name\":\"a\\u002db\",\"arguments\":12}"
                    "\n</tool_call>");
  EXPECT_EQ(w.name, "a-b");
  EXPECT_EQ(w.arguments, "12");
  EXPECT_TRUE(w.complete);
  w = ParseEveryWay({false, false, Calls::kForced},
                    "<tool_call>\n{\"name\": \"f\", \"arguments\": \"s}\"}"
                    "\n</tool_call>");
  EXPECT_EQ(w.arguments, "\"s}\"");
  EXPECT_TRUE(w.complete);
}

TEST(AnswerParser, CutCalls) {
  // Cut inside the arguments (max_tokens, a stop string): the call as far
  // as it went, not complete.
  Whole w = ParseEveryWay({false, false, Calls::kForced},
                          "<tool_call>\n{\"name\": \"f\", \"arguments\": "
                          "{\"a\": [1, 2");
  EXPECT_TRUE(w.started);
  EXPECT_FALSE(w.complete);
  EXPECT_EQ(w.arguments, "{\"a\":[1,2");
  // Cut before the name is whole: not a call; the text is content.
  w = ParseEveryWay({false, false, Calls::kForced},
                    "<tool_call>\n{\"name\": \"fo");
  EXPECT_FALSE(w.started);
  EXPECT_EQ(w.content, "<tool_call>\n{\"name\": \"fo");
  // Cut before "</tool_call>" is whole.
  w = ParseEveryWay({false, false, Calls::kForced},
                    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</to");
  EXPECT_TRUE(w.started);
  EXPECT_FALSE(w.complete);
  EXPECT_EQ(w.arguments, "{}");
}

TEST(AnswerParser, AutoCall) {
  const AnswerParser::Options o{true, false, Calls::kAuto};
  Whole w = ParseEveryWay(o, "<think>\nweather\n</think>\n\nLet me check.\n"
                             "<tool_call>\n{\"name\": \"get_weather\", "
                             "\"arguments\": {\"city\": \"Paris\"}}\n"
                             "</tool_call>");
  EXPECT_EQ(w.reasoning, "\nweather\n");
  EXPECT_EQ(w.content, "Let me check."); // the newline before the call goes
  EXPECT_EQ(w.name, "get_weather");
  EXPECT_EQ(w.arguments, "{\"city\":\"Paris\"}");
  EXPECT_TRUE(w.complete);
  // "<tool_call>" followed by what is no call: all of it content, and no
  // call after it either.
  w = ParseEveryWay(o, "a <tool_call> nope <tool_call>\n{\"name\": \"f\", "
                       "\"arguments\": {}}\n</tool_call>");
  EXPECT_FALSE(w.started);
  EXPECT_EQ(w.content, "a <tool_call> nope <tool_call>\n{\"name\": \"f\", "
                       "\"arguments\": {}}\n</tool_call>");
  // No call: trailing whitespace comes back at the end.
  w = ParseEveryWay(o, "just text \n");
  EXPECT_EQ(w.content, "just text \n");
  // Without tools, "<tool_call>" is text.
  const std::string call =
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  w = ParseEveryWay({false, false, Calls::kNone}, call);
  EXPECT_FALSE(w.started);
  EXPECT_EQ(w.content, call);
}

// DeepSeek-V3.1's syntax (ToolCalls.h): the markers, the name up to the
// separator, the arguments compact; "auto" ends the content at the first
// marker.
TEST(AnswerParser, DeepSeekCalls) {
  const std::string open = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>";
  const std::string sep = "<｜tool▁sep｜>";
  const std::string close = "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  AnswerParser::Options forced{false, false, Calls::kForced};
  forced.syntax = AnswerParser::Syntax::kDeepSeek;
  Whole w = ParseEveryWay(
      forced, open + "get_weather" + sep +
                  "{\"city\": \"Pa ris\",\n \"n\": [1, 2]}" + close);
  EXPECT_TRUE(w.complete);
  EXPECT_EQ(w.names, 1);
  EXPECT_EQ(w.name, "get_weather");
  EXPECT_EQ(w.arguments, "{\"city\":\"Pa ris\",\"n\":[1,2]}");
  EXPECT_EQ(w.content, "");
  // Cut before the closing markers are whole: started, not complete.
  w = ParseEveryWay(forced, open + "f" + sep + "{}<｜tool▁call▁end｜><｜to");
  EXPECT_TRUE(w.started);
  EXPECT_FALSE(w.complete);
  EXPECT_EQ(w.arguments, "{}");
  // A name that is not one (a space in it), or cut before the separator:
  // not a call, the text is content.
  w = ParseEveryWay(forced, open + "get weather" + sep + "{}" + close);
  EXPECT_FALSE(w.started);
  EXPECT_EQ(w.content, open + "get weather" + sep + "{}" + close);
  w = ParseEveryWay(forced, open + "get_wea");
  EXPECT_FALSE(w.started);
  EXPECT_EQ(w.content, open + "get_wea");
  // "auto": text, then the call; Qwen3's marker is only text here.
  AnswerParser::Options automatic{false, false, Calls::kAuto};
  automatic.syntax = AnswerParser::Syntax::kDeepSeek;
  w = ParseEveryWay(automatic, "Let me <tool_call> check.\n" + open + "f" +
                                   sep + "7" + close);
  EXPECT_EQ(w.content, "Let me <tool_call> check.");
  EXPECT_EQ(w.name, "f");
  EXPECT_EQ(w.arguments, "7");
  EXPECT_TRUE(w.complete);
  // The first marker's start is held back until it is known not to be one.
  AnswerParser held(automatic);
  EXPECT_EQ(held.Feed("ok <｜tool", false).content, "ok");
  EXPECT_EQ(held.Feed("ok <｜tool▁sep｜>", true).content, " <｜tool▁sep｜>");
  // And Qwen3's syntax is unchanged by the option's default.
  w = ParseEveryWay({false, false, Calls::kAuto},
                    "a " + open + "f" + sep + "{}" + close);
  EXPECT_FALSE(w.started);
}

TEST(AnswerParser, PromptOpensThink) {
  // Ids: 1 "<think>", 2 "</think>", 9 "<|im_start|>" (special), 5 text.
  const auto special = [](int32_t t) { return t == 9; };
  // Qwen3 thinking templates: "<|im_start|>assistant\n<think>\n".
  EXPECT_TRUE(PromptOpensThink({9, 5, 5, 1, 5}, 1, 2, special));
  // enable_thinking=false: "<think>\n\n</think>\n\n".
  EXPECT_FALSE(PromptOpensThink({9, 5, 1, 5, 2, 5}, 1, 2, special));
  // A <think> in an earlier turn, then a new turn: not open.
  EXPECT_FALSE(PromptOpensThink({9, 5, 1, 5, 9, 5}, 1, 2, special));
  EXPECT_FALSE(PromptOpensThink({}, 1, 2, special));
}

/// 200 texts of up to 11 of `bits` (drawn with `seed`) for each way of
/// calling tools, each parsed every way (ParseEveryWay) in `syntax`.
void ParseRandomTexts(const std::vector<std::string> &bits, unsigned seed,
                      AnswerParser::Syntax syntax) {
  std::mt19937 rng(seed);
  for (Calls calls : {Calls::kNone, Calls::kForced, Calls::kAuto})
    for (int n = 0; n < 200; ++n) {
      std::string text;
      for (int k = rng() % 12; k > 0; --k)
        text += bits[rng() % bits.size()];
      AnswerParser::Options o{n % 2 == 0, n % 3 == 0, calls};
      o.syntax = syntax;
      ParseEveryWay(o, text);
    }
}

TEST(AnswerParser, RandomTextsSplitTheSameInAnyPieces) {
  const std::vector<std::string> bits = {"<think>",
                                         "</think>",
                                         "\n",
                                         "a",
                                         " ",
                                         "<tool_call>",
                                         "<",
                                         "<t",
                                         "}",
                                         "{\"name\": \"f\", \"arguments\": ",
                                         "{",
                                         "\"s\\\"\"",
                                         "1",
                                         ",",
                                         "</tool_call>",
                                         "\"k\": ",
                                         "[",
                                         "]"};
  ParseRandomTexts(bits, 1, AnswerParser::Syntax::kQwen3);
}

TEST(AnswerParser, RandomDeepSeekTextsSplitTheSameInAnyPieces) {
  const std::vector<std::string> bits = {"<｜tool▁calls▁begin｜>",
                                         "<｜tool▁call▁begin｜>",
                                         "<｜tool▁sep｜>",
                                         "<｜tool▁call▁end｜>",
                                         "<｜tool▁calls▁end｜>",
                                         "<｜tool",
                                         "f",
                                         "\n",
                                         " ",
                                         "{",
                                         "}",
                                         "\"s<\\\"\"",
                                         "1",
                                         ",",
                                         "<think>",
                                         "</think>"};
  ParseRandomTexts(bits, 2, AnswerParser::Syntax::kDeepSeek);
}

} // namespace
