// A request's own token choice (serve/TokenChooser.h) over a byte-level
// tokenizer (one token a byte, plus "ab" and a special end token): OpenAI's
// penalties and logit biases, and constrained sampling, whose Gumbel-max
// walk must sample the softmax restricted to the tokens the grammar takes
// (checked against that distribution over many seeds), keep to the budget
// and take the end token only where the JSON may end; marker tokens
// (DeepSeek's tool-call markers) stand for their byte in a grammar.
#include "duck/runtime/serve/TokenChooser.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>

namespace {

using namespace duck::runtime;
using Json = nlohmann::json;

constexpr int32_t kAb = 256, kEnd = 257, kVocab = 258;

/// GPT-2's byte-to-character map (ByteLevel).
std::string ByteChar(int b) {
  auto printable = [](int k) {
    return (k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE;
  };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int k = 0; k < b; ++k)
      n += !printable(k);
    cp = 0x100 + n;
  }
  std::string s;
  if (cp < 0x80)
    return s += (char)cp, s;
  s += (char)(0xC0 | (cp >> 6));
  s += (char)(0x80 | (cp & 0x3F));
  return s;
}

/// With `extra` added tokens after kEnd.
std::unique_ptr<Tokenizer> MiniTokenizer(Json extra = Json::array()) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b)
    vocab[ByteChar(b)] = b;
  vocab["ab"] = kAb;
  Json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false},
             {"trim_offsets", false}, {"use_regex", false}};
  Json t = {{"version", "1.0"},
            {"added_tokens",
             {{{"id", kEnd}, {"content", "<|end|>"}, {"single_word", false},
               {"lstrip", false}, {"rstrip", false}, {"normalized", false},
               {"special", true}}}},
            {"normalizer", nullptr},
            {"pre_tokenizer", bl},
            {"post_processor", bl},
            {"decoder", bl},
            {"model",
             {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
              {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""},
              {"fuse_unk", false}, {"byte_fallback", false},
              {"ignore_merges", false}, {"vocab", vocab},
              {"merges", Json::array({"a b"})}}}};
  for (const Json &a : extra)
    t["added_tokens"].push_back(a);
  auto tok = Tokenizer::CreateFromJson(t.dump(), "mini.json");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

std::vector<float> Row(std::map<int32_t, float> set, float rest = 0,
                       size_t n = kVocab) {
  std::vector<float> r(n, rest);
  for (const auto &[id, v] : set)
    r[id] = v;
  return r;
}

TEST(TokenChooser, PenaltiesAndBias) {
  auto tok = MiniTokenizer();
  ASSERT_TRUE(tok);
  ChooserOptions o;
  o.frequency_penalty = 1.5f;
  o.presence_penalty = 0.4f;
  TokenChooser c(o, *tok);
  Sampler greedy(SamplerOptions{});
  // 'x' leads 'y' by 1.8: once (1.9 penalty) it falls behind; 'y' then
  // leads 'x' by 0.1, and after one 'y' (1.9) 'x' leads again.
  const std::vector<float> row = Row({{'x', 3.0f}, {'y', 1.2f}});
  EXPECT_EQ(c.Choose(row, greedy, 9), 'x');
  EXPECT_EQ(c.Choose(row, greedy, 8), 'y');
  EXPECT_EQ(c.Choose(row, greedy, 7), 'x');
  // Biases: +100 forces a token, -100 bans the best.
  ChooserOptions b;
  b.logit_bias = {{'q', 100.0f}, {'x', -100.0f}};
  TokenChooser cb(b, *tok);
  EXPECT_EQ(cb.Choose(row, greedy, 9), 'q');
  ChooserOptions ban;
  ban.logit_bias = {{'x', -100.0f}};
  TokenChooser cban(ban, *tok);
  EXPECT_EQ(cban.Choose(row, greedy, 9), 'y');
}

TEST(TokenChooser, ConstrainedSamplingIsTheMaskedSoftmax) {
  auto tok = MiniTokenizer();
  ASSERT_TRUE(tok);
  auto g = JsonGrammar::FromSchema(R"({"enum": [1, 2, 3]})");
  ASSERT_TRUE(g.ok());
  auto grammar = std::make_shared<JsonGrammar>(std::move(*g));
  // The allowed tokens have probabilities 0.2, 0.3, 0.5 among themselves;
  // every other token is far likelier and must never come.
  const std::vector<float> row = Row(
      {{'1', std::log(0.2f)}, {'2', std::log(0.3f)}, {'3', std::log(0.5f)}},
      4.0f);
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int seed = 0; seed < n; ++seed) {
    ChooserOptions o;
    o.grammars = {grammar};
    o.sampler.temperature = 1;
    o.sampler.seed = (uint64_t)seed;
    TokenChooser c(o, *tok);
    Sampler unused(o.sampler);
    ++counts[c.Choose(row, unused, 8)];
  }
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_NEAR(counts['1'] / (double)n, 0.2, 0.015);
  EXPECT_NEAR(counts['2'] / (double)n, 0.3, 0.015);
  EXPECT_NEAR(counts['3'] / (double)n, 0.5, 0.015);
}

TEST(TokenChooser, BudgetAndEnd) {
  auto tok = MiniTokenizer();
  ASSERT_TRUE(tok);
  auto grammar = std::make_shared<JsonGrammar>(JsonGrammar::AnyObject());
  ChooserOptions o;
  o.grammars = {grammar};
  o.stop_ids = {kEnd};
  TokenChooser c(o, *tok);
  Sampler greedy(SamplerOptions{});
  // The end token is likeliest but the JSON has not begun; '{' is next.
  EXPECT_EQ(c.Choose(Row({{kEnd, 9}, {'[', 8}, {'{', 1}}), greedy, 5), '{');
  // Two tokens left: '"' would need 4 more bytes ("":0}); '}' closes.
  EXPECT_EQ(c.Choose(Row({{'"', 9}, {'}', 1}}), greedy, 2), '}');
  EXPECT_TRUE(c.Finished());
}

TEST(TokenChooser, MarkersAreTheirTokens) {
  // "<|m|>" (258) and a special "<|s|>" (259) stand for 0xF8 and 0xF9.
  const int32_t m = 258, sp = 259;
  auto added = [](int32_t id, const char *content, bool special) {
    return Json{
        {"id", id},          {"content", content}, {"single_word", false},
        {"lstrip", false},   {"rstrip", false},    {"normalized", false},
        {"special", special}};
  };
  auto tok = MiniTokenizer(
      Json::array({added(m, "<|m|>", false), added(sp, "<|s|>", true)}));
  ASSERT_TRUE(tok);
  JsonGrammar g = JsonGrammar::AnyObject();
  g.SetAffixes("\xF8", "\xF9");
  ChooserOptions o;
  o.grammars = {std::make_shared<JsonGrammar>(g)};
  o.stop_ids = {kEnd};
  o.markers = {{m, 0xF8}, {sp, 0xF9}};
  TokenChooser c(o, *tok);
  Sampler greedy(SamplerOptions{});
  // The marker's text in pieces, or the byte itself, are never taken.
  EXPECT_EQ(c.Choose(Row({{'<', 9}, {0xF8, 8}, {m, 1}}, 0, 260), greedy, 9), m);
  EXPECT_EQ(c.Choose(Row({{m, 9}, {'{', 1}}, 0, 260), greedy, 8), '{');
  EXPECT_EQ(c.Choose(Row({{'}', 1}}, 0, 260), greedy, 7), '}');
  // The closing marker is the special token, not its byte.
  EXPECT_FALSE(c.Finished());
  EXPECT_EQ(c.Choose(Row({{0xF9, 9}, {kEnd, 8}, {sp, 1}}, 0, 260), greedy, 6),
            sp);
  EXPECT_TRUE(c.Finished());
  // Without markers a special token is never taken.
  ChooserOptions plain = o;
  plain.markers.clear();
  plain.grammars = {std::make_shared<JsonGrammar>(JsonGrammar::AnyObject())};
  TokenChooser p(plain, *tok);
  EXPECT_EQ(p.Choose(Row({{sp, 9}, {'{', 1}}, 0, 260), greedy, 6), '{');
  // A trigger that is a marker's byte: free until the marker token comes
  // (its byte token is not it), then the grammar holds.
  ChooserOptions t = o;
  t.trigger = "\xF8";
  TokenChooser ct(t, *tok);
  EXPECT_EQ(ct.Choose(Row({{0xF8, 9}}, 0, 260), greedy, 9), 0xF8);
  EXPECT_EQ(ct.Choose(Row({{'[', 9}}, 0, 260), greedy, 8), '[');
  EXPECT_EQ(ct.Choose(Row({{m, 9}}, 0, 260), greedy, 7), m);
  EXPECT_EQ(ct.Choose(Row({{'[', 9}, {'{', 1}}, 0, 260), greedy, 6), '{');
}

} // namespace
