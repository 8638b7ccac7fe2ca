//===- Session.h - a plan, its ducks and an engine, ready to run -*- C++
//-*-===//
//
// What duckrun and duckrun serve share: load and verify the plan, read the
// tokenizer, start local ducks or connect to a cluster, prepare the weights
// through the ducks' caches, open the ELF, and build the engine with as
// many sequence slots as the caller will decode together. Failed ducks are
// brought back mid-run (ClusterFfnRunner::SetRecover). The caller owns
// cancellation (a flag it sets) and signal handling; nothing here is
// global.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_SESSION_H
#define DUCK_RUNTIME_SESSION_H

#include "duck/runtime/text/ChatTemplate.h"
#include "duck/runtime/engine/ClusterRunner.h"
#include "duck/runtime/cluster/DuckClient.h"
#include "duck/runtime/engine/Engine.h"
#include "duck/runtime/cluster/LocalCluster.h"
#include "duck/runtime/plan/Plan.h"
#include "duck/runtime/text/Tokenizer.h"

#include "absl/status/statusor.h"

#include <atomic>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace duck::runtime {

struct SessionOptions {
  std::string plan_dir;
  std::string tokenizer_path;  // "": tokenizer.json next to the checkpoint
  bool need_tokenizer = true;  // fail without one (not for --prompt-ids)
  std::string cluster_file;    // "": start a local embedded cluster
  uint32_t cores_per_duck = 0; // local cluster; 0: spread this machine
  std::string duckd_path;
  bool persistent = true;
  bool invalidate_cache = false;
  bool verify_weights = false;
  uint32_t threads = 0;        // host threads; 0: every core
  uint32_t prefill_chunk = 32; // prompt tokens a sequence puts in one step
  uint32_t max_seq = 0;        // 0: min(model max positions, 4096)
  uint32_t max_seqs = 1;       // sequences decoded together, a cache each
  /// Start even when max_seqs full-length KV caches would not fit in the
  /// memory this machine has available (they are reserved, not filled).
  bool kv_overcommit = false;
  /// GQA's KV cache in IEEE half (EngineOptions::kv_f16).
  bool kv_f16 = false;
  /// EngineOptions::host_prefetch_bytes: half this machine's last-level
  /// cache (8 MiB if unknown), or off.
  bool host_prefetch = false;
  bool all_logits = false;     // logits of every row (--logits-out)
  /// Build and run the plan's MTP module (EngineOptions::mtp), and keep
  /// every row's MTP logits (mtp_all_logits, --mtp-logits-out).
  bool mtp = false, mtp_all_logits = false;
  uint32_t recover_seconds = 60;
  uint32_t step_timeout_ms = 30000; // a step unanswered this long: hung
  int32_t reply_spin_us = 0;
  size_t keep_steps = 0; // per-step metrics kept; 0: all (one run)
  bool quiet = false;    // no progress on the log stream
  /// The log stream is a terminal: an upload's progress redraws one line
  /// ('\r'); otherwise it is a line every 10 s, so that a log file gets a
  /// few lines rather than one per chunk.
  bool log_is_terminal = false;
  /// Set by the caller (a signal handler, a server shutting down) to stop
  /// a long prepare; checked between its stages.
  const std::atomic<bool> *cancel = nullptr;
};

/// OK when `seqs` caches of `max_seq` tokens fit in `available` bytes
/// (0: unknown, always OK); else an error saying what fits and what to do.
absl::Status CheckKvFits(uint64_t kv_bytes_per_token, uint32_t max_seq,
                         uint32_t seqs, uint64_t available);

/// /proc/meminfo's MemAvailable, in bytes (0 when unknown).
uint64_t MemAvailableBytes();

class Session {
public:
  /// Load, then Start.
  static absl::StatusOr<std::unique_ptr<Session>>
  Create(const SessionOptions &opts, std::ostream &log);
  /// Loads and checks the plan and the tokenizer only (fast: callers check
  /// their prompt against them before any duck starts).
  static absl::StatusOr<std::unique_ptr<Session>>
  Load(const SessionOptions &opts);
  /// Brings up the ducks, prepares their weights and builds the engine;
  /// progress goes to `log` unless quiet. On error the ducks it started
  /// are stopped again (by Close or the destructor).
  absl::Status Start(std::ostream &log);
  ~Session();

  const LoadedPlan &plan() const { return *plan_; }
  const plan::ModelDef &model() const { return *plan_->def().model(); }
  /// Null when the plan has no tokenizer and none was given.
  const Tokenizer *tokenizer() const { return tok_.get(); }
  /// The engine and runner exist once Start has succeeded.
  Engine &engine() { return *engine_; }
  const Engine &engine() const { return *engine_; }
  const ClusterFfnRunner &runner() const { return *runner_; }
  /// The ducks' connections (once Start has succeeded). A duck brought
  /// back mid-run replaces it, on the thread that runs the engine.
  const DuckClient &client() const { return *client_; }
  /// What each duck's weight cache did at Start (hit, partial, miss) and
  /// the bytes uploaded to it.
  const PrepareReport &prepare_report() const { return prepare_; }
  uint32_t max_seq() const { return max_seq_; }
  uint32_t ducks() const;
  bool local() const { return local_ != nullptr; }
  bool persistent() const { return client_ && client_->persistent(); }
  /// The cluster file's duck read bandwidth (0: not given).
  double duck_read_gbs() const { return duck_read_gbs_; }
  uint32_t threads() const { return threads_; }
  /// A name for the model: the plan directory's last component.
  const std::string &name() const { return name_; }

  /// Token ids of a plain-text prompt: the tokenizer's prefix (the BOS
  /// when tokenizer_config.json asks for it, PromptPrefixIds), then the
  /// text with special-token spellings encoded as ordinary text.
  absl::StatusOr<std::vector<int32_t>>
  EncodePrompt(const std::string &text) const;
  /// The ids that end a generation: the model's EOS, plus for a chat the
  /// token that ends an assistant turn in its format (<|im_end|>, ...).
  std::vector<int32_t> StopTokens(bool chat) const;
  /// How a chat is written as this model's prompt (from its tokenizer's
  /// special tokens and the plan's family; kNone without a tokenizer).
  ChatFormat chat_format() const { return chat_format_; }
  /// The prompt ids of a chat: the checkpoint's chat template when it has
  /// one (EncodeChatTemplate, no tools or arguments), else the built-in
  /// format (RenderChat); then Encode with special tokens. Errors name the
  /// message, or say the model has no chat format.
  absl::StatusOr<std::vector<int32_t>>
  EncodeChat(absl::Span<const ChatMessage> messages) const;
  /// The checkpoint's own chat template (tokenizer_config.json's
  /// chat_template), or null: it has none, or one Duck cannot parse
  /// (chat_template_note() then says why the built-in format is used).
  const CheckpointTemplate *chat_template() const {
    return chat_template_ ? &*chat_template_ : nullptr;
  }
  const std::string &chat_template_note() const { return template_note_; }
  /// The prompt ids of OpenAI chat `messages` rendered by chat_template()
  /// with `args`; errors (InvalidArgument) are the template's.
  absl::StatusOr<std::vector<int32_t>>
  EncodeChatTemplate(const nlohmann::ordered_json &messages,
                     const ChatTemplateArgs &args) const;

  /// Closes the duck connections and stops local ducks (also done by the
  /// destructor).
  void Close();

  /// Whether the fault a test asked for (DUCK_TEST_KILL_DUCK) happened:
  /// an error when its step was never reached or the kill failed; OK when
  /// none was asked for.
  absl::Status CheckTestFault() const;

private:
  Session() = default;
  struct TestFault;
  absl::Status ArmTestFault(const char *spec);

  SessionOptions opts_;
  std::unique_ptr<LoadedPlan> plan_;
  std::unique_ptr<Tokenizer> tok_;
  ChatFormat chat_format_ = ChatFormat::kNone;
  std::vector<int32_t> prompt_prefix_; // PromptPrefixIds
  std::optional<CheckpointTemplate> chat_template_;
  std::string template_note_; // why a chat_template is not used
  std::unique_ptr<LocalCluster> local_;
  DuckClientOptions co_;
  std::vector<DuckEndpoint> spares_; // the cluster file's, not yet used
  std::unique_ptr<DuckClient> client_;
  PrepareReport prepare_;
  std::vector<std::string> images_;
  std::vector<uint8_t> elf_;
  std::unique_ptr<ClusterFfnRunner> runner_;
  std::unique_ptr<Engine> engine_;
  uint32_t max_seq_ = 0, threads_ = 1;
  double duck_read_gbs_ = 0;
  std::string name_;
  std::shared_ptr<TestFault> fault_;
};

/// The user's cache directory for Duck ($XDG_CACHE_HOME/duck).
std::string CacheBase();

/// This machine's read bandwidth with `threads` threads
/// (MeasureReadBandwidthGbs): measured once (~0.5 s) and kept in the cache
/// directory.
double HostReadBandwidthGbs(unsigned threads);

} // namespace duck::runtime

#endif
