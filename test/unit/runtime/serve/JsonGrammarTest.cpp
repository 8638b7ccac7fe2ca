// The JSON automaton of constrained decoding (serve/JsonGrammar.h): what it
// takes and refuses, the schema subset and its refusals, and the property
// the decoding rule relies on: ClosingLength is exact, so that random
// bytes chosen under "the closing must fit what is left" always end in a
// complete JSON text within the budget that the schema accepts.
#include "duck/runtime/serve/JsonGrammar.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>

namespace {

using duck::runtime::JsonGrammar;
using duck::runtime::JsonState;
using json = nlohmann::json;

bool Takes(const JsonGrammar &g, const std::string &text, bool *done) {
  JsonState s = g.Start();
  if (!s.FeedAll(g, text))
    return false;
  *done = s.CanEnd(g);
  return true;
}

TEST(JsonGrammar, AnyObject) {
  const JsonGrammar g = JsonGrammar::AnyObject();
  bool done = false;
  EXPECT_TRUE(Takes(g, R"({"a": [1, -2.5e3, true, null, "x\u00e9\n"]})",
                    &done));
  EXPECT_TRUE(done);
  EXPECT_TRUE(Takes(g, "{\n  \"k\": {\n\t\t\"z\": 0.5}", &done));
  EXPECT_FALSE(done);
  for (const char *bad : {"[1]", "{\"a\" 1}", "{,}", "{\"a\":01}",
                          "{\"a\":tru}", "{\"a\":1}x", " {}", "{\"a\":  1}",
                          "{\n\n\"a\":1}",
                          "{\"a\":\"\x01\"}", "{\"a\":1.}"})
    EXPECT_FALSE(Takes(g, bad, &done) && done) << bad;
  EXPECT_EQ(g.MinLength(), 2u);
}

TEST(JsonGrammar, SchemaOrderRequiredEnum) {
  auto g = JsonGrammar::FromSchema(R"({"type": "object",
    "properties": {"name": {"type": "string"},
                   "age": {"type": "integer"},
                   "color": {"enum": ["red", "green", 7]}},
    "required": ["age", "color"], "additionalProperties": false})");
  ASSERT_TRUE(g.ok()) << g.status();
  bool done = false;
  EXPECT_TRUE(Takes(*g, R"({"name":"x","age":3,"color":"red"})", &done));
  EXPECT_TRUE(done);
  EXPECT_TRUE(Takes(*g, R"({"age":-3,"color":7})", &done));
  EXPECT_TRUE(done);
  EXPECT_FALSE(Takes(*g, R"({"color":7})", &done));      // age required
  EXPECT_FALSE(Takes(*g, R"({"age":1.5,)", &done));      // integer
  EXPECT_FALSE(Takes(*g, R"({"age":1,"color":"blue")", &done));
  EXPECT_FALSE(Takes(*g, R"({"age":1})", &done));        // color required
  EXPECT_EQ(g->MinLength(), std::string(R"({"age":0,"color":7})").size());
}

TEST(JsonGrammar, RefusesOutsideTheSubset) {
  for (const char *s :
       {R"({"anyOf": [{"type": "string"}]})",
        R"({"type": "object", "properties": {"a": {"$ref": "#/x"}}})",
        R"({"type": "string", "pattern": "a+"})", R"({"type": "date"})",
        R"({"type": "object", "required": ["b"]})"}) {
    auto g = JsonGrammar::FromSchema(s);
    EXPECT_FALSE(g.ok()) << s;
  }
  auto g = JsonGrammar::FromSchema(R"({"properties": {"a": {"anyOf": []}}})");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("'anyOf'"), std::string::npos);
  EXPECT_NE(g.status().message().find("/properties/a"), std::string::npos);
}

/// Random bytes under the budget rule: always some byte fits, and the text
/// ends complete within the budget.
std::string RandomText(const JsonGrammar &g, uint32_t budget, uint32_t seed) {
  std::mt19937 rng(seed);
  JsonState s = g.Start();
  std::string out;
  for (uint32_t used = 0; used < budget && !s.Done(); ++used) {
    if (s.CanEnd(g) && rng() % 8 == 0)
      break;
    std::vector<std::pair<unsigned char, JsonState>> ok;
    for (int b = 0; b < 256; ++b) {
      JsonState n = s;
      if (n.Feed(g, (unsigned char)b) &&
          n.ClosingLength(g) <= budget - used - 1)
        ok.emplace_back((unsigned char)b, n);
    }
    EXPECT_FALSE(ok.empty()) << "stuck after \"" << out << "\" budget " << budget << " seed " << seed;
    if (ok.empty())
      break;
    // Prefer structure over long strings now and then.
    const auto &pick = ok[rng() % ok.size()];
    out += (char)pick.first;
    s = pick.second;
  }
  EXPECT_TRUE(s.CanEnd(g)) << out;
  EXPECT_LE(out.size(), budget);
  return out;
}

TEST(JsonGrammar, ClosesWithinBudget) {
  auto g = JsonGrammar::FromSchema(R"({"type": "object",
    "properties": {"id": {"type": "integer"},
      "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
      "pos": {"type": "object", "properties": {"x": {"type": "number"},
              "y": {"type": ["number", "null"]}}, "required": ["x", "y"]},
      "kind": {"enum": ["a", "ab", 1, 12, null, {"k": [1]}]},
      "any": {}, "flag": {"type": "boolean"}},
    "required": ["id", "tags", "pos", "kind", "flag"]})");
  ASSERT_TRUE(g.ok()) << g.status();
  for (uint32_t budget :
       {g->MinLength(), g->MinLength() + 1, g->MinLength() + 20, 200u})
    for (uint32_t seed = 0; seed < 40; ++seed) {
      const std::string text = RandomText(*g, budget, seed);
      json j = json::parse(text, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << text;
      for (const char *k : {"id", "tags", "pos", "kind", "flag"})
        EXPECT_TRUE(j.contains(k)) << text;
      EXPECT_TRUE(j["id"].is_number_integer()) << text;
      EXPECT_GE(j["tags"].size(), 2u) << text;
      EXPECT_TRUE(j["flag"].is_boolean()) << text;
    }
  const JsonGrammar any = JsonGrammar::AnyObject();
  for (uint32_t budget : {2u, 3u, 17u, 64u})
    for (uint32_t seed = 0; seed < 40; ++seed) {
      const std::string text = RandomText(any, budget, seed);
      json j = json::parse(text, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << text;
      EXPECT_TRUE(j.is_object()) << text;
    }
}

} // namespace
