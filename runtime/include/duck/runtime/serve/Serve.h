//===- Serve.h - duckrun serve: an OpenAI-compatible HTTP server -*- C++
//-*-===//
//
// POST /v1/chat/completions and /v1/completions (streaming as server-sent
// events), GET /v1/models, /health and /metrics, over one Session whose
// engine decodes up to `parallel` sequences in every duck step (Batcher).
// Listens before the ducks are prepared (/health answers 503 until they
// are), serves until the caller's stop flag is set, then lets running
// requests finish for a grace period, cancels the rest and closes the
// ducks.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_SERVE_H
#define DUCK_RUNTIME_SERVE_H

#include "duck/runtime/session/Session.h"

#include "absl/status/status.h"

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <string>

namespace duck::runtime {

/// ServeOptions::kv_budget's default: 2 GiB, at most a quarter of the
/// memory available when the server starts and what the KV caches at full
/// length leave of it.
inline constexpr uint64_t kKvBudgetAuto = ~uint64_t{0};

struct ServeOptions {
  SessionOptions session; // max_seqs is set from parallel
  std::string host = "127.0.0.1";
  int port = 8080;                   // 0: any free port (printed)
  uint32_t parallel = 4;             // sequences decoded together
  uint32_t queue_limit = 64;         // requests waiting for a slot; then 429
  std::string api_key;               // "": no key needed
  uint64_t max_body_bytes = 1 << 20; // larger requests get 413
  uint32_t shutdown_grace_seconds = 10;
  /// Lookup drafts a step for requests that do not say (--speculative
  /// lookup:K; 0: none).
  uint32_t speculative = 0;
  /// The drafts come from the plan's MTP module instead of lookup
  /// (--speculative mtp[:K]; session.mtp set): up to `speculative` (K) a
  /// step, chained, for a request whose own `speculative` is above 0.
  bool speculative_mtp = false;
  /// Bytes of the prefix store (--kv-budget; 0: none): the KV caches of
  /// finished sequences kept beyond the slots, found again by token prefix
  /// (PrefixStore.h).
  uint64_t kv_budget = kKvBudgetAuto;
  /// Set by the caller (SIGINT/SIGTERM) to stop serving.
  const std::atomic<bool> *stop = nullptr;
};

/// Serves until *opts.stop; the listening address and progress go to
/// `log`. Returns an error when the server cannot start (bad plan, port
/// taken, ducks that cannot be prepared).
absl::Status Serve(const ServeOptions &opts, std::ostream &log);

} // namespace duck::runtime

#endif
