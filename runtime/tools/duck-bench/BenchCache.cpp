//===- BenchCache.cpp - duck-bench cache: warm vs cold weight start-up ----===//
//
// Start-up of one duck with a weight set of --size bytes (default 1 GiB), in
// the same run: the miss path (connect, hello, full prepare of the image
// over loopback with checksum verification and msync, open, first step)
// against the hit path (the same with the cache already holding the image:
// no weight bytes move), and the hit after a duckd restart (the cache file
// survives). The image is synthetic (valid fp9 planes, not packed from a
// checkpoint); building it is not timed.
//
//===----------------------------------------------------------------------===//
#include "BenchSubcommands.h"
#include "Common.h"

#include "SyntheticImage.h"
#include "duck/runtime/cluster/DuckClient.h"
#include "duck/runtime/cluster/LocalCluster.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <iterator>
#include <unistd.h>

using namespace duck::bench;

namespace {

struct CacheOptions {
  uint64_t size = 1ull << 30;
  uint32_t cores = 1;
  std::string duckd, elf, dir;
  std::string token; // set: every frame authenticated (HMAC-SHA256)
  bool sync = true, json = false;
};

bool ParseSize(const char *text, uint64_t *out) {
  char *end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || v <= 0)
    return false;
  switch (*end) {
  case 'K':
  case 'k':
    v *= 1024;
    ++end;
    break;
  case 'M':
  case 'm':
    v *= 1024 * 1024;
    ++end;
    break;
  case 'G':
  case 'g':
    v *= 1024.0 * 1024 * 1024;
    ++end;
    break;
  default:
    break;
  }
  if (*end)
    return false;
  *out = uint64_t(v);
  return true;
}

/// One start-up: connect + hello + prepare + open + one mode-4 step.
struct Startup {
  double seconds = 0;
  duckd_cache_result result = DUCKD_CACHE_MISS;
  uint64_t uploaded = 0;
};

/// The machine's own bound on a miss: the image's bytes written into a new
/// file in the cache's directory with large write()s (and fdatasync when
/// duckd syncs), just before the miss. The file is kept until the end, so
/// the miss cannot reuse its pages: in a VM whose freed memory goes back to
/// the host, the first touch of a page is most of the cost of writing it,
/// and both then write pages the guest has not touched lately (if anything
/// the write gets the warmer ones, so the ratio errs low).
absl::StatusOr<double> NewFileWriteSeconds(const std::string &path,
                                           uint64_t bytes, bool sync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                        0644);
  if (fd < 0)
    return absl::InternalError(path + ": " + std::strerror(errno));
  std::vector<uint8_t> buf(4u << 20);
  for (size_t i = 0; i < buf.size(); ++i)
    buf[i] = uint8_t(i * 131 + 7);
  const double t0 = nowSeconds();
  uint64_t done = 0;
  bool ok = true;
  while (ok && done < bytes) {
    const size_t n = size_t(std::min<uint64_t>(buf.size(), bytes - done));
    const ssize_t w = ::write(fd, buf.data(), n);
    ok = w > 0;
    done += ok ? uint64_t(w) : 0;
  }
  if (ok && sync)
    ok = ::fdatasync(fd) == 0;
  const double seconds = nowSeconds() - t0;
  const std::string err = ok ? "" : std::strerror(errno);
  ::close(fd);
  if (!ok)
    return absl::InternalError(path + ": " + err);
  return seconds;
}

absl::StatusOr<Startup> StartOnce(const duck::runtime::LocalCluster &c,
                                  const std::string &image,
                                  const std::vector<uint8_t> &elf,
                                  bool invalidate, uint32_t hidden,
                                  uint32_t experts, const std::string &token) {
  const double t0 = nowSeconds();
  duck::runtime::DuckClientOptions o;
  o.ducks = c.endpoints();
  o.token = token;
  o.read_environment = false;
  o.scratch_bytes = 64 << 20;
  o.call_timeout = absl::Minutes(10);
  auto client = duck::runtime::DuckClient::Create(o);
  if (!client.ok())
    return client.status();
  duck::runtime::PrepareOptions po;
  po.invalidate = invalidate;
  auto rep = (*client)->Prepare({image}, po);
  if (!rep.ok())
    return rep.status();
  if (absl::Status s = (*client)->Open(elf); !s.ok())
    return s;
  auto ib = duck::duckd::MakeIb(DUCK_MODE_MOE_DECODE_SMP, 0, 1, 8,
                                duck::duckd::RandomRouting(1, 8, experts, 3),
                                duck::duckd::RandomX(hidden, 4));
  std::vector<absl::Span<const uint8_t>> ibs = {ib};
  std::vector<duck::runtime::DuckOutput> out;
  if (absl::Status s = (*client)->Step(ibs, &out); !s.ok())
    return s;
  Startup st;
  st.seconds = nowSeconds() - t0;
  st.result = rep->result[0];
  st.uploaded = rep->bytes_uploaded[0];
  return st;
}

const char *ResultName(duckd_cache_result r) {
  return r == DUCKD_CACHE_HIT       ? "hit"
         : r == DUCKD_CACHE_PARTIAL ? "partial"
                                    : "miss";
}

} // namespace

static void PrintCacheUsage(FILE *out) {
  std::fprintf(
      out,
      "usage: duck-bench cache [--size=1G] [--cores=1] [--dir=DIR] "
      "[--no-sync]\n"
      "  [--duckd=PATH] [--elf=PATH] [--token=SECRET] [--json]\n\n"
      "Times one local duck's start-up with a synthetic weight image of\n"
      "--size bytes (K, M or G; default 1G): a miss (connect, hello, the\n"
      "whole image uploaded over loopback, checked and synced, a session\n"
      "opened, a first step), a hit (the same, the cache already holding\n"
      "the image: no weight bytes move) and a hit after duckd restarts.\n"
      "Beside the miss, a new file of the same size written with 4 MiB\n"
      "write()s (and fdatasync): the machine's own limit for filling new\n"
      "pages, and the miss's rate as a share of it.\n\n"
      "  --cores N      the duck's cores (default 1)\n"
      "  --dir DIR      where the cache and the image go (default: a new\n"
      "                 directory under /tmp, removed at the end)\n"
      "  --no-sync      duckd does not msync the cache (and the new file is\n"
      "                 not fdatasync'd)\n"
      "  --duckd, --elf the daemon and the duck ELF (default: this build's)\n"
      "  --token        authenticate every frame with this secret\n"
      "  --json         one JSON object instead of the table\n");
}

int duckBenchCache(int argc, char **argv) {
  CacheOptions o;
  bool badNumber = false; // said on stderr by parseWhole
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char *key) { return flagValue(argv[i], key); };
    bool ok = true;
    if (a == "--help" || a == "-h") {
      PrintCacheUsage(stdout);
      return 0;
    } else if (a == "--json")
      o.json = true;
    else if (a == "--no-sync")
      o.sync = false;
    else if (const char *v = val("--size"))
      ok = ParseSize(v, &o.size);
    else if (const char *v = val("--cores"))
      o.cores = uint32_t(parseWhole("--cores", v, &badNumber));
    else if (const char *v = val("--duckd"))
      o.duckd = v;
    else if (const char *v = val("--elf"))
      o.elf = v;
    else if (const char *v = val("--dir"))
      o.dir = v;
    else if (const char *v = val("--token"))
      o.token = v;
    else
      ok = false;
    if (!ok || badNumber || o.cores == 0) {
      std::fprintf(stderr, "duck-bench cache: bad option '%s'\n", argv[i]);
      PrintCacheUsage(stderr);
      return 2;
    }
  }
  auto elfRead = duck::runtime::ReadDuckElf(o.elf);
  if (!elfRead.ok()) {
    std::fprintf(stderr, "duck-bench cache: %s (or --elf)\n",
                 std::string(elfRead.status().message()).c_str());
    return 1;
  }
  const std::vector<uint8_t> elf = std::move(*elfRead);

  // The weight set: MoE slots of about 64 MiB (hidden 4096, inter 256).
  duck::duckd::SyntheticSpec spec;
  spec.hidden = 4096;
  spec.block = 128;
  spec.pack = false;
  spec.seed = 2024;
  duck::duckd::SyntheticSlot slot;
  slot.kind = DUCK_SLOT_MOE;
  slot.inter = 256;
  slot.experts = 18;
  const uint64_t perSlot = [&] {
    duck::duckd::SyntheticSpec one = spec;
    one.slots = {slot};
    return duck::duckd::SyntheticImageBytes(one);
  }();
  const uint32_t nSlots =
      uint32_t(std::max<uint64_t>(1, (o.size + perSlot - 1) / perSlot));
  for (uint32_t s = 0; s < nSlots; ++s) {
    slot.layer = s;
    spec.slots.push_back(slot);
  }
  const uint64_t imageBytes = duck::duckd::SyntheticImageBytes(spec);

  std::string dir = o.dir;
  bool ownDir = false;
  if (dir.empty()) {
    char tmpl[] = "/tmp/duck-bench-cache-XXXXXX";
    if (!mkdtemp(tmpl)) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = tmpl;
    ownDir = true;
  }
  const std::string image = dir + "/bench-image.duckw";
  const double b0 = nowSeconds();
  if (absl::Status s = duck::duckd::WriteSyntheticImage(spec, image); !s.ok()) {
    std::fprintf(stderr, "duck-bench cache: %s\n",
                 std::string(s.message()).c_str());
    return 1;
  }
  const double buildSeconds = nowSeconds() - b0;

  duck::runtime::LocalClusterOptions co;
  co.ducks = 1;
  co.cores = o.cores;
  co.duckd_path = o.duckd;
  co.cache_dir = dir;
  co.name_prefix = "bench-cache";
  co.weights_size = (imageBytes + (1 << 20)) / 4096 * 4096;
  co.sync = o.sync;
  co.token = o.token;
  auto cluster = duck::runtime::LocalCluster::Start(co);
  if (!cluster.ok()) {
    std::fprintf(stderr, "duck-bench cache: %s\n",
                 std::string(cluster.status().message()).c_str());
    return 1;
  }
  const std::string newFile = dir + "/bench-new-file";
  absl::StatusOr<double> limit = NewFileWriteSeconds(newFile, imageBytes, o.sync);
  auto miss = StartOnce(**cluster, image, elf, /*invalidate=*/true, spec.hidden,
                        slot.experts, o.token);
  auto hit = miss.ok() ? StartOnce(**cluster, image, elf, false, spec.hidden,
                                   slot.experts, o.token)
                       : miss;
  absl::StatusOr<Startup> restart = hit;
  if (hit.ok()) {
    if (absl::Status s = (*cluster)->Restart(0); !s.ok())
      restart = s;
    else
      restart = StartOnce(**cluster, image, elf, false, spec.hidden,
                          slot.experts, o.token);
  }
  (void)(*cluster)->Stop();
  ::unlink(newFile.c_str());
  ::unlink(image.c_str());
  ::unlink((*cluster)->cache_file(0).c_str());
  if (ownDir)
    ::rmdir(dir.c_str());
  for (const auto *r : {&miss, &hit, &restart})
    if (!r->ok()) {
      std::fprintf(stderr, "duck-bench cache: %s\n",
                   std::string(r->status().message()).c_str());
      return 1;
    }
  if (!limit.ok()) {
    std::fprintf(stderr, "duck-bench cache: %s\n",
                 std::string(limit.status().message()).c_str());
    return 1;
  }
  const double missGbs = double(miss->uploaded) / miss->seconds / 1e9;
  const double limitGbs = double(imageBytes) / *limit / 1e9;

  const double speedup = miss->seconds / hit->seconds;
  if (o.json) {
    std::printf("%s\n", JsonObject()
                            .str("bench", "cache")
                            .integer("image_bytes", int64_t(imageBytes))
                            .integer("slots", nSlots)
                            .integer("cores", o.cores)
                            .boolean("sync", o.sync)
                            .boolean("authenticated", !o.token.empty())
                            .num("build_s", buildSeconds)
                            .num("miss_s", miss->seconds)
                            .integer("miss_uploaded", int64_t(miss->uploaded))
                            .num("miss_gbps", missGbs)
                            .num("new_file_write_gbps", limitGbs)
                            .num("miss_of_new_file_write", missGbs / limitGbs)
                            .num("hit_s", hit->seconds)
                            .str("hit_result", ResultName(hit->result))
                            .num("hit_after_restart_s", restart->seconds)
                            .str("restart_result", ResultName(restart->result))
                            .num("speedup", speedup)
                            .text()
                            .c_str());
    return 0;
  }
  std::printf("duck-bench cache: %.2f GiB image, %u slots (build %.1f s, not "
              "timed), msync %s\n",
              double(imageBytes) / double(1ull << 30), nSlots, buildSeconds,
              o.sync ? "on" : "off");
  Table t({"path", "cache", "uploaded MiB", "start-up s"});
  t.row({"miss", ResultName(miss->result),
         format("%.1f", double(miss->uploaded) / (1 << 20)),
         format("%.3f", miss->seconds)});
  t.row({"hit", ResultName(hit->result),
         format("%.1f", double(hit->uploaded) / (1 << 20)),
         format("%.3f", hit->seconds)});
  t.row({"hit after restart", ResultName(restart->result),
         format("%.1f", double(restart->uploaded) / (1 << 20)),
         format("%.3f", restart->seconds)});
  t.print(stdout);
  std::printf("hit is %.1fx faster than miss\n", speedup);
  std::printf("miss uploads at %.2f GB/s; a new file of the same size, "
              "written with 4 MiB write()s%s just before: %.2f GB/s (the miss "
              "at %.2f of it)\n",
              missGbs, o.sync ? " and fdatasync" : "", limitGbs,
              missGbs / limitGbs);
  return 0;
}
