// libFuzzer: a chat template (Jinja.h) parsed and, when accepted, rendered
// over a chat with tools (or over the JSON after a 0 byte as the messages).
#include "duck/runtime/text/Jinja.h"

#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using Json = nlohmann::ordered_json;
  std::string_view all(reinterpret_cast<const char *>(data), size);
  const size_t cut = all.find('\0');
  auto t = duck::runtime::jinja::Template::Parse(all.substr(0, cut));
  if (!t.ok())
    return 0;
  static const Json kVars = Json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "<think>\nhm\n</think>\n\n",
       "tool_calls": [{"type": "function", "function":
         {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "{\"temp\": 21}"}],
    "tools": [{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {}}}}}],
    "add_generation_prompt": true, "enable_thinking": false,
    "bos_token": "<s>", "eos_token": "</s>"})");
  Json vars = kVars;
  if (cut != std::string_view::npos) {
    Json m = Json::parse(all.substr(cut + 1), nullptr,
                         /*allow_exceptions=*/false);
    if (!m.is_discarded())
      vars["messages"] = std::move(m);
  }
  (void)t->Render(vars);
  return 0;
}
