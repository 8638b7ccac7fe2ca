//===- JinjaTest.cpp - the Jinja subset of chat templates -----------------===//
//
// Each expected string is what jinja2 renders for the same template with
// transformers' settings (trim_blocks, lstrip_blocks, its tojson); the
// real Qwen3 and DeepSeek-V3 templates are compared against jinja2 and
// @huggingface/jinja in test/e2e/chat-template.test.
//===----------------------------------------------------------------------===//
#include "duck/runtime/text/Jinja.h"
#include "duck/runtime/text/ChatTemplate.h"

#include <gtest/gtest.h>

namespace {

using duck::runtime::ChatTemplateArgs;
using duck::runtime::CheckpointTemplate;
using duck::runtime::jinja::PythonJsonDumps;
using duck::runtime::jinja::Template;
using Json = nlohmann::ordered_json;

std::string Render(const std::string &src, const Json &vars = Json::object()) {
  auto t = Template::Parse(src);
  if (!t.ok())
    return "parse error: " + std::string(t.status().message());
  auto out = t->Render(vars);
  if (!out.ok())
    return "render error: " + std::string(out.status().message());
  return *out;
}

TEST(JinjaTest, WhitespaceControlAndBlockTrimming) {
  // "-" strips every space on its side; trim_blocks drops the newline after
  // a block tag, lstrip_blocks the indentation before one; {{ }} keeps both;
  // the source's last newline goes (jinja2's keep_trailing_newline=False).
  EXPECT_EQ(Render("a  {{- 'b' -}}  \n c"), "abc");
  EXPECT_EQ(Render("{% if true %}\n  x\n{% endif %}\ny"), "  x\ny");
  EXPECT_EQ(Render("    {% if true %}x{% endif %}\n  {{ 'y' }}\n"), "x  y");
  EXPECT_EQ(Render("a {% if true %}b{% endif %}"), "a b");
  EXPECT_EQ(Render("{{ 'a' -}}  \n  {% if true %}b{% endif %}"), "ab");
  EXPECT_EQ(Render("{# a comment #}\nz"), "z");
  EXPECT_EQ(Render("{% if true +%}\nx{% endif %}"), "\nx");
}

TEST(JinjaTest, LoopsAndNamespaces) {
  const Json vars = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(Render("{% for x in xs %}{{ loop.index }}{{ x }}"
                   "{% if loop.first %}F{% endif %}"
                   "{% if loop.last %}L{{ loop.length }}{% endif %}"
                   "{% endfor %}",
                   vars),
            "1aF2b3cL3");
  EXPECT_EQ(Render("{% for x in xs[::-1] %}{{ x }}{{ loop.revindex0 }}"
                   "{% endfor %}",
                   vars),
            "c2b1a0");
  // A set in a loop stays in the loop; a namespace carries it out.
  EXPECT_EQ(Render("{% set n = 0 %}{% set ns = namespace(n=0, s='') %}"
                   "{% for x in xs %}{% set n = n + 1 %}"
                   "{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ x %}"
                   "{% endfor %}{{ n }} {{ ns.n }} {{ ns.s }}",
                   vars),
            "0 3 abc");
  EXPECT_EQ(Render("{% for x in xs if x != 'b' %}{{ x }}{{ loop.index }}"
                   "{% endfor %}|{% for x in [] %}{% else %}none{% endfor %}",
                   vars),
            "a1c2|none");
  EXPECT_EQ(Render("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}"
                   "{% for x in xs %}{% if x == 'b' %}{% break %}{% endif %}"
                   "{{ x }}{% endfor %}",
                   {{"d", {{"z", 1}, {"a", 2}}}, {"xs", vars["xs"]}}),
            "z=1;a=2;a");
}

TEST(JinjaTest, ExpressionsAsJinja2EvaluatesThem) {
  const Json vars = {{"m",
                      {{"role", "user"},
                       {"content", "<think>\nhm\n"
                                   "</think>\n\nok"}}},
                     {"n", nullptr}};
  EXPECT_EQ(Render("{{ m.content.split('</think>')[-1].lstrip('\\n') }}|"
                   "{{ m.content.split('</think>')[0].rstrip('\\n')"
                   ".split('<think>')[-1].lstrip('\\n') }}",
                   vars),
            "ok|hm");
  EXPECT_EQ(Render("{{ '</think>' in m.content }} {{ 'x' not in m.role }} "
                   "{{ m['role'] == 'user' and not m.missing is defined }} "
                   "{{ n is none }} {{ m.missing is defined }} "
                   "{{ 'ab' ~ 1 ~ none }} {{ 7 // 2 }} {{ -7 % 3 }} "
                   "{{ 'y' if n else 'z' }} {{ [1, 2] + [3] }} "
                   "{{ '  pad ' | trim }} {{ 'abc'[1:] }} {{ 'héllo'|length }}",
                   vars),
            "True True True True False ab1None 3 2 z [1, 2, 3] pad bc 5");
  EXPECT_EQ(Render("{{ false is false }}{{ 0 is false }}{{ x is string }}"
                   "{{ {'a': 1} is mapping }}{{ 'a,b'.replace(',', ';') }}"
                   "{{ 'ab'.startswith('a') }}{{ 'ab'.endswith('a') }}"
                   "{{ x | default('dflt') }}{{ [3, 1] | join('-') }}"),
            "TrueFalseFalseTruea;bTrueFalsedflt3-1");
}

TEST(JinjaTest, ToJsonIsPythonsJsonDumps) {
  // transformers' tojson: json.dumps(ensure_ascii=False), members in their
  // order, ", " and ": ".
  const Json v = Json::parse(R"({"z": [1, 2.5, true, null], "a": "é\n\"\u0001",
                                 "e": {}, "l": []})");
  EXPECT_EQ(PythonJsonDumps(v),
            "{\"z\": [1, 2.5, true, null], \"a\": \"é\\n\\\"\\u0001\", "
            "\"e\": {}, \"l\": []}");
  EXPECT_EQ(PythonJsonDumps(Json::parse("[1.0, 1e-05, 1e+20]")),
            "[1.0, 1e-05, 1e+20]");
  EXPECT_EQ(Render("{{ v | tojson(indent=2) }}", {{"v", {{"a", {1}}}}}),
            "{\n  \"a\": [\n    1\n  ]\n}");
}

TEST(JinjaTest, ErrorsNameTheConstructAndWhere) {
  EXPECT_EQ(Render("ok\n  {% macro f() %}{% endmacro %}"),
            "parse error: chat template, line 2, column 6: '{% macro %}' is "
            "not in the Jinja subset Duck renders");
  EXPECT_EQ(Render("{{ x | wordwrap }}", {{"x", "a"}}),
            "render error: chat template, line 1, column 8: filter "
            "'wordwrap' is not in the Jinja subset Duck renders");
  EXPECT_EQ(Render("{% if x %}"),
            "parse error: chat template, line 1, column 11: the template "
            "ends before '{% elif %}'");
  EXPECT_EQ(Render("{{ raise_exception('no tools here') }}"),
            "render error: chat template, line 1, column 4: the template "
            "raised: no tools here");
  EXPECT_EQ(Render("{{ 'a' + 1 }}"),
            "render error: chat template, line 1, column 8: '+' between "
            "string and number");
}

TEST(JinjaTest, NestingIsBoundedNotAStackOverflow) {
  // A template or a value nested without end is an error, not a crash.
  const std::string parens =
      std::string(5000, '(') + "1" + std::string(5000, ')');
  EXPECT_NE(Render("{{ " + parens + " }}").find("nested deeper than 200"),
            std::string::npos);
  std::string sum = "{{ 1";
  for (int i = 0; i < 5000; ++i)
    sum += " + 1";
  EXPECT_NE(Render(sum + " }}").find("nested deeper than 200"),
            std::string::npos);
  std::string ifs;
  for (int i = 0; i < 5000; ++i)
    ifs += "{% if true %}";
  EXPECT_NE(Render(ifs).find("nested deeper than 200"), std::string::npos);
  Json deep = 1;
  for (int i = 0; i < 1000; ++i)
    deep = Json::array({deep});
  EXPECT_EQ(Render("{{ v | tojson }}", {{"v", deep}}),
            "render error: chat template, line 1, column 8: '|tojson' of a "
            "value nested deeper than 512 levels");
  EXPECT_EQ(Render("{{ v | length }}", {{"v", deep}}), "1");
}

TEST(CheckpointTemplateTest, ReadsTheConfigsTemplateAndTokens) {
  const std::string cfg = R"({
    "bos_token": {"__type": "AddedToken", "content": "<s>"},
    "eos_token": "</s>",
    "chat_template": [
      {"name": "tool_use", "template": "tools"},
      {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}>{% endif %}{% if enable_thinking is defined %}{{ enable_thinking }}{% endif %}"}
    ]})";
  auto t = CheckpointTemplate::FromConfig(cfg, "cfg.json");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->has_value());
  EXPECT_FALSE((*t)->RendersTools());
  const Json messages = Json::parse(R"([{"role": "user", "content": "hi"}])");
  ChatTemplateArgs args;
  EXPECT_EQ(*(*t)->Render(messages, args), "<s>hi</s>>");
  args.add_generation_prompt = false;
  args.enable_thinking = false;
  EXPECT_EQ(*(*t)->Render(messages, args), "<s>hi</s>False");

  auto none = CheckpointTemplate::FromConfig(R"({"eos_token": "x"})", "c");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto bad = CheckpointTemplate::FromConfig(R"({"chat_template": "{% for %}"})",
                                            "dir/tokenizer_config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "dir/tokenizer_config.json: chat template, line 1, column 8: "
            "expected a loop variable, found '%}'");
}

} // namespace
