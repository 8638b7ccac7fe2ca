//===- JsonGrammar.h - JSON and JSON Schema as a byte-level automaton -*- C++
//-*-===//
//
// Constrained decoding for `response_format`: a pushdown automaton over the
// bytes of a JSON text. JsonGrammar is the compiled, immutable grammar (any
// JSON object, or a JSON Schema of the common subset); JsonState is one
// generation's position in it, small and cheap to copy, so that a candidate
// token is tried by feeding its bytes to a copy.
//
// The schema subset: `type` (object, array, string, number, integer,
// boolean, null, or a list of them), `properties`, `required`, `enum`,
// `const`, `items`, `minItems`, `maxItems`, `additionalProperties` (any
// value: members beyond `properties` are never generated), and the
// annotations `title`, `description`, `$schema`, `$comment`, `default`,
// `examples`. Any other keyword is refused, naming it. Object members are
// generated in the order `properties` lists them (optional ones may be
// left out); an object without `properties` (and without
// `additionalProperties: false`) and a schema without a type take any
// JSON. Insignificant whitespace: one byte, or a newline and up to 16
// spaces or tabs of indentation; none around the top-level value. Numbers: at most 15 digits before and after
// the point and 2 in the exponent (JavaScript reads them as finite
// numbers, and integers exactly).
//
// ClosingLength is the fewest bytes that complete the text from a state,
// exact for every state: the decoding rule that keeps a text closable
// within its token budget relies on it (every byte is a token of a
// byte-level vocabulary, so one byte of the shortest completion can always
// be sent).
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_SERVE_JSONGRAMMAR_H
#define DUCK_RUNTIME_SERVE_JSONGRAMMAR_H

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace duck::runtime {

class JsonGrammar;

/// A position in a JsonGrammar's text.
class JsonState {
public:
  /// Consumes one byte; false (and the state unspecified) when the grammar
  /// does not allow it here.
  bool Feed(const JsonGrammar &g, unsigned char c);
  /// Consumes `bytes`; false when any is refused.
  bool FeedAll(const JsonGrammar &g, std::string_view bytes);
  /// True when the text so far is a complete value (it may go on: a
  /// number, an enum value that prefixes another).
  bool CanEnd(const JsonGrammar &g) const;
  /// True when the value (and the grammar's suffix) is complete and
  /// nothing may follow.
  bool Done() const { return done_; }
  /// The fewest bytes that complete the value.
  uint32_t ClosingLength(const JsonGrammar &g) const;

  struct Frame {
    uint8_t kind = 0, phase = 0;
    uint16_t node = 0, child = 0;
    uint32_t n = 0, pos = 0;
    uint64_t mask = 0;
  };

private:
  enum class Fed { kNo, kYes, kPass };
  bool StartValue(const JsonGrammar &g, uint16_t node, unsigned char c);
  void ValueEnded();
  bool FeedObject(const JsonGrammar &g, Frame &f, unsigned char c);
  bool FeedArray(const JsonGrammar &g, Frame &f, unsigned char c);
  bool FeedKey(const JsonGrammar &g, Frame &f, unsigned char c);
  Fed FeedLiteral(const JsonGrammar &g, Frame &f, unsigned char c);
  bool Space(unsigned char c);
  uint32_t FrameRest(const JsonGrammar &g, const Frame &f) const;

  friend class JsonGrammar;
  absl::InlinedVector<Frame, 12> stack_;
  bool started_ = false, value_done_ = false, done_ = false;
  uint32_t pre_left_ = 0, post_left_ = 0; // bytes of the affixes to come
  uint8_t ws_ = 0; // whitespace bytes in a row; high bit: after a newline
};

class JsonGrammar {
public:
  /// `response_format: {"type": "json_object"}`: any JSON object.
  static JsonGrammar AnyObject();
  /// A JSON Schema (its JSON text); InvalidArgument naming the keyword or
  /// value outside the subset, and where it is.
  static absl::StatusOr<JsonGrammar> FromSchema(std::string_view schema);

  /// The same grammar between two literal texts (a tool call's
  /// "<tool_call>\n" and "\n</tool_call>").
  void SetAffixes(std::string prefix, std::string suffix) {
    prefix_ = std::move(prefix), suffix_ = std::move(suffix);
  }

  /// The fewest bytes of a complete text.
  uint32_t MinLength() const {
    return nodes_[root_].min_len + (uint32_t)(prefix_.size() + suffix_.size());
  }
  JsonState Start() const;

private:
  friend class JsonState;
  friend struct SchemaCompiler;
  enum Types : uint8_t {
    kObj = 1, kArr = 2, kStr = 4, kNum = 8, kInt = 16, kBool = 32,
    kNull = 64, kAny = 127
  };
  struct Node {
    uint8_t types = 0;                 // what a value may be
    std::vector<std::string> literals; // enum/const: only these texts
    bool free_object = true;           // any members
    std::vector<std::string> keys;     // "key" with its quotes
    std::vector<uint16_t> props;       // each key's value
    std::vector<bool> required;
    uint16_t items = 0; // 0: any value
    uint32_t min_items = 0, max_items = UINT32_MAX;
    uint32_t min_len = 1;
  };
  JsonGrammar();
  /// Fewest bytes that end a schema object after its members [0, from),
  /// `first` when none was written yet (no comma ahead).
  uint32_t ObjectRest(const Node &n, uint32_t from, bool first) const;
  /// The last property index a member at `from` may use (the first
  /// required one at or after it, else the last).
  uint32_t LastCandidate(const Node &n, uint32_t from) const;
  void ComputeMinLength(Node &n) const;

  std::vector<Node> nodes_; // 0: any value, 1: true/false, 2: null
  uint16_t root_ = 0;
  std::string prefix_, suffix_;
};

} // namespace duck::runtime

#endif
