// duck-plan-dump: prints a Duck plan (model.duckplan) as JSON, after the
// FlatBuffers verifier and the identifier/version checks.
#include "duck/plan/plan_generated.h"
#include "duck_plan_schema_text.h"
#include "plan_trailer.h"

#include "flatbuffers/idl.h"
#include "flatbuffers/util.h"

#include <cstdio>
#include <cstring>
#include <string>

/// The usage text on `out` (stdout for --help, stderr for a bad command
/// line); returns 2, the bad command line's status.
static int usage(FILE *out = stderr) {
  std::fprintf(
      out,
      "usage: duck-plan-dump <plan-dir | model.duckplan> [--summary]\n"
      "       duck-plan-dump --reseal <model.duckplan>\n"
      "\n"
      "Verifies the plan (checksum trailer, FlatBuffers verifier, "
      "file identifier\n'DKPL', plan version) and prints it as "
      "JSON; --summary prints the plan's\nsettings, its step limits and a line "
      "per duck (with the experts it holds\nof each MoE layer) "
      "instead.\n"
      "\n"
      "--reseal writes a fresh checksum trailer after the FlatBuffer "
      "of a plan edited\nby hand (for example through its JSON and "
      "flatc -b), so the runtime's own\nchecks, not the checksum, "
      "judge it.\n");
  return 2;
}

/// Rewrites `path` as its FlatBuffer (an old trailer dropped) plus a new
/// trailer, through a temporary file and a rename.
static int reseal(const std::string &path) {
  std::string buf;
  if (!flatbuffers::LoadFile(path.c_str(), true, &buf)) {
    std::fprintf(stderr, "duck-plan-dump: error: cannot read '%s'\n",
                 path.c_str());
    return 1;
  }
  uint64_t size = buf.size();
  if (size >= DUCK_PLAN_TRAILER_BYTES &&
      std::memcmp(buf.data() + size - DUCK_PLAN_TRAILER_BYTES,
                  DUCK_PLAN_TRAILER_MAGIC, 4) == 0)
    size -= DUCK_PLAN_TRAILER_BYTES;
  flatbuffers::Verifier v(reinterpret_cast<const uint8_t *>(buf.data()), size);
  if (!duck::plan::PlanDefBufferHasIdentifier(buf.data()) ||
      !duck::plan::VerifyPlanDefBuffer(v)) {
    std::fprintf(stderr,
                 "duck-plan-dump: error: '%s' is not a well-formed Duck plan\n",
                 path.c_str());
    return 1;
  }
  uint8_t trailer[DUCK_PLAN_TRAILER_BYTES];
  duck_plan_trailer(buf.data(), size, trailer);
  std::string out = buf.substr(0, size);
  out.append(reinterpret_cast<const char *>(trailer), sizeof trailer);
  const std::string tmp = path + ".reseal-tmp";
  if (!flatbuffers::SaveFile(tmp.c_str(), out, true) ||
      std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "duck-plan-dump: error: cannot write '%s'\n",
                 path.c_str());
    std::remove(tmp.c_str());
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  std::string path;
  bool summary = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--summary"))
      summary = true;
    else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h"))
      return usage(stdout), 0;
    else if (!std::strcmp(argv[i], "--reseal"))
      return i + 2 == argc ? reseal(argv[i + 1]) : usage();
    else if (path.empty())
      path = argv[i];
    else
      return usage();
  }
  if (path.empty())
    return usage();
  if (flatbuffers::DirExists(path.c_str()))
    path += "/model.duckplan";
  std::string buf;
  if (!flatbuffers::LoadFile(path.c_str(), true, &buf)) {
    std::fprintf(stderr, "duck-plan-dump: error: cannot read '%s'\n",
                 path.c_str());
    return 1;
  }
  if (!duck::plan::PlanDefBufferHasIdentifier(buf.data())) {
    std::fprintf(stderr,
                 "duck-plan-dump: error: '%s' is not a Duck plan (file "
                 "identifier is not 'DKPL')\n",
                 path.c_str());
    return 1;
  }
  uint64_t planSize = 0;
  if (!duck_plan_trailer_ok(buf.data(), buf.size(), &planSize)) {
    std::fprintf(stderr,
                 "duck-plan-dump: error: '%s' is corrupt or not written by "
                 "duckc (its checksum trailer is missing or does not match)\n",
                 path.c_str());
    return 1;
  }
  flatbuffers::Verifier v(reinterpret_cast<const uint8_t *>(buf.data()),
                          planSize);
  if (!duck::plan::VerifyPlanDefBuffer(v)) {
    std::fprintf(stderr,
                 "duck-plan-dump: error: '%s' is corrupt or truncated (the "
                 "FlatBuffers verifier rejected it)\n",
                 path.c_str());
    return 1;
  }
  const duck::plan::PlanDef *plan = duck::plan::GetPlanDef(buf.data());
  const uint32_t version = (uint32_t)duck::plan::PlanFormat::Version;
  if (plan->version() != version) {
    std::fprintf(stderr,
                 "duck-plan-dump: error: '%s' is plan version %u; this tool "
                 "reads version %u\n",
                 path.c_str(), plan->version(), version);
    return 1;
  }
  if (summary) {
    std::printf("plan: version %u, model %s, tp %u, multiple_of %u, "
                "strategy %s, %u ops\n",
                plan->version(),
                plan->model() && plan->model()->name()
                    ? plan->model()->name()->c_str()
                    : "?",
                plan->tp(), plan->multiple_of(),
                plan->strategy() == 2   ? "mixed (per MoE layer)"
                : plan->strategy() == 1 ? "experts"
                                        : "intermediate",
                plan->ops() ? plan->ops()->size() : 0);
    if (const duck::plan::MtpDef *m = plan->mtp())
      std::printf("mtp: DeepSeek's MTP module, layer %u, %u ops "
                  "(duckrun --speculative mtp)\n",
                  m->layer(), m->ops() ? m->ops()->size() : 0);
    if (plan->wire_x_bf16())
      std::printf("wire: activations to the ducks in bf16\n");
    if (plan->wire_out_bf16())
      std::printf("wire: the ducks' answers in bf16\n");
    if (plan->wire_x_q8())
      std::printf("wire: activations to the ducks in q8\n");
    if (plan->wire_out_q8())
      std::printf("wire: the ducks' answers in q8\n");
    if (const duck::plan::StepLimitsDef *l = plan->step_limits())
      std::printf("step limits: intermediate %u, experts %u (%u a token), "
                  "head rows %u\n",
                  l->max_inter(), l->max_experts(), l->max_active(),
                  l->max_head_rows());
    if (plan->ducks())
      for (const duck::plan::DuckDef *d : *plan->ducks()) {
        // Where a MoE layer's experts went: the first MoE slot's range,
        // and how many a layer when that differs between layers (whole
        // experts with equal shares: the extra ones rotate).
        std::string experts;
        const duck::plan::SlotDef *first = nullptr;
        uint32_t lo = ~0u, hi = 0, layers = 0;
        bool alike = true;
        if (d->slots())
          for (const duck::plan::SlotDef *sd : *d->slots()) {
            if (!sd->moe())
              continue;
            if (!first)
              first = sd;
            const uint32_t n = sd->expert_end() - sd->expert_begin();
            lo = std::min(lo, n);
            hi = std::max(hi, n);
            ++layers;
            alike = alike && sd->expert_begin() == first->expert_begin() &&
                    sd->expert_end() == first->expert_end();
          }
        if (first) {
          experts = ", experts [" + std::to_string(first->expert_begin()) +
                    ", " + std::to_string(first->expert_end()) + ")";
          if (!alike)
            experts += " in layer " + std::to_string(first->layer()) + ", " +
                       std::to_string(lo) + "-" + std::to_string(hi) +
                       " a layer over " + std::to_string(layers) +
                       " MoE layers";
        }
        std::printf("duck %u: %s, %llu bytes, %u slots, key %s%s\n",
                    d->rank(), d->image() ? d->image()->c_str() : "?",
                    (unsigned long long)d->image_bytes(),
                    d->slots() ? d->slots()->size() : 0,
                    d->model_key() ? d->model_key()->c_str() : "?",
                    experts.c_str());
      }
    return 0;
  }
  flatbuffers::IDLOptions opts;
  opts.strict_json = true;
  opts.output_default_scalars_in_json = true;
  opts.output_enum_identifiers = true;
  flatbuffers::Parser parser(opts);
  if (!parser.Parse(kDuckPlanSchemaText)) {
    std::fprintf(stderr, "duck-plan-dump: internal error: schema: %s\n",
                 parser.error_.c_str());
    return 1;
  }
  std::string json;
  if (!flatbuffers::GenerateText(parser, buf.data(), &json)) {
    std::fprintf(stderr, "duck-plan-dump: error: cannot print the plan\n");
    return 1;
  }
  std::fputs(json.c_str(), stdout);
  return 0;
}
