// duck::WrapUsage: the usage text of the absl tools' --help, wrapped at 79
// columns after absl's "<tool>: ".
#include "duck_rt/tool_flags.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> Lines(const std::string &text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

std::string Words(const std::string &text) {
  std::istringstream in(text);
  std::string all, word;
  while (in >> word)
    all += word + " ";
  return all;
}

TEST(ToolFlags, ShortUsageIsUnchanged) {
  const std::string msg = "Runs a plan.\n\n  tool <plan>\n";
  EXPECT_EQ(duck::WrapUsage(msg, 9), msg);
}

TEST(ToolFlags, LongLinesBreakBetweenWordsWithinTheWidth) {
  std::string para;
  for (int i = 0; i < 40; ++i)
    para += "word" + std::to_string(i) + " ";
  para.pop_back();
  const std::string msg = "first " + para + "\n\n    " + para + "\nlast";
  const std::string out = duck::WrapUsage(msg, 9); // "duckrun: "
  const std::vector<std::string> lines = Lines(out);
  ASSERT_GT(lines.size(), 6u);
  EXPECT_LE(lines[0].size() + 9, 79u); // after the tool's name
  bool indented = false;
  for (const std::string &line : lines) {
    EXPECT_LE(line.size(), 79u) << line;
    EXPECT_NE(line.back(), ' ') << line;
    if (line.rfind("    word", 0) == 0)
      indented = true;
  }
  EXPECT_TRUE(indented) << out;
  // The indented paragraph's continuations keep its four spaces.
  size_t blank = 0;
  while (!lines[blank].empty())
    ++blank;
  for (size_t i = blank + 1; i + 1 < lines.size(); ++i)
    EXPECT_EQ(lines[i].rfind("    ", 0), 0u) << lines[i];
  EXPECT_EQ(lines.back(), "last");
  EXPECT_EQ(Words(out), Words(msg)); // nothing lost, nothing added
}

TEST(ToolFlags, AWordLongerThanTheLineStaysWhole) {
  const std::string word(100, 'x');
  const std::string out = duck::WrapUsage("a " + word + " b", 9);
  EXPECT_EQ(out, "a\n" + word + "\nb");
}

} // namespace
