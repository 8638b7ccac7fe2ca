// libFuzzer: tokenizer.json loading; an accepted tokenizer then encodes and
// decodes a text (the input's tail after a 0 byte, or a fixed one).
#include "duck/runtime/text/Tokenizer.h"

#include <cstring>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view all(reinterpret_cast<const char *>(data), size);
  size_t cut = all.find('\0');
  std::string_view json = all.substr(0, cut);
  std::string_view text = cut == std::string_view::npos
                              ? std::string_view("Hello, ducks! 123")
                              : all.substr(cut + 1);
  auto tok = duck::runtime::Tokenizer::CreateFromJson(json, "fuzz");
  if (!tok.ok())
    return 0;
  std::vector<int32_t> ids = (*tok)->Encode(text, true);
  (void)(*tok)->Decode(ids);
  return 0;
}
