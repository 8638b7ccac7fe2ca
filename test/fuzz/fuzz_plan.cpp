// libFuzzer: the plan loader (identifier, FlatBuffers verifier, versions,
// checksum trailer, semantic checks) on a model.duckplan in a scratch
// directory.
#include "duck/runtime/Plan.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

static std::string dir() {
  static std::string d = [] {
    char tmpl[] = "/tmp/duck-fuzz-plan-XXXXXX";
    return std::string(mkdtemp(tmpl));
  }();
  return d;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string path = dir() + "/model.duckplan";
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f)
    return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  duck::runtime::PlanLoadOptions o;
  o.checkpoint_dir = dir();
  (void)duck::runtime::LoadedPlan::Load(dir(), o);
  return 0;
}
