//===- Tokenizer.cpp - HF tokenizer.json byte-level BPE -------------------===//
//
// Loading checks everything the encoder relies on once; encoding then runs
// without failure paths: added-token split -> NFC -> Split regexes -> byte
// mapping -> BPE (a min-heap of (rank, position) over a linked list of
// symbols, so long pre-tokens stay O(n log n)).
//===----------------------------------------------------------------------===//
#include "duck/runtime/text/Tokenizer.h"

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <nlohmann/json.hpp>
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace duck::runtime {
namespace {

using Json = nlohmann::json;

// Bounds the id-indexed tables a hostile file could make us allocate.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

/// Debian's abseil has its own string_view; StrCat and the hash maps need it.
absl::string_view AbslView(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD"; // U+FFFD

//===----------------------------------------------------------------------===//
// UTF-8
//===----------------------------------------------------------------------===//

/// Appends the valid UTF-8 of `in` to `out`, each maximal invalid subpart
/// replaced by one U+FFFD (the Unicode/W3C recommended practice, as Rust's
/// from_utf8_lossy and JS TextDecoder do). With `hold_incomplete_tail`, a
/// truncated but so far valid sequence at the very end is not consumed.
/// Returns the number of bytes consumed.
size_t AppendValidUtf8(std::string_view in, std::string *out,
                       bool hold_incomplete_tail) {
  const size_t n = in.size();
  size_t i = 0;
  while (i < n) {
    const auto b = static_cast<uint8_t>(in[i]);
    if (b < 0x80) {
      out->push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    int need;
    uint8_t lo = 0x80, hi = 0xBF; // allowed range of the next byte
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0)
        lo = 0xA0; // no overlong forms
      if (b == 0xED)
        hi = 0x9F; // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0)
        lo = 0x90;
      if (b == 0xF4)
        hi = 0x8F; // <= U+10FFFF
    } else {
      out->append(kReplacementChar);
      ++i;
      continue;
    }
    size_t j = i + 1;
    int got = 0;
    while (got < need && j < n) {
      const auto c = static_cast<uint8_t>(in[j]);
      if (c < lo || c > hi)
        break;
      lo = 0x80;
      hi = 0xBF;
      ++j;
      ++got;
    }
    if (got == need) {
      out->append(in.data() + i, j - i);
    } else if (j == n && hold_incomplete_tail) {
      return i;
    } else {
      out->append(kReplacementChar);
    }
    i = j;
  }
  return n;
}

/// Decodes the code point at s[*i] of valid UTF-8 and advances *i.
uint32_t NextCodePoint(std::string_view s, size_t *i) {
  const auto b = static_cast<uint8_t>(s[*i]);
  int extra = b < 0x80 ? 0 : b < 0xE0 ? 1 : b < 0xF0 ? 2 : 3;
  uint32_t cp = extra == 0   ? b
                : extra == 1 ? (b & 0x1F)
                : extra == 2 ? (b & 0x0F)
                             : (b & 0x07);
  ++*i;
  for (; extra > 0 && *i < s.size(); --extra, ++*i)
    cp = (cp << 6) | (static_cast<uint8_t>(s[*i]) & 0x3F);
  return cp;
}

void AppendCodePoint(uint32_t cp, std::string *out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsAscii(std::string_view s) {
  for (char c : s)
    if (static_cast<uint8_t>(c) >= 0x80)
      return false;
  return true;
}

//===----------------------------------------------------------------------===//
// GPT-2 byte-to-unicode table
//===----------------------------------------------------------------------===//

/// Printable bytes map to themselves; the other 68, in increasing order,
/// to U+0100 + n.
std::array<uint32_t, 256> ByteToCodePointTable() {
  std::array<uint32_t, 256> table{};
  uint32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    table[b] = printable ? static_cast<uint32_t>(b) : next++;
  }
  return table;
}

struct PcreCodeDeleter {
  void operator()(pcre2_code *code) const { pcre2_code_free(code); }
};
using PcreCode = std::unique_ptr<pcre2_code, PcreCodeDeleter>;

struct PcreMatchDataDeleter {
  void operator()(pcre2_match_data *data) const { pcre2_match_data_free(data); }
};
using PcreMatchData = std::unique_ptr<pcre2_match_data, PcreMatchDataDeleter>;

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
  bool normalized; // matched in the normalised text rather than the raw one
};

struct Merge {
  int32_t rank;
  int32_t id; // the merged token
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (uint64_t{static_cast<uint32_t>(left)} << 32) |
         static_cast<uint32_t>(right);
}

/// Per-Encode() scratch, so that Encode() stays const and reentrant.
struct EncodeScratch {
  struct Symbol {
    int32_t id; // -1 once merged into its left neighbour
    int32_t prev, next;
  };
  struct Candidate {
    int32_t rank, pos, left, right, merged;
  };
  PcreMatchData match_data;
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::string mapped;
  std::string normalized;
};

} // namespace

struct Tokenizer::Impl {
  bool nfc = false;
  std::vector<PcreCode> splits; // applied in order, each with Isolated
  bool ignore_merges = false;
  int32_t unk_id = -1;

  absl::flat_hash_map<std::string, int32_t> vocab; // model.vocab
  absl::flat_hash_map<uint64_t, Merge> merges;
  std::array<uint32_t, 256> byte_chars{};
  std::array<int32_t, 256> byte_ids{}; // -1: no token for that byte

  std::vector<AddedToken> added;
  absl::flat_hash_map<std::string, int32_t> added_ids;
  // Indices into `added` by first byte, longest first: the first one that
  // matches at a position is the leftmost-longest match.
  std::array<std::vector<uint32_t>, 256> added_by_first_byte;

  std::vector<std::string> token_text;  // by id
  std::vector<std::string> token_bytes; // by id
  std::vector<int32_t> special_ids;
  std::vector<bool> is_special; // by id

  template <typename Fn>
  void SplitAdded(std::string_view text, bool normalized_pass,
                  bool allow_special, Fn &&fn) const;
  std::string_view Normalize(std::string_view text, std::string *buf) const;
  void PreTokenize(std::string_view text, size_t level, EncodeScratch &s,
                   std::vector<int32_t> &out) const;
  void Bpe(std::string_view piece, EncodeScratch &s,
           std::vector<int32_t> &out) const;
};

namespace {

//===----------------------------------------------------------------------===//
// Loading
//===----------------------------------------------------------------------===//

const char *TypeName(const Json &j) {
  switch (j.type()) {
  case Json::value_t::null:
    return "null";
  case Json::value_t::object:
    return "an object";
  case Json::value_t::array:
    return "an array";
  case Json::value_t::string:
    return "a string";
  case Json::value_t::boolean:
    return "a boolean";
  case Json::value_t::number_integer:
  case Json::value_t::number_unsigned:
    return "an integer";
  case Json::value_t::number_float:
    return "a number";
  default:
    return "a binary value";
  }
}

/// Reads tokenizer.json into an Impl; every error names the source file
/// and the field.
class Loader {
public:
  Loader(std::string_view source, Tokenizer::Impl &impl)
      : source_(source), impl_(impl) {}

  absl::Status Load(const Json &root);

private:
  absl::Status Error(const std::string &what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", what));
  }
  /// `obj[key]`, or nullptr when absent (obj is an object).
  static const Json *Find(const Json &obj, std::string_view key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  absl::Status ExpectType(const Json &j, Json::value_t type,
                          const std::string &where,
                          const char *expected) const {
    const bool ok =
        j.type() == type ||
        (type == Json::value_t::number_integer && j.is_number_integer());
    if (ok)
      return absl::OkStatus();
    return Error(
        absl::StrCat(where, " must be ", expected, ", not ", TypeName(j)));
  }
  /// An optional boolean field (absent or null gives `def`).
  absl::StatusOr<bool> OptionalBool(const Json &obj, const char *key,
                                    const std::string &where, bool def) const {
    const Json *j = Find(obj, key);
    if (!j || j->is_null())
      return def;
    if (!j->is_boolean())
      return Error(absl::StrCat(where, ".", key, " must be a boolean, not ",
                                TypeName(*j)));
    return j->get<bool>();
  }
  /// An optional string that must be empty when present.
  absl::Status ExpectEmptyString(const Json &obj, const char *key,
                                 const std::string &where) const {
    const Json *j = Find(obj, key);
    if (!j || j->is_null())
      return absl::OkStatus();
    if (!j->is_string() || !j->get_ref<const std::string &>().empty())
      return Error(absl::StrCat(where, ".", key, " is ", j->dump(),
                                "; only an empty ", key, " is supported"));
    return absl::OkStatus();
  }
  absl::StatusOr<int32_t> TokenIdValue(const Json &j,
                                       const std::string &where) const {
    if (!j.is_number_integer())
      return Error(
          absl::StrCat(where, " must be an integer id, not ", TypeName(j)));
    const int64_t id = j.is_number_unsigned()
                           ? static_cast<int64_t>(std::min<uint64_t>(
                                 j.get<uint64_t>(), uint64_t{1} << 62))
                           : j.get<int64_t>();
    if (id < 0 || id >= kMaxTokenId)
      return Error(absl::StrCat(where, " is ", id, "; ids must be in [0, ",
                                kMaxTokenId, ")"));
    return static_cast<int32_t>(id);
  }

  absl::Status LoadModel(const Json &model);
  absl::Status LoadMerges(const Json &merges);
  absl::Status LoadAddedTokens(const Json &added);
  absl::Status LoadNormalizer(const Json &normalizer, const std::string &where);
  absl::Status LoadPreTokenizer(const Json &pre);
  absl::Status LoadSplit(const Json &split, const std::string &where);
  absl::Status LoadDecoder(const Json &decoder);
  absl::Status BuildTables();

  std::string source_;
  Tokenizer::Impl &impl_;
};

absl::Status Loader::Load(const Json &root) {
  if (!root.is_object())
    return Error(absl::StrCat("the top level must be a JSON object, not ",
                              TypeName(root)));
  const Json *model = Find(root, "model");
  if (!model)
    return Error("model is missing");
  if (auto st = LoadModel(*model); !st.ok())
    return st;
  if (const Json *added = Find(root, "added_tokens");
      added && !added->is_null())
    if (auto st = LoadAddedTokens(*added); !st.ok())
      return st;
  if (const Json *norm = Find(root, "normalizer"); norm && !norm->is_null())
    if (auto st = LoadNormalizer(*norm, "normalizer"); !st.ok())
      return st;
  const Json *pre = Find(root, "pre_tokenizer");
  if (!pre || pre->is_null())
    return Error("pre_tokenizer is missing; a byte-level BPE needs "
                 "[Split..., ByteLevel]");
  if (auto st = LoadPreTokenizer(*pre); !st.ok())
    return st;
  const Json *decoder = Find(root, "decoder");
  if (!decoder || decoder->is_null())
    return Error("decoder is missing; only ByteLevel is supported");
  if (auto st = LoadDecoder(*decoder); !st.ok())
    return st;
  return BuildTables();
}

absl::Status Loader::LoadModel(const Json &model) {
  if (auto st = ExpectType(model, Json::value_t::object, "model", "an object");
      !st.ok())
    return st;
  const Json *type = Find(model, "type");
  if (!type)
    return Error("model.type is missing; only BPE is supported");
  if (!type->is_string() || type->get_ref<const std::string &>() != "BPE")
    return Error(absl::StrCat(
        "model.type is ",
        type->is_string() ? type->get_ref<const std::string &>() : type->dump(),
        "; only BPE is supported"));

  if (const Json *dropout = Find(model, "dropout");
      dropout && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0))
    return Error(absl::StrCat("model.dropout is ", dropout->dump(),
                              "; BPE dropout is not supported"));
  for (const char *key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto st = ExpectEmptyString(model, key, "model"); !st.ok())
      return st;
  auto byte_fallback = OptionalBool(model, "byte_fallback", "model", false);
  if (!byte_fallback.ok())
    return byte_fallback.status();
  if (*byte_fallback)
    return Error("model.byte_fallback is true; byte-fallback BPE is not "
                 "supported (only byte-level BPE)");
  auto ignore_merges = OptionalBool(model, "ignore_merges", "model", false);
  if (!ignore_merges.ok())
    return ignore_merges.status();
  impl_.ignore_merges = *ignore_merges;

  const Json *vocab = Find(model, "vocab");
  if (!vocab || vocab->is_null())
    return Error("model.vocab is missing");
  if (auto st =
          ExpectType(*vocab, Json::value_t::object, "model.vocab", "an object");
      !st.ok())
    return st;
  if (vocab->empty())
    return Error("model.vocab is empty");
  impl_.vocab.reserve(vocab->size());
  for (const auto &[token, value] : vocab->items()) {
    // The message is only built for a bad entry: 150k entries load here.
    const bool plain_id = value.is_number_integer() &&
                          value.get<int64_t>() >= 0 &&
                          value.get<int64_t>() < kMaxTokenId;
    auto id =
        plain_id
            ? static_cast<int32_t>(value.get<int64_t>())
            : TokenIdValue(value, absl::StrCat("model.vocab[\"", token, "\"]"));
    if (!id.ok())
      return id.status();
    impl_.vocab.try_emplace(token, *id);
  }

  if (const Json *unk = Find(model, "unk_token"); unk && !unk->is_null()) {
    if (!unk->is_string())
      return Error(absl::StrCat("model.unk_token must be a string, not ",
                                TypeName(*unk)));
    auto it = impl_.vocab.find(unk->get_ref<const std::string &>());
    if (it == impl_.vocab.end())
      return Error(absl::StrCat("model.unk_token ", unk->dump(),
                                " is not in model.vocab"));
    impl_.unk_id = it->second;
  }

  const Json *merges = Find(model, "merges");
  if (!merges || merges->is_null())
    return Error("model.merges is missing");
  return LoadMerges(*merges);
}

absl::Status Loader::LoadMerges(const Json &merges) {
  if (auto st =
          ExpectType(merges, Json::value_t::array, "model.merges", "an array");
      !st.ok())
    return st;
  impl_.merges.reserve(merges.size());
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json &m = merges[rank];
    auto where = [rank] { return absl::StrCat("model.merges[", rank, "]"); };
    std::string_view left, right;
    if (m.is_string()) {
      // "a b": byte-level tokens never contain a space.
      const std::string &s = m.get_ref<const std::string &>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != s.npos)
        return Error(absl::StrCat(where(), " is ", m.dump(),
                                  "; expected two tokens separated by one "
                                  "space"));
      left = std::string_view(s).substr(0, space);
      right = std::string_view(s).substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() &&
               m[1].is_string()) {
      left = m[0].get_ref<const std::string &>();
      right = m[1].get_ref<const std::string &>();
    } else {
      return Error(absl::StrCat(where(), " is ", m.dump(),
                                "; expected \"a b\" or [\"a\", \"b\"]"));
    }
    auto find = [&](std::string_view token) -> int32_t {
      auto it = impl_.vocab.find(AbslView(token));
      return it == impl_.vocab.end() ? -1 : it->second;
    };
    const int32_t left_id = find(left), right_id = find(right);
    merged.assign(left);
    merged.append(right);
    const int32_t merged_id = find(merged);
    for (auto [token, id] :
         {std::pair<std::string_view, int32_t>{left, left_id},
          {right, right_id},
          {merged, merged_id}})
      if (id < 0)
        return Error(absl::StrCat(where(), " ", m.dump(), " needs \"",
                                  AbslView(token),
                                  "\", which is not in model.vocab"));
    // A repeated pair keeps its first (best) rank.
    impl_.merges.try_emplace(PairKey(left_id, right_id),
                             Merge{static_cast<int32_t>(rank), merged_id});
  }
  return absl::OkStatus();
}

absl::Status Loader::LoadAddedTokens(const Json &added) {
  if (auto st =
          ExpectType(added, Json::value_t::array, "added_tokens", "an array");
      !st.ok())
    return st;
  for (size_t i = 0; i < added.size(); ++i) {
    const Json &t = added[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    if (auto st = ExpectType(t, Json::value_t::object, where, "an object");
        !st.ok())
      return st;
    const Json *id = Find(t, "id");
    const Json *content = Find(t, "content");
    if (!id)
      return Error(absl::StrCat(where, ".id is missing"));
    if (!content || !content->is_string() ||
        content->get_ref<const std::string &>().empty())
      return Error(absl::StrCat(where, ".content must be a non-empty string"));
    AddedToken token;
    token.content = content->get<std::string>();
    auto id_value = TokenIdValue(*id, where + ".id");
    if (!id_value.ok())
      return id_value.status();
    token.id = *id_value;
    auto special = OptionalBool(t, "special", where, false);
    if (!special.ok())
      return special.status();
    token.special = *special;
    // tokenizers' default: special tokens are matched in the raw text.
    auto normalized = OptionalBool(t, "normalized", where, !token.special);
    if (!normalized.ok())
      return normalized.status();
    token.normalized = *normalized;
    for (const char *flag : {"lstrip", "rstrip", "single_word"}) {
      auto value = OptionalBool(t, flag, where, false);
      if (!value.ok())
        return value.status();
      if (*value)
        return Error(absl::StrCat(where, " (", content->dump(), ") sets ", flag,
                                  "; not supported"));
    }
    if (!impl_.added_ids.try_emplace(token.content, token.id).second)
      return Error(
          absl::StrCat(where, ": ", content->dump(), " is listed twice"));
    impl_.added.push_back(std::move(token));
  }
  return absl::OkStatus();
}

absl::Status Loader::LoadNormalizer(const Json &normalizer,
                                    const std::string &where) {
  if (auto st =
          ExpectType(normalizer, Json::value_t::object, where, "an object");
      !st.ok())
    return st;
  const Json *type = Find(normalizer, "type");
  const std::string name =
      type && type->is_string() ? type->get<std::string>() : "missing";
  if (name == "NFC") {
    impl_.nfc = true;
    return absl::OkStatus();
  }
  if (name == "Sequence") {
    const Json *list = Find(normalizer, "normalizers");
    const std::string list_where = absl::StrCat(where, ".normalizers");
    if (!list)
      return Error(absl::StrCat(list_where, " is missing"));
    if (auto st =
            ExpectType(*list, Json::value_t::array, list_where, "an array");
        !st.ok())
      return st;
    for (size_t i = 0; i < list->size(); ++i)
      if (auto st =
              LoadNormalizer((*list)[i], absl::StrCat(list_where, "[", i, "]"));
          !st.ok())
        return st;
    return absl::OkStatus();
  }
  return Error(absl::StrCat(where, ".type is ", name,
                            "; only NFC (or none) is supported"));
}

absl::Status Loader::LoadPreTokenizer(const Json &pre) {
  if (auto st =
          ExpectType(pre, Json::value_t::object, "pre_tokenizer", "an object");
      !st.ok())
    return st;
  std::vector<std::pair<const Json *, std::string>> steps;
  const Json *type = Find(pre, "type");
  if (type && type->is_string() &&
      type->get_ref<const std::string &>() == "Sequence") {
    const Json *list = Find(pre, "pretokenizers");
    if (!list || !list->is_array())
      return Error("pre_tokenizer.pretokenizers must be an array");
    for (size_t i = 0; i < list->size(); ++i)
      steps.emplace_back(&(*list)[i],
                         absl::StrCat("pre_tokenizer.pretokenizers[", i, "]"));
  } else {
    steps.emplace_back(&pre, "pre_tokenizer");
  }

  for (size_t i = 0; i < steps.size(); ++i) {
    const auto &[step, where] = steps[i];
    if (!step->is_object())
      return Error(absl::StrCat(where, " must be an object"));
    const Json *step_type = Find(*step, "type");
    const std::string name = step_type && step_type->is_string()
                                 ? step_type->get<std::string>()
                                 : "missing";
    const bool last = i + 1 == steps.size();
    if (name == "Split" && !last) {
      if (auto st = LoadSplit(*step, where); !st.ok())
        return st;
      continue;
    }
    if (name == "ByteLevel" && last) {
      // tokenizers' defaults are add_prefix_space=true, use_regex=true.
      auto prefix = OptionalBool(*step, "add_prefix_space", where, true);
      if (!prefix.ok())
        return prefix.status();
      auto use_regex = OptionalBool(*step, "use_regex", where, true);
      if (!use_regex.ok())
        return use_regex.status();
      if (*prefix)
        return Error(absl::StrCat(where, " is ByteLevel with "
                                         "add_prefix_space=true; not "
                                         "supported"));
      if (*use_regex)
        return Error(absl::StrCat(where, " is ByteLevel with use_regex=true "
                                         "(the built-in GPT-2 regex); only "
                                         "Split steps then ByteLevel with "
                                         "use_regex=false are supported"));
      continue;
    }
    return Error(absl::StrCat(
        where, ".type is ", name,
        "; only Sequence[Split (behavior Isolated)..., ByteLevel] is "
        "supported"));
  }
  return absl::OkStatus();
}

absl::Status Loader::LoadSplit(const Json &split, const std::string &where) {
  const Json *behavior = Find(split, "behavior");
  if (!behavior || !behavior->is_string() ||
      behavior->get_ref<const std::string &>() != "Isolated")
    return Error(absl::StrCat(
        where, ".behavior is ", behavior ? behavior->dump() : "missing",
        "; only Split with behavior Isolated is supported"));
  auto invert = OptionalBool(split, "invert", where, false);
  if (!invert.ok())
    return invert.status();
  if (*invert)
    return Error(absl::StrCat(where, ".invert is true; not supported"));
  const Json *pattern = Find(split, "pattern");
  if (!pattern || !pattern->is_object())
    return Error(absl::StrCat(where, ".pattern must be an object with Regex "
                                     "or String"));
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  const Json *text = Find(*pattern, "Regex");
  std::string field = absl::StrCat(where, ".pattern.Regex");
  if (!text) {
    text = Find(*pattern, "String");
    field = absl::StrCat(where, ".pattern.String");
    options |= PCRE2_LITERAL;
  }
  if (!text || !text->is_string() ||
      text->get_ref<const std::string &>().empty())
    return Error(absl::StrCat(where, ".pattern must hold a non-empty Regex "
                                     "or String"));
  const std::string &source = text->get_ref<const std::string &>();
  int error = 0;
  PCRE2_SIZE offset = 0;
  PcreCode code(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()),
                              source.size(), options, &error, &offset,
                              nullptr));
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Error(absl::StrCat(field, " does not compile at offset ", offset,
                              ": ", reinterpret_cast<const char *>(message)));
  }
  // JIT when the library has it; the interpreter otherwise.
  (void)pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE);
  impl_.splits.push_back(std::move(code));
  return absl::OkStatus();
}

absl::Status Loader::LoadDecoder(const Json &decoder) {
  const Json *type = decoder.is_object() ? Find(decoder, "type") : nullptr;
  const std::string name =
      type && type->is_string() ? type->get<std::string>() : "missing";
  if (name != "ByteLevel")
    return Error(absl::StrCat("decoder.type is ", name,
                              "; only ByteLevel is supported"));
  return absl::OkStatus();
}

absl::Status Loader::BuildTables() {
  int64_t max_id = -1;
  for (const auto &[token, id] : impl_.vocab)
    max_id = std::max<int64_t>(max_id, id);
  for (const AddedToken &t : impl_.added)
    max_id = std::max<int64_t>(max_id, t.id);
  const size_t size = static_cast<size_t>(max_id + 1);
  impl_.token_text.assign(size, std::string());
  impl_.token_bytes.assign(size, std::string());
  impl_.is_special.assign(size, false);
  for (const auto &[token, id] : impl_.vocab)
    impl_.token_text[id] = token;
  for (const AddedToken &t : impl_.added) {
    impl_.token_text[t.id] = t.content;
    if (t.special && !impl_.is_special[t.id]) {
      impl_.is_special[t.id] = true;
      impl_.special_ids.push_back(t.id);
    }
  }
  std::sort(impl_.special_ids.begin(), impl_.special_ids.end());

  // The ByteLevel decoder: a token whose characters all come from the byte
  // table decodes to those bytes, any other token to its own UTF-8.
  impl_.byte_chars = ByteToCodePointTable();
  std::array<int16_t, 0x144> char_to_byte;
  char_to_byte.fill(-1);
  for (int b = 0; b < 256; ++b)
    char_to_byte[impl_.byte_chars[b]] = static_cast<int16_t>(b);
  for (size_t id = 0; id < size; ++id) {
    const std::string &text = impl_.token_text[id];
    std::string &bytes = impl_.token_bytes[id];
    bool all_mapped = true;
    for (size_t i = 0; i < text.size() && all_mapped;) {
      const uint32_t cp = NextCodePoint(text, &i);
      if (cp < char_to_byte.size() && char_to_byte[cp] >= 0)
        bytes.push_back(static_cast<char>(char_to_byte[cp]));
      else
        all_mapped = false;
    }
    if (!all_mapped)
      bytes = text;
  }

  std::string one_char;
  for (int b = 0; b < 256; ++b) {
    one_char.clear();
    AppendCodePoint(impl_.byte_chars[b], &one_char);
    auto it = impl_.vocab.find(one_char);
    impl_.byte_ids[b] = it == impl_.vocab.end() ? -1 : it->second;
  }

  std::vector<uint32_t> order(impl_.added.size());
  for (uint32_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return impl_.added[a].content.size() > impl_.added[b].content.size();
  });
  for (uint32_t i : order)
    impl_.added_by_first_byte[static_cast<uint8_t>(impl_.added[i].content[0])]
        .push_back(i);
  return absl::OkStatus();
}

} // namespace

//===----------------------------------------------------------------------===//
// Encoding
//===----------------------------------------------------------------------===//

/// Calls fn(piece, -1) for text between added tokens and fn({}, id) for each
/// added token, leftmost-longest. Only tokens of this pass (raw or
/// normalised text) take part; special ones only if allowed.
template <typename Fn>
void Tokenizer::Impl::SplitAdded(std::string_view text, bool normalized_pass,
                                 bool allow_special, Fn &&fn) const {
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken *match = nullptr;
    for (uint32_t k : added_by_first_byte[static_cast<uint8_t>(text[i])]) {
      const AddedToken &t = added[k];
      if (t.normalized != normalized_pass || (t.special && !allow_special))
        continue;
      if (text.compare(i, t.content.size(), t.content) == 0) {
        match = &t;
        break;
      }
    }
    if (!match) {
      ++i; // tokens start with a lead byte, so this never splits a character
      continue;
    }
    if (i > start)
      fn(text.substr(start, i - start), -1);
    fn(std::string_view(), match->id);
    i += match->content.size();
    start = i;
  }
  if (start < text.size())
    fn(text.substr(start), -1);
}

std::string_view Tokenizer::Impl::Normalize(std::string_view text,
                                            std::string *buf) const {
  if (!nfc || IsAscii(text))
    return text;
  utf8proc_uint8_t *result = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t *>(text.data()),
      static_cast<utf8proc_ssize_t>(text.size()), &result,
      static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) // cannot happen on valid UTF-8; keep the text as it is
    return text;
  buf->assign(reinterpret_cast<const char *>(result), static_cast<size_t>(n));
  std::free(result);
  return *buf;
}

/// Splits `text` with splits[level] (Isolated: both the matches and the
/// text between them are pieces) and hands each piece to the next level;
/// past the last level, to BPE.
void Tokenizer::Impl::PreTokenize(std::string_view text, size_t level,
                                  EncodeScratch &s,
                                  std::vector<int32_t> &out) const {
  if (text.empty())
    return;
  if (level == splits.size()) {
    Bpe(text, s, out);
    return;
  }
  const pcre2_code *code = splits[level].get();
  const auto *subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t piece_start = 0, offset = 0;
  while (offset < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK,
                         s.match_data.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code, subject, text.size(), offset,
                       PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, s.match_data.get(),
                       nullptr);
    if (rc < 0) // no match, or a resource limit: the rest is one piece
      break;
    const PCRE2_SIZE *ovector = pcre2_get_ovector_pointer(s.match_data.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end <= begin) { // an empty match splits nothing; step one character
      size_t next = offset;
      NextCodePoint(text, &next);
      offset = next;
      continue;
    }
    if (begin > piece_start)
      PreTokenize(text.substr(piece_start, begin - piece_start), level + 1, s,
                  out);
    PreTokenize(text.substr(begin, end - begin), level + 1, s, out);
    piece_start = offset = end;
  }
  if (piece_start < text.size())
    PreTokenize(text.substr(piece_start), level + 1, s, out);
}

void Tokenizer::Impl::Bpe(std::string_view piece, EncodeScratch &s,
                          std::vector<int32_t> &out) const {
  if (ignore_merges) {
    s.mapped.clear();
    for (char c : piece)
      AppendCodePoint(byte_chars[static_cast<uint8_t>(c)], &s.mapped);
    if (auto it = vocab.find(s.mapped); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }

  auto &symbols = s.symbols;
  symbols.clear();
  for (char c : piece) {
    int32_t id = byte_ids[static_cast<uint8_t>(c)];
    if (id < 0)
      id = unk_id;
    if (id < 0) // no token and no unk: dropped, as tokenizers does
      continue;
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1});
  }
  if (symbols.empty())
    return;
  symbols.back().next = -1;

  // Min-heap on (rank, position): the lowest rank first, leftmost on ties.
  auto later = [](const EncodeScratch::Candidate &a,
                  const EncodeScratch::Candidate &b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  auto &heap = s.heap;
  heap.clear();
  auto push_pair = [&](int32_t pos) {
    if (pos < 0)
      return;
    const int32_t next = symbols[pos].next;
    if (next < 0)
      return;
    const int32_t left = symbols[pos].id, right = symbols[next].id;
    auto it = merges.find(PairKey(left, right));
    if (it == merges.end())
      return;
    heap.push_back({it->second.rank, pos, left, right, it->second.id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i)
    push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const EncodeScratch::Candidate c = heap.back();
    heap.pop_back();
    // Stale if either side has been merged since the candidate was pushed.
    auto &left = symbols[c.pos];
    if (left.id != c.left || left.next < 0)
      continue;
    auto &right = symbols[left.next];
    if (right.id != c.right)
      continue;
    left.id = c.merged;
    right.id = -1;
    left.next = right.next;
    if (left.next >= 0)
      symbols[left.next].prev = c.pos;
    push_pair(left.prev);
    push_pair(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next)
    out.push_back(symbols[i].id);
}

//===----------------------------------------------------------------------===//
// Tokenizer
//===----------------------------------------------------------------------===//

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>>
Tokenizer::Create(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    return absl::DataLossError(absl::StrCat(path, ": read error"));
  return CreateFromJson(text.str(), path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>>
Tokenizer::CreateFromJson(std::string_view json, std::string_view source) {
  Json root;
  try {
    root = Json::parse(json.begin(), json.end());
  } catch (const Json::parse_error &e) {
    return absl::InvalidArgumentError(absl::StrCat(
        AbslView(source), ": malformed JSON at byte ", e.byte, ": ", e.what()));
  } catch (const Json::exception &e) { // e.g. a number too large for a double
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(source), ": unreadable JSON: ", e.what()));
  }
  auto impl = std::make_unique<Impl>();
  try {
    if (auto st = Loader(source, *impl).Load(root); !st.ok())
      return st;
  } catch (const Json::exception &e) { // a type check we missed
    return absl::InvalidArgumentError(absl::StrCat(
        AbslView(source), ": unexpected tokenizer.json content: ", e.what()));
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text,
                                       bool allow_special) const {
  const Impl &m = *impl_;
  std::string clean;
  clean.reserve(text.size());
  AppendValidUtf8(text, &clean, /*hold_incomplete_tail=*/false);

  EncodeScratch scratch;
  scratch.match_data.reset(pcre2_match_data_create(1, nullptr));
  std::vector<int32_t> out;
  out.reserve(clean.size() / 3 + 1);
  m.SplitAdded(clean, /*normalized_pass=*/false, allow_special,
               [&](std::string_view raw, int32_t raw_id) {
                 if (raw_id >= 0) {
                   out.push_back(raw_id);
                   return;
                 }
                 std::string_view norm = m.Normalize(raw, &scratch.normalized);
                 m.SplitAdded(norm, /*normalized_pass=*/true, allow_special,
                              [&](std::string_view piece, int32_t id) {
                                if (id >= 0)
                                  out.push_back(id);
                                else
                                  m.PreTokenize(piece, 0, scratch, out);
                              });
               });
  return out;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids)
    bytes.append(TokenBytes(id));
  std::string out;
  out.reserve(bytes.size());
  AppendValidUtf8(bytes, &out, /*hold_incomplete_tail=*/false);
  return out;
}

int32_t Tokenizer::TokenId(std::string_view token) const {
  if (auto it = impl_->added_ids.find(AbslView(token));
      it != impl_->added_ids.end())
    return it->second;
  if (auto it = impl_->vocab.find(AbslView(token)); it != impl_->vocab.end())
    return it->second;
  return -1;
}

std::string_view Tokenizer::Token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->token_text.size())
    return {};
  return impl_->token_text[id];
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->token_bytes.size())
    return {};
  return impl_->token_bytes[id];
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->token_text.size());
}

const std::vector<int32_t> &Tokenizer::special_token_ids() const {
  return impl_->special_ids;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->is_special.size() &&
         impl_->is_special[id];
}

//===----------------------------------------------------------------------===//
// StreamDecoder
//===----------------------------------------------------------------------===//

std::string StreamDecoder::Push(int32_t id) {
  pending_.append(tokenizer_.TokenBytes(id));
  std::string out;
  const size_t used =
      AppendValidUtf8(pending_, &out, /*hold_incomplete_tail=*/true);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out;
  AppendValidUtf8(pending_, &out, /*hold_incomplete_tail=*/false);
  pending_.clear();
  return out;
}

} // namespace duck::runtime
