//===- Tokenizer.h - HF tokenizer.json byte-level BPE -----------*- C++ -*-===//
//
// The host tokenizer for Qwen2/Qwen3 (and other byte-level BPE models) read
// from a Hugging Face tokenizer.json: added/special tokens split out first
// and matched literally, NFC normalisation, the model's own Split regexes
// (PCRE2, Unicode classes), the GPT-2 byte-to-unicode table, merges by rank.
// What the file asks for and this does not implement is refused at Create()
// with a message naming the file and the field, never approximated.
//
// Encode() never adds BOS/EOS (the post_processor is not applied); callers
// build the chat template out of special tokens. Encode/Decode are const and
// safe to call from several threads.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_TOKENIZER_H
#define DUCK_RUNTIME_TOKENIZER_H

#include "absl/status/statusor.h"
#include "absl/types/span.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace duck::runtime {

class Tokenizer {
public:
  /// Loads tokenizer.json from `path`.
  static absl::StatusOr<std::unique_ptr<Tokenizer>>
  Create(const std::string &path);
  /// Same, from the file's text already in memory; `source` names it in
  /// error messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>>
  CreateFromJson(std::string_view json, std::string_view source);
  ~Tokenizer();

  /// Token ids of `text`. Added tokens are always split out; those marked
  /// special (<|im_start|>, ...) only if `allow_special`, else they are
  /// encoded as ordinary text. Invalid UTF-8 in `text` is replaced by
  /// U+FFFD first.
  std::vector<int32_t> Encode(std::string_view text,
                              bool allow_special = true) const;
  /// The text of `ids` (special tokens included). Ids that name no token
  /// are skipped; byte sequences that are not valid UTF-8 become U+FFFD.
  std::string Decode(absl::Span<const int32_t> ids) const;

  /// Id of a vocabulary entry in its tokenizer.json spelling ("Ġthe",
  /// "<|im_end|>"), or -1.
  int32_t TokenId(std::string_view token) const;
  /// The tokenizer.json spelling of `id` ("" if no token has that id).
  std::string_view Token(int32_t id) const;
  /// The raw bytes `id` decodes to; possibly a fragment of a UTF-8
  /// character ("" if no token has that id).
  std::string_view TokenBytes(int32_t id) const;

  /// One past the largest id (model vocabulary plus added tokens).
  int32_t vocab_size() const;
  /// Ids of the added tokens marked special, ascending.
  const std::vector<int32_t> &special_token_ids() const;
  bool IsSpecial(int32_t id) const;

  struct Impl;

private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Decodes a stream of ids one at a time (generation) and returns only
/// complete UTF-8: bytes of a character split across tokens are held back
/// until the character is complete; bytes that can never become valid are
/// emitted as U+FFFD. Concatenating every Push() and the final Flush()
/// gives Decode() of the whole sequence.
class StreamDecoder {
public:
  explicit StreamDecoder(const Tokenizer &tokenizer) : tokenizer_(tokenizer) {}

  /// Text completed by `id` (possibly empty).
  std::string Push(int32_t id);
  /// The held-back bytes of an unfinished character, as U+FFFD; resets.
  std::string Flush();
  /// Bytes currently held back.
  size_t pending_bytes() const { return pending_.size(); }

private:
  const Tokenizer &tokenizer_;
  std::string pending_;
};

} // namespace duck::runtime

#endif // DUCK_RUNTIME_TOKENIZER_H
