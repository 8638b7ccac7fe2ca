//===- Common.h - Helpers shared by the duck-bench subcommands --*- C++ -*-===//
//
// Clock, memory, random numbers, machine facts, the command-line list
// parser, a minimal JSON writer and a text table. duck-bench is part of
// duck-rt, so nothing here may use LLVM.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_BENCH_COMMON_H
#define DUCK_BENCH_COMMON_H

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "Support.h" // the clock, buffers, random numbers, median

namespace duck::bench {




/// What the benchmark knows about the machine it runs on.
struct MachineInfo {
  std::string cpuModel;
  uint32_t onlineCores = 1;
  std::vector<int> cpus;   // CPUs this process may run on, in order
  uint64_t llcBytes = 0;   // last-level cache size
  std::string llcSource;   // "sysfs", "sysconf", "fallback" or "option"
  std::string date;        // UTC, ISO 8601
  std::string loadAverage; // /proc/loadavg's first three fields
};

/// Reads /proc/cpuinfo, the affinity mask, and the LLC size from
/// /sys/devices/system/cpu/cpu0/cache (then sysconf, then 32 MiB).
MachineInfo detectMachine();

/// The default cold set of a benchmark: 4x the last-level cache and at
/// least 1 GiB (on a 2-vCPU Zen 5 VM reporting 32 MiB of L3, a 128 MiB set
/// still read at 80-97 GB/s against 42-51 from 512 MiB up: part of it came
/// from cache).
inline uint64_t defaultColdBytes(uint64_t llcBytes) {
  return 4 * llcBytes > (1ull << 30) ? 4 * llcBytes : 1ull << 30;
}

std::string loadAverageNow();

/// Parses "1,2,4" and ranges such as "1-4" (or "1-4,8") into positive
/// integers of at most `max` (counts of cores or tokens by default).
/// Returns false on anything else.
bool parseUintList(const std::string &text, std::vector<uint32_t> &out,
                   uint32_t max = 4096);

/// The value of `arg` when it is `key=VALUE` (a pointer into arg), else
/// null: the subcommands' `--name=value` options.
const char *flagValue(const char *arg, const char *key);

/// An option's value as a whole number (digits only: no sign, nothing
/// after them, at most `max`) or as a finite real number (`parseReal`).
/// On anything else: says on stderr which option and value were wrong,
/// sets *bad and returns 0, so a parser can go on and refuse at the end.
uint64_t parseWhole(const char *key, const char *text, bool *bad,
                    uint64_t max = UINT32_MAX);
double parseReal(const char *key, const char *text, bool *bad);

/// Splits "a,b,c" at the commas (an empty text gives one empty item).
std::vector<std::string> splitCommas(const std::string &text);


/// printf into a std::string.
std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/// One JSON object written on one line, fields in insertion order.
class JsonObject {
public:
  JsonObject &num(const char *key, double v); // NaN and inf become null
  JsonObject &integer(const char *key, int64_t v);
  JsonObject &str(const char *key, const std::string &v);
  JsonObject &boolean(const char *key, bool v);
  JsonObject &null(const char *key);
  JsonObject &raw(const char *key, const std::string &json);
  std::string text() const { return "{" + body_ + "}"; }

private:
  void key(const char *k);
  std::string body_;
};

std::string jsonString(const std::string &s);
std::string jsonNumber(double v);
std::string jsonNumbers(const std::vector<double> &v);

/// A plain text table: columns sized to their widest cell, numbers right
/// aligned, text left aligned.
class Table {
public:
  explicit Table(std::vector<std::string> header);
  void row(std::vector<std::string> cells);
  void print(FILE *out) const;
  bool empty() const { return rows_.empty(); }

private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

} // namespace duck::bench

#endif // DUCK_BENCH_COMMON_H
