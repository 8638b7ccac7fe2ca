// duckrun: runs a compiled Duck plan: brings up the ducks, prepares their
// weights through the cache, and generates text.
#include "duck/runtime/session/Generate.h"
#include "duck/runtime/serve/PrefixStore.h"
#include "duck/runtime/serve/Serve.h"
#include "duck_rt/tool_flags.h"

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <string>
#include <unistd.h>

ABSL_FLAG(std::string, prompt, "", "Prompt text; '-' or no prompt with a "
                                   "non-terminal stdin reads stdin");
ABSL_FLAG(bool, chat, false,
          "Send the prompt as a user message in the model's chat format, "
          "chosen from its tokenizer's special tokens: ChatML for Qwen3 "
          "(<|im_start|>user ... <|im_start|>assistant), DeepSeek's for "
          "DeepSeek-V3 and V3.2 (<｜User｜> ... <｜Assistant｜>, V3.2 in its "
          "chat mode)");
ABSL_FLAG(std::string, prompt_ids, "",
          "Comma-separated token ids instead of text (no tokenizer needed)");
ABSL_FLAG(uint32_t, max_tokens, 32, "Tokens to generate at most");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature; 0 = greedy");
ABSL_FLAG(uint32_t, top_k, 0, "Sample from the k most likely tokens (0: off)");
ABSL_FLAG(double, top_p, 1.0, "Nucleus sampling threshold (1: off)");
ABSL_FLAG(uint64_t, seed, 0, "Sampling seed");
ABSL_FLAG(bool, kv_overcommit, false,
          "Start even when every sequence's KV cache at --max-seq (times "
          "serve's --parallel) would not fit in the memory available; it is "
          "reserved, not filled, so memory grows with the positions reached (2 "
          "MiB a layer's K or V at a time: 512 positions of 8 kv heads of "
          "128 floats, each mapped by a background thread from half its "
          "positions before; without it every sequence's first 2 MiB are "
          "mapped at start)");
ABSL_FLAG(std::string, host_prefetch, "off",
          "on: while a decoded token's step is on the ducks, read the host "
          "weights of the next ops (a MoE router, an attention's host "
          "projections) into this core's caches, up to half the last-level "
          "cache, so that the host's products read them from there. Pays "
          "where those products are memory bound and the ducks are other "
          "boxes; `duck-bench prefetch` measures it (docs/perf.md)");
ABSL_FLAG(std::string, kv_cache, "f32",
          "Element type of the attention's KV cache: f32 (exact), or f16 "
          "(IEEE half: half the memory a position and half the bytes a "
          "decoded token reads from it, values rounded to 11 significant "
          "bits; grouped-query attention only)");
ABSL_FLAG(uint32_t, max_seq, 0,
          "KV cache length (prompt + generated); default min(model, 4096)");
ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer.json (default: next to the checkpoint)");
ABSL_FLAG(std::string, cluster, "",
          "Cluster file of running duckd's ({\"ducks\": [{\"host\", "
          "\"port\"}], \"token\"}); default: start local ducks");
ABSL_FLAG(uint32_t, cores_per_duck, 0,
          "Cores of each local duck (default: this machine's cores / tp)");
ABSL_FLAG(std::string, duckd, "", "duckd binary for local ducks");
ABSL_FLAG(bool, persistent, true,
          "Persistent duck sessions; --nopersistent (or DUCK_PERSISTENT=0) "
          "loads the ELF for every step");
ABSL_FLAG(bool, invalidate_cache, false, "Force a full weight upload");
ABSL_FLAG(bool, verify_weights, false, "Re-hash every weight image at load");
ABSL_FLAG(bool, decode_only, false,
          "Run the prompt one token at a time through the decode modes");
ABSL_FLAG(uint32_t, threads, 0,
          "Host threads for attention and the LM head (0: every core)");
ABSL_FLAG(uint32_t, prefill_chunk, 0,
          "Prompt tokens per duck step (default: 64 for one generation, the "
          "fastest prefill on the benchmark shapes; 32 for serve, whose steps "
          "also carry every decoding request's row)");
ABSL_FLAG(std::string, speculative, "none",
          "Speculative decoding: 'lookup[:K]' (K drafts a step at most, "
          "default 3, 1-16): the next token and up to K drafts go through "
          "one step and every draft the model would have produced anyway is "
          "accepted; drafts are the tokens that most often followed the "
          "text's last n-gram (2-4 tokens) earlier in the text or in "
          "--lookup-corpus. "
          "The output is identical to 'none', greedy or sampled with the "
          "same --seed (each token is one draw on the same logits); fewer "
          "drafts are tried where they are rejected. 'wrong[:K]': drafts "
          "drawn at random (almost never accepted), to measure what "
          "rejected drafts cost. 'mtp[:K]' (DeepSeek plans compiled with "
          "their MTP module, duckc compile --mtp; K default 1): the module "
          "drafts the token after next from the model's last hidden state; "
          "K > 1 chains it on its own draft and output, as DeepSeek and "
          "vLLM do. It runs over every accepted position (its own cache), "
          "its rows wait while drafts pause, and it stops after 4 drafts "
          "all rejected. Sampled drafts are accepted when the sampled token "
          "equals them, so the output for a --seed is the one 'none' "
          "gives. 'none': one token a step. With serve: the default of "
          "requests that do not set Duck's 'speculative' field (its drafts "
          "a step, 0: none; with mtp:K, up to K); the MTP module runs for "
          "every request that asks, all of them in one module step");
ABSL_FLAG(std::string, lookup_corpus, "",
          "Token ids (spaces, commas or newlines between them) that "
          "--speculative lookup also searches for drafts, e.g. a previous "
          "run's --print-ids output after its prompt's ids");
ABSL_FLAG(bool, quiet, false, "No progress or summary on stderr");
ABSL_FLAG(bool, print_ids, false,
          "Print the generated token ids (space-separated) instead of text");
ABSL_FLAG(bool, ignore_eos, false,
          "Keep generating past end-of-sequence tokens (benchmarks, tests)");
ABSL_FLAG(std::string, summary_json, "", "Write the run summary as JSON");
ABSL_FLAG(double, read_bw_gbs, 0,
          "Read bandwidth (GB/s) that decode_bound_fraction divides by "
          "(0: this machine's, measured once over 1 GiB and cached; a "
          "benchmark passes the figure it measured in the same window)");
ABSL_FLAG(std::string, mtp_logits_out, "",
          "Write the plan's MTP module's logits at every position whose next "
          "token is known (the prompt's and the generated tokens' but the "
          "last; each guesses the token after next) here, as --logits-out "
          "(DeepSeek plans with an MTP module)");
ABSL_FLAG(std::string, logits_out, "",
          "Write the logits of every prompt position, then of every "
          "generated token, here (raw float32, vocab floats a row)");

ABSL_FLAG(uint32_t, recover_seconds, 60,
          "When a duck dies, hangs or drops its connection mid-run: restart "
          "it (local ducks) or reconnect, prepare through the weight cache "
          "and resend the step, for at most this many seconds (0: give up "
          "at once)");

ABSL_FLAG(uint32_t, step_timeout_ms, 30000,
          "A duck step not answered within this many milliseconds counts as "
          "a hung duck: it is restarted (local) or reconnected and the step "
          "sent again (see --recover-seconds)");

ABSL_FLAG(int32_t, reply_spin_us, 0,
          "Spin this long (microseconds) for a step's replies before "
          "sleeping: saves the host's wake-up on every step but holds a "
          "core (for remote ducks; on one box it gains nothing)");

// duckrun serve.
ABSL_FLAG(std::string, host, "127.0.0.1",
          "serve: address to listen on (loopback unless told otherwise)");
ABSL_FLAG(int32_t, port, 8080, "serve: TCP port (0: any free port, printed)");
ABSL_FLAG(uint32_t, parallel, 4,
          "serve: sequences decoded together in every duck step");
ABSL_FLAG(uint32_t, queue, 64,
          "serve: requests waiting for a sequence slot before new ones get "
          "429");
ABSL_FLAG(std::string, api_key, "",
          "serve: require 'Authorization: Bearer KEY' (default: "
          "$DUCK_API_KEY, else no key)");
ABSL_FLAG(uint64_t, max_request_bytes, 1 << 20,
          "serve: larger request bodies get 413");
ABSL_FLAG(std::string, kv_budget, "auto",
          "serve: bytes of the prefix store, which keeps the KV caches of "
          "finished requests beyond the --parallel slots and gives a new "
          "prompt the longest stored prefix of it (least recently used "
          "evicted first): 2GiB, 512MiB, 0 (none); auto: 2GiB, at most a "
          "quarter of the memory available at start and what the KV caches "
          "at full length leave of it. A budget that does not fit beside "
          "them is refused (--kv-overcommit starts anyway)");
ABSL_FLAG(uint32_t, shutdown_grace_seconds, 10,
          "serve: on SIGINT/SIGTERM, let running requests finish this long "
          "before cancelling them");

namespace {
std::atomic<bool> gInterrupted{false};
void onSignal(int) { gInterrupted.store(true); }

/// SIGINT/SIGTERM set the flag; the run stops cleanly between steps.
void installInterruptHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

/// The session flags both modes share; `chunk` is the mode's default
/// prompt chunk.
duck::runtime::SessionOptions sessionFlags(const char *plan, uint32_t chunk) {
  duck::runtime::SessionOptions so;
  so.plan_dir = plan;
  so.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  so.cluster_file = absl::GetFlag(FLAGS_cluster);
  so.cores_per_duck = absl::GetFlag(FLAGS_cores_per_duck);
  so.duckd_path = absl::GetFlag(FLAGS_duckd);
  so.persistent = absl::GetFlag(FLAGS_persistent);
  so.invalidate_cache = absl::GetFlag(FLAGS_invalidate_cache);
  so.verify_weights = absl::GetFlag(FLAGS_verify_weights);
  so.threads = absl::GetFlag(FLAGS_threads);
  so.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  if (so.prefill_chunk == 0)
    so.prefill_chunk = chunk;
  so.max_seq = absl::GetFlag(FLAGS_max_seq);
  so.kv_overcommit = absl::GetFlag(FLAGS_kv_overcommit);
  const std::string kv = absl::GetFlag(FLAGS_kv_cache);
  if (kv != "f32" && kv != "f16") {
    std::cerr << "duckrun: error: --kv-cache must be f32 or f16, got '" << kv
              << "'\n";
    std::exit(2);
  }
  so.kv_f16 = kv == "f16";
  const std::string hp = absl::GetFlag(FLAGS_host_prefetch);
  if (hp != "on" && hp != "off") {
    std::cerr << "duckrun: error: --host-prefetch must be on or off, got '"
              << hp << "'\n";
    std::exit(2);
  }
  so.host_prefetch = hp == "on";
  so.recover_seconds = absl::GetFlag(FLAGS_recover_seconds);
  so.step_timeout_ms = absl::GetFlag(FLAGS_step_timeout_ms);
  so.reply_spin_us = absl::GetFlag(FLAGS_reply_spin_us);
  so.quiet = absl::GetFlag(FLAGS_quiet);
  so.log_is_terminal = isatty(STDERR_FILENO);
  return so;
}

/// What is wrong with --temperature or --top-p ("" when both are valid):
/// a temperature is finite and not negative (0: greedy), a top-p in (0, 1].
std::string BadSamplingFlag() {
  const double t = absl::GetFlag(FLAGS_temperature);
  const double p = absl::GetFlag(FLAGS_top_p);
  if (!(t >= 0) || std::isinf(t))
    return absl::StrCat("--temperature: ", t,
                        " is not a temperature (0 for greedy, or above)");
  if (!(p > 0 && p <= 1))
    return absl::StrCat("--top-p: ", p,
                        " is not a probability mass in (0, 1] (1: off)");
  return "";
}

/// --speculative and --lookup-corpus.
absl::Status ReadSpeculative(duck::runtime::SpeculativeOptions *out) {
  auto spec =
      duck::runtime::ParseSpeculative(absl::GetFlag(FLAGS_speculative));
  if (!spec.ok())
    return spec.status();
  *out = std::move(*spec);
  const std::string corpus = absl::GetFlag(FLAGS_lookup_corpus);
  if (corpus.empty())
    return absl::OkStatus();
  if (!out->lookup)
    return absl::InvalidArgumentError(
        "--lookup-corpus needs --speculative lookup");
  auto ids = duck::runtime::ReadTokenIds(corpus);
  if (!ids.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("--lookup-corpus: ", ids.status().message()));
  out->corpus = std::move(*ids);
  return absl::OkStatus();
}

int serveMain(const std::vector<char *> &args) {
  if (args.size() != 3) {
    std::cerr << "duckrun: error: usage: duckrun serve <plan-dir> [--port N] "
                 "[--parallel N] ... (see --help)\n";
    return 2;
  }
  duck::runtime::ServeOptions so;
  so.session = sessionFlags(args[2], 32);
  so.host = absl::GetFlag(FLAGS_host);
  so.port = absl::GetFlag(FLAGS_port);
  if (so.port < 0 || so.port > 65535) {
    std::cerr << "duckrun: error: --port " << so.port
              << " is not a TCP port (0-65535)\n";
    return 2;
  }
  so.parallel = absl::GetFlag(FLAGS_parallel);
  if (so.parallel == 0 || so.parallel > 256) {
    std::cerr << "duckrun: error: --parallel must be 1 to 256\n";
    return 2;
  }
  so.queue_limit = absl::GetFlag(FLAGS_queue);
  so.api_key = absl::GetFlag(FLAGS_api_key);
  if (so.api_key.empty())
    if (const char *k = std::getenv("DUCK_API_KEY"))
      so.api_key = k;
  so.max_body_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  so.shutdown_grace_seconds = absl::GetFlag(FLAGS_shutdown_grace_seconds);
  if (const std::string kb = absl::GetFlag(FLAGS_kv_budget); kb != "auto") {
    if (!duck::runtime::ParseByteSize(kb, &so.kv_budget)) {
      std::cerr << "duckrun: error: --kv-budget '" << kb
                << "' is not a size (2GiB, 512MiB, 0, auto)\n";
      return 2;
    }
  }
  {
    duck::runtime::SpeculativeOptions spec;
    if (absl::Status s = ReadSpeculative(&spec); !s.ok()) {
      std::cerr << "duckrun: error: " << s.message() << "\n";
      return 2;
    }
    if (!spec.corpus.empty() || spec.wrong) {
      std::cerr << "duckrun: error: --lookup-corpus and --speculative wrong "
                   "are for one generation, not serve\n";
      return 2;
    }
    so.speculative = spec.lookup || spec.mtp ? spec.k : 0;
    so.speculative_mtp = spec.mtp;
    so.session.mtp = spec.mtp;
  }
  installInterruptHandlers();
  so.stop = &gInterrupted;
  so.session.cancel = &gInterrupted;
  absl::Status s = duck::runtime::Serve(so, std::cerr);
  if (!s.ok()) {
    std::cerr << "duckrun serve: error: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  absl::SetProgramUsageMessage(
      "Runs a compiled Duck plan.\n\n"
      "  duckrun <plan-dir> --prompt \"...\" [--chat] [--max-tokens N]\n"
      "          [--temperature T --top-k K --top-p P --seed S]\n"
      "          [--cluster FILE | --cores-per-duck C] [--summary-json F]\n"
      "  duckrun serve <plan-dir> [--host 127.0.0.1] [--port 8080]\n"
      "          [--parallel N] [--kv-budget 2GiB] [--api-key KEY]\n"
      "          [--cluster FILE ...]\n\n"
      "serve: an OpenAI-compatible HTTP server (POST /v1/chat/completions, "
      "/v1/completions, streaming or not; GET /v1/models, /health, "
      "/metrics). Up to --parallel requests decode together, one row each "
      "in every duck step; a request gets the same tokens as the one-shot "
      "run with the same prompt and sampling settings; a prompt sharing a "
      "prefix with an earlier one (in a slot or the --kv-budget prefix "
      "store) prefills only the rest. Listens at once "
      "(/health is 503 until the ducks are prepared) and stops on "
      "SIGINT/SIGTERM after letting running requests finish.\n\n"
      "With no --cluster, starts as many local duckd's as the plan has ducks "
      "(on 127.0.0.1) and stops them at exit, also on Ctrl-C. Weights go "
      "through each duck's cache: a second run of the same plan uploads "
      "nothing. Tokens stream to stdout; the summary goes to stderr. Flags "
      "may be spelled with '-' or '_' (--max-tokens, --max_tokens).\n\n"
      "Environment: DUCK_HOST_ISA=avx2 keeps the host's products on their "
      "AVX2 kernels where the CPU has AVX-512 (to measure an AVX2 host); "
      "DUCK_HOST_FP8=fp9 converts an FP8 checkpoint's host matrices to fp9 "
      "(1.125 bytes a weight) instead of reading their e4m3 bytes (1 byte, "
      "the default); either way the results have the same bits.");
  duck::ToolFlags flags(argc, argv);
  const std::vector<char *> &args = flags.positional();
  if (args.size() >= 2 && std::string(args[1]) == "serve")
    return serveMain(args);
  if (args.size() != 2) {
    std::cerr << "duckrun: error: expected exactly one plan directory (see "
                 "--help)\n";
    return 2;
  }
  duck::runtime::GenerateOptions o;
  o.session = sessionFlags(args[1], 64);
  o.prompt = absl::GetFlag(FLAGS_prompt);
  o.chat = absl::GetFlag(FLAGS_chat);
  std::string ids = absl::GetFlag(FLAGS_prompt_ids);
  for (absl::string_view s : absl::StrSplit(ids, ',', absl::SkipEmpty())) {
    int32_t v;
    if (!absl::SimpleAtoi(s, &v)) {
      std::cerr << "duckrun: error: --prompt-ids: '" << s
                << "' is not an integer\n";
      return 2;
    }
    o.prompt_ids.push_back(v);
  }
  if (o.prompt_ids.empty() && (o.prompt == "-" || (o.prompt.empty() &&
                                                   !isatty(STDIN_FILENO)))) {
    o.prompt.assign(std::istreambuf_iterator<char>(std::cin),
                    std::istreambuf_iterator<char>());
  }
  if (o.prompt.empty() && o.prompt_ids.empty()) {
    std::cerr << "duckrun: error: no prompt (use --prompt, --prompt-ids or "
                 "stdin)\n";
    return 2;
  }
  o.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (std::string bad = BadSamplingFlag(); !bad.empty()) {
    std::cerr << "duckrun: error: " << bad << "\n";
    return 2;
  }
  o.sampler.temperature = (float)absl::GetFlag(FLAGS_temperature);
  o.sampler.top_k = absl::GetFlag(FLAGS_top_k);
  o.sampler.top_p = (float)absl::GetFlag(FLAGS_top_p);
  o.sampler.seed = absl::GetFlag(FLAGS_seed);
  o.decode_only = absl::GetFlag(FLAGS_decode_only);
  o.stop_at_eos = !absl::GetFlag(FLAGS_ignore_eos);
  o.print_ids = absl::GetFlag(FLAGS_print_ids);
  o.summary_json = absl::GetFlag(FLAGS_summary_json);
  o.read_bw_gbs = absl::GetFlag(FLAGS_read_bw_gbs);
  if (!(o.read_bw_gbs >= 0) || std::isinf(o.read_bw_gbs)) {
    std::cerr << "duckrun: error: --read-bw-gbs: " << o.read_bw_gbs
              << " is not a bandwidth (GB/s, or 0 to measure it)\n";
    return 2;
  }
  o.logits_out = absl::GetFlag(FLAGS_logits_out);
  o.mtp_logits_out = absl::GetFlag(FLAGS_mtp_logits_out);
  if (absl::Status s = ReadSpeculative(&o.speculative); !s.ok()) {
    std::cerr << "duckrun: error: " << s.message() << "\n";
    return 2;
  }
  installInterruptHandlers();
  o.cancel = &gInterrupted;
  absl::Status s = duck::runtime::Generate(o, std::cout, std::cerr);
  if (!s.ok()) {
    std::cerr << "duckrun: error: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
