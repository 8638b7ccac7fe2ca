//===- JsonGrammar.cpp - JSON and JSON Schema as a byte-level automaton ---===//
#include "duck/runtime/serve/JsonGrammar.h"

#include "absl/strings/str_cat.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

namespace duck::runtime {
namespace {

// Ordered: object members are generated in the order the schema lists them.
using json = nlohmann::ordered_json;

enum Kind : uint8_t { kObject = 1, kArray, kString, kNumber, kLiteral };
// Object and array phases (arrays use kOpen, kInValue, kAfterValue, kComma).
enum Phase : uint8_t {
  kOpen,
  kKey,     // a listed key, matched against the candidates (mask, pos)
  kKeyFree, // any key: a string frame above
  kColon,
  kValue,
  kInValue, // the value's frame above
  kAfterValue,
  kComma,
};
// String phases.
enum : uint8_t { kChars, kEscape, kHex, kUtf8 };
// Number phases; `n` counts the digits of the current part.
enum : uint8_t { kNeg, kZero, kInt, kDot, kFrac, kE, kESign, kExp };

constexpr uint32_t kMaxDepth = 32;
// Whitespace between tokens: one byte, or a newline and up to 16 bytes of
// indentation (spaces or tabs).
constexpr uint8_t kMaxIndent = 16;
constexpr uint32_t kMaxIntDigits = 15, kMaxExpDigits = 2;

bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsHex(unsigned char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/// A string's next byte; false when refused; *closed when it ended it.
bool FeedString(JsonState::Frame &f, unsigned char c, bool *closed) {
  *closed = false;
  switch (f.phase) {
  case kChars:
    if (c == '"')
      return *closed = true;
    if (c == '\\')
      return f.phase = kEscape, true;
    if (c < 0x20 || (c >= 0x80 && c < 0xC2) || c > 0xF4)
      return false;
    if (c >= 0x80) {
      f.phase = kUtf8, f.n = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
      // The first continuation byte's range (no overlong forms, no
      // surrogates, nothing past U+10FFFF), as 'lo | hi << 8'.
      f.mask = c == 0xE0   ? 0xA0 | 0xBF << 8
               : c == 0xED ? 0x80 | 0x9F << 8
               : c == 0xF0 ? 0x90 | 0xBF << 8
               : c == 0xF4 ? 0x80 | 0x8F << 8
                           : 0x80 | 0xBF << 8;
    }
    return true;
  case kEscape:
    if (c == 'u')
      return f.phase = kHex, f.n = 4, true;
    if (!std::strchr("\"\\/bfnrt", c) || c == 0)
      return false;
    return f.phase = kChars, true;
  case kHex:
  case kUtf8:
    if (f.phase == kHex ? !IsHex(c)
                        : (c < (f.mask & 0xFF) || c > (f.mask >> 8 & 0xFF)))
      return false;
    f.mask = 0x80 | 0xBF << 8;
    if (--f.n == 0)
      f.phase = kChars;
    return true;
  }
  return false;
}

/// A number's next byte: 1 taken, 0 refused, -1 the number ended before it.
int FeedNumber(JsonState::Frame &f, unsigned char c) {
  const bool integer = f.child != 0;
  const bool digit = IsDigit(c);
  const uint32_t limit = f.phase >= kE ? kMaxExpDigits : kMaxIntDigits;
  switch (f.phase) {
  case kNeg:
    if (!digit)
      return 0;
    f.phase = c == '0' ? kZero : kInt, f.n = 1;
    return 1;
  case kZero:
  case kInt:
  case kFrac:
  case kExp:
    if (digit && f.phase != kZero && f.n < limit)
      return ++f.n, 1;
    if (c == '.' && !integer && f.phase <= kInt)
      return f.phase = kDot, f.n = 0, 1;
    if ((c == 'e' || c == 'E') && !integer && f.phase <= kFrac)
      return f.phase = kE, f.n = 0, 1;
    return digit ? 0 : -1;
  case kDot:
    return digit ? (f.phase = kFrac, f.n = 1, 1) : 0;
  case kE:
    if (c == '+' || c == '-')
      return f.phase = kESign, 1;
    [[fallthrough]];
  case kESign:
    return digit ? (f.phase = kExp, f.n = 1, 1) : 0;
  }
  return 0;
}

bool NumberCanEnd(const JsonState::Frame &f) {
  return f.phase == kZero || f.phase == kInt || f.phase == kFrac ||
         f.phase == kExp;
}

} // namespace

//===----------------------------------------------------------------------===//
// The automaton
//===----------------------------------------------------------------------===//

bool JsonState::Space(unsigned char c) {
  if (c != ' ' && c != '\n' && c != '\t')
    return false;
  if (ws_ == 0)
    return ws_ = c == '\n' ? 0x80 | 1 : 1, true;
  // After a newline (the high bit): indentation.
  if (!(ws_ & 0x80) || c == '\n' || (ws_ & 0x7F) > kMaxIndent)
    return false;
  return ++ws_, true;
}

bool JsonState::StartValue(const JsonGrammar &g, uint16_t node,
                           unsigned char c) {
  const JsonGrammar::Node &n = g.nodes_[node];
  Frame f;
  f.node = node;
  if (!n.literals.empty()) {
    f.kind = kLiteral;
  } else if (c == '{' && (n.types & JsonGrammar::kObj)) {
    f.kind = kObject, f.phase = kOpen;
  } else if (c == '[' && (n.types & JsonGrammar::kArr)) {
    f.kind = kArray, f.phase = kOpen;
  } else if (c == '"' && (n.types & JsonGrammar::kStr)) {
    f.kind = kString, f.phase = kChars;
  } else if ((c == '-' || IsDigit(c)) &&
             (n.types & (JsonGrammar::kNum | JsonGrammar::kInt))) {
    f.kind = kNumber;
    f.child = (n.types & JsonGrammar::kNum) ? 0 : 1;
    f.phase = c == '-' ? kNeg : c == '0' ? kZero : kInt;
    f.n = c == '-' ? 0 : 1;
  } else if ((c == 't' || c == 'f') && (n.types & JsonGrammar::kBool)) {
    f.kind = kLiteral, f.node = 1;
  } else if (c == 'n' && (n.types & JsonGrammar::kNull)) {
    f.kind = kLiteral, f.node = 2;
  } else {
    return false;
  }
  if ((f.kind == kObject || f.kind == kArray) && stack_.size() >= kMaxDepth)
    return false;
  if (!stack_.empty())
    stack_.back().phase = kInValue;
  if (f.kind == kLiteral) {
    const auto &lits = g.nodes_[f.node].literals;
    f.mask = lits.size() >= 64 ? ~0ull : (1ull << lits.size()) - 1;
    stack_.push_back(f);
    return FeedLiteral(g, stack_.back(), c) == Fed::kYes;
  }
  stack_.push_back(f);
  return true;
}

void JsonState::ValueEnded() {
  stack_.pop_back();
  if (stack_.empty()) {
    value_done_ = true;
    done_ = post_left_ == 0;
    return;
  }
  Frame &p = stack_.back();
  if (p.phase == kKeyFree) {
    p.phase = kColon, p.child = 0;
    return;
  }
  p.phase = kAfterValue;
  if (p.kind == kArray)
    ++p.n;
}

JsonState::Fed JsonState::FeedLiteral(const JsonGrammar &g, Frame &f,
                                      unsigned char c) {
  const auto &lits = g.nodes_[f.node].literals;
  uint64_t next = 0;
  bool complete = false, longer = false;
  for (size_t i = 0; i < lits.size(); ++i) {
    if (!(f.mask >> i & 1))
      continue;
    if (lits[i].size() == f.pos)
      complete = true;
    else if ((unsigned char)lits[i][f.pos] == c)
      next |= 1ull << i;
  }
  if (!next)
    return complete ? Fed::kPass : Fed::kNo;
  f.mask = next, ++f.pos;
  for (size_t i = 0; i < lits.size(); ++i)
    if ((next >> i & 1) && lits[i].size() > f.pos)
      longer = true;
  if (!longer) // every candidate left is complete: the value ended
    ValueEnded();
  return Fed::kYes;
}

bool JsonState::FeedKey(const JsonGrammar &g, Frame &f, unsigned char c) {
  const JsonGrammar::Node &n = g.nodes_[f.node];
  uint64_t next = 0;
  for (size_t i = 0; i < n.keys.size(); ++i)
    if ((f.mask >> i & 1) && n.keys[i].size() > f.pos &&
        (unsigned char)n.keys[i][f.pos] == c)
      next |= 1ull << i;
  if (!next)
    return false;
  f.mask = next, ++f.pos;
  for (size_t i = 0; i < n.keys.size(); ++i)
    if ((next >> i & 1) && n.keys[i].size() == f.pos) {
      f.phase = kColon, f.child = n.props[i], f.n = (uint32_t)i + 1;
      break;
    }
  return true;
}

bool JsonState::FeedObject(const JsonGrammar &g, Frame &f, unsigned char c) {
  const JsonGrammar::Node &n = g.nodes_[f.node];
  const bool canClose = n.free_object || g.ObjectRest(n, f.n, true) == 1;
  const bool more = n.free_object || f.n < n.keys.size();
  switch (f.phase) {
  case kKey:
    return FeedKey(g, f, c);
  case kColon:
    return c == ':' ? (f.phase = kValue, true) : Space(c);
  case kValue:
    return Space(c) || StartValue(g, f.child, c);
  case kOpen:
  case kAfterValue:
    if (Space(c))
      return true;
    if (c == '}' && canClose)
      return ValueEnded(), true;
    if (f.phase == kAfterValue)
      return c == ',' && more ? (f.phase = kComma, true) : false;
    if (!more)
      return false;
    [[fallthrough]];
  case kComma:
    if (Space(c))
      return true;
    if (c != '"')
      return false;
    if (n.free_object) {
      f.phase = kKeyFree;
      Frame s;
      s.kind = kString;
      stack_.push_back(s);
      return true;
    }
    f.phase = kKey, f.pos = 1, f.mask = 0;
    for (uint32_t i = f.n; i <= g.LastCandidate(n, f.n); ++i)
      f.mask |= 1ull << i;
    return true;
  }
  return false;
}

bool JsonState::FeedArray(const JsonGrammar &g, Frame &f, unsigned char c) {
  const JsonGrammar::Node &n = g.nodes_[f.node];
  if (Space(c))
    return true;
  if (f.phase == kAfterValue) {
    if (c == ',' && f.n < n.max_items)
      return f.phase = kComma, true;
    if (c == ']' && f.n >= n.min_items)
      return ValueEnded(), true;
    return false;
  }
  if (f.phase == kOpen && c == ']' && n.min_items == 0)
    return ValueEnded(), true;
  if (f.phase == kOpen && n.max_items == 0)
    return false;
  return StartValue(g, n.items, c);
}

bool JsonState::Feed(const JsonGrammar &g, unsigned char c) {
  if (done_)
    return false;
  if (pre_left_ > 0) {
    if (c != (unsigned char)g.prefix_[g.prefix_.size() - pre_left_])
      return false;
    return --pre_left_, true;
  }
  if (value_done_) {
    if (c != (unsigned char)g.suffix_[g.suffix_.size() - post_left_])
      return false;
    done_ = --post_left_ == 0;
    return true;
  }
  if (stack_.empty()) {
    if (started_)
      return false;
    started_ = true;
    return StartValue(g, g.root_, c);
  }
  Frame &f = stack_.back();
  const bool space = c == ' ' || c == '\n' || c == '\t';
  if (!space || f.kind == kString)
    ws_ = 0;
  switch (f.kind) {
  case kString: {
    bool closed = false;
    if (!FeedString(f, c, &closed))
      return false;
    if (closed)
      ValueEnded();
    return true;
  }
  case kNumber:
  case kLiteral: {
    int r = 1;
    if (f.kind == kNumber)
      r = FeedNumber(f, c);
    else if (Fed fed = FeedLiteral(g, f, c); fed != Fed::kYes)
      r = fed == Fed::kNo ? 0 : -1;
    if (r >= 0)
      return r == 1;
    ValueEnded(); // ended before c: c is the parent's
    return Feed(g, c);
  }
  case kObject:
    return FeedObject(g, f, c);
  case kArray:
    return FeedArray(g, f, c);
  }
  return false;
}

bool JsonState::FeedAll(const JsonGrammar &g, std::string_view bytes) {
  for (char c : bytes)
    if (!Feed(g, (unsigned char)c))
      return false;
  return true;
}

bool JsonState::CanEnd(const JsonGrammar &g) const {
  if (done_)
    return true;
  if (stack_.size() != 1 || post_left_ > 0)
    return false;
  const Frame &f = stack_.back();
  if (f.kind == kNumber)
    return NumberCanEnd(f);
  if (f.kind != kLiteral)
    return false;
  const auto &lits = g.nodes_[f.node].literals;
  for (size_t i = 0; i < lits.size(); ++i)
    if ((f.mask >> i & 1) && lits[i].size() == f.pos)
      return true;
  return false;
}

/// The fewest bytes that end frame `f`; below the top, its child (the
/// frame above) counts as written.
uint32_t JsonState::FrameRest(const JsonGrammar &g, const Frame &f) const {
  const JsonGrammar::Node &n = g.nodes_[f.node];
  switch (f.kind) {
  case kString:
    return f.phase == kChars ? 1 : f.phase == kEscape ? 2 : f.n + 1;
  case kNumber:
    return NumberCanEnd(f) ? 0 : 1;
  case kLiteral: {
    uint32_t best = UINT32_MAX;
    for (size_t i = 0; i < n.literals.size(); ++i)
      if (f.mask >> i & 1)
        best = std::min(best, (uint32_t)n.literals[i].size() - f.pos);
    return best;
  }
  case kArray: {
    const uint32_t item = g.nodes_[n.items].min_len;
    const uint32_t have = f.n + (f.phase == kInValue ? 1 : 0);
    const uint32_t need = n.min_items > have ? n.min_items - have : 0;
    if (f.phase == kOpen)
      return need ? need * item + need : 1;
    if (f.phase == kComma)
      return item + (need > 1 ? (need - 1) * (item + 1) : 0) + 1;
    return need * (item + 1) + 1;
  }
  }
  // An object.
  const uint32_t tail = n.free_object ? 1 : g.ObjectRest(n, f.n, false);
  switch (f.phase) {
  case kOpen:
    return n.free_object ? 1 : g.ObjectRest(n, 0, true);
  case kKeyFree: // the key's closing quote is the string frame's
    return 1 + 1 + 1;
  case kColon:
    return 1 + g.nodes_[f.child].min_len + tail;
  case kValue:
    return g.nodes_[f.child].min_len + tail;
  case kInValue:
  case kAfterValue:
    return tail;
  }
  // kKey (pos > 0) or kComma (pos 0, with the key's opening quote).
  if (n.free_object)
    return 2 + 1 + 1 + 1;
  uint32_t best = UINT32_MAX;
  const uint64_t mask = f.phase == kKey ? f.mask : ~0ull;
  for (uint32_t i = f.n; i <= g.LastCandidate(n, f.n); ++i)
    if (mask >> i & 1)
      best = std::min(best, (uint32_t)n.keys[i].size() -
                                (f.phase == kKey ? f.pos : 0) + 1 +
                                g.nodes_[n.props[i]].min_len +
                                g.ObjectRest(n, i + 1, false));
  return best;
}

uint32_t JsonState::ClosingLength(const JsonGrammar &g) const {
  if (done_)
    return 0;
  if (!started_)
    return pre_left_ + g.nodes_[g.root_].min_len + post_left_;
  uint32_t total = post_left_;
  for (size_t i = stack_.size(); i-- > 0;)
    total += FrameRest(g, stack_[i]);
  return total;
}

//===----------------------------------------------------------------------===//
// The grammar
//===----------------------------------------------------------------------===//

JsonGrammar::JsonGrammar() {
  nodes_.resize(3);
  nodes_[0].types = kAny;
  nodes_[1].literals = {"true", "false"};
  nodes_[1].min_len = 4;
  nodes_[2].literals = {"null"};
  nodes_[2].min_len = 4;
}

JsonState JsonGrammar::Start() const {
  JsonState s;
  s.pre_left_ = (uint32_t)prefix_.size();
  s.post_left_ = (uint32_t)suffix_.size();
  return s;
}

JsonGrammar JsonGrammar::AnyObject() {
  JsonGrammar g;
  Node n;
  n.types = kObj;
  n.min_len = 2;
  g.nodes_.push_back(n);
  g.root_ = 3;
  return g;
}

uint32_t JsonGrammar::ObjectRest(const Node &n, uint32_t from,
                                 bool first) const {
  uint32_t total = 1;
  for (size_t k = from; k < n.keys.size(); ++k)
    if (n.required[k]) {
      total += (first ? 0 : 1) + (uint32_t)n.keys[k].size() + 1 +
               nodes_[n.props[k]].min_len;
      first = false;
    }
  return total;
}

uint32_t JsonGrammar::LastCandidate(const Node &n, uint32_t from) const {
  for (uint32_t k = from; k < n.keys.size(); ++k)
    if (n.required[k])
      return k;
  return (uint32_t)n.keys.size() - 1;
}

void JsonGrammar::ComputeMinLength(Node &n) const {
  uint32_t best = UINT32_MAX;
  for (const std::string &l : n.literals)
    best = std::min(best, (uint32_t)l.size());
  if (!n.literals.empty()) {
    n.min_len = best;
    return;
  }
  if (n.types & kObj)
    best = std::min(best, n.free_object ? 2 : ObjectRest(n, 0, true) + 1);
  if (n.types & kArr) {
    const uint32_t item = nodes_[n.items].min_len;
    best = std::min(best, n.min_items == 0
                              ? 2
                              : 2 + n.min_items * item + n.min_items - 1);
  }
  if (n.types & kStr)
    best = std::min(best, 2u);
  if (n.types & (kNum | kInt))
    best = std::min(best, 1u);
  if (n.types & (kBool | kNull))
    best = std::min(best, 4u);
  n.min_len = best;
}

//===----------------------------------------------------------------------===//
// JSON Schema
//===----------------------------------------------------------------------===//

struct SchemaCompiler {
  JsonGrammar &g;
  std::string error;

  uint32_t depth = 0;

  bool Fail(const std::string &where, const std::string &what) {
    error = absl::StrCat(what, " (at ", where.empty() ? "/" : where, ")");
    return false;
  }
  bool Types(const json &s, const std::string &at, JsonGrammar::Node *n);
  bool Object(const json &s, const std::string &at, JsonGrammar::Node *n);
  bool Array(const json &s, const std::string &at, JsonGrammar::Node *n);
  bool Literals(const json &s, const std::string &at, JsonGrammar::Node *n);
  /// The node of schema `s`; 0 on error (node 0 is never a compiled one).
  uint16_t Compile(const json &s, const std::string &at);
};

bool SchemaCompiler::Types(const json &s, const std::string &at,
                           JsonGrammar::Node *n) {
  static const std::pair<const char *, uint8_t> kNames[] = {
      {"object", JsonGrammar::kObj}, {"array", JsonGrammar::kArr},
      {"string", JsonGrammar::kStr}, {"number", JsonGrammar::kNum},
      {"integer", JsonGrammar::kInt}, {"boolean", JsonGrammar::kBool},
      {"null", JsonGrammar::kNull}};
  if (!s.contains("type")) {
    n->types = s.contains("properties") ? JsonGrammar::kObj
               : s.contains("items")    ? JsonGrammar::kArr
                                        : JsonGrammar::kAny;
    return true;
  }
  const json &t = s["type"];
  for (const json &one : t.is_array() ? t : json::array({t})) {
    uint8_t bit = 0;
    for (const auto &[name, b] : kNames)
      if (one.is_string() && one.get<std::string>() == name)
        bit = b;
    if (!bit)
      return Fail(at + "/type", absl::StrCat("'type' ", one.dump(),
                                             " is not a JSON Schema type"));
    n->types |= bit;
  }
  return n->types ? true : Fail(at + "/type", "'type' is an empty list");
}

bool SchemaCompiler::Literals(const json &s, const std::string &at,
                              JsonGrammar::Node *n) {
  if (s.contains("const"))
    n->literals.push_back(s["const"].dump());
  if (s.contains("enum")) {
    if (!s["enum"].is_array() || s["enum"].empty() || s["enum"].size() > 64)
      return Fail(at + "/enum",
                  "'enum' must be a list of 1 to 64 values here");
    if (!n->literals.empty())
      return Fail(at, "'enum' beside 'const' is not supported");
    for (const json &v : s["enum"])
      n->literals.push_back(v.dump());
  }
  return true;
}

bool SchemaCompiler::Object(const json &s, const std::string &at,
                            JsonGrammar::Node *n) {
  const json props = s.value("properties", json::object());
  const json req = s.value("required", json::array());
  if (!props.is_object() || props.size() > 64)
    return Fail(at + "/properties",
                "'properties' must be an object of at most 64 members");
  if (!req.is_array())
    return Fail(at + "/required", "'required' must be a list of names");
  const bool closed = s.contains("additionalProperties") &&
                      s["additionalProperties"] == false;
  n->free_object = props.empty() && !closed;
  for (const json &r : req)
    if (!r.is_string() || !props.contains(r.get<std::string>()))
      return Fail(at + "/required",
                  absl::StrCat("'required' names ", r.dump(),
                               ", which 'properties' does not list"));
  for (auto it = props.begin(); it != props.end(); ++it) {
    const uint16_t child =
        Compile(it.value(), at + "/properties/" + it.key());
    if (!child)
      return false;
    n->keys.push_back(json(it.key()).dump());
    n->props.push_back(child);
    n->required.push_back(std::find(req.begin(), req.end(), it.key()) !=
                          req.end());
  }
  return true;
}

bool SchemaCompiler::Array(const json &s, const std::string &at,
                           JsonGrammar::Node *n) {
  for (const char *k : {"minItems", "maxItems"})
    if (s.contains(k) && !(s[k].is_number_unsigned() && s[k] <= 4096))
      return Fail(at + "/" + k,
                  absl::StrCat("'", k, "' must be an integer in [0, 4096]"));
  n->min_items = s.value("minItems", 0u);
  n->max_items = s.value("maxItems", UINT32_MAX);
  if (n->min_items > n->max_items)
    return Fail(at, "'minItems' is larger than 'maxItems'");
  if (s.contains("items")) {
    n->items = Compile(s["items"], at + "/items");
    if (!n->items)
      return false;
  }
  return true;
}

uint16_t SchemaCompiler::Compile(const json &s, const std::string &at) {
  static const char *const kKnown[] = {
      "type",     "properties", "required", "enum",        "const",
      "items",    "minItems",   "maxItems", "additionalProperties",
      "title",    "description", "$schema", "$comment",    "default",
      "examples"};
  if (s == true || (s.is_object() && s.empty()))
    return Compile(json{{"type", {"object", "array", "string", "number",
                                  "boolean", "null"}}},
                   at); // any value
  if (!s.is_object())
    return Fail(at, "a schema must be an object"), 0;
  for (auto it = s.begin(); it != s.end(); ++it)
    if (std::find_if(std::begin(kKnown), std::end(kKnown), [&](const char *k) {
          return it.key() == k;
        }) == std::end(kKnown))
      return Fail(at, absl::StrCat("the JSON Schema keyword '", it.key(),
                                   "' is not supported")),
             0;
  if (++depth > kMaxDepth - 2)
    return Fail(at, "the schema nests too deep"), 0;
  JsonGrammar::Node n;
  bool ok = Types(s, at, &n) && Literals(s, at, &n);
  if (ok && n.literals.empty() && (n.types & JsonGrammar::kObj))
    ok = Object(s, at, &n);
  if (ok && n.literals.empty() && (n.types & JsonGrammar::kArr))
    ok = Array(s, at, &n);
  --depth;
  if (!ok)
    return 0;
  if (g.nodes_.size() >= 65535)
    return Fail(at, "the schema is too large"), 0;
  g.ComputeMinLength(n);
  g.nodes_.push_back(std::move(n));
  return (uint16_t)(g.nodes_.size() - 1);
}

absl::StatusOr<JsonGrammar> JsonGrammar::FromSchema(std::string_view text) {
  json s = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (s.is_discarded())
    return absl::InvalidArgumentError("the schema is not JSON");
  JsonGrammar g;
  SchemaCompiler c{g, "", 0};
  const uint16_t root = c.Compile(s, "");
  if (!root)
    return absl::InvalidArgumentError(c.error);
  g.root_ = root;
  return g;
}

} // namespace duck::runtime
