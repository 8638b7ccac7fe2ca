//===- BenchArgs.h - what duck-bench cluster and collective share --*- C++
//-*-===//
//
// Their command lines ("--key value" or "--key=value") and the shell
// quoting of the paths they pass to duckc, duck-mkmodel and duckrun.
//
//===----------------------------------------------------------------------===//
#ifndef DUCK_BENCH_BENCHARGS_H
#define DUCK_BENCH_BENCHARGS_H

#include <cstring>
#include <string>

namespace duck::bench {

/// argv[*i]'s value for `key` ("--key value" or "--key=value"), advancing
/// *i past a separate value; null when argv[*i] is not `key`.
inline const char *ArgValue(int argc, char **argv, int *i, const char *key) {
  const size_t n = std::strlen(key);
  if (std::strncmp(argv[*i], key, n) != 0)
    return nullptr;
  if (argv[*i][n] == '=')
    return argv[*i] + n + 1;
  if (argv[*i][n] == 0 && *i + 1 < argc)
    return argv[++*i];
  return nullptr;
}

/// `s` quoted for /bin/sh.
inline std::string ShellQuote(const std::string &s) {
  std::string q = "'";
  for (char c : s)
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

} // namespace duck::bench

#endif // DUCK_BENCH_BENCHARGS_H
