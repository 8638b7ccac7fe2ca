// duck-tokenize: encodes text with a tokenizer.json and prints the ids, or
// decodes ids back to text, or renders chats with a checkpoint's chat
// template; for debugging prompts and generations.
#include "duck/runtime/text/ChatTemplate.h"
#include "duck/runtime/text/Tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

/// The usage text on `out` (stdout for --help, stderr for a bad command
/// line); returns 2, the bad command line's status.
static int usage(FILE *out = stderr) {
  std::fprintf(
      out,
      "usage: duck-tokenize [--no-special] [--tokens] [--repeat N] "
      "<tokenizer.json> [text...]\n"
      "       duck-tokenize <tokenizer.json> --decode <id>...\n"
      "       duck-tokenize --render-chat <tokenizer_config.json> "
      "<chats.json> [family]\n"
      "\n"
      "Prints the ids of the text (the arguments joined by spaces, or stdin "
      "if none)\non one line. --tokens prints one \"id<TAB>token\" line per "
      "id instead;\n--no-special encodes special tokens such as "
      "<|im_start|> as plain text.\n--decode prints the text of the ids.\n"
      "--repeat N encodes N times and reports load and encode times on "
      "stderr.\n--render-chat renders each chat of a JSON list ({\"name\", "
      "\"messages\",\n\"tools\", \"enable_thinking\", "
      "\"add_generation_prompt\" (default true), \"families\"})\nwith "
      "the config's chat_template, skipping those whose \"families\" leave "
      "out\n[family]; prints \"=== name ===\", the prompt and a newline "
      "for each.\n");
  return 2;
}

static std::string readFile(const char *path, bool *ok) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  *ok = bool(in);
  return buf.str();
}

// --render-chat: the chats of a corpus through the checkpoint's template.
static int renderChats(const char *config_path, const char *chats_path,
                       const std::string &family) {
  using Json = nlohmann::ordered_json;
  bool ok_cfg = false, ok_chats = false;
  const std::string cfg = readFile(config_path, &ok_cfg);
  const std::string chats = readFile(chats_path, &ok_chats);
  if (!ok_cfg || !ok_chats) {
    std::fprintf(stderr, "duck-tokenize: cannot read %s\n",
                 ok_cfg ? chats_path : config_path);
    return 1;
  }
  auto tmpl = duck::runtime::CheckpointTemplate::FromConfig(cfg, config_path);
  const Json list = Json::parse(chats, nullptr, /*allow_exceptions=*/false);
  if (!tmpl.ok() || !*tmpl || !list.is_array()) {
    std::fprintf(stderr, "duck-tokenize: %s\n",
                 !tmpl.ok() ? std::string(tmpl.status().message()).c_str()
                 : !*tmpl   ? "the config has no chat_template"
                            : "the chats file is not a JSON list");
    return 1;
  }
  for (const Json &c : list) {
    if (!family.empty() && c.contains("families") &&
        std::find(c["families"].begin(), c["families"].end(), family) ==
            c["families"].end())
      continue;
    duck::runtime::ChatTemplateArgs args;
    args.add_generation_prompt = c.value("add_generation_prompt", true);
    if (c.contains("enable_thinking"))
      args.enable_thinking = c["enable_thinking"].get<bool>();
    if (c.contains("tools"))
      args.tools = c["tools"];
    auto text = (*tmpl)->Render(c.value("messages", Json::array()), args);
    if (!text.ok()) {
      std::fprintf(stderr, "duck-tokenize: %s: %s\n",
                   c.value("name", "?").c_str(),
                   std::string(text.status().message()).c_str());
      return 1;
    }
    std::cout << "=== " << c.value("name", "") << " ===\n" << *text << "\n";
  }
  return 0;
}

int main(int argc, char **argv) {
  bool allow_special = true, show_tokens = false, decode = false;
  long repeat = 0;
  std::string path;
  std::vector<std::string> rest;
  if (argc >= 4 && std::strcmp(argv[1], "--render-chat") == 0)
    return renderChats(argv[2], argv[3], argc > 4 ? argv[4] : "");
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h")
      return usage(stdout), 0;
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
