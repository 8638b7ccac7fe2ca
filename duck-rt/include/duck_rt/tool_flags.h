// Command-line parsing shared by Duck's host tools that use absl flags
// (duckd, duckrun, duck-cluster): --max-tokens is accepted as well as absl's
// --max_tokens, and --help lists the tool's own flags and exits 0 (absl's
// own handling exits 1, which scripts read as a failure). Host-only C++.
#ifndef DUCK_RT_TOOL_FLAGS_H
#define DUCK_RT_TOOL_FLAGS_H

#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "duck_rt/wrap_text.h"

#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#ifndef DUCK_VERSION
#define DUCK_VERSION "unknown"
#endif

namespace duck {

/// The usage message as --help prints it after absl's "<tool>: " (which
/// takes `first_column` columns of the first line): a line longer than 79
/// columns is broken between words, its continuations indented as it is.
inline std::string WrapUsage(const std::string &msg, size_t first_column) {
  std::string out;
  size_t start = 0, col = first_column;
  while (true) {
    const size_t nl = msg.find('\n', start);
    const std::string_view line = std::string_view(msg).substr(
        start, nl == std::string::npos ? std::string::npos : nl - start);
    if (col + line.size() <= 79) {
      out += line;
    } else {
      const size_t indent = std::min(line.find_first_not_of(' '), line.size());
      out.append(indent, ' ');
      out += WrapWords(line.substr(indent), 79, col + indent, indent);
    }
    if (nl == std::string::npos)
      return out;
    out += '\n';
    start = nl + 1;
    col = 0;
  }
}

/// Parses argv with absl; returns the positional arguments (argv[0] first).
/// The strings live as long as the returned object.
class ToolFlags {
public:
  ToolFlags(int argc, char **argv) : storage_(argv, argv + argc) {
    absl::FlagsUsageConfig config;
    // Our flags are defined in files under duck-rt/ or runtime/; absl's own
    // (--flagfile, ...) are left to --helpfull.
    auto ours = [](absl::string_view path) {
      return absl::StrContains(path, "duck") || absl::StrContains(path, "runtime");
    };
    config.contains_help_flags = ours;
    config.contains_helpshort_flags = ours;
    // --help heads the list "Flags from <tool>:", not with the source path
    // of the build machine.
    std::string tool = argc > 0 ? argv[0] : "this tool";
    tool = tool.substr(tool.find_last_of('/') + 1);
    // (absl filters on the name this returns: only ours are renamed.)
    config.normalize_filename = [tool, ours](absl::string_view path) {
      return ours(path) ? tool : std::string(path);
    };
    // --version: the tool and Duck's version (absl's default names the
    // build type).
    config.version_string = [tool] {
      return tool + " (Duck) " DUCK_VERSION "\n";
    };
    absl::SetFlagsUsageConfig(config);
    std::vector<char *> fixed;
    for (std::string &a : storage_) {
      if (a.rfind("--", 0) == 0)
        for (size_t i = 2; i < a.size() && a[i] != '='; ++i)
          if (a[i] == '-')
            a[i] = '_';
      fixed.push_back(a.data());
    }
    // absl::ParseCommandLine, but a help request (--help, --helpfull, ...)
    // is answered on stdout with exit status 0.
    namespace fi = absl::flags_internal;
    positional_ = fi::ParseCommandLineImpl(
        (int)fixed.size(), fixed.data(), fi::ArgvListAction::kRemoveParsedArgs,
        fi::UsageFlagsAction::kIgnoreUsage,
        fi::OnUndefinedFlag::kAbortIfUndefined);
    const std::string usage =
        WrapUsage(std::string(absl::ProgramUsageMessage()), tool.size() + 2);
    if (fi::HandleUsageFlags(std::cout, usage) >= 0) {
      std::cout.flush();
      std::exit(0);
    }
  }
  const std::vector<char *> &positional() const { return positional_; }

private:
  std::vector<std::string> storage_;
  std::vector<char *> positional_;
};

} // namespace duck

#endif // DUCK_RT_TOOL_FLAGS_H
