//===- ChatTemplate.cpp - a chat as the model's prompt text ---------------===//
//
// The formats are the models' own: Qwen3's ChatML, DeepSeek-V3's chat
// template and DeepSeek-V3.2's message encoder in chat mode (no tools, no
// thinking). See ChatTemplate.h for what each writes. A checkpoint's own
// Jinja chat template is rendered by CheckpointTemplate (Jinja.h).
//===----------------------------------------------------------------------===//
#include "duck/runtime/text/ChatTemplate.h"

#include "duck/runtime/text/Tokenizer.h"

#include "absl/strings/str_cat.h"

#include <nlohmann/json.hpp>

namespace duck::runtime {
namespace {

// DeepSeek's markers, as its tokenizer.json spells them (U+FF5C fullwidth
// vertical bars, U+2581 for the spaces).
// (char arrays: this abseil's StrCat takes no std::string_view.)
constexpr char kDsBos[] = "<｜begin▁of▁sentence｜>";
constexpr char kDsEos[] = "<｜end▁of▁sentence｜>";
constexpr char kDsUser[] = "<｜User｜>";
constexpr char kDsAssistant[] = "<｜Assistant｜>";
constexpr char kThinkEnd[] = "</think>";

bool KnownRole(const std::string &r) {
  return r == "system" || r == "user" || r == "assistant" || r == "developer" ||
         r == "tool";
}

absl::Status BadMessage(size_t i, const std::string &what) {
  return absl::InvalidArgumentError(absl::StrCat("messages[", i, "]: ", what));
}

std::string ChatMl(absl::Span<const ChatMessage> messages) {
  std::string text;
  for (const ChatMessage &m : messages)
    absl::StrAppend(&text, "<|im_start|>",
                    m.role == "developer" ? "system" : m.role, "\n", m.content,
                    "<|im_end|>\n");
  text += "<|im_start|>assistant\n";
  return text;
}

absl::StatusOr<std::string> DeepSeek(absl::Span<const ChatMessage> messages,
                                     bool v32) {
  const char *name = v32 ? "DeepSeek-V3.2" : "DeepSeek-V3";
  std::string text(kDsBos), system;
  if (!v32) { // V3 puts every system message first, after the BOS
    for (const ChatMessage &m : messages)
      if (m.role == "system")
        absl::StrAppend(&system, system.empty() ? "" : "\n\n", m.content);
    text += system;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage &m = messages[i];
    if (m.role == "system") {
      if (v32)
        text += m.content;
    } else if (m.role == "user") {
      absl::StrAppend(&text, kDsUser, m.content, v32 ? kDsAssistant : "",
                      v32 ? kThinkEnd : "");
    } else if (m.role == "developer" && v32) {
      absl::StrAppend(&text, kDsUser,
                      "\n\n# The user's message is: ", m.content, kDsAssistant,
                      kThinkEnd);
    } else if (m.role == "assistant") {
      absl::StrAppend(&text, v32 ? "" : kDsAssistant, m.content, kDsEos);
    } else {
      return BadMessage(i, absl::StrCat("role '", m.role, "' has no place in ",
                                        name,
                                        "'s chat format as Duck serves it "
                                        "(no tools; send instructions as "
                                        "'system')"));
    }
  }
  // The reply starts after a user turn, not after a finished answer.
  size_t last = messages.size();
  while (last > 0 && messages[last - 1].role == "system")
    --last;
  if (last == 0 || (messages[last - 1].role != "user" &&
                    messages[last - 1].role != "developer"))
    return BadMessage(last ? last - 1 : 0,
                      absl::StrCat(name, " answers a user message: the last "
                                         "message other than 'system' must be "
                                         "'user'"));
  if (!v32)
    text += kDsAssistant;
  return text;
}

} // namespace

ChatFormat ChooseChatFormat(const Tokenizer &tok, bool deepseek_v32) {
  if (tok.TokenId("<|im_start|>") >= 0 && tok.TokenId("<|im_end|>") >= 0)
    return ChatFormat::kChatMl;
  if (tok.TokenId(kDsUser) >= 0 && tok.TokenId(kDsAssistant) >= 0)
    return deepseek_v32 ? ChatFormat::kDeepSeekV32 : ChatFormat::kDeepSeekV3;
  return ChatFormat::kNone;
}

std::string_view ChatFormatName(ChatFormat format) {
  switch (format) {
  case ChatFormat::kChatMl:
    return "ChatML";
  case ChatFormat::kDeepSeekV3:
    return "DeepSeek-V3";
  case ChatFormat::kDeepSeekV32:
    return "DeepSeek-V3.2 (chat mode)";
  case ChatFormat::kNone:
    break;
  }
  return "none";
}

absl::StatusOr<std::string> RenderChat(ChatFormat format,
                                       absl::Span<const ChatMessage> messages) {
  if (format == ChatFormat::kNone)
    return absl::InvalidArgumentError(
        "this model's tokenizer has none of the chat formats Duck knows "
        "(ChatML's <|im_start|>/<|im_end|>, DeepSeek's <｜User｜>/"
        "<｜Assistant｜>): send the prompt as text (duckrun --prompt without "
        "--chat, or /v1/completions)");
  if (messages.empty())
    return absl::InvalidArgumentError("a chat needs at least one message");
  for (size_t i = 0; i < messages.size(); ++i)
    if (!KnownRole(messages[i].role))
      return BadMessage(i,
                        absl::StrCat("unknown role '", messages[i].role, "'"));
  if (format == ChatFormat::kChatMl)
    return ChatMl(messages);
  return DeepSeek(messages, format == ChatFormat::kDeepSeekV32);
}

absl::StatusOr<std::vector<int32_t>>
PromptPrefixIds(std::string_view config_json, std::string_view source,
                const Tokenizer &tok) {
  using Json = nlohmann::json;
  const std::string where(source.data(), source.size());
  if (config_json.empty())
    return std::vector<int32_t>{};
  Json c;
  try {
    c = Json::parse(config_json.begin(), config_json.end());
  } catch (const Json::exception &e) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": malformed JSON: ", e.what()));
  }
  if (!c.is_object() || !c.contains("add_bos_token") ||
      !c["add_bos_token"].is_boolean() || !c["add_bos_token"].get<bool>())
    return std::vector<int32_t>{};
  // bos_token: a string, or an AddedToken object with its "content".
  const Json *bos = c.contains("bos_token") ? &c["bos_token"] : nullptr;
  if (bos && bos->is_object() && bos->contains("content"))
    bos = &(*bos)["content"];
  if (!bos || !bos->is_string())
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": add_bos_token is true but bos_token names no token"));
  const std::string name = bos->get<std::string>();
  const int32_t id = tok.TokenId(name);
  if (id < 0)
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": bos_token '", name, "' is not a token of the tokenizer"));
  return std::vector<int32_t>{id};
}

namespace {
// A special token in tokenizer_config.json: a string, or an AddedToken
// object with its "content"; "" when absent.
std::string ConfigToken(const nlohmann::ordered_json &c, const char *key) {
  if (!c.contains(key))
    return "";
  const nlohmann::ordered_json &t = c[key];
  if (t.is_object() && t.contains("content") && t["content"].is_string())
    return t["content"].get<std::string>();
  return t.is_string() ? t.get<std::string>() : "";
}
} // namespace

absl::StatusOr<std::optional<CheckpointTemplate>>
CheckpointTemplate::FromConfig(std::string_view config_json,
                               std::string_view source) {
  using Json = nlohmann::ordered_json;
  const std::string where(source.data(), source.size());
  if (config_json.empty())
    return std::nullopt;
  Json c = Json::parse(config_json.begin(), config_json.end(), nullptr,
                       /*allow_exceptions=*/false);
  if (c.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(where, ": malformed JSON"));
  if (!c.is_object() || !c.contains("chat_template"))
    return std::nullopt;
  const Json *src = &c["chat_template"];
  if (src->is_array()) // [{"name": ..., "template": ...}]: the default one
    for (const Json &t : *src)
      if (t.is_object() && t.value("name", "") == "default" &&
          t.contains("template"))
        src = &t["template"];
  if (!src->is_string())
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": chat_template is neither a string nor a list of named "
               "templates with a \"default\""));
  auto t = jinja::Template::Parse(src->get<std::string>());
  if (!t.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", t.status().message()));
  return CheckpointTemplate(std::move(*t), ConfigToken(c, "bos_token"),
                            ConfigToken(c, "eos_token"));
}

absl::StatusOr<std::string>
CheckpointTemplate::Render(const nlohmann::ordered_json &messages,
                           const ChatTemplateArgs &args) const {
  nlohmann::ordered_json vars = {
      {"messages", messages},
      {"add_generation_prompt", args.add_generation_prompt},
      {"bos_token", bos_},
      {"eos_token", eos_}};
  if (args.tools)
    vars["tools"] = *args.tools;
  if (args.enable_thinking)
    vars["enable_thinking"] = *args.enable_thinking;
  return template_.Render(vars);
}

std::string_view ChatEndToken(ChatFormat format) {
  switch (format) {
  case ChatFormat::kChatMl:
    return "<|im_end|>";
  case ChatFormat::kDeepSeekV3:
  case ChatFormat::kDeepSeekV32:
    return kDsEos;
  case ChatFormat::kNone:
    break;
  }
  return "";
}

} // namespace duck::runtime
