//===- TokenizerJson.cpp - A tiny byte-level BPE tokenizer.json -----------===//

#include "TokenizerJson.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <unordered_map>

using llvm::StringRef;

namespace duck::mkmodel {

static const StringRef kSpecialTokens[] = {"<|endoftext|>", "<|im_start|>",
                                           "<|im_end|>"};

llvm::ArrayRef<StringRef> specialTokens() { return kSpecialTokens; }

/// The Qwen2 pre-tokenizer regex, verbatim (reference/FORMATS.md section 3).
static constexpr const char *kQwen2SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

//===----------------------------------------------------------------------===//
// Byte-level alphabet
//===----------------------------------------------------------------------===//

/// GPT-2 bytes_to_unicode: printable Latin-1 bytes keep their code point;
/// the other 68, in increasing order, become U+0100 + n.
static uint32_t byteCodePoint(uint8_t byte) {
  auto keeps = [](unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  };
  if (keeps(byte))
    return byte;
  uint32_t n = 0;
  for (unsigned b = 0; b < byte; ++b)
    if (!keeps(b))
      ++n;
  return 0x100 + n;
}

std::string byteToken(uint8_t byte) {
  uint32_t cp = byteCodePoint(byte);
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else { // all code points are below U+0800: two UTF-8 bytes
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

std::string bytesToTokenText(StringRef bytes) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t;
    for (unsigned b = 0; b < 256; ++b)
      t.push_back(byteToken(static_cast<uint8_t>(b)));
    return t;
  }();
  std::string out;
  for (char c : bytes)
    out += table[static_cast<uint8_t>(c)];
  return out;
}

//===----------------------------------------------------------------------===//
// Pre-tokenizer (training only)
//===----------------------------------------------------------------------===//

// Character classes in the ASCII sense; bytes >= 0x80 count as letters,
// which is what \p{L} says of most non-ASCII text.
static bool isLetter(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}
static bool isDigit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool isNewline(unsigned char c) { return c == '\n' || c == '\r'; }
static bool isSpace(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\v' || c == '\f' || isNewline(c);
}

/// Length of the regex match at `i`, trying the alternatives in order.
static size_t matchAt(StringRef text, size_t i) {
  size_t n = text.size();
  auto at = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  unsigned char c = at(i);
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (c == '\'')
    for (StringRef suffix : {"s", "t", "re", "ve", "m", "ll", "d"})
      if (text.substr(i + 1, suffix.size()).equals_insensitive(suffix))
        return 1 + suffix.size();
  // [^\r\n\p{L}\p{N}]?\p{L}+
  {
    size_t j = i;
    if (!isLetter(c) && !isDigit(c) && !isNewline(c))
      ++j;
    if (j < n && isLetter(at(j))) {
      while (j < n && isLetter(at(j)))
        ++j;
      return j - i;
    }
  }
  // \p{N}
  if (isDigit(c))
    return 1;
  // ?[^\s\p{L}\p{N}]+[\r\n]*
  {
    size_t j = c == ' ' ? i + 1 : i;
    size_t k = j;
    while (k < n && !isSpace(at(k)) && !isLetter(at(k)) && !isDigit(at(k)))
      ++k;
    if (k > j) {
      while (k < n && isNewline(at(k)))
        ++k;
      return k - i;
    }
  }
  // Whitespace from here on.
  size_t end = i;
  while (end < n && isSpace(at(end)))
    ++end;
  // \s*[\r\n]+ ends after the run's last newline.
  for (size_t k = end; k > i; --k)
    if (isNewline(at(k - 1)))
      return k - i;
  // \s+(?!\S) leaves the last space to the next word; \s+ takes the rest.
  if (end < n && end - i >= 2)
    return end - i - 1;
  return std::max<size_t>(end - i, 1);
}

std::vector<std::string> pretokenize(StringRef text) {
  std::vector<std::string> pieces;
  for (size_t i = 0; i < text.size();) {
    size_t len = matchAt(text, i);
    pieces.push_back(text.substr(i, len).str());
    i += len;
  }
  return pieces;
}

//===----------------------------------------------------------------------===//
// Trainer
//===----------------------------------------------------------------------===//

StringRef trainingText() {
  return R"(Ducks are small water birds. A duck swims on the pond in the
morning, dives for weeds and snails, and walks back to the reeds when the
sun is high. Most ducks can fly, and some of them fly a long way: they leave
the cold north in the autumn and come back in the spring. The mallard is the
duck you see in every town park; the drake has a green head and a white ring
around his neck, the hen is brown so that she is hard to see on her nest.

A duck's feet are webbed, which makes them good paddles but poor shoes. Its
bill is flat and wide, with fine edges that work like a sieve: the duck takes
a mouthful of water and mud, pushes the water out, and keeps the seeds and
insects. Ducks don't get wet under their feathers, because they spread oil
over them from a gland near the tail. They'll sleep on the water with one eye
open, and a group of ducks on the water is called a raft.

A compiler is a program that reads a program and writes another one. The
front end parses the source text into a tree, checks the types and names,
and lowers the tree into an intermediate representation. The middle of the
compiler runs passes over that representation: it folds constants, removes
dead code, inlines small functions, unrolls loops and moves values into
registers. The back end selects machine instructions, schedules them, and
writes an object file that the linker turns into an executable.

Our compiler is called Duck. It reads a model checkpoint with its config and
weights, partitions every layer across a cluster of small machines that we
call ducks, and writes a plan: which duck holds which slice of the weights,
which kernels it runs, and when the host sends it the next token. Each duck
has 2 cores with AVX2 vector units and 8 or 16 GB of memory. The host runs
the tokenizer, the embedding and the sampler; the ducks run attention and
the experts. A run with 4 ducks generates about 12 tokens per second.

Why would anyone build a compiler for ducks? Because it's fun, and because
it is how you learn what a machine really does. We test every pass, we
compare the logits with a reference in double precision, and we keep the
numbers honest: 1, 2, 3, 10, 100, 1000. If the plan is wrong, the ducks
won't agree, and the test fails before the model says anything silly.

Before a model can read a sentence, a tokenizer cuts the text into pieces.
It splits the words from the spaces and the punctuation, turns every piece
into bytes, and then joins the most frequent pairs of bytes, again and again,
until each common word is a single token. Rare words stay in several parts,
and a new word is never a problem: in the worst case it is spelled byte by
byte. The list of joins is learned once, from a large amount of text, and
the order of the list decides which pair is joined first.

On a quiet evening the pond is still and grey. Three ducklings follow their
mother in a straight line, a heron stands in the shallow water without
moving, and a frog jumps from a leaf. Children throw bread from the bridge,
although the keepers say that bread is bad for birds; oats, peas and chopped
lettuce are better. When the first frost comes, the ducks gather where the
water keeps moving and the ice cannot close over it.

Writing fast code for a small machine is a question of memory. The weights
of a large model do not fit in one place, so they are cut into blocks and
spread over many machines; each machine multiplies its own block and sends a
short result over the network. The numbers are stored with few bits, packed
tightly, and unpacked just before they are used. Good kernels read every
byte once, keep the vector registers busy, and never wait for the network
when there is other work to do.
)";
}

namespace {

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

class VocabBuilder {
public:
  explicit VocabBuilder(int64_t vocab)
      : model_size_(static_cast<size_t>(vocab - kNumSpecialTokens)) {
    for (unsigned b = 0; b < 256; ++b)
      add(std::string(1, static_cast<char>(b)));
  }

  bool full() const { return v_.tokens.size() >= model_size_; }

  /// Whether joining `a` and `b` gives a string not yet spelled by any
  /// token (specials included), so that the merge adds a new id.
  bool isNew(const std::string &joined) const {
    if (ids_.count(joined))
      return false;
    for (StringRef special : kSpecialTokens)
      if (joined == special)
        return false;
    return true;
  }

  int32_t merge(int32_t a, int32_t b) {
    v_.merges.emplace_back(a, b);
    return add(v_.tokens[a] + v_.tokens[b]);
  }

  void learn(StringRef text) {
    std::map<std::string, int64_t> counts;
    for (std::string &piece : pretokenize(text))
      ++counts[piece];
    std::vector<Word> words;
    for (const auto &[piece, count] : counts) {
      Word w{{}, count};
      for (char c : piece)
        w.symbols.push_back(static_cast<uint8_t>(c));
      words.push_back(std::move(w));
    }
    while (!full()) {
      std::unordered_map<uint64_t, int64_t> pair_counts;
      for (const Word &w : words)
        for (size_t i = 0; i + 1 < w.symbols.size(); ++i)
          pair_counts[key(w.symbols[i], w.symbols[i + 1])] += w.count;
      // Most frequent pair, ties to the smallest (left, right) ids: a total
      // order, so the hash map's iteration order does not matter.
      uint64_t best = 0;
      int64_t best_count = 0;
      for (const auto &[k, count] : pair_counts) {
        if (count < best_count || (count == best_count && k > best))
          continue;
        if (!isNew(v_.tokens[k >> 32] + v_.tokens[k & 0xFFFFFFFFu]))
          continue;
        best = k;
        best_count = count;
      }
      if (best_count == 0)
        break;
      int32_t a = static_cast<int32_t>(best >> 32);
      int32_t b = static_cast<int32_t>(best & 0xFFFFFFFFu);
      int32_t joined = merge(a, b);
      for (Word &w : words) {
        size_t out = 0;
        for (size_t i = 0; i < w.symbols.size(); ++out) {
          if (i + 1 < w.symbols.size() && w.symbols[i] == a &&
              w.symbols[i + 1] == b) {
            w.symbols[out] = joined;
            i += 2;
          } else {
            w.symbols[out] = w.symbols[i++];
          }
        }
        w.symbols.resize(out);
      }
    }
    v_.learned_merges = v_.merges.size();
  }

  /// Past what the text supports: join printable tokens pairwise, in id
  /// order, skipping strings already present.
  void fill() {
    while (!full()) {
      std::vector<int32_t> base;
      for (size_t id = 0; id < v_.tokens.size(); ++id) {
        bool printable = true;
        for (char c : v_.tokens[id])
          printable &= c >= 0x20 && c <= 0x7E;
        if (printable)
          base.push_back(static_cast<int32_t>(id));
      }
      size_t before = v_.tokens.size();
      for (int32_t a : base)
        for (int32_t b : base) {
          if (full())
            return;
          if (isNew(v_.tokens[a] + v_.tokens[b]))
            merge(a, b);
        }
      if (v_.tokens.size() == before) // cannot happen: lengths grow
        return;
    }
  }

  BpeVocab take() { return std::move(v_); }

private:
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
  }

  int32_t add(std::string bytes) {
    int32_t id = static_cast<int32_t>(v_.tokens.size());
    ids_[bytes] = id;
    v_.tokens.push_back(std::move(bytes));
    return id;
  }

  size_t model_size_;
  BpeVocab v_;
  llvm::StringMap<int32_t> ids_;
};

} // namespace

BpeVocab buildBpeVocab(int64_t vocab) {
  VocabBuilder builder(std::max(vocab, kMinVocab));
  builder.learn(trainingText());
  builder.fill();
  return builder.take();
}

//===----------------------------------------------------------------------===//
// JSON
//===----------------------------------------------------------------------===//

static std::string finish(std::string text) {
  text += "\n";
  return text;
}

std::string renderTokenizerJson(int64_t vocab) {
  BpeVocab v = buildBpeVocab(vocab);
  std::vector<std::string> spelled;
  spelled.reserve(v.tokens.size());
  for (const std::string &t : v.tokens)
    spelled.push_back(bytesToTokenText(t));

  std::string text;
  llvm::raw_string_ostream os(text);
  llvm::json::OStream j(os, /*IndentSize=*/2);
  auto byteLevel = [&](StringRef type) {
    j.object([&] {
      j.attribute("type", type);
      j.attribute("add_prefix_space", false);
      j.attribute("trim_offsets", false);
      j.attribute("use_regex", false);
    });
  };
  j.object([&] {
    j.attribute("version", "1.0");
    j.attribute("truncation", nullptr);
    j.attribute("padding", nullptr);
    j.attributeArray("added_tokens", [&] {
      for (int64_t i = 0; i < kNumSpecialTokens; ++i)
        j.object([&] {
          j.attribute("id", endOfTextId(vocab) + i);
          j.attribute("content", kSpecialTokens[i]);
          j.attribute("single_word", false);
          j.attribute("lstrip", false);
          j.attribute("rstrip", false);
          j.attribute("normalized", false);
          j.attribute("special", true);
        });
    });
    j.attributeObject("normalizer", [&] { j.attribute("type", "NFC"); });
    j.attributeObject("pre_tokenizer", [&] {
      j.attribute("type", "Sequence");
      j.attributeArray("pretokenizers", [&] {
        j.object([&] {
          j.attribute("type", "Split");
          j.attributeObject("pattern",
                            [&] { j.attribute("Regex", kQwen2SplitRegex); });
          j.attribute("behavior", "Isolated");
          j.attribute("invert", false);
        });
        j.object([&] {
          j.attribute("type", "ByteLevel");
          j.attribute("add_prefix_space", false);
          j.attribute("trim_offsets", false);
          j.attribute("use_regex", false);
        });
      });
    });
    j.attributeBegin("post_processor");
    byteLevel("ByteLevel");
    j.attributeEnd();
    j.attributeBegin("decoder");
    byteLevel("ByteLevel");
    j.attributeEnd();
    j.attributeObject("model", [&] {
      j.attribute("type", "BPE");
      j.attribute("dropout", nullptr);
      j.attribute("unk_token", nullptr);
      j.attribute("continuing_subword_prefix", "");
      j.attribute("end_of_word_suffix", "");
      j.attribute("fuse_unk", false);
      j.attribute("byte_fallback", false);
      j.attribute("ignore_merges", false);
      j.attributeObject("vocab", [&] {
        for (size_t id = 0; id < spelled.size(); ++id)
          j.attribute(spelled[id], static_cast<int64_t>(id));
      });
      j.attributeArray("merges", [&] {
        for (const auto &[a, b] : v.merges)
          j.value(spelled[a] + " " + spelled[b]);
      });
    });
  });
  os.flush();
  return finish(std::move(text));
}

std::string renderTokenizerConfig(const ModelSpec &spec) {
  // A plain ChatML template (no system prompt or tool handling).
  static constexpr const char *kChatTemplate =
      R"({%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})";
  std::string text;
  llvm::raw_string_ostream os(text);
  llvm::json::OStream j(os, /*IndentSize=*/2);
  // Keys sorted, as transformers' save_pretrained writes them.
  j.object([&] {
    j.attribute("add_bos_token", false);
    j.attribute("add_prefix_space", false);
    j.attributeObject("added_tokens_decoder", [&] {
      for (int64_t i = 0; i < kNumSpecialTokens; ++i)
        j.attributeObject(std::to_string(endOfTextId(spec.vocab) + i), [&] {
          j.attribute("content", kSpecialTokens[i]);
          j.attribute("lstrip", false);
          j.attribute("normalized", false);
          j.attribute("rstrip", false);
          j.attribute("single_word", false);
          j.attribute("special", true);
        });
    });
    j.attributeArray("additional_special_tokens", [&] {
      j.value(kSpecialTokens[1]);
      j.value(kSpecialTokens[2]);
    });
    j.attribute("bos_token", nullptr);
    j.attribute("chat_template", kChatTemplate);
    j.attribute("clean_up_tokenization_spaces", false);
    // config.json's eos_token_id; generation_config.json adds <|im_end|>.
    j.attribute("eos_token", kSpecialTokens[0]);
    j.attribute("errors", "replace");
    j.attribute("model_max_length", spec.max_pos);
    j.attribute("pad_token", kSpecialTokens[0]);
    j.attribute("split_special_tokens", false);
    j.attribute("tokenizer_class", "Qwen2Tokenizer");
    j.attribute("unk_token", nullptr);
  });
  os.flush();
  return finish(std::move(text));
}

} // namespace duck::mkmodel
