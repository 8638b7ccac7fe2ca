// Word-wrapping of --help text, shared by the tools (std only: the absl
// tools through tool_flags.h, duckc and duck-mkmodel directly).
#ifndef DUCK_RT_WRAP_TEXT_H
#define DUCK_RT_WRAP_TEXT_H

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

namespace duck {

/// `text`'s words (split at spaces) in lines of at most `width` columns:
/// the first line continues from column `first_column` (where the caller
/// left its line), each later one starts with `indent` spaces. A word
/// longer than a line stands alone on one. No newline at the end.
inline std::string WrapWords(std::string_view text, size_t width,
                             size_t first_column, size_t indent) {
  std::string out;
  size_t col = first_column;
  bool first = true;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = std::min(text.find(' ', pos), text.size());
    const std::string_view word = text.substr(pos, end - pos);
    pos = end + 1;
    if (word.empty())
      continue;
    if (!first && col + 1 + word.size() > width) {
      out += '\n';
      out.append(indent, ' ');
      col = indent;
    } else if (!first) {
      out += ' ';
      ++col;
    }
    out += word;
    col += word.size();
    first = false;
  }
  return out;
}

} // namespace duck

#endif // DUCK_RT_WRAP_TEXT_H
