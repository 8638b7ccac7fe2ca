//===- TokenizerJson.h - A tiny byte-level BPE tokenizer.json ---*- C++ -*-===//
//
// Every model directory gets a HF tokenizer.json of the Qwen2/Qwen3 form
// (byte-level BPE, NFC, the Qwen2 Split regex, ByteLevel pre-tokenizer,
// decoder and post-processor; see reference/FORMATS.md section 3) whose size
// is exactly the config's vocab_size:
//
//   ids 0..255          the 256 byte tokens (GPT-2 bytes_to_unicode), id = byte
//   ids 256..vocab-4    one token per merge, in merge order; the merges are
//                       learned by a small deterministic BPE trainer from a
//                       built-in English text, then (for vocabularies larger
//                       than the text supports) continued with concatenations
//                       of printable tokens
//   ids vocab-3..-1     <|endoftext|>, <|im_start|>, <|im_end|> (added tokens,
//                       as in Qwen's file they are not in model.vocab)
//
// Everything is a pure function of vocab_size: no seed, no hash order.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_MKMODEL_TOKENIZERJSON_H
#define DUCK_MKMODEL_TOKENIZERJSON_H

#include "ModelSpec.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace duck::mkmodel {

/// 256 byte tokens + 3 special tokens.
constexpr int64_t kMinVocab = 259;
constexpr int64_t kNumSpecialTokens = 3;

/// "<|endoftext|>", "<|im_start|>", "<|im_end|>": the last three ids.
llvm::ArrayRef<llvm::StringRef> specialTokens();
/// Ids of the special tokens for a vocabulary of `vocab` ids.
inline int64_t endOfTextId(int64_t vocab) { return vocab - 3; }
inline int64_t imStartId(int64_t vocab) { return vocab - 2; }
inline int64_t imEndId(int64_t vocab) { return vocab - 1; }

/// The GPT-2 bytes_to_unicode spelling of `byte`, as UTF-8 ("!" for 0x21,
/// "Ġ" for 0x20, "Ā" for 0x00).
std::string byteToken(uint8_t byte);
/// The tokenizer.json spelling of raw bytes: each byte through byteToken.
std::string bytesToTokenText(llvm::StringRef bytes);

/// Splits ASCII-ish text the way the Qwen2 pre-tokenizer regex does (letters
/// and digits in the ASCII sense; other bytes count as punctuation). Used for
/// training only.
std::vector<std::string> pretokenize(llvm::StringRef text);

/// The built-in English text the merges are learned from.
llvm::StringRef trainingText();

struct BpeVocab {
  /// Raw bytes of each model token, by id (byte tokens first). Holds
  /// vocab - 3 entries; the special tokens follow as added tokens.
  std::vector<std::string> tokens;
  /// Merge i joins (first, second) into token 256 + i.
  std::vector<std::pair<int32_t, int32_t>> merges;
  /// How many leading merges come from the training text.
  size_t learned_merges = 0;
};

/// The vocabulary for `vocab` ids (>= kMinVocab).
BpeVocab buildBpeVocab(int64_t vocab);

/// tokenizer.json text for a vocabulary of `vocab` ids (ends with a newline).
std::string renderTokenizerJson(int64_t vocab);
/// tokenizer_config.json text: the specials, a ChatML chat template.
std::string renderTokenizerConfig(const ModelSpec &spec);

} // namespace duck::mkmodel

#endif // DUCK_MKMODEL_TOKENIZERJSON_H
