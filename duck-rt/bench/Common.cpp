//===- Common.cpp - Helpers shared by the duck-bench subcommands ----------===//

#include "Common.h"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

namespace duck::bench {

namespace {

std::string readFirstLine(const std::string &path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

/// "32768K", "32M", "1048576" -> bytes; 0 when unreadable.
uint64_t parseCacheSize(const std::string &s) {
  if (s.empty())
    return 0;
  char *end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end && (*end == 'K' || *end == 'k'))
    v <<= 10;
  else if (end && (*end == 'M' || *end == 'm'))
    v <<= 20;
  else if (end && (*end == 'G' || *end == 'g'))
    v <<= 30;
  return v;
}

/// The largest data or unified cache of the highest level cpu0 reports.
uint64_t llcFromSysfs() {
  int bestLevel = 0;
  uint64_t best = 0;
  for (int i = 0; i < 16; ++i) {
    std::string dir = format("/sys/devices/system/cpu/cpu0/cache/index%d/", i);
    std::string type = readFirstLine(dir + "type");
    if (type.empty())
      continue;
    if (type != "Unified" && type != "Data")
      continue;
    int level = std::atoi(readFirstLine(dir + "level").c_str());
    uint64_t size = parseCacheSize(readFirstLine(dir + "size"));
    if (size && (level > bestLevel || (level == bestLevel && size > best))) {
      bestLevel = level;
      best = size;
    }
  }
  return best;
}

} // namespace

std::string loadAverageNow() {
  std::istringstream in(readFirstLine("/proc/loadavg"));
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

MachineInfo detectMachine() {
  MachineInfo m;
  {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("model name", 0) == 0) {
        size_t colon = line.find(':');
        if (colon != std::string::npos) {
          m.cpuModel = line.substr(colon + 1);
          m.cpuModel.erase(0, m.cpuModel.find_first_not_of(" \t"));
        }
        break;
      }
    }
    if (m.cpuModel.empty())
      m.cpuModel = "unknown";
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  m.onlineCores = online > 0 ? (uint32_t)online : 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set))
        m.cpus.push_back(c);
  if (m.cpus.empty())
    for (uint32_t c = 0; c < m.onlineCores; ++c)
      m.cpus.push_back((int)c);

  if ((m.llcBytes = llcFromSysfs()) != 0) {
    m.llcSource = "sysfs";
  } else {
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l3 > 0 || l2 > 0) {
      m.llcBytes = (uint64_t)(l3 > 0 ? l3 : l2);
      m.llcSource = "sysconf";
    } else {
      m.llcBytes = 32ull << 20;
      m.llcSource = "fallback";
    }
  }

  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  m.date = buf;
  m.loadAverage = loadAverageNow();
  return m;
}

const char *flagValue(const char *arg, const char *key) {
  const size_t n = std::strlen(key);
  return std::strncmp(arg, key, n) == 0 && arg[n] == '=' && arg[n + 1]
             ? arg + n + 1
             : nullptr;
}

uint64_t parseWhole(const char *key, const char *text, bool *bad,
                    uint64_t max) {
  char *end = nullptr;
  errno = 0;
  const unsigned long long v =
      text[0] >= '0' && text[0] <= '9' ? std::strtoull(text, &end, 10) : 0;
  const bool whole = end && *end == '\0' && errno == 0;
  if (whole && v <= max)
    return v;
  if (whole)
    std::fprintf(stderr, "duck-bench: %s: %s is more than %llu\n", key, text,
                 (unsigned long long)max);
  else
    std::fprintf(stderr, "duck-bench: %s: '%s' is not a whole number\n", key,
                 text);
  *bad = true;
  return 0;
}

double parseReal(const char *key, const char *text, bool *bad) {
  char *end = nullptr;
  const double v = std::strtod(text, &end);
  if (end != text && *end == '\0' && std::isfinite(v))
    return v;
  std::fprintf(stderr, "duck-bench: %s: '%s' is not a number\n", key, text);
  *bad = true;
  return 0;
}

std::vector<std::string> splitCommas(const std::string &text) {
  std::vector<std::string> out;
  for (size_t p = 0; p <= text.size();) {
    size_t q = text.find(',', p);
    if (q == std::string::npos)
      q = text.size();
    out.push_back(text.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

bool parseUintList(const std::string &text, std::vector<uint32_t> &out,
                   uint32_t max) {
  out.clear();
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty())
      return false;
    size_t dash = item.find('-');
    char *end = nullptr;
    unsigned long a = std::strtoul(item.c_str(), &end, 10);
    if (dash == std::string::npos) {
      if (*end != '\0' || a == 0 || a > max)
        return false;
      out.push_back((uint32_t)a);
      continue;
    }
    if (end != item.c_str() + dash)
      return false;
    unsigned long b = std::strtoul(item.c_str() + dash + 1, &end, 10);
    if (*end != '\0' || a == 0 || b < a || b > max)
      return false;
    for (unsigned long v = a; v <= b; ++v)
      out.push_back((uint32_t)v);
  }
  return !out.empty();
}


std::string format(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(n > 0 ? (size_t)n : 0, '\0');
  if (n > 0)
    std::vsnprintf(&s[0], (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

std::string jsonString(const std::string &s) {
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = (unsigned char)ch;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      out += format("\\u%04x", c);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string jsonNumber(double v) {
  if (!std::isfinite(v))
    return "null";
  return format("%.6g", v);
}

std::string jsonNumbers(const std::vector<double> &v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? "," : "") + jsonNumber(v[i]);
  return out + "]";
}

void JsonObject::key(const char *k) {
  if (!body_.empty())
    body_ += ",";
  body_ += jsonString(k) + ":";
}

JsonObject &JsonObject::num(const char *k, double v) {
  key(k);
  body_ += jsonNumber(v);
  return *this;
}

JsonObject &JsonObject::integer(const char *k, int64_t v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}

JsonObject &JsonObject::str(const char *k, const std::string &v) {
  key(k);
  body_ += jsonString(v);
  return *this;
}

JsonObject &JsonObject::boolean(const char *k, bool v) {
  key(k);
  body_ += v ? "true" : "false";
  return *this;
}

JsonObject &JsonObject::null(const char *k) {
  key(k);
  body_ += "null";
  return *this;
}

JsonObject &JsonObject::raw(const char *k, const std::string &json) {
  key(k);
  body_ += json;
  return *this;
}

Table::Table(std::vector<std::string> header) : header_(std::move(header)) {}

void Table::row(std::vector<std::string> cells) {
  cells.resize(header_.size());
  rows_.push_back(std::move(cells));
}

void Table::print(FILE *out) const {
  std::vector<size_t> width(header_.size());
  std::vector<bool> numeric(header_.size(), true);
  for (size_t c = 0; c < header_.size(); ++c)
    width[c] = header_[c].size();
  for (const auto &r : rows_)
    for (size_t c = 0; c < r.size(); ++c) {
      width[c] = std::max(width[c], r[c].size());
      const std::string &s = r[c];
      if (!s.empty() && s != "-" &&
          s.find_first_not_of("0123456789.+-exX%") != std::string::npos)
        numeric[c] = false;
    }
  auto line = [&](const std::vector<std::string> &cells) {
    std::string s;
    for (size_t c = 0; c < cells.size(); ++c) {
      std::string pad(width[c] - cells[c].size(), ' ');
      s += c ? "  " : "";
      s += numeric[c] ? pad + cells[c] : cells[c] + pad;
    }
    while (!s.empty() && s.back() == ' ')
      s.pop_back();
    std::fprintf(out, "%s\n", s.c_str());
  };
  line(header_);
  std::vector<std::string> rule;
  for (size_t w : width)
    rule.push_back(std::string(w, '-'));
  line(rule);
  for (const auto &r : rows_)
    line(r);
}

} // namespace duck::bench
