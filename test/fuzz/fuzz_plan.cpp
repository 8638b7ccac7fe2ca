// libFuzzer: the plan loader (identifier, FlatBuffers verifier, versions,
// checksum trailer, semantic checks) on a model.duckplan in a scratch
// directory.
//
// An input is resealed: unless it already ends with a trailer ("DKCS" 16
// bytes from its end, which tests the checksum check itself), the harness
// appends the trailer of its bytes, so a mutation reaches the checks after
// the checksum instead of stopping there. utils/run-fuzz.sh seeds the
// corpus with a compiled plan without its trailer and points
// DUCK_FUZZ_PLAN_SEED at that plan's directory and DUCK_FUZZ_PLAN_MODEL at
// its checkpoint, so the checkpoint files and weight images the checks read
// are there. With DUCK_FUZZ_PLAN_STATS set it prints, at exit, how many
// inputs stopped at each stage: the proof that mutations get past the
// checksum.
#include "duck/runtime/engine/Engine.h"
#include "duck/runtime/plan/Plan.h"
#include "plan_trailer.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <string>
#include <unistd.h>

static const std::string &dir() {
  static const std::string d = [] {
    char tmpl[] = "/tmp/duck-fuzz-plan-XXXXXX";
    std::string out(mkdtemp(tmpl));
    // The seed plan's weight images, by link: the image checks read them.
    if (const char *seed = std::getenv("DUCK_FUZZ_PLAN_SEED"))
      if (DIR *dp = opendir(seed)) {
        while (const dirent *e = readdir(dp))
          if (std::strstr(e->d_name, ".weights"))
            (void)symlink((std::string(seed) + "/" + e->d_name).c_str(),
                          (out + "/" + e->d_name).c_str());
        closedir(dp);
      }
    return out;
  }();
  return d;
}

namespace {
enum Stage { kIdentifier, kVerifier, kVersions, kTrailer, kSemantic, kLoaded,
             kStages };
const char *const kStageNames[kStages] = {
    "identifier", "verifier", "versions", "trailer", "semantic", "loaded"};
uint64_t gStages[kStages];

Stage StageOf(const absl::Status &s) {
  if (s.ok())
    return kLoaded;
  const std::string m(s.message());
  if (m.find("no 'DKPL' file identifier") != std::string::npos)
    return kIdentifier;
  if (m.find("FlatBuffers verifier") != std::string::npos)
    return kVerifier;
  if (m.find("plan version") != std::string::npos ||
      m.find("duck ABI") != std::string::npos ||
      m.find("fp9 format") != std::string::npos)
    return kVersions;
  if (m.find("checksum trailer") != std::string::npos ||
      m.find("checksum does not match") != std::string::npos)
    return kTrailer;
  return kSemantic;
}

void PrintStages() {
  std::fprintf(stderr, "fuzz-plan stages:");
  for (int i = 0; i < kStages; ++i)
    std::fprintf(stderr, " %s %llu", kStageNames[i],
                 (unsigned long long)gStages[i]);
  std::fprintf(stderr, "\n");
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string path = dir() + "/model.duckplan";
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f)
    return 0;
  std::fwrite(data, 1, size, f);
  const bool sealed =
      size >= DUCK_PLAN_TRAILER_BYTES &&
      std::memcmp(data + size - DUCK_PLAN_TRAILER_BYTES,
                  DUCK_PLAN_TRAILER_MAGIC, 4) == 0;
  if (!sealed) {
    uint8_t trailer[DUCK_PLAN_TRAILER_BYTES];
    duck_plan_trailer(data, size, trailer);
    std::fwrite(trailer, 1, sizeof trailer, f);
  }
  std::fclose(f);
  duck::runtime::PlanLoadOptions o;
  // Never the plan's own checkpoint_dir: a mutated path could name any file.
  const char *model = std::getenv("DUCK_FUZZ_PLAN_MODEL");
  o.checkpoint_dir = model ? model : dir();
  o.verify_weight_checksums = true;
  static const bool stats = [] {
    if (!std::getenv("DUCK_FUZZ_PLAN_STATS"))
      return false;
    std::atexit(PrintStages);
    return true;
  }();
  auto loaded =
      duck::runtime::LoadedPlan::Load(dir(), duck::runtime::HostOpKinds(), o);
  if (stats)
    ++gStages[StageOf(loaded.status())];
  return 0;
}
