// The session's up-front checks that need no ducks.
#include "duck/runtime/session/Session.h"

#include <gtest/gtest.h>

namespace {

using duck::runtime::CheckKvFits;

// Every sequence's KV cache is reserved at --max-seq: the worst case is
// checked against the memory available, with an error saying what fits.
TEST(Session, KvCacheMustFitTheMachine) {
  const uint64_t kib224 = 224 * 1024; // Qwen3-0.6B: 28 layers x 8 kv x 128 x 2 x 4
  const uint64_t gib = 1ull << 30;
  EXPECT_TRUE(CheckKvFits(kib224, 4096, 16, 20 * gib).ok()); // 14 GiB
  EXPECT_TRUE(CheckKvFits(kib224, 4096, 16, 0).ok());        // unknown
  absl::Status s = CheckKvFits(kib224, 4096, 32, 20 * gib);  // 28 GiB
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("needs up to 28.00 GiB (32 sequence(s) x 4096 "
                             "tokens x 224.0 KiB a token)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("22 sequence(s) of 4096 tokens fit"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("--kv-overcommit"), std::string::npos) << s;
  s = CheckKvFits(kib224, 200000, 1, 20 * gib);
  EXPECT_NE(s.message().find("one sequence fits 93622 tokens"),
            std::string::npos)
      << s;
}

} // namespace
