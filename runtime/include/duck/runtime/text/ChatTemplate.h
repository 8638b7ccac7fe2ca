//===- ChatTemplate.h - a chat as the model's prompt text -------*- C++ -*-===//
//
// `duckrun --chat` and the server's /v1/chat/completions turn messages into
// the prompt the model was trained on. Which format that is comes from the
// model's own tokenizer: ChatML (<|im_start|>role ... <|im_end|>) for
// Qwen3, DeepSeek's (<｜User｜> ... <｜Assistant｜>) for DeepSeek-V3 and
// V3.2, in V3.2's chat (non-thinking) mode. The text is then encoded with
// special tokens allowed (Tokenizer::Encode), so the markers become their
// token ids.
//
// When the checkpoint's tokenizer_config.json has a `chat_template`, that
// Jinja template is rendered instead (CheckpointTemplate, Jinja.h), with
// the request's tools and template arguments; the formats above are the
// fallback for a checkpoint without one.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_CHATTEMPLATE_H
#define DUCK_RUNTIME_CHATTEMPLATE_H

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "duck/runtime/text/Jinja.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace duck::runtime {

class Tokenizer;

enum class ChatFormat {
  kNone,        // the tokenizer has no markers of a format below
  kChatMl,      // Qwen3 (and the test models' tokenizers)
  kDeepSeekV3,  // DeepSeek-V3's template
  kDeepSeekV32, // DeepSeek-V3.2's encoder, chat mode
};

struct ChatMessage {
  std::string role; // system, user, assistant, developer or tool
  std::string content;
};

/// ChatML when the tokenizer has <|im_start|> and <|im_end|>; DeepSeek's
/// when it has <｜User｜> and <｜Assistant｜> (V3.2's encoding when
/// `deepseek_v32`, the plan's family); kNone otherwise.
ChatFormat ChooseChatFormat(const Tokenizer &tok, bool deepseek_v32);

/// "ChatML", "DeepSeek-V3", "DeepSeek-V3.2 (chat mode)" or "none".
std::string_view ChatFormatName(ChatFormat format);

/// The prompt text of `messages`, ending where the assistant's reply
/// starts:
///  - ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" each (developer
///    speaks as system), then "<|im_start|>assistant\n";
///  - DeepSeek-V3: the begin-of-sentence token, the system messages
///    (joined by a blank line), then "<｜User｜>{content}" for a user and
///    "<｜Assistant｜>{content}<｜end▁of▁sentence｜>" for an assistant
///    message, then "<｜Assistant｜>";
///  - DeepSeek-V3.2: the begin-of-sentence token, then in order: a system
///    message as is, a user message as "<｜User｜>{content}<｜Assistant｜>"
///    and "</think>", an assistant message as
///    "{content}<｜end▁of▁sentence｜>", a developer message as its encoder
///    writes one ("<｜User｜>\n\n# The user's message is: {content}..."), so
///    that the prompt ends in "<｜Assistant｜></think>".
/// Errors (InvalidArgument) name the message: an unknown role, a role the
/// format cannot say (tool messages need the tool calls Duck does not
/// serve, in DeepSeek's formats), a DeepSeek chat without a user message,
/// or kNone.
absl::StatusOr<std::string> RenderChat(ChatFormat format,
                                       absl::Span<const ChatMessage> messages);

/// The ids a Hugging Face tokenizer puts before a plain-text prompt
/// (a completion; a chat's format writes its own): the BOS token when
/// tokenizer_config.json (`config_json`, read from `source`; "" when the
/// checkpoint has none) sets add_bos_token, as DeepSeek's does; none
/// otherwise (Qwen3). Errors name the file: bad JSON, or a BOS the
/// tokenizer does not have.
absl::StatusOr<std::vector<int32_t>>
PromptPrefixIds(std::string_view config_json, std::string_view source,
                const Tokenizer &tok);

/// The token that ends an assistant turn ("<|im_end|>",
/// "<｜end▁of▁sentence｜>"), "" for kNone: a chat stops there.
std::string_view ChatEndToken(ChatFormat format);

/// What a chat template is rendered with besides the messages.
struct ChatTemplateArgs {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;         // absent: the template's default
  std::optional<nlohmann::ordered_json> tools; // OpenAI `tools`, as sent
};

/// The checkpoint's own chat template: tokenizer_config.json's
/// `chat_template` (a string, or the list of named templates' "default"),
/// rendered as transformers renders it, with the config's bos_token and
/// eos_token.
class CheckpointTemplate {
public:
  /// nullopt when the config ("" when the checkpoint has none) has no
  /// chat_template. Errors (InvalidArgument) name `source`: bad JSON, a
  /// chat_template of another type, or one that does not parse (its
  /// line:column and the construct).
  static absl::StatusOr<std::optional<CheckpointTemplate>>
  FromConfig(std::string_view config_json, std::string_view source);

  /// The prompt of `messages` (OpenAI chat messages, as sent). Errors
  /// (InvalidArgument): what the template raised or could not evaluate.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json &messages,
                                     const ChatTemplateArgs &args) const;

  /// Whether the template reads `tools` (Qwen3's does, DeepSeek-V3's not).
  bool RendersTools() const { return template_.Reads("tools"); }

private:
  CheckpointTemplate(jinja::Template t, std::string bos, std::string eos)
      : template_(std::move(t)), bos_(std::move(bos)), eos_(std::move(eos)) {}
  jinja::Template template_;
  std::string bos_, eos_;
};

} // namespace duck::runtime

#endif // DUCK_RUNTIME_CHATTEMPLATE_H
