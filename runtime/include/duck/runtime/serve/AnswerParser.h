//===- AnswerParser.h - a chat answer's text as reasoning, content, a call -*-
// C++ -*-===//
//
// Splits a chat answer as it is generated, so that a stream and the whole
// answer say the same thing (the whole answer is the concatenation of the
// parts the stream sent):
//  - reasoning (Qwen3's thinking, as vLLM and llama-server return it): when
//    the prompt opened a think block, or the answer starts with "<think>",
//    the text up to "</think>" is `reasoning_content`; the content is what
//    follows "</think>", its leading newlines dropped;
//  - a tool call (Qwen3's syntax, ToolCalls.h): under tool_choice "auto"
//    the content ends where "<tool_call>" starts (its trailing whitespace
//    dropped); under "required" or a named function the answer is the
//    call. The call "<tool_call>\n{"name": NAME, "arguments": ARGS}\n
//    </tool_call>" gives NAME once it is whole, then ARGS in pieces as they
//    come, without the whitespace outside strings (compact JSON: the bytes
//    of ARGS otherwise as written). Text that turns out not to be a call
//    is content.
//  - DeepSeek's syntax (Syntax::kDeepSeek, ToolCalls.h) the same way:
//    the content ends where "<｜tool▁calls▁begin｜>" starts; the call
//    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS
//    <｜tool▁call▁end｜><｜tool▁calls▁end｜>" gives NAME (the text up to
//    the separator: 1-64 letters, digits, _ or -) and ARGS as above.
// Text that may still become a marker ("<think>", "</think>",
// "<tool_call>" or "<｜tool▁calls▁begin｜>", whitespace before a call) is
// held until it is known.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_SERVE_ANSWERPARSER_H
#define DUCK_RUNTIME_SERVE_ANSWERPARSER_H

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace duck::runtime {

/// What one Feed made certain (each part new since the last Feed).
struct AnswerParts {
  std::string reasoning, content;
  std::string call_name;     // the call's name, in the Feed that completes it
  std::string arguments;     // a piece of the call's arguments
  bool call_started = false; // call_name is set (it may be "")
};

class AnswerParser {
public:
  enum class Calls { kNone, kForced, kAuto };
  enum class Syntax { kQwen3, kDeepSeek };
  struct Options {
    bool reasoning = false; // look for Qwen3's <think> ... </think>
    bool in_think = false;  // the prompt opened a think block
    Calls calls = Calls::kNone;
    Syntax syntax = Syntax::kQwen3; // how a call is written
  };

  explicit AnswerParser(Options o);

  /// Parses more of the answer: `text` is all of it so far (each call's
  /// text extends the previous one's); `final`: nothing follows, so
  /// nothing is held back.
  AnswerParts Feed(std::string_view text, bool final);

  /// A think block opened (the answer has reasoning_content, maybe "").
  bool had_reasoning() const { return had_reasoning_; }
  /// The call's name was reported.
  bool call_started() const { return state_ >= State::kArgs; }
  /// The call closed ("</tool_call>", "<｜tool▁calls▁end｜>").
  bool call_complete() const { return state_ == State::kDone; }

private:
  enum class State {
    kStart,      // maybe "<think>"
    kThink,      // reasoning
    kAfterThink, // newlines after "</think>"
    kContent,
    kHead,   // maybe a call, up to its arguments
    kArgs,   // the call's arguments
    kTail,   // after them, up to "</tool_call>" (the call's end)
    kDone,   // the call closed
    kBroken, // the call's text ended badly
  };
  void Start(std::string_view text, bool final, AnswerParts *out);
  void Think(std::string_view text, bool final, AnswerParts *out);
  void Content(std::string_view text, bool final, AnswerParts *out);
  void Head(std::string_view text, bool final, AnswerParts *out);
  void Args(std::string_view text, AnswerParts *out);
  void Tail(std::string_view text);

  Options o_;
  State state_;
  size_t pos_ = 0;       // text[0, pos_) is parsed
  size_t call_from_ = 0; // kHead: where the call's text (and the
                         // whitespace before it) starts
  bool had_reasoning_ = false;
  // kArgs: a JSON value's scanner.
  int depth_ = 0;
  bool began_ = false, in_string_ = false, escape_ = false;
};

/// Whether `prompt` ends inside a think block: back from its end, the
/// token `open` ("<think>") comes before `close` ("</think>") and before
/// any token `special` names (the turn's "<|im_start|>"), as Qwen3's
/// thinking templates end the prompt.
bool PromptOpensThink(const std::vector<int32_t> &prompt, int32_t open,
                      int32_t close,
                      const std::function<bool(int32_t)> &special);

} // namespace duck::runtime

#endif
