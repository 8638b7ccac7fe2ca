// duck-tokenize: encodes text with a tokenizer.json and prints the ids, or
// decodes ids back to text; for debugging prompts and generations.
#include "duck/runtime/text/Tokenizer.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

static int usage() {
  std::fprintf(
      stderr,
      "usage: duck-tokenize [--no-special] [--tokens] [--repeat N] "
      "<tokenizer.json> [text...]\n"
      "       duck-tokenize <tokenizer.json> --decode <id>...\n"
      "\n"
      "Prints the ids of the text (the arguments joined by spaces, or stdin "
      "if none)\non one line. --tokens prints one \"id<TAB>token\" line per "
      "id instead;\n--no-special encodes special tokens such as "
      "<|im_start|> as plain text.\n--decode prints the text of the ids.\n"
      "--repeat N encodes N times and reports load and encode times on "
      "stderr.\n");
  return 2;
}

int main(int argc, char **argv) {
  bool allow_special = true, show_tokens = false, decode = false;
  long repeat = 0;
  std::string path;
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h")
      return usage(), 0;
    if (arg == "--no-special")
      allow_special = false;
    else if (arg == "--tokens")
      show_tokens = true;
    else if (arg == "--decode")
      decode = true;
    else if (arg == "--repeat" && i + 1 < argc)
      repeat = std::strtol(argv[++i], nullptr, 10);
    else if (path.empty())
      path = arg;
    else
      rest.push_back(arg);
  }
  if (path.empty())
    return usage();

  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start)
        .count();
  };
  const auto load_start = Clock::now();
  auto tokenizer = duck::runtime::Tokenizer::Create(path);
  const double load_ms = ms_since(load_start);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "duck-tokenize: %s\n",
                 std::string(tokenizer.status().message()).c_str());
    return 1;
  }

  if (decode) {
    std::vector<int32_t> ids;
    for (const std::string &s : rest) {
      char *end = nullptr;
      errno = 0;
      const long id = std::strtol(s.c_str(), &end, 10);
      if (errno || end == s.c_str() || *end || id < 0 ||
          id >= (*tokenizer)->vocab_size()) {
        std::fprintf(stderr, "duck-tokenize: '%s' is not a token id (0..%d)\n",
                     s.c_str(), (*tokenizer)->vocab_size() - 1);
        return 1;
      }
      ids.push_back(static_cast<int32_t>(id));
    }
    std::cout << (*tokenizer)->Decode(ids) << "\n";
    return 0;
  }

  std::string text;
  if (rest.empty()) {
    text.assign(std::istreambuf_iterator<char>(std::cin), {});
  } else {
    for (size_t i = 0; i < rest.size(); ++i)
      text += (i ? " " : "") + rest[i];
  }
  const std::vector<int32_t> ids = (*tokenizer)->Encode(text, allow_special);
  if (repeat > 0) {
    const auto start = Clock::now();
    size_t sink = 0;
    for (long i = 0; i < repeat; ++i)
      sink += (*tokenizer)->Encode(text, allow_special).size();
    std::fprintf(stderr,
                 "load %.1f ms; encode %zu bytes -> %zu tokens: %.1f us "
                 "(mean of %ld)\n",
                 load_ms, text.size(), sink / repeat,
                 1000.0 * ms_since(start) / repeat, repeat);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (show_tokens)
      std::cout << ids[i] << "\t" << (*tokenizer)->Token(ids[i]) << "\n";
    else
      std::cout << (i ? " " : "") << ids[i];
  }
  if (!show_tokens)
    std::cout << "\n";
  return 0;
}
