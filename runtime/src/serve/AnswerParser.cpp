//===- AnswerParser.cpp - a chat answer as reasoning, content and a call --===//
#include "duck/runtime/serve/AnswerParser.h"

#include "duck/runtime/serve/ToolCalls.h"

#include <nlohmann/json.hpp>

#include <initializer_list>

namespace duck::runtime {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

using Syntax = AnswerParser::Syntax;

/// Where a call starts: "<tool_call>" or "<｜tool▁calls▁begin｜>".
std::string_view CallOpen(Syntax syntax) {
  return syntax == Syntax::kDeepSeek ? DeepSeekMarkerText(kCallsBegin)
                                     : kCallOpen;
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_' || c == '-';
}

bool IsJsonSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

bool IsSpace(char c) { return IsJsonSpace(c) || c == '\f' || c == '\v'; }

/// The longest suffix of text[from, end) that is a proper prefix of
/// `marker`: it may be the marker's start.
size_t PartialSuffix(std::string_view text, size_t from,
                     std::string_view marker) {
  for (size_t n = std::min(marker.size() - 1, text.size() - from); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n))
      return n;
  return 0;
}

enum class Match { kMore, kNo, kYes };

/// Matches the start of a call's text piece by piece; kMore: it may still
/// match when more text comes.
struct Cursor {
  std::string_view s;
  size_t i = 0;

  void Spaces() {
    while (i < s.size() && IsJsonSpace(s[i]))
      ++i;
  }
  Match Literal(std::string_view lit) {
    Spaces();
    const size_t n = std::min(lit.size(), s.size() - i);
    if (s.substr(i, n) != lit.substr(0, n))
      return Match::kNo;
    if (n < lit.size())
      return Match::kMore;
    i += n;
    return Match::kYes;
  }
  Match String(std::string *out) {
    Spaces();
    if (i >= s.size())
      return Match::kMore;
    if (s[i] != '"')
      return Match::kNo;
    for (size_t j = i + 1; j < s.size(); ++j) {
      if (s[j] == '\\') {
        ++j;
      } else if (s[j] == '"') {
        const auto v = nlohmann::json::parse(s.substr(i, j + 1 - i), nullptr,
                                             /*allow_exceptions=*/false);
        if (!v.is_string())
          return Match::kNo;
        *out = v.get<std::string>();
        i = j + 1;
        return Match::kYes;
      }
    }
    return Match::kMore;
  }
  /// A function name (1-64 name characters) up to `marker`, past both.
  Match NameUntil(std::string_view marker, std::string *out) {
    Spaces();
    size_t j = i;
    while (j < s.size() && j - i <= 64 && IsNameChar(s[j]))
      ++j;
    if (j - i > 64)
      return Match::kNo;
    if (j == s.size())
      return Match::kMore;
    if (j == i)
      return Match::kNo;
    const size_t n = std::min(marker.size(), s.size() - j);
    if (s.substr(j, n) != marker.substr(0, n))
      return Match::kNo;
    if (n < marker.size())
      return Match::kMore;
    *out = std::string(s.substr(i, j - i));
    i = j + marker.size();
    return Match::kYes;
  }
};

/// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>`.
Match MatchDeepSeekHead(std::string_view s, std::string *name, size_t *end) {
  Cursor c{s};
  for (int m : {kCallsBegin, kCallBegin})
    if (Match r = c.Literal(DeepSeekMarkerText(m)); r != Match::kYes)
      return r;
  if (Match r = c.NameUntil(DeepSeekMarkerText(kToolSep), name);
      r != Match::kYes)
    return r;
  *end = c.i;
  return Match::kYes;
}

/// `<tool_call> {"name": NAME, "arguments":` (whitespace anywhere between).
Match MatchHead(std::string_view s, std::string *name, size_t *end) {
  Cursor c{s};
  for (std::string_view lit :
       {kCallOpen, std::string_view("{"), std::string_view("\"name\""),
        std::string_view(":")})
    if (Match m = c.Literal(lit); m != Match::kYes)
      return m;
  if (Match m = c.String(name); m != Match::kYes)
    return m;
  for (std::string_view lit :
       {std::string_view(","), std::string_view("\"arguments\""),
        std::string_view(":")})
    if (Match m = c.Literal(lit); m != Match::kYes)
      return m;
  *end = c.i;
  return Match::kYes;
}

/// `} </tool_call>` after the arguments (DeepSeek's:
/// `<｜tool▁call▁end｜><｜tool▁calls▁end｜>`).
Match MatchTail(std::string_view s, Syntax syntax, size_t *end) {
  Cursor c{s};
  const bool ds = syntax == Syntax::kDeepSeek;
  for (std::string_view lit :
       {ds ? DeepSeekMarkerText(kCallEnd) : std::string_view("}"),
        ds ? DeepSeekMarkerText(kCallsEnd) : kCallClose})
    if (Match m = c.Literal(lit); m != Match::kYes)
      return m;
  *end = c.i;
  return Match::kYes;
}

} // namespace

AnswerParser::AnswerParser(Options o) : o_(o) {
  if (o_.calls == Calls::kForced)
    state_ = State::kHead;
  else if (o_.reasoning && o_.in_think)
    state_ = State::kThink;
  else
    state_ = o_.reasoning ? State::kStart : State::kContent;
  had_reasoning_ = state_ == State::kThink;
}

AnswerParts AnswerParser::Feed(std::string_view text, bool final) {
  AnswerParts out;
  for (;;) {
    const State state = state_;
    const size_t pos = pos_;
    switch (state_) {
    case State::kStart:
      Start(text, final, &out);
      break;
    case State::kThink:
      Think(text, final, &out);
      break;
    case State::kAfterThink:
      while (pos_ < text.size() && text[pos_] == '\n')
        ++pos_;
      if (pos_ < text.size() || final)
        state_ = State::kContent;
      break;
    case State::kContent:
      Content(text, final, &out);
      break;
    case State::kHead:
      Head(text, final, &out);
      break;
    case State::kArgs:
      Args(text, &out);
      break;
    case State::kTail:
      Tail(text);
      break;
    case State::kDone:
    case State::kBroken:
      break;
    }
    if (state_ == state && pos_ == pos)
      return out;
  }
}

void AnswerParser::Start(std::string_view text, bool final, AnswerParts *) {
  const std::string_view rest = text.substr(pos_);
  if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
    pos_ += kThinkOpen.size();
    had_reasoning_ = true;
    state_ = State::kThink;
  } else if (final || kThinkOpen.substr(0, rest.size()) != rest) {
    state_ = State::kContent;
  } // else: it may still be "<think>"
}

void AnswerParser::Think(std::string_view text, bool final, AnswerParts *out) {
  const size_t at = text.find(kThinkClose, pos_);
  if (at != std::string_view::npos) {
    out->reasoning += text.substr(pos_, at - pos_);
    pos_ = at + kThinkClose.size();
    state_ = State::kAfterThink;
    return;
  }
  const size_t end =
      text.size() - (final ? 0 : PartialSuffix(text, pos_, kThinkClose));
  out->reasoning += text.substr(pos_, end - pos_);
  pos_ = end;
}

void AnswerParser::Content(std::string_view text, bool final,
                           AnswerParts *out) {
  if (o_.calls != Calls::kAuto) {
    out->content += text.substr(pos_);
    pos_ = text.size();
    return;
  }
  const std::string_view open = CallOpen(o_.syntax);
  const size_t at = text.find(open, pos_);
  size_t end = at;
  if (at == std::string_view::npos)
    end = text.size() - (final ? 0 : PartialSuffix(text, pos_, open));
  // Whitespace before a call is not content: held until a call is ruled out.
  if (at != std::string_view::npos || !final)
    while (end > pos_ && IsSpace(text[end - 1]))
      --end;
  out->content += text.substr(pos_, end - pos_);
  pos_ = end;
  if (at != std::string_view::npos) {
    call_from_ = pos_;
    pos_ = at;
    state_ = State::kHead;
  }
}

void AnswerParser::Head(std::string_view text, bool final, AnswerParts *out) {
  std::string name;
  size_t end = 0;
  const Match m = o_.syntax == Syntax::kDeepSeek
                      ? MatchDeepSeekHead(text.substr(pos_), &name, &end)
                      : MatchHead(text.substr(pos_), &name, &end);
  if (m == Match::kYes) {
    out->call_started = true;
    out->call_name = std::move(name);
    pos_ += end;
    state_ = State::kArgs;
  } else if (m == Match::kNo || final) {
    // Not a call: its text (and the whitespace before it) is content, and
    // no call follows.
    o_.calls = Calls::kNone;
    pos_ = call_from_;
    state_ = State::kContent;
  }
}

void AnswerParser::Args(std::string_view text, AnswerParts *out) {
  for (; pos_ < text.size(); ++pos_) {
    const char c = text[pos_];
    if (in_string_) {
      out->arguments += c;
      if (escape_)
        escape_ = false;
      else if (c == '\\')
        escape_ = true;
      else if (c == '"')
        in_string_ = false;
      if (!in_string_ && depth_ == 0)
        break; // a string was the whole value
      continue;
    }
    // (DeepSeek's: a marker follows the arguments directly.)
    const bool closer = c == '}' || c == ']' || c == ',' ||
                        (c == '<' && o_.syntax == Syntax::kDeepSeek);
    // A number or literal at the top ends at what cannot be part of it.
    if ((began_ && depth_ == 0 && (IsJsonSpace(c) || closer)) ||
        (!began_ && closer)) {
      state_ = State::kTail;
      return;
    }
    if (IsJsonSpace(c))
      continue; // compact: no whitespace outside strings
    began_ = true;
    out->arguments += c;
    if (c == '"')
      in_string_ = true;
    else if (c == '{' || c == '[')
      ++depth_;
    else if ((c == '}' || c == ']') && --depth_ == 0)
      break;
  }
  if (pos_ < text.size()) { // the value ended at text[pos_]
    ++pos_;
    state_ = State::kTail;
  }
}

void AnswerParser::Tail(std::string_view text) {
  size_t end = 0;
  const Match m = MatchTail(text.substr(pos_), o_.syntax, &end);
  if (m == Match::kYes) {
    pos_ += end;
    state_ = State::kDone;
  } else if (m == Match::kNo) {
    state_ = State::kBroken;
  }
}

bool PromptOpensThink(const std::vector<int32_t> &prompt, int32_t open,
                      int32_t close,
                      const std::function<bool(int32_t)> &special) {
  for (size_t i = prompt.size(); i-- > 0;) {
    if (prompt[i] == open)
      return true;
    if (prompt[i] == close || special(prompt[i]))
      return false;
  }
  return false;
}

} // namespace duck::runtime
