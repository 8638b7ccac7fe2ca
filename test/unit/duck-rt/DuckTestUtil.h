// Shared by the duck ELF and duckd tests: aligned buffers, the synthetic
// test image, and the reference (the kernels run directly, in-process).
#ifndef DUCK_TEST_UNIT_DUCKTESTUTIL_H
#define DUCK_TEST_UNIT_DUCKTESTUTIL_H

#include "SyntheticImage.h"

#include "duck_rt/abi.h"
#include "duck_rt/kernels.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace duck::test {

using duck::duckd::SlotViews;
using duck::duckd::SyntheticSlot;
using duck::duckd::SyntheticSpec;

/// Page-aligned memory (the weight buffer and scratch are in duckd).
struct Aligned {
  uint8_t *p = nullptr;
  size_t n = 0;
  explicit Aligned(size_t bytes) : n(bytes) {
    p = static_cast<uint8_t *>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
    std::memset(p, 0, bytes);
  }
  ~Aligned() { std::free(p); }
};

inline void YieldThread() { std::this_thread::yield(); }

/// A file's bytes (the duck ELF, duckd's binary); empty if unreadable.
inline std::vector<uint8_t> ReadFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

constexpr uint32_t kHidden = 128;

/// Slot 0 dense, slot 1 MoE (all experts), slot 2 MoE holding every other
/// expert (expert placement).
inline SyntheticSpec TestSpec(uint64_t seed = 7) {
  SyntheticSpec s;
  s.hidden = kHidden;
  s.block = 64;
  s.seed = seed;
  SyntheticSlot dense;
  dense.kind = DUCK_SLOT_DENSE;
  dense.layer = 0;
  dense.inter = 192;
  SyntheticSlot moe;
  moe.kind = DUCK_SLOT_MOE;
  moe.layer = 1;
  moe.inter = 64;
  moe.experts = 8;
  SyntheticSlot half = moe;
  half.layer = 2;
  half.present = {true, false, true, false, true, false, true, false};
  s.slots = {dense, moe, half};
  return s;
}

/// The kernels run directly (1 core) on host views of the same image.
struct Reference {
  std::vector<uint8_t> image;
  explicit Reference(const std::vector<uint8_t> &img) : image(img) {}

  std::vector<float> Run(uint32_t mode, uint32_t slot, uint32_t tokens,
                         uint32_t top_k,
                         std::vector<duck_expert_slot> routing,
                         const std::vector<float> &x) {
    // 64-byte aligned copy of the image for the kernels.
    Aligned img(image.size());
    std::memcpy(img.p, image.data(), image.size());
    std::vector<duck_ffn_weights> w = SlotViews(img.p, slot);
    const uint32_t n = uint32_t(w.size());
    const uint32_t inter = w[0].gate.rows;
    // Experts this duck does not hold contribute nothing (the ELF remaps
    // them to the "skip" id).
    const auto *sh = reinterpret_cast<const duck_slot_header *>(
        img.p + reinterpret_cast<const duck_slot_entry *>(
                    img.p + DUCK_IMAGE_HEADER_BYTES)[slot]
                    .offset);
    const auto *descs = reinterpret_cast<const duck_ffn_desc *>(sh + 1);
    for (auto &s : routing)
      if (!descs[s.expert].present)
        s.expert = n;
    duck_barrier bar;
    duck_barrier_init(&bar, 1);
    duck_smp_ctx smp{1, &bar};
    Aligned scratch(4 * duck_ffn_scratch_floats(kHidden, inter, tokens) + 64);
    auto *sc = reinterpret_cast<float *>(scratch.p);
    std::vector<float> out(uint64_t(tokens) * kHidden);
    switch (mode) {
    case DUCK_MODE_DENSE_DECODE: {
      Aligned shared(4 * inter);
      for (uint32_t t = 0; t < tokens; ++t)
        duck_mlp_decode(&smp, 0, &w[0], x.data() + t * kHidden,
                        out.data() + t * kHidden,
                        reinterpret_cast<float *>(shared.p), sc);
      break;
    }
    case DUCK_MODE_MOE_DECODE:
    case DUCK_MODE_MOE_DECODE_SMP: {
      Aligned slotOut(4ull * top_k * kHidden);
      for (uint32_t t = 0; t < tokens; ++t) {
        std::vector<duck_expert_slot> s(routing.begin() + t * top_k,
                                        routing.begin() + (t + 1) * top_k);
        duck_moe_decode(&smp, 0, w.data(), n, s.data(), top_k,
                        x.data() + t * kHidden, out.data() + t * kHidden,
                        reinterpret_cast<float *>(slotOut.p), sc);
      }
      break;
    }
    case DUCK_MODE_DENSE_PREFILL: {
      Aligned shared(4ull * tokens * inter);
      duck_mlp_prefill(&smp, 0, &w[0], x.data(), tokens, out.data(),
                       reinterpret_cast<float *>(shared.p), sc);
      break;
    }
    case DUCK_MODE_MOE_PREFILL: {
      std::vector<uint32_t> work(
          duck_moe_prefill_work_words(tokens, top_k, n, 1));
      Aligned pairs(4ull * tokens * top_k * kHidden);
      duck_moe_prefill(&smp, 0, w.data(), n, routing.data(), top_k, x.data(),
                       tokens, out.data(), reinterpret_cast<float *>(pairs.p),
                       work.data(), sc);
      break;
    }
    default:
      ADD_FAILURE() << "no reference for mode " << mode;
    }
    return out;
  }
};

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline void ExpectBitIdentical(const std::vector<float> &got,
                        const std::vector<float> &want, const char *what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(Bits(got[i]), Bits(want[i])) << what << " element " << i;
}

} // namespace duck::test

#endif // DUCK_TEST_UNIT_DUCKTESTUTIL_H
