// The duck ELF loaded in-process with duckd's loader: the loader's
// refusals, every mode bit-identical to the kernels run directly, the IB and
// weight validation catalogue (a status, never a fault), and the defined
// state of every step (stale barrier, board, cache and generation).
#include "DuckTestUtil.h"
#include "ElfLoader.h"

#include "duck_rt/abi.h"
#include "duck_rt/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <elf.h>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace {

using namespace duck::test;
using duck::duckd::LoadedElf;
using duck::duckd::MakeIb;
using duck::duckd::RandomRouting;
using duck::duckd::RandomX;
using duck::duckd::SlotViews;
using duck::duckd::SyntheticSlot;
using duck::duckd::SyntheticSpec;

std::vector<uint8_t> ReadFile(const char *path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

/// Runs an ELF entry on `cores` threads with a duck_info per core.
struct ElfRunner {
  std::unique_ptr<LoadedElf> elf;
  uint32_t cores = 1;
  Aligned weights;
  uint64_t weights_size = 0, generation = 1, seq = 0;
  Aligned scratch;
  uint64_t scratch_size;
  std::vector<uint8_t> ob;
  std::vector<uint64_t> cycles;
  std::vector<std::string> logs;
  std::vector<int> rets;

  ElfRunner(const char *path, const std::vector<uint8_t> &image,
            uint32_t n_cores, uint64_t scratch_bytes = 8 << 20)
      : cores(n_cores), weights(image.size() + 4096),
        weights_size(image.size()), scratch(scratch_bytes),
        scratch_size(scratch_bytes), ob(1 << 20), cycles(n_cores),
        logs(n_cores), rets(n_cores) {
    auto loaded = LoadedElf::Load(ReadFile(path));
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (loaded.ok())
      elf = std::move(*loaded);
    std::memcpy(weights.p, image.data(), image.size());
  }

  /// Returns core 0's status; the OB header status must agree.
  int Call(const std::vector<uint8_t> &ib, bool run = false,
           uint64_t ob_limit = 1 << 20) {
    ++seq;
    auto body = [&](uint32_t c) {
      duck_info info{};
      info.abi_version = DUCK_ABI_VERSION;
      info.info_size = sizeof info;
      info.ib = ib.data();
      info.ib_size = ib.size();
      info.ob = ob.data();
      info.ob_limit = ob_limit;
      std::vector<char> log(4096);
      info.log = log.data();
      info.log_limit = log.size();
      info.tsc_hz = 1;
      info.smp_cpu_index = c;
      info.smp_cpu_count = cores;
      info.weights = weights.p;
      info.weights_size = weights_size;
      info.scratch = scratch.p;
      info.scratch_size = scratch_size;
      info.core_cycles = cycles.data();
      info.yield = YieldThread;
      info.weights_generation = generation;
      info.step_seq = seq;
      rets[c] = (run ? elf->run() : elf->step())(&info);
      logs[c].assign(log.data(), info.log_size);
      if (c == 0)
        ob_size = info.ob_size;
    };
    std::vector<std::thread> threads;
    for (uint32_t c = 1; c < cores; ++c)
      threads.emplace_back(body, c);
    body(0);
    for (auto &t : threads)
      t.join();
    return rets[0];
  }

  const duck_ob_header &Header() const {
    return *reinterpret_cast<const duck_ob_header *>(ob.data());
  }
  std::vector<float> Out() const {
    const duck_ob_header &h = Header();
    std::vector<float> v(uint64_t(h.n_tokens) * h.hidden);
    std::memcpy(v.data(), ob.data() + h.out_offset, v.size() * 4);
    return v;
  }
  uint64_t ob_size = 0;
};

struct Case {
  uint32_t mode, slot, tokens, top_k;
};

// Every compute mode on 1 and 3 cores, through both entry points, equals the
// kernels run directly, bit for bit (the same kernel code runs).
TEST(DuckElf, EveryModeMatchesTheKernels) {
  auto image = duck::duckd::BuildSyntheticImage(TestSpec());
  ASSERT_TRUE(image.ok()) << image.status();
  Reference ref(*image);
  const Case cases[] = {
      {DUCK_MODE_DENSE_DECODE, 0, 1, 0},   {DUCK_MODE_DENSE_DECODE, 0, 2, 0},
      {DUCK_MODE_MOE_DECODE, 1, 1, 4},     {DUCK_MODE_MOE_DECODE_SMP, 1, 1, 4},
      {DUCK_MODE_MOE_DECODE_SMP, 1, 2, 8}, {DUCK_MODE_MOE_DECODE_SMP, 2, 1, 6},
      {DUCK_MODE_DENSE_PREFILL, 0, 5, 0},  {DUCK_MODE_MOE_PREFILL, 1, 7, 3},
      {DUCK_MODE_MOE_PREFILL, 2, 4, 4},
  };
  for (uint32_t cores : {1u, 3u}) {
    ElfRunner r(DUCK_ELF_PATH, *image, cores);
    ASSERT_TRUE(r.elf);
    // Prepare modes attach (and cache) both kinds of slot.
    EXPECT_EQ(r.Call(MakeIb(DUCK_MODE_DENSE_PREPARE, 0, 0, 0, {}, {})),
              DUCK_STATUS_OK)
        << r.logs[0];
    EXPECT_EQ(r.Call(MakeIb(DUCK_MODE_MOE_PREPARE, 1, 0, 0, {}, {})),
              DUCK_STATUS_OK)
        << r.logs[0];
    EXPECT_EQ(r.Header().status, uint32_t(DUCK_STATUS_OK));
    uint64_t seed = 100;
    for (const Case &c : cases) {
      for (bool run : {false, true}) {
        auto x = RandomX(c.tokens * kHidden, ++seed);
        auto routing = c.top_k ? RandomRouting(c.tokens, c.top_k, 8, ++seed)
                               : std::vector<duck_expert_slot>();
        auto ib = MakeIb(c.mode, c.slot, c.tokens, c.top_k, routing, x);
        ASSERT_EQ(r.Call(ib, run), DUCK_STATUS_OK)
            << "mode " << c.mode << ": " << r.logs[0];
        const duck_ob_header &h = r.Header();
        EXPECT_EQ(h.magic, DUCK_OB_MAGIC);
        EXPECT_EQ(h.n_tokens, c.tokens);
        EXPECT_EQ(h.hidden, kHidden);
        EXPECT_EQ(r.ob_size, 64 + uint64_t(c.tokens) * kHidden * 4);
        for (uint32_t k = 0; k < cores; ++k)
          EXPECT_GT(r.cycles[k], 0u);
        std::string what = "mode " + std::to_string(c.mode) + " slot " +
                           std::to_string(c.slot) + " cores " +
                           std::to_string(cores) + (run ? " run" : " step");
        ExpectBitIdentical(r.Out(),
                           ref.Run(c.mode, c.slot, c.tokens, c.top_k, routing,
                                   x),
                           what.c_str());
      }
    }
  }
}

// An IB whose x is bf16 (DUCK_IB_X_BF16, duckc --wire-activations bf16)
// gives, in every mode and on 1 and 3 cores, the bits an fp32 IB of the
// same rounded values gives; an unknown flag is refused with a status.
TEST(DuckElf, Bf16ActivationsAreTheRoundedFp32Ones) {
  auto image = duck::duckd::BuildSyntheticImage(TestSpec());
  ASSERT_TRUE(image.ok()) << image.status();
  const Case cases[] = {
      {DUCK_MODE_DENSE_DECODE, 0, 1, 0},   {DUCK_MODE_MOE_DECODE, 1, 1, 4},
      {DUCK_MODE_MOE_DECODE_SMP, 1, 2, 8}, {DUCK_MODE_DENSE_PREFILL, 0, 5, 0},
      {DUCK_MODE_MOE_PREFILL, 1, 7, 3},
  };
  for (uint32_t cores : {1u, 3u}) {
    ElfRunner r(DUCK_ELF_PATH, *image, cores);
    ASSERT_TRUE(r.elf);
    uint64_t seed = 900;
    for (const Case &c : cases) {
      auto x = RandomX(c.tokens * kHidden, ++seed);
      x[0] = 1.00390625f; // a tie: rounds to even (1.0)
      x[1] = 1.01171875f; // a tie: rounds up to even (1.015625)
      x[2] = -1e-40f;     // a subnormal
      auto routing = c.top_k ? RandomRouting(c.tokens, c.top_k, 8, ++seed)
                             : std::vector<duck_expert_slot>();
      std::vector<float> rounded(x.size());
      for (size_t i = 0; i < x.size(); ++i)
        rounded[i] = duck_bf16_to_f32(duck_f32_to_bf16(x[i]));
      EXPECT_EQ(rounded[0], 1.0f);
      EXPECT_EQ(rounded[1], 1.015625f);
      std::vector<uint8_t> ib(
          duck_ib_bytes_flags(c.tokens, c.top_k, kHidden, DUCK_IB_X_BF16));
      duck_ib_write_flags(ib.data(), c.mode, c.slot, c.tokens, c.top_k,
                          routing.data(), x.data(), kHidden, DUCK_IB_X_BF16);
      const std::string what =
          "mode " + std::to_string(c.mode) + " cores " + std::to_string(cores);
      ASSERT_EQ(r.Call(ib), DUCK_STATUS_OK) << what << ": " << r.logs[0];
      const std::vector<float> got = r.Out();
      ASSERT_EQ(
          r.Call(MakeIb(c.mode, c.slot, c.tokens, c.top_k, routing, rounded)),
          DUCK_STATUS_OK)
          << what << ": " << r.logs[0];
      ExpectBitIdentical(got, r.Out(), what.c_str());
    }
    // Flags the ELF does not know.
    auto x = RandomX(kHidden, 1);
    std::vector<uint8_t> ib(duck_ib_bytes(1, 0, kHidden));
    duck_ib_write_flags(ib.data(), DUCK_MODE_DENSE_DECODE, 0, 1, 0, nullptr,
                        x.data(), kHidden, 16);
    EXPECT_EQ(r.Call(ib), DUCK_STATUS_BAD_INPUT);
    EXPECT_NE(r.logs[0].find("ib: unknown or conflicting flags 16"),
              std::string::npos)
        << r.logs[0];
    // Two forms of x (or of the results) at once.
    for (uint32_t both : {uint32_t(DUCK_IB_X_BF16 | DUCK_IB_X_Q8),
                          uint32_t(DUCK_IB_OUT_BF16 | DUCK_IB_OUT_Q8)}) {
      std::vector<uint8_t> ib2(duck_ib_bytes_flags(1, 0, kHidden, both));
      duck_ib_write_flags(ib2.data(), DUCK_MODE_DENSE_DECODE, 0, 1, 0, nullptr,
                          x.data(), kHidden, both);
      EXPECT_EQ(r.Call(ib2), DUCK_STATUS_BAD_INPUT) << both;
    }
    // A bf16 IB cut short of its x.
    std::vector<uint8_t> cut(
        duck_ib_bytes_flags(2, 0, kHidden, DUCK_IB_X_BF16));
    duck_ib_write_flags(cut.data(), DUCK_MODE_DENSE_DECODE, 0, 2, 0, nullptr,
                        RandomX(2 * kHidden, 2).data(), kHidden,
                        DUCK_IB_X_BF16);
    cut.resize(cut.size() - 2);
    EXPECT_EQ(r.Call(cut), DUCK_STATUS_BAD_INPUT);
  }
}

// An IB of case `c` with x in the form `flags` asks for (duck_ib_write_flags).
std::vector<uint8_t> FlagIb(const Case &c,
                            const std::vector<duck_expert_slot> &routing,
                            const std::vector<float> &x, uint32_t flags) {
  std::vector<uint8_t> ib(
      duck_ib_bytes_flags(c.tokens, c.top_k, kHidden, flags));
  duck_ib_write_flags(ib.data(), c.mode, c.slot, c.tokens, c.top_k,
                      routing.data(), x.data(), kHidden, flags);
  return ib;
}

/// TestSpec's image with a head slot of 200 rows after its FFN slots (the
/// wire-form tests' image: every mode, a head ending in a q8 block of 8).
absl::StatusOr<std::vector<uint8_t>> ImageWithHead(SyntheticSpec *spec) {
  *spec = TestSpec();
  spec->slots.push_back(SyntheticSlot{DUCK_SLOT_HEAD, 2, 200, 1, {}});
  return duck::duckd::BuildSyntheticImage(*spec);
}

// An IB whose x is q8 (DUCK_IB_X_Q8, duckc --wire-activations q8) gives,
// in every mode and on 1 and 3 cores, the bits an fp32 IB of the decoded
// values gives; a q8 IB cut short of its x is refused.
TEST(DuckElf, Q8ActivationsAreTheDecodedFp32Ones) {
  SyntheticSpec spec;
  auto image = ImageWithHead(&spec);
  ASSERT_TRUE(image.ok()) << image.status();
  const Case cases[] = {
      {DUCK_MODE_DENSE_DECODE, 0, 1, 0},
      {DUCK_MODE_MOE_DECODE, 1, 1, 4},
      {DUCK_MODE_MOE_DECODE_SMP, 1, 2, 8},
      {DUCK_MODE_DENSE_PREFILL, 0, 5, 0},
      {DUCK_MODE_MOE_PREFILL, 1, 7, 3},
      {DUCK_MODE_HEAD, (uint32_t)spec.slots.size() - 1, 3, 0},
  };
  for (uint32_t cores : {1u, 3u}) {
    ElfRunner r(DUCK_ELF_PATH, *image, cores);
    ASSERT_TRUE(r.elf);
    uint64_t seed = 1900;
    for (const Case &c : cases) {
      auto x = RandomX(c.tokens * kHidden, ++seed);
      auto routing = c.top_k ? RandomRouting(c.tokens, c.top_k, 8, ++seed)
                             : std::vector<duck_expert_slot>();
      const std::vector<uint8_t> ib = FlagIb(c, routing, x, DUCK_IB_X_Q8);
      std::vector<float> decoded(x.size());
      const uint8_t *q = ib.data() + duck_ib_x_offset(c.tokens * c.top_k);
      for (uint32_t t = 0; t < c.tokens; ++t)
        duck_q8_decode_row(q + t * duck_q8_row_bytes(kHidden), kHidden,
                           decoded.data() + t * kHidden);
      ASSERT_NE(decoded, x); // the wire really rounded
      const std::string what =
          "mode " + std::to_string(c.mode) + " cores " + std::to_string(cores);
      ASSERT_EQ(r.Call(ib), DUCK_STATUS_OK) << what << ": " << r.logs[0];
      const std::vector<float> got = r.Out();
      ASSERT_EQ(
          r.Call(MakeIb(c.mode, c.slot, c.tokens, c.top_k, routing, decoded)),
          DUCK_STATUS_OK)
          << what << ": " << r.logs[0];
      ExpectBitIdentical(got, r.Out(), what.c_str());
    }
    std::vector<uint8_t> cut(duck_ib_bytes_flags(2, 0, kHidden, DUCK_IB_X_Q8));
    duck_ib_write_flags(cut.data(), DUCK_MODE_DENSE_DECODE, 0, 2, 0, nullptr,
                        RandomX(2 * kHidden, 2).data(), kHidden, DUCK_IB_X_Q8);
    cut.resize(cut.size() - 1);
    EXPECT_EQ(r.Call(cut), DUCK_STATUS_BAD_INPUT);
  }
}

/// The first byte of slot `slot` of an image (its header).
uint8_t *SlotBytes(std::vector<uint8_t> &image, uint32_t slot) {
  duck_image_header ih;
  std::memcpy(&ih, image.data(), sizeof ih);
  duck_slot_entry e;
  std::memcpy(&e, image.data() + ih.slot_table_offset + slot * sizeof e,
              sizeof e);
  return image.data() + e.offset;
}

/// A head slot whose `up` is not empty is refused.
void ExpectHeadRefused(const std::vector<uint8_t> &image) {
  std::vector<uint8_t> bad = image;
  auto *d = reinterpret_cast<duck_ffn_desc *>(SlotBytes(bad, 1) +
                                              sizeof(duck_slot_header));
  d->up.desc.rows = 1;
  ElfRunner r(DUCK_ELF_PATH, bad, 1);
  ASSERT_TRUE(r.elf);
  EXPECT_EQ(r.Call(MakeIb(DUCK_MODE_HEAD, 1, 1, 0, {}, RandomX(kHidden, 2))),
            DUCK_STATUS_BAD_WEIGHTS);
  EXPECT_NE(r.logs[0].find("has an up or down matrix"), std::string::npos)
      << r.logs[0];
}

/// The OB bytes of `tokens` rows of `width` fp32 results in the form
/// `outFlag` asks for (DUCK_IB_OUT_BF16 or DUCK_IB_OUT_Q8).
std::vector<uint8_t> NarrowedOb(const std::vector<float> &f32, uint32_t tokens,
                                uint32_t width, uint32_t outFlag) {
  std::vector<uint8_t> ob(tokens * duck_out_row_bytes(width, outFlag));
  for (uint32_t t = 0; t < tokens; ++t) {
    uint8_t *row = ob.data() + t * duck_out_row_bytes(width, outFlag);
    if (outFlag == DUCK_IB_OUT_Q8) {
      duck_q8_encode_row(f32.data() + t * width, width, row);
      continue;
    }
    for (uint32_t i = 0; i < width; ++i) {
      const uint16_t v = duck_f32_to_bf16(f32[t * width + i]);
      std::memcpy(row + 2 * i, &v, 2);
    }
  }
  return ob;
}

// DUCK_IB_OUT_BF16 / DUCK_IB_OUT_Q8: the OB carries each token's fp32
// results rounded to bf16 (two bytes a value) or as a q8 row
// (duck_q8_encode_row's bytes), the header's width unchanged, in every
// mode, 1 and 3 cores, with fp32 x or x in the same form; the head's 200
// rows end in a q8 block of 8.
TEST(DuckElf, NarrowResultsAreTheEncodedFp32Ones) {
  SyntheticSpec spec;
  auto image = ImageWithHead(&spec);
  ASSERT_TRUE(image.ok()) << image.status();
  const Case cases[] = {
      {DUCK_MODE_DENSE_DECODE, 0, 1, 0},
      {DUCK_MODE_MOE_DECODE_SMP, 1, 2, 8},
      {DUCK_MODE_MOE_PREFILL, 1, 7, 3},
      {DUCK_MODE_HEAD, (uint32_t)spec.slots.size() - 1, 3, 0},
  };
  const uint32_t forms[][2] = {{DUCK_IB_X_BF16, DUCK_IB_OUT_BF16},
                               {DUCK_IB_X_Q8, DUCK_IB_OUT_Q8}};
  for (uint32_t cores : {1u, 3u})
    for (const auto &form : forms)
      for (uint32_t xflag : {0u, form[0]}) {
        ElfRunner r(DUCK_ELF_PATH, *image, cores);
        ASSERT_TRUE(r.elf);
        uint64_t seed = 700;
        for (const Case &c : cases) {
          auto x = RandomX(c.tokens * kHidden, ++seed);
          auto routing = c.top_k ? RandomRouting(c.tokens, c.top_k, 8, ++seed)
                                 : std::vector<duck_expert_slot>();
          const std::string what = "mode " + std::to_string(c.mode) +
                                   " out flag " + std::to_string(form[1]);
          auto ibOf = [&](uint32_t flags) {
            return FlagIb(c, routing, x, flags);
          };
          ASSERT_EQ(r.Call(ibOf(xflag)), DUCK_STATUS_OK) << what << r.logs[0];
          const std::vector<float> f32 = r.Out();
          const uint32_t width = r.Header().hidden;
          ASSERT_EQ(r.Call(ibOf(xflag | form[1])), DUCK_STATUS_OK)
              << what << r.logs[0];
          ASSERT_EQ(r.Header().hidden, width) << what;
          const std::vector<uint8_t> want =
              NarrowedOb(f32, c.tokens, width, form[1]);
          ASSERT_EQ(r.ob_size, 64 + want.size()) << what;
          EXPECT_EQ(std::memcmp(r.ob.data() + r.Header().out_offset,
                                want.data(), want.size()),
                    0)
              << what;
        }
      }
}

// Mode HEAD on a head slot gives each row's logit exactly as duck_gemv
// (one token) and duck_gemm (a batch) give it, on 1 and 3 cores, also for
// a head slot of several matrices; a malformed head slot, and either slot
// kind under the other's mode, are refused with a status.
TEST(DuckElf, HeadModeMatchesTheKernels) {
  SyntheticSpec spec = TestSpec();
  spec.slots = {SyntheticSlot{DUCK_SLOT_DENSE, 0, 128, 1, {}},
                SyntheticSlot{DUCK_SLOT_HEAD, 2, 200, 1, {}}};
  auto image = duck::duckd::BuildSyntheticImage(spec);
  ASSERT_TRUE(image.ok()) << image.status();
  const duck_fp9_matrix head = SlotViews(image->data(), 1)[0].gate;
  ASSERT_EQ(head.rows, 200u);
  for (uint32_t cores : {1u, 3u}) {
    ElfRunner r(DUCK_ELF_PATH, *image, cores);
    ASSERT_TRUE(r.elf);
    uint64_t seed = 7;
    for (uint32_t tokens : {1u, 2u, 6u}) {
      auto x = RandomX(tokens * kHidden, ++seed);
      ASSERT_EQ(r.Call(MakeIb(DUCK_MODE_HEAD, 1, tokens, 0, {}, x)),
                DUCK_STATUS_OK)
          << r.logs[0];
      EXPECT_EQ(r.Header().hidden, 200u);
      EXPECT_EQ(r.ob_size, 64 + uint64_t(tokens) * 200 * 4);
      std::vector<float> want(tokens * 200);
      Aligned xs(2 * tokens * kHidden * 4);
      if (tokens == 1)
        duck_gemv(&head, x.data(), want.data(), 0, 200,
                  reinterpret_cast<float *>(xs.p), DUCK_DECODE_SHIFT);
      else
        duck_gemm(&head, x.data(), kHidden, tokens, want.data(), 200, 0, 200,
                  reinterpret_cast<float *>(xs.p));
      ExpectBitIdentical(r.Out(), want, "head");
    }
    EXPECT_EQ(r.Call(MakeIb(DUCK_MODE_HEAD, 0, 1, 0, {}, RandomX(kHidden, 1))),
              DUCK_STATUS_BAD_INPUT);
    EXPECT_EQ(r.Call(MakeIb(DUCK_MODE_DENSE_DECODE, 1, 1, 0, {},
                            RandomX(kHidden, 1))),
              DUCK_STATUS_BAD_INPUT);
  }
  // A head slot wider than the model's hidden size (an o_proj: K = heads
  // x v_head_dim): x is K wide, the rows the same GEMV's.
  {
    SyntheticSpec wide = TestSpec();
    SyntheticSlot o{DUCK_SLOT_HEAD, 0, 96, 1, {}};
    o.k = 3 * kHidden;
    wide.slots = {SyntheticSlot{DUCK_SLOT_DENSE, 0, 128, 1, {}}, o};
    auto img = duck::duckd::BuildSyntheticImage(wide);
    ASSERT_TRUE(img.ok()) << img.status();
    const duck_fp9_matrix m = SlotViews(img->data(), 1)[0].gate;
    ASSERT_EQ(m.k, 3 * kHidden);
    ElfRunner r(DUCK_ELF_PATH, *img, 2);
    ASSERT_TRUE(r.elf);
    for (uint32_t tokens : {1u, 5u}) {
      auto x = RandomX(tokens * m.k, 40 + tokens);
      ASSERT_EQ(r.Call(MakeIb(DUCK_MODE_HEAD, 1, tokens, 0, {}, x)),
                DUCK_STATUS_OK)
          << r.logs[0];
      std::vector<float> want(tokens * 96);
      Aligned xs(2 * tokens * m.k * 4);
      if (tokens == 1)
        duck_gemv(&m, x.data(), want.data(), 0, 96,
                  reinterpret_cast<float *>(xs.p), DUCK_DECODE_SHIFT);
      else
        duck_gemm(&m, x.data(), m.k, tokens, want.data(), 96, 0, 96,
                  reinterpret_cast<float *>(xs.p));
      ExpectBitIdentical(r.Out(), want, "wide head");
    }
  }
  // A head slot of three matrices (an attention's input projections, e.g.
  // q, k and v): the rows concatenate, each row its matrix's GEMV, also
  // where a core's share of the rows straddles two matrices.
  {
    SyntheticSpec multi = TestSpec();
    SyntheticSlot qkv{DUCK_SLOT_HEAD, 0, 200, 1, {}};
    qkv.pieces = {64, 8, 128};
    multi.slots = {SyntheticSlot{DUCK_SLOT_DENSE, 0, 128, 1, {}}, qkv};
    auto img = duck::duckd::BuildSyntheticImage(multi);
    ASSERT_TRUE(img.ok()) << img.status();
    const std::vector<duck_ffn_weights> views = SlotViews(img->data(), 1);
    ASSERT_EQ(views.size(), 3u);
    for (uint32_t cores : {1u, 3u}) {
      ElfRunner r(DUCK_ELF_PATH, *img, cores);
      ASSERT_TRUE(r.elf);
      for (uint32_t tokens : {1u, 4u}) {
        auto x = RandomX(tokens * kHidden, 60 + tokens + cores);
        ASSERT_EQ(r.Call(MakeIb(DUCK_MODE_HEAD, 1, tokens, 0, {}, x)),
                  DUCK_STATUS_OK)
            << r.logs[0];
        EXPECT_EQ(r.Header().hidden, 200u);
        std::vector<float> want(tokens * 200);
        Aligned xs(2 * tokens * kHidden * 4);
        uint32_t row0 = 0;
        for (const duck_ffn_weights &w : views) {
          const duck_fp9_matrix &m = w.gate;
          if (tokens == 1)
            duck_gemv(&m, x.data(), want.data() + row0, 0, m.rows,
                      reinterpret_cast<float *>(xs.p), DUCK_DECODE_SHIFT);
          else
            duck_gemm(&m, x.data(), kHidden, tokens, want.data() + row0, 200,
                      0, m.rows, reinterpret_cast<float *>(xs.p));
          row0 += m.rows;
        }
        ExpectBitIdentical(r.Out(), want, "multi-matrix head");
      }
    }
    // The header's rows must be the matrices' rows.
    std::vector<uint8_t> off = *img;
    reinterpret_cast<duck_slot_header *>(SlotBytes(off, 1))->inter = 201;
    ElfRunner r(DUCK_ELF_PATH, off, 1);
    ASSERT_TRUE(r.elf);
    EXPECT_EQ(r.Call(MakeIb(DUCK_MODE_HEAD, 1, 1, 0, {}, RandomX(kHidden, 3))),
              DUCK_STATUS_BAD_WEIGHTS);
    EXPECT_NE(r.logs[0].find("matrices hold 200 rows"), std::string::npos)
        << r.logs[0];
  }
  ExpectHeadRefused(*image);
}

// A chained head slot (an MLA head's query through W_UK): piece 0 reads
// all of x, pieces 1 and 2 read parts of piece 0's results (64 wide from
// row 32, from row 0), piece 3 reads x from 64 on; the OB carries rows from
// 40 on. Each piece's rows are its own GEMV (GEMM) of what it reads, on 1
// and 3 cores; a piece reading beyond what was produced is refused.
TEST(DuckElf, ChainedHeadPiecesReadEarlierResults) {
  SyntheticSpec spec = TestSpec();
  SyntheticSlot chain{DUCK_SLOT_HEAD, 0, 96 + 64 + 16 + 8, 1, {}};
  chain.pieces = {96, 64, 16, 8};
  chain.piece_k = {kHidden, 64, 64, 64};
  chain.piece_input = {DUCK_HEAD_INPUT_X, DUCK_HEAD_INPUT_RESULTS | 32,
                       DUCK_HEAD_INPUT_RESULTS | 0, DUCK_HEAD_INPUT_X | 64};
  chain.ob_begin = 40;
  spec.slots = {SyntheticSlot{DUCK_SLOT_DENSE, 0, 128, 1, {}}, chain};
  auto image = duck::duckd::BuildSyntheticImage(spec);
  ASSERT_TRUE(image.ok()) << image.status();
  const std::vector<duck_ffn_weights> v = SlotViews(image->data(), 1);
  ASSERT_EQ(v.size(), 4u);
  const uint32_t rows = 184, outW = rows - 40;
  for (uint32_t cores : {1u, 3u}) {
    ElfRunner r(DUCK_ELF_PATH, *image, cores);
    ASSERT_TRUE(r.elf);
    for (uint32_t tokens : {1u, 3u}) {
      auto x = RandomX(tokens * kHidden, 90 + tokens + cores);
      ASSERT_EQ(r.Call(MakeIb(DUCK_MODE_HEAD, 1, tokens, 0, {}, x)),
                DUCK_STATUS_OK)
          << r.logs[0];
      EXPECT_EQ(r.Header().hidden, outW);
      std::vector<float> res(tokens * rows), want;
      Aligned xs(2 * tokens * kHidden * 4);
      float *s = reinterpret_cast<float *>(xs.p);
      const float *in[4] = {x.data(), res.data() + 32, res.data(),
                            x.data() + 64};
      const uint32_t ld[4] = {kHidden, rows, rows, kHidden};
      uint32_t row0 = 0;
      for (int p = 0; p < 4; ++p) {
        const duck_fp9_matrix &m = v[p].gate;
        if (tokens == 1)
          duck_gemv(&m, in[p], res.data() + row0, 0, m.rows, s,
                    DUCK_DECODE_SHIFT);
        else
          duck_gemm(&m, in[p], ld[p], tokens, res.data() + row0, rows, 0,
                    m.rows, s);
        row0 += m.rows;
      }
      for (uint32_t t = 0; t < tokens; ++t)
        want.insert(want.end(), res.begin() + t * rows + 40,
                    res.begin() + (t + 1) * rows);
      ExpectBitIdentical(r.Out(), want, "chained head");
    }
  }
  // Piece 1 reading rows 40..104 of the 96 produced before it.
  static_assert(kHidden == 128, "the pieces' K are cut for a K of 128");
  std::vector<uint8_t> bad = *image;
  auto *d = reinterpret_cast<duck_ffn_desc *>(SlotBytes(bad, 1) +
                                              sizeof(duck_slot_header));
  d[1].input = DUCK_HEAD_INPUT_RESULTS | 40;
  ElfRunner r(DUCK_ELF_PATH, bad, 1);
  ASSERT_TRUE(r.elf);
  EXPECT_EQ(r.Call(MakeIb(DUCK_MODE_HEAD, 1, 1, 0, {}, RandomX(kHidden, 2))),
            DUCK_STATUS_BAD_WEIGHTS);
  EXPECT_NE(r.logs[0].find("reads outside its input"), std::string::npos)
      << r.logs[0];
}

/// An IB with one field changed.
std::vector<uint8_t> WithHeader(std::vector<uint8_t> ib,
                                void (*edit)(duck_ib_header &)) {
  duck_ib_header h;
  std::memcpy(&h, ib.data(), sizeof h);
  edit(h);
  std::memcpy(ib.data(), &h, sizeof h);
  return ib;
}

// Every malformed IB field gives its status in the OB header (on 2 cores, so
// a wrong early exit would deadlock), and the next good step still works.
TEST(DuckElf, BadInputsGiveAStatusNeverAFault) {
  auto image = duck::duckd::BuildSyntheticImage(TestSpec());
  ASSERT_TRUE(image.ok());
  ElfRunner r(DUCK_ELF_PATH, *image, 2);
  ASSERT_TRUE(r.elf);
  auto x = RandomX(kHidden, 1);
  auto routing = RandomRouting(1, 4, 8, 2);
  const auto good = MakeIb(DUCK_MODE_MOE_DECODE_SMP, 1, 1, 4, routing, x);
  const auto dense = MakeIb(DUCK_MODE_DENSE_DECODE, 0, 1, 0, {}, x);
  struct Bad {
    const char *what;
    std::vector<uint8_t> ib;
    int want;
  };
  std::vector<Bad> bad = {
      {"empty IB", {}, DUCK_STATUS_BAD_INPUT},
      {"short IB", std::vector<uint8_t>(good.begin(), good.begin() + 20),
       DUCK_STATUS_BAD_INPUT},
      {"bad magic", WithHeader(good, [](duck_ib_header &h) { h.magic ^= 1; }),
       DUCK_STATUS_BAD_INPUT},
      {"bad abi",
       WithHeader(good, [](duck_ib_header &h) { h.abi_version = 99; }),
       DUCK_STATUS_BAD_INPUT},
      {"unknown mode",
       WithHeader(good, [](duck_ib_header &h) { h.mode = DUCK_MODE_COUNT; }),
       DUCK_STATUS_BAD_MODE},
      {"head mode on an FFN slot",
       WithHeader(good, [](duck_ib_header &h) { h.mode = DUCK_MODE_HEAD; }),
       DUCK_STATUS_BAD_INPUT},
      {"test-only mode in the production ELF",
       WithHeader(good, [](duck_ib_header &h) { h.mode = 100; }),
       DUCK_STATUS_BAD_MODE},
      {"slot out of range",
       WithHeader(good, [](duck_ib_header &h) { h.slot = 3; }),
       DUCK_STATUS_BAD_INPUT},
      {"MoE mode on a dense slot",
       WithHeader(good, [](duck_ib_header &h) { h.slot = 0; }),
       DUCK_STATUS_BAD_INPUT},
      {"dense mode on a MoE slot",
       WithHeader(dense, [](duck_ib_header &h) { h.slot = 1; }),
       DUCK_STATUS_BAD_INPUT},
      {"zero tokens",
       WithHeader(good, [](duck_ib_header &h) { h.n_tokens = 0; }),
       DUCK_STATUS_BAD_INPUT},
      {"huge token count",
       WithHeader(good, [](duck_ib_header &h) { h.n_tokens = 0x7FFFFFFF; }),
       DUCK_STATUS_BAD_INPUT},
      {"MoE with top_k 0",
       WithHeader(good, [](duck_ib_header &h) { h.top_k = 0; }),
       DUCK_STATUS_BAD_INPUT},
      {"top_k 65", WithHeader(good, [](duck_ib_header &h) { h.top_k = 65; }),
       DUCK_STATUS_BAD_INPUT},
      {"dense with top_k",
       WithHeader(dense, [](duck_ib_header &h) { h.top_k = 1; }),
       DUCK_STATUS_BAD_INPUT},
      {"x unaligned",
       WithHeader(good, [](duck_ib_header &h) { h.x_offset += 4; }),
       DUCK_STATUS_BAD_INPUT},
      {"x over the slots",
       WithHeader(good, [](duck_ib_header &h) { h.x_offset = 32; }),
       DUCK_STATUS_BAD_INPUT},
      {"x beyond the IB",
       WithHeader(good, [](duck_ib_header &h) { h.x_offset = 0xFFFFFFE0u; }),
       DUCK_STATUS_BAD_INPUT},
      {"IB cut short", std::vector<uint8_t>(good.begin(), good.end() - 4),
       DUCK_STATUS_BAD_INPUT},
  };
  {
    auto ib = good;
    reinterpret_cast<duck_expert_slot *>(ib.data() + 32)[2].expert = 8;
    bad.push_back({"expert id beyond the slot", ib, DUCK_STATUS_BAD_INPUT});
    ib = good;
    reinterpret_cast<duck_expert_slot *>(ib.data() + 32)[1].weight = NAN;
    bad.push_back({"NaN routing weight", ib, DUCK_STATUS_BAD_INPUT});
  }
  for (const Bad &b : bad) {
    EXPECT_EQ(r.Call(b.ib), b.want) << b.what;
    EXPECT_EQ(r.Header().status, uint32_t(b.want)) << b.what;
    EXPECT_EQ(r.ob_size, 64u) << b.what;
    EXPECT_FALSE(r.logs[0].empty()) << b.what;
    EXPECT_EQ(r.Call(good), DUCK_STATUS_OK) << "after " << b.what;
  }
  // Buffers too small for the step.
  EXPECT_EQ(r.Call(good, false, 64 + kHidden * 4 - 4),
            DUCK_STATUS_OB_TOO_SMALL);
  const uint64_t need = duck_step_scratch_bytes(kHidden, 64, 1, 4, 8, 2);
  r.scratch_size = need - 1;
  EXPECT_EQ(r.Call(good), DUCK_STATUS_SCRATCH_TOO_SMALL) << r.logs[0];
  r.scratch_size = need;
  EXPECT_EQ(r.Call(good), DUCK_STATUS_OK) << r.logs[0];
  // No weight image at all.
  r.weights_size = 0;
  EXPECT_EQ(r.Call(good), DUCK_STATUS_BAD_WEIGHTS);
  r.weights_size = image->size();
  EXPECT_EQ(r.Call(good), DUCK_STATUS_OK);

  // Random corruption of the IB header and slots: a status, never a fault.
  std::mt19937 rng(5);
  for (int i = 0; i < 3000; ++i) {
    auto ib = good;
    for (int k = 0; k < 3; ++k)
      ib[rng() % 96] = uint8_t(rng());
    int st = r.Call(ib);
    EXPECT_TRUE(st >= DUCK_STATUS_OK && st <= DUCK_STATUS_BAD_MODE) << st;
  }
  EXPECT_EQ(r.Call(good), DUCK_STATUS_OK);
}

// A corrupt weight buffer (header, slot table, slot header, descriptors,
// kernel ids) gives BAD_WEIGHTS, never a fault; random corruption of the
// prologue and slot tables too.
TEST(DuckElf, BadWeightsGiveAStatusNeverAFault) {
  auto image = duck::duckd::BuildSyntheticImage(TestSpec());
  ASSERT_TRUE(image.ok());
  auto x = RandomX(kHidden, 1);
  auto routing = RandomRouting(1, 4, 8, 2);
  const auto ib = MakeIb(DUCK_MODE_MOE_DECODE_SMP, 1, 1, 4, routing, x);
  const auto *table = reinterpret_cast<const duck_slot_entry *>(
      image->data() + DUCK_IMAGE_HEADER_BYTES);
  const uint64_t slot1 = table[1].offset;
  auto descAt = [&](uint32_t e) {
    return slot1 + sizeof(duck_slot_header) + e * sizeof(duck_ffn_desc);
  };
  struct Edit {
    const char *what;
    uint64_t offset;
    std::vector<uint8_t> bytes;
  };
  auto u32 = [](uint32_t v) {
    std::vector<uint8_t> b(4);
    std::memcpy(b.data(), &v, 4);
    return b;
  };
  auto u64 = [](uint64_t v) {
    std::vector<uint8_t> b(8);
    std::memcpy(b.data(), &v, 8);
    return b;
  };
  const Edit edits[] = {
      {"image magic", 0, u32(0)},
      {"image total beyond the buffer", offsetof(duck_image_header, total_bytes),
       u64(1ull << 40)},
      {"slot table offset", offsetof(duck_image_header, slot_table_offset),
       u64(1ull << 40)},
      {"slot offset unaligned", DUCK_IMAGE_HEADER_BYTES + 32, u64(slot1 + 8)},
      {"slot beyond the image", DUCK_IMAGE_HEADER_BYTES + 32 + 8,
       u64(1ull << 40)},
      {"slot magic", slot1, u32(0)},
      {"slot block", slot1 + offsetof(duck_slot_header, block), u32(48)},
      {"slot expert count", slot1 + offsetof(duck_slot_header, n_experts),
       u32(1u << 30)},
      {"gate offset outside the slot", descAt(3), u64(1ull << 40)},
      {"gate offset unaligned", descAt(3), u64(4096 + 4)},
      {"gate rows", descAt(3) + 8, u32(65)},
      {"down kernel id",
       descAt(5) + offsetof(duck_ffn_desc, down) +
           offsetof(duck_matrix_ref, kernel),
       u32(DUCK_KERNEL_EXACT128)},
      {"present flag", descAt(2) + offsetof(duck_ffn_desc, present), u32(7)},
  };
  ElfRunner r(DUCK_ELF_PATH, *image, 2);
  ASSERT_TRUE(r.elf);
  ASSERT_EQ(r.Call(ib), DUCK_STATUS_OK);
  for (const Edit &e : edits) {
    uint8_t *at = r.weights.p + e.offset;
    std::vector<uint8_t> saved(at, at + e.bytes.size());
    std::memcpy(at, e.bytes.data(), e.bytes.size());
    ++r.generation; // duckd bumps it on every write
    EXPECT_EQ(r.Call(ib), DUCK_STATUS_BAD_WEIGHTS) << e.what << ": " << r.logs[0];
    EXPECT_EQ(r.Call(MakeIb(DUCK_MODE_MOE_PREPARE, 1, 0, 0, {}, {})),
              DUCK_STATUS_BAD_WEIGHTS)
        << e.what;
    std::memcpy(at, saved.data(), saved.size());
    ++r.generation;
    EXPECT_EQ(r.Call(ib), DUCK_STATUS_OK) << "after " << e.what;
  }
  std::mt19937 rng(9);
  const uint64_t prologue = DUCK_IMAGE_HEADER_BYTES + 3 * 32;
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::pair<uint64_t, uint8_t>> saved;
    for (int k = 0; k < 2; ++k) {
      uint64_t off = (rng() & 1) ? rng() % prologue
                                 : slot1 + rng() % (32 + 8 * 128);
      saved.push_back({off, r.weights.p[off]});
      r.weights.p[off] = uint8_t(rng());
    }
    ++r.generation;
    int st = r.Call(ib);
    EXPECT_TRUE(st >= DUCK_STATUS_OK && st <= DUCK_STATUS_BAD_MODE) << st;
    for (auto it = saved.rbegin(); it != saved.rend(); ++it)
      r.weights.p[it->first] = it->second;
  }
  ++r.generation;
  EXPECT_EQ(r.Call(ib), DUCK_STATUS_OK);
}

// Every step starts from a defined state: scribbling over the ELF's barrier,
// job board, job and slot cache (test ELF mode 102), interleaving
// single-core modes and failing steps, and replacing the weights under a new
// generation never changes a result.
TEST(DuckElf, StaleStateNeverChangesResults) {
  auto image = duck::duckd::BuildSyntheticImage(TestSpec(7));
  auto other = duck::duckd::BuildSyntheticImage(TestSpec(8));
  ASSERT_TRUE(image.ok() && other.ok());
  auto x = RandomX(kHidden, 3);
  auto routing = RandomRouting(1, 8, 8, 4);
  const auto ib = MakeIb(DUCK_MODE_MOE_DECODE_SMP, 1, 1, 8, routing, x);
  const auto ib1 = MakeIb(DUCK_MODE_MOE_DECODE, 1, 1, 8, routing, x);
  const auto prefill = MakeIb(DUCK_MODE_DENSE_PREFILL, 0, 3, 0, {},
                              RandomX(3 * kHidden, 5));
  const auto want = Reference(*image).Run(DUCK_MODE_MOE_DECODE_SMP, 1, 1, 8,
                                          routing, x);
  ElfRunner r(DUCK_TEST_ELF_PATH, *image, 3);
  ASSERT_TRUE(r.elf);
  const auto scribble = MakeIb(102, 0, 0, 0, {}, {});
  for (int round = 0; round < 20; ++round) {
    ASSERT_EQ(r.Call(ib), DUCK_STATUS_OK) << r.logs[0];
    ExpectBitIdentical(r.Out(), want, "after a clean step");
    ASSERT_EQ(r.Call(scribble), DUCK_STATUS_OK);
    ASSERT_EQ(r.Call(ib), DUCK_STATUS_OK) << r.logs[0];
    ExpectBitIdentical(r.Out(), want, "after the state was scribbled over");
    ASSERT_EQ(r.Call(ib1), DUCK_STATUS_OK);
    ASSERT_EQ(r.Call(WithHeader(ib, [](duck_ib_header &h) { h.top_k = 99; })),
              DUCK_STATUS_BAD_INPUT);
    ASSERT_EQ(r.Call(prefill), DUCK_STATUS_OK);
    ASSERT_EQ(r.Call(ib), DUCK_STATUS_OK) << r.logs[0];
    ExpectBitIdentical(r.Out(), want, "after mixed steps");
  }
  // New weights under a new generation: the cached views are not reused.
  std::memcpy(r.weights.p, other->data(), other->size());
  ++r.generation;
  ASSERT_EQ(r.Call(ib), DUCK_STATUS_OK);
  ExpectBitIdentical(
      r.Out(),
      Reference(*other).Run(DUCK_MODE_MOE_DECODE_SMP, 1, 1, 8, routing, x),
      "after new weights");
  // Generation 0 means "unknown": every step re-validates.
  std::memcpy(r.weights.p, image->data(), image->size());
  r.generation = 0;
  ASSERT_EQ(r.Call(ib), DUCK_STATUS_OK);
  ExpectBitIdentical(r.Out(), want, "generation 0");
}

// duck_step_scratch_bytes is exactly what every mode needs.
TEST(DuckElf, StepScratchBytesIsExact) {
  auto image = duck::duckd::BuildSyntheticImage(TestSpec());
  ASSERT_TRUE(image.ok());
  ElfRunner r(DUCK_ELF_PATH, *image, 2);
  ASSERT_TRUE(r.elf);
  const Case cases[] = {{DUCK_MODE_DENSE_DECODE, 0, 1, 0},
                        {DUCK_MODE_MOE_DECODE_SMP, 1, 1, 8},
                        {DUCK_MODE_DENSE_PREFILL, 0, 6, 0},
                        {DUCK_MODE_MOE_PREFILL, 1, 5, 4}};
  for (const Case &c : cases) {
    const uint32_t inter = c.slot == 0 ? 192 : 64;
    const uint32_t experts = c.slot == 0 ? 1 : 8;
    const uint64_t need =
        duck_step_scratch_bytes(kHidden, inter, c.tokens, c.top_k, experts, 2);
    auto ib = MakeIb(c.mode, c.slot, c.tokens, c.top_k,
                     c.top_k ? RandomRouting(c.tokens, c.top_k, 8, 1)
                             : std::vector<duck_expert_slot>(),
                     RandomX(c.tokens * kHidden, 2));
    r.scratch_size = need;
    EXPECT_EQ(r.Call(ib), DUCK_STATUS_OK) << c.mode << ": " << r.logs[0];
    r.scratch_size = need - 1;
    EXPECT_EQ(r.Call(ib), DUCK_STATUS_SCRATCH_TOO_SMALL) << c.mode;
  }
  EXPECT_EQ(duck_step_scratch_bytes(kHidden, 64, 1u << 30, 8, 8, 4),
            ~uint64_t(0));
}

/// duck.elf with a few bytes changed.
struct PatchedElf {
  std::vector<uint8_t> bytes = ReadFile(DUCK_ELF_PATH);
  Elf64_Ehdr &eh() { return *reinterpret_cast<Elf64_Ehdr *>(bytes.data()); }
  Elf64_Phdr &ph(int i) {
    return *reinterpret_cast<Elf64_Phdr *>(bytes.data() + eh().e_phoff +
                                           i * sizeof(Elf64_Phdr));
  }
  int Find(uint32_t type, uint32_t flags = 0) {
    for (int i = 0; i < eh().e_phnum; ++i)
      if (ph(i).p_type == type && (ph(i).p_flags & flags) == flags)
        return i;
    return -1;
  }
  std::string Load() {
    auto r = LoadedElf::Load(bytes);
    return r.ok() ? "ok" : std::string(r.status().message());
  }
};

// The loader refuses what is not a freestanding x86-64 ELF with only
// RELATIVE relocations, naming the reason.
TEST(DuckElf, LoaderRefusesBadElfs) {
  ASSERT_EQ(PatchedElf().Load(), "ok");
  struct Check {
    const char *what;
    void (*patch)(PatchedElf &);
    const char *message;
  };
  const Check checks[] = {
      {"truncated", [](PatchedElf &e) { e.bytes.resize(40); }, "truncated"},
      {"magic", [](PatchedElf &e) { e.bytes[1] = 'X'; }, "bad magic"},
      {"32-bit", [](PatchedElf &e) { e.bytes[EI_CLASS] = ELFCLASS32; },
       "ELFCLASS64"},
      {"big-endian", [](PatchedElf &e) { e.bytes[EI_DATA] = ELFDATA2MSB; },
       "little-endian"},
      {"aarch64", [](PatchedElf &e) { e.eh().e_machine = EM_AARCH64; },
       "need x86-64"},
      {"executable", [](PatchedElf &e) { e.eh().e_type = ET_EXEC; },
       "ET_DYN"},
      {"program headers past the end",
       [](PatchedElf &e) { e.eh().e_phoff = e.bytes.size() - 8; },
       "program headers"},
      {"segment past the end",
       [](PatchedElf &e) {
         Elf64_Phdr &p = e.ph(e.Find(PT_LOAD, PF_X));
         p.p_filesz = p.p_memsz = 1 << 30;
       },
       "past the end"},
      {"writable code",
       [](PatchedElf &e) { e.ph(e.Find(PT_LOAD, PF_X)).p_flags |= PF_W; },
       "writable and executable"},
      {"huge bss",
       [](PatchedElf &e) { e.ph(e.Find(PT_LOAD, PF_W)).p_memsz = 1ull << 40; },
       "image limit"},
      {"interpreter",
       [](PatchedElf &e) { e.ph(e.Find(PT_GNU_STACK)).p_type = PT_INTERP; },
       "PT_INTERP"},
      {"cut mid-file", [](PatchedElf &e) { e.bytes.resize(e.bytes.size() / 2); },
       "past the end"},
  };
  for (const Check &c : checks) {
    PatchedElf e;
    c.patch(e);
    std::string got = e.Load();
    EXPECT_NE(got.find(c.message), std::string::npos)
        << c.what << ": got '" << got << "'";
  }
  // The host's own executable (dynamically linked) is refused too.
  std::string got = duck::duckd::CheckElf(ReadFile("/proc/self/exe")).ToString();
  EXPECT_NE(got.find("PT_INTERP"), std::string::npos) << got;

  // Relocations: patch a RELA table into the dynamic section.
  auto withRela = [](uint32_t type, bool writable) {
    PatchedElf e;
    const Elf64_Phdr dyn = e.ph(e.Find(PT_DYNAMIC));
    Elf64_Phdr ro{}; // the read-only data segment (not the headers)
    for (int i = 0; i < e.eh().e_phnum; ++i)
      if (e.ph(i).p_type == PT_LOAD && e.ph(i).p_flags == PF_R &&
          e.ph(i).p_offset)
        ro = e.ph(i);
    const Elf64_Phdr rw = e.ph(e.Find(PT_LOAD, PF_W));
    Elf64_Rela rela{};
    rela.r_offset = writable ? rw.p_vaddr + rw.p_memsz - 8 : ro.p_vaddr;
    rela.r_info = ELF64_R_INFO(0, type);
    rela.r_addend = 16;
    // Place the table over the first bytes of .rodata (never run here)
    // and point DT_RELA/DT_RELASZ at it.
    const uint64_t at = ro.p_offset;
    std::memcpy(e.bytes.data() + at, &rela, sizeof rela);
    auto *d = reinterpret_cast<Elf64_Dyn *>(e.bytes.data() + dyn.p_offset);
    for (int i = 0; d[i].d_tag != DT_NULL; ++i)
      if (d[i].d_tag == DT_SONAME) {
        d[i].d_tag = DT_RELA;
        d[i].d_un.d_ptr = ro.p_vaddr;
      } else if (d[i].d_tag == DT_SYMBOLIC) {
        d[i].d_tag = DT_RELASZ;
        d[i].d_un.d_val = sizeof rela;
      }
    return e.Load();
  };
  EXPECT_EQ(withRela(R_X86_64_RELATIVE, true), "ok");
  EXPECT_NE(withRela(R_X86_64_64, true).find("only R_X86_64_RELATIVE"),
            std::string::npos);
  EXPECT_NE(withRela(R_X86_64_JUMP_SLOT, true).find("only R_X86_64_RELATIVE"),
            std::string::npos);
  EXPECT_NE(withRela(R_X86_64_RELATIVE, false).find("writable segment"),
            std::string::npos);
}

} // namespace
