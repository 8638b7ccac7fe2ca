//===- Serve.cpp - duckrun serve: an OpenAI-compatible HTTP server --------===//
//
// HTTP (cpp-httplib) on a pool of connection threads; one batcher thread
// owns the engine. A request becomes a Job: the batcher's callbacks turn
// tokens into text (stop strings are matched there, so a match ends the
// sequence at once) and the connection thread drains the job's text into
// one JSON response or into server-sent events.
//===----------------------------------------------------------------------===//
#include "duck/runtime/serve/Serve.h"

#include "duck/runtime/StatusMacros.h"
#include "duck/runtime/serve/AnswerParser.h"
#include "duck/runtime/serve/Batcher.h"
#include "duck/runtime/serve/StatusPage.h"
#include "duck/runtime/serve/ToolCalls.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <dirent.h>
#include <map>
#include <mutex>
#include <netdb.h>
#include <ostream>
#include <poll.h>
#include <sys/socket.h>
#include <thread>

namespace duck::runtime {
namespace {

using json = nlohmann::json;

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// JSON text; bytes that are not UTF-8 (a model can emit any bytes) become
/// U+FFFD instead of an exception.
std::string Dump(const json &j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

/// An OpenAI-shaped error.
void SetError(httplib::Response &res, int status, const std::string &message,
              const char *type, const char *param = nullptr,
              const char *code = nullptr) {
  json e = {{"message", message},
            {"type", type},
            {"param", param ? json(param) : json(nullptr)},
            {"code", code ? json(code) : json(nullptr)}};
  res.status = status;
  res.set_content(Dump(json{{"error", e}}), "application/json");
}

//===----------------------------------------------------------------------===//
// Connections
//===----------------------------------------------------------------------===//

/// A socket address as the HTTP library reports it (numeric host, port).
bool HostAndPort(const sockaddr_storage &a, socklen_t len, std::string *host,
                 int *port) {
  if (a.ss_family == AF_INET)
    *port = ntohs(reinterpret_cast<const sockaddr_in *>(&a)->sin_port);
  else if (a.ss_family == AF_INET6)
    *port = ntohs(reinterpret_cast<const sockaddr_in6 *>(&a)->sin6_port);
  else
    return false;
  char buf[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr *>(&a), len, buf, sizeof buf,
                  nullptr, 0, NI_NUMERICHOST) != 0)
    return false;
  *host = buf;
  return true;
}

/// Calls fn(fd, local host, local port, peer host, peer port) for each
/// connected socket of this process until fn returns true.
template <typename Fn> void ForEachConnection(Fn fn) {
  DIR *d = opendir("/proc/self/fd");
  if (!d)
    return;
  while (const dirent *e = readdir(d)) {
    char *end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end || fd == dirfd(d))
      continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    std::string lhost, phost;
    int lport = -1, pport = -1;
    if (getsockname((int)fd, reinterpret_cast<sockaddr *>(&local), &ll) != 0 ||
        getpeername((int)fd, reinterpret_cast<sockaddr *>(&peer), &pl) != 0 ||
        !HostAndPort(local, ll, &lhost, &lport) ||
        !HostAndPort(peer, pl, &phost, &pport))
      continue;
    if (fn((int)fd, lhost, lport, phost, pport))
      break;
  }
  closedir(d);
}

/// The socket a request arrived on (the library hands handlers none): the
/// open one with the request's two ends; -1 when there is none. It stays
/// open while the request's handler runs.
int ConnectionFd(const httplib::Request &req) {
  int found = -1;
  ForEachConnection([&](int fd, const std::string &lhost, int lport,
                        const std::string &phost, int pport) {
    if (lport == req.local_port && pport == req.remote_port &&
        lhost == req.local_addr && phost == req.remote_addr)
      found = fd;
    return found >= 0;
  });
  return found;
}

/// Ends a connection whose request body is left unread, once the answer is
/// out (the library would take the rest for the next request, and it reads
/// a line of any length): the answers that say 'Connection: close'.
void StopReading(const httplib::Request &req) {
  const int fd = ConnectionFd(req);
  if (fd >= 0)
    ::shutdown(fd, SHUT_RD);
}

/// True once the client closed its end (or the connection broke); bytes it
/// sent ahead (a pipelined request) keep it alive.
bool PeerGone(int fd) {
  pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0)
    return false;
  if (p.revents & (POLLERR | POLLNVAL))
    return true;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 ||
         (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/// Shuts every connection accepted on `port` (the library's threads
/// blocked reading them wake up and end).
void CutConnections(int port) {
  ForEachConnection([port](int fd, const std::string &, int lport,
                           const std::string &, int) {
    if (lport == port)
      ::shutdown(fd, SHUT_RDWR);
    return false;
  });
}

/// The connection threads: made as connections come, up to a cap, rather
/// than a fixed few, since a client that trickles its request in holds
/// one as long as it likes (the library sets no deadline for a request's
/// head; a fixed pool of them starved everyone else). At shutdown the
/// connections still open after a grace period are cut.
class ConnectionPool : public httplib::TaskQueue {
public:
  ConnectionPool(size_t max_threads, int port)
      : max_(std::max<size_t>(1, max_threads)), port_(port) {}
  ~ConnectionPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fn));
    if (jobs_.size() > idle_ && threads_.size() < max_)
      threads_.emplace_back([this] { Work(); });
    cv_.notify_one();
  }

  void shutdown() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopped_)
      return;
    stopped_ = true;
    cv_.notify_all();
    const bool idle = done_.wait_for(lock, std::chrono::seconds(2), [&] {
      return busy_ == 0 && jobs_.empty();
    });
    lock.unlock();
    if (!idle)
      CutConnections(port_);
    for (std::thread &t : threads_)
      t.join();
    threads_.clear();
  }

private:
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return stopped_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty())
        return;
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      ++busy_;
      lock.unlock();
      fn();
      lock.lock();
      --busy_;
      done_.notify_all();
    }
  }

  const size_t max_;
  const int port_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0, busy_ = 0;
  bool stopped_ = false;
};

/// A request field's problem, reported as 400 with the field's name.
struct FieldError {
  std::string param, message;
};

//===----------------------------------------------------------------------===//
// Metrics
//===----------------------------------------------------------------------===//

/// A Prometheus histogram with fixed upper bounds (seconds).
class Histogram {
public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void Add(double v) {
    size_t i =
        std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
    ++counts_[i];
    sum_ += v;
    ++n_;
  }
  void Write(std::string &out, const std::string &name,
             const std::string &help) const {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name,
                    " histogram\n");
    uint64_t acc = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
      acc += counts_[i];
      absl::StrAppend(&out, name, "_bucket{le=\"", bounds_[i], "\"} ", acc,
                      "\n");
    }
    absl::StrAppend(&out, name, "_bucket{le=\"+Inf\"} ", n_, "\n", name,
                    "_sum ", sum_, "\n", name, "_count ", n_, "\n");
  }

private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t n_ = 0;
};

struct Metrics {
  std::mutex mu;
  std::map<std::string, uint64_t> requests; // by "endpoint,status"
  Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram tpot{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};

  void Count(const std::string &endpoint, int status) {
    std::lock_guard<std::mutex> lock(mu);
    ++requests[absl::StrCat(endpoint, ",", status)];
  }
};

//===----------------------------------------------------------------------===//
// Jobs
//===----------------------------------------------------------------------===//

/// One request between its connection thread and the batcher thread.
struct Job {
  std::mutex mu;
  std::condition_variable cv;
  std::string text; // all text so far, stop strings cut off
  size_t ready = 0; // text[0, ready) may be parsed (no partial stop)
  bool done = false;
  FinishReason why = FinishReason::kLength;
  absl::Status error;
  uint32_t prompt_tokens = 0, completion_tokens = 0;
  std::atomic<uint32_t> cached_tokens{0}; // prompt tokens reused (prefix)
  uint64_t id = 0;          // the batcher's
  bool stop_string = false; // a stop string cut the text
  double t_submit = 0, t_first = 0, t_last = 0;

  // With logprobs: one entry a generated token (chat's shape: token,
  // logprob, bytes, top_logprobs); the stream has sent [0, lp_sent).
  bool want_logprobs = false;
  std::vector<json> logprobs;
  size_t lp_sent = 0, lp_offset = 0; // lp_offset: completions' text_offset

  // Tool calls (ToolCalls.h): kForced, the whole answer is a call; kAuto,
  // text then maybe a call from "<tool_call>" on.
  enum class Tools { kNone, kForced, kAuto } tools = Tools::kNone;

  // The answer as AnswerParser splits text[0, ready): what it gave so far,
  // and what a stream has sent of it.
  std::unique_ptr<AnswerParser> parser;
  std::string reasoning, content, call_name, arguments;
  bool call_started = false;
  size_t reasoning_sent = 0, content_sent = 0, arguments_sent = 0;
  bool name_sent = false;

  // Batcher thread only.
  std::unique_ptr<StreamDecoder> decoder;
  std::vector<std::string> stops;
  const Tokenizer *tokenizer = nullptr;
};

/// A token as OpenAI's logprobs show it: its text and its UTF-8 bytes
/// (a token may hold part of a character: the bytes say which).
json TokenEntry(const Tokenizer &tok, int32_t id, float logprob) {
  const std::string_view b = tok.TokenBytes(id);
  json bytes = json::array();
  for (unsigned char c : b)
    bytes.push_back((int)c);
  return json{{"token", std::string(b)}, {"logprob", logprob},
              {"bytes", bytes}};
}

void OnLogprobs(Job &j, int32_t id, const TokenLogprobs &lp) {
  json e = TokenEntry(*j.tokenizer, id, lp.logprob);
  json top = json::array();
  for (const auto &[alt, l] : lp.top)
    top.push_back(TokenEntry(*j.tokenizer, alt, l));
  e["top_logprobs"] = std::move(top);
  std::lock_guard<std::mutex> lock(j.mu);
  j.logprobs.push_back(std::move(e));
}

/// Entries in the shape of the answer: chat's {"content": [...]}, or the
/// legacy completions' parallel lists.
json LogprobsJson(bool chat, const std::vector<json> &entries, size_t from,
                  size_t to, size_t *text_offset) {
  if (chat)
    return json{{"content", json(std::vector<json>(entries.begin() + from,
                                                   entries.begin() + to))}};
  json tokens = json::array(), lps = json::array(), tops = json::array(),
       offsets = json::array();
  for (size_t i = from; i < to; ++i) {
    const json &e = entries[i];
    tokens.push_back(e["token"]);
    lps.push_back(e["logprob"]);
    json top = json::object();
    for (const json &t : e["top_logprobs"])
      top[t["token"].get<std::string>()] = t["logprob"];
    tops.push_back(std::move(top));
    offsets.push_back(*text_offset);
    *text_offset += e["bytes"].size();
  }
  return json{{"tokens", tokens},
              {"token_logprobs", lps},
              {"top_logprobs", tops},
              {"text_offset", offsets}};
}

/// The longest suffix of `text` that is a proper prefix of a stop string:
/// held back until the next token shows whether the stop matches.
size_t HeldBack(const std::string &text,
                const std::vector<std::string> &stops) {
  size_t hold = 0;
  for (const std::string &s : stops)
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  return hold;
}

constexpr char kToolCallMarker[] = "<tool_call>";

/// Parses more of the job's text (all of it when `final`).
void ParseMore(Job &j, bool final) {
  const AnswerParts p = j.parser->Feed(
      std::string_view(j.text).substr(0, final ? j.text.size() : j.ready),
      final);
  j.reasoning += p.reasoning;
  j.content += p.content;
  j.arguments += p.arguments;
  if (p.call_started) {
    j.call_started = true;
    j.call_name = p.call_name;
  }
}

/// Whether a stream has parts of the answer to send.
bool Unsent(const Job &j) {
  return j.reasoning.size() > j.reasoning_sent ||
         j.content.size() > j.content_sent ||
         (j.call_started && !j.name_sent) ||
         j.arguments.size() > j.arguments_sent;
}

TokenVerdict OnToken(Job &j, int32_t id) {
  std::string piece = j.decoder->Push(id);
  std::lock_guard<std::mutex> lock(j.mu);
  const double t = now();
  if (j.completion_tokens == 0)
    j.t_first = t;
  j.t_last = t;
  ++j.completion_tokens;
  const size_t before = j.text.size();
  j.text += piece;
  TokenVerdict v = TokenVerdict::kContinue;
  size_t cut = std::string::npos;
  for (const std::string &s : j.stops) {
    // Only a match that ends in the new piece is new.
    const size_t from = before >= s.size() ? before - s.size() + 1 : 0;
    size_t at = j.text.find(s, from);
    if (at != std::string::npos)
      cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    j.text.resize(cut);
    j.stop_string = true;
    j.ready = j.text.size();
    v = TokenVerdict::kStop;
  } else {
    j.ready = j.text.size() - HeldBack(j.text, j.stops);
  }
  ParseMore(j, false);
  j.cv.notify_all();
  return v;
}

void OnDone(Job &j, FinishReason why, const absl::Status &error) {
  std::lock_guard<std::mutex> lock(j.mu);
  std::string tail;
  if ((why == FinishReason::kLength || why == FinishReason::kStop) &&
      !j.stop_string)
    tail = j.decoder->Flush(); // an unfinished character, as U+FFFD
  j.text += tail;
  j.why = why;
  j.ready = j.text.size();
  ParseMore(j, true);
  j.error = error;
  j.done = true;
  j.cv.notify_all();
}

//===----------------------------------------------------------------------===//
// Request parsing
//===----------------------------------------------------------------------===//

struct Params {
  std::vector<int32_t> prompt;
  uint32_t max_tokens = 0;
  SamplerOptions sampler;
  std::vector<std::string> stops;
  bool stream = false, include_usage = false, ignore_eos = false;
  int speculative = -1; // drafts a step (Duck's field); -1: the server's
  bool logprobs = false;     // return each token's log probability
  uint32_t top_logprobs = 0; // and this many alternatives
  float presence_penalty = 0, frequency_penalty = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::shared_ptr<const JsonGrammar> grammar; // response_format
  bool reasoning = true; // 'reasoning_format' is not "none"
  /// The body with its objects in the request's order (schemas, tools),
  /// when it has any.
  nlohmann::ordered_json ordered;
  ToolRequest tools;
  /// tool_choice "required" or named: the answer is one tool call that
  /// follows one of these.
  std::vector<std::shared_ptr<const JsonGrammar>> tool_grammars;
};

/// The body with its members in the request's order (the parsed body's
/// objects are sorted by key, and a schema's properties are generated, and
/// tools shown to the model, in the order the request lists them); null
/// when it has no schema or tools.
nlohmann::ordered_json Ordered(const std::string &body) {
  if (body.find("json_schema") == std::string::npos &&
      body.find("tool") == std::string::npos)
    return nullptr;
  auto b = nlohmann::ordered_json::parse(body, nullptr,
                                         /*allow_exceptions=*/false);
  return b.is_object() ? b : nullptr;
}

/// The text of a message's content: a string, or an array of
/// {"type": "text", "text": ...} parts.
std::optional<std::string> ContentText(const json &c) {
  if (c.is_string())
    return c.get<std::string>();
  if (c.is_null())
    return std::string();
  if (!c.is_array())
    return std::nullopt;
  std::string out;
  for (const json &p : c) {
    if (!p.is_object() || p.value("type", "") != "text" ||
        !p.contains("text") || !p["text"].is_string())
      return std::nullopt;
    out += p["text"].get<std::string>();
  }
  return out;
}

/// 'stop': a string or up to 4, none empty.
std::optional<FieldError> ParseStops(const json &b, Params *p) {
  if (b.contains("stop") && !b["stop"].is_null()) {
    const json &s = b["stop"];
    if (s.is_string()) {
      p->stops.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const json &x : s) {
        if (!x.is_string())
          return FieldError{"stop", "'stop' must be a string or an array of "
                                    "at most 4 strings"};
        p->stops.push_back(x.get<std::string>());
      }
    } else {
      return FieldError{"stop", "'stop' must be a string or an array of at "
                                "most 4 strings"};
    }
    for (const std::string &x : p->stops)
      if (x.empty())
        return FieldError{"stop", "a stop string is empty"};
  }
  return std::nullopt;
}

/// The booleans 'stream', 'stream_options.include_usage', 'ignore_eos',
/// and Duck's 'speculative' (lookup drafts a step).
std::optional<FieldError> ParseFlags(const json &b, Params *p) {
  if (b.contains("stream") && !b["stream"].is_null()) {
    if (!b["stream"].is_boolean())
      return FieldError{"stream", "'stream' must be true or false"};
    p->stream = b["stream"].get<bool>();
  }
  if (b.contains("stream_options") && !b["stream_options"].is_null()) {
    const json &so = b["stream_options"];
    if (!so.is_object())
      return FieldError{"stream_options", "'stream_options' must be an object"};
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean())
        return FieldError{"stream_options",
                          "'stream_options.include_usage' must be a boolean"};
      p->include_usage = so["include_usage"].get<bool>();
    }
  }
  if (b.contains("ignore_eos") && !b["ignore_eos"].is_null()) {
    if (!b["ignore_eos"].is_boolean())
      return FieldError{"ignore_eos", "'ignore_eos' must be true or false"};
    p->ignore_eos = b["ignore_eos"].get<bool>();
  }
  if (b.contains("speculative") && !b["speculative"].is_null()) {
    const json &v = b["speculative"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > 16)
      return FieldError{"speculative",
                        "'speculative' must be an integer from 0 (none) to "
                        "16 (lookup drafts a step)"};
    p->speculative = (int)v.get<int64_t>();
  }
  return std::nullopt;
}

/// 'reasoning_format' (chat; llama-server's field): "auto" (the default)
/// or "deepseek" return Qwen3's thinking as reasoning_content, "none"
/// leaves it in the content.
std::optional<FieldError> ParseReasoning(const json &b, Params *p) {
  if (!b.contains("reasoning_format") || b["reasoning_format"].is_null())
    return std::nullopt;
  const json &v = b["reasoning_format"];
  if (v != "auto" && v != "deepseek" && v != "none")
    return FieldError{"reasoning_format", "'reasoning_format' must be "
                                          "\"auto\", \"deepseek\" or \"none\""};
  p->reasoning = v != "none";
  return std::nullopt;
}

/// 'presence_penalty' and 'frequency_penalty' (numbers in [-2, 2]) and
/// 'logit_bias' (token id strings of this vocabulary to numbers in
/// [-100, 100]).
std::optional<FieldError> ParsePenalties(const json &b, uint32_t vocab,
                                         Params *p) {
  for (const char *k : {"presence_penalty", "frequency_penalty"}) {
    if (!b.contains(k) || b[k].is_null())
      continue;
    if (!b[k].is_number() || !(std::fabs(b[k].get<double>()) <= 2))
      return FieldError{k, absl::StrCat("'", k, "' must be a number in "
                                        "[-2, 2]")};
    (k[0] == 'p' ? p->presence_penalty : p->frequency_penalty) =
        b[k].get<float>();
  }
  if (!b.contains("logit_bias") || b["logit_bias"].is_null())
    return std::nullopt;
  const json &lb = b["logit_bias"];
  if (!lb.is_object())
    return FieldError{"logit_bias", "'logit_bias' must be an object mapping "
                                    "token ids to numbers"};
  for (auto it = lb.begin(); it != lb.end(); ++it) {
    const std::string &k = it.key();
    const bool digits = !k.empty() && k.size() <= 10 &&
                        std::all_of(k.begin(), k.end(), [](char c) {
                          return c >= '0' && c <= '9';
                        });
    if (!digits || std::stoll(k) >= (int64_t)vocab)
      return FieldError{"logit_bias",
                        absl::StrCat("'logit_bias' key \"", k, "\" is not a "
                                     "token id of this model (0 to ",
                                     vocab - 1, ")")};
    if (!it->is_number() || !(std::fabs(it->get<double>()) <= 100))
      return FieldError{"logit_bias",
                        absl::StrCat("'logit_bias' value for token ", k,
                                     " must be a number in [-100, 100]")};
    p->logit_bias.emplace_back((int32_t)std::stoll(k), it->get<float>());
  }
  return std::nullopt;
}

/// 'response_format': text, json_object or json_schema (a JSON Schema of
/// the subset JsonGrammar.h lists); the grammar the output must follow.
std::optional<FieldError> ParseResponseFormat(const json &b, Params *p) {
  if (!b.contains("response_format") || b["response_format"].is_null())
    return std::nullopt;
  auto bad = [](absl::string_view why) {
    return FieldError{"response_format", absl::StrCat("'response_format' ",
                                                      why)};
  };
  const json &rf = b["response_format"];
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    return bad("must be an object with a 'type'");
  const std::string type = rf["type"].get<std::string>();
  if (type == "text")
    return std::nullopt;
  if (type == "json_object") {
    p->grammar = std::make_shared<JsonGrammar>(JsonGrammar::AnyObject());
    return std::nullopt;
  }
  if (type != "json_schema")
    return bad(absl::StrCat("type '", type, "' is not one of text, "
                            "json_object, json_schema"));
  const json js = rf.value("json_schema", json());
  if (!js.is_object() || !js.contains("name") || !js["name"].is_string())
    return bad("json_schema needs an object 'json_schema' with a 'name'");
  if (js.contains("strict") && !js["strict"].is_null() &&
      !js["strict"].is_boolean())
    return bad("json_schema.strict must be true or false");
  if (!js.contains("schema") || !js["schema"].is_object())
    return bad("json_schema.schema must be a JSON Schema object");
  auto g = JsonGrammar::FromSchema(
      p->ordered["response_format"]["json_schema"]["schema"].dump());
  if (!g.ok())
    return bad(absl::StrCat("json_schema.schema: ", g.status().message()));
  p->grammar = std::make_shared<JsonGrammar>(std::move(*g));
  return std::nullopt;
}

/// 'tools' and 'tool_choice' (chat): the tools for the prompt and, under
/// "required" or a named function, the grammars of the answer's call.
/// `deepseek`: how DeepSeek's markers are spelt in a grammar, when this
/// model writes its calls that way (ToolCalls.h); null: ChatML or none.
std::optional<FieldError>
ParseToolFields(ChatFormat format, const MarkerSpelling *deepseek, Params *p) {
  if (!p->ordered.is_object())
    return std::nullopt;
  if (auto e = ParseTools(p->ordered, &p->tools))
    return FieldError{e->param, e->message};
  if (p->tools.tools.empty())
    return std::nullopt;
  if (format != ChatFormat::kChatMl && !deepseek)
    return FieldError{
        "tools",
        absl::StrCat("'tools' is served for the ChatML (Qwen3) "
                     "family and for DeepSeek checkpoints whose chat "
                     "template reads 'tools'; this model's chat "
                     "format is ",
                     std::string(ChatFormatName(format)),
                     format == ChatFormat::kNone ? ""
                                                 : " without such a template")};
  if (p->tools.choice == ToolRequest::Choice::kNone)
    return std::nullopt;
  if (p->grammar)
    return FieldError{"response_format",
                      "'response_format' cannot constrain an answer that "
                      "may be a tool call (send 'tool_choice': \"none\")"};
  if (auto e = deepseek ? DeepSeekToolCallGrammars(p->tools, *deepseek,
                                                   &p->tool_grammars)
                        : ToolCallGrammars(p->tools, &p->tool_grammars))
    return FieldError{e->param, e->message};
  return std::nullopt;
}

/// Fields a client may send that this server cannot honour yet: a 400
/// naming the field, never an answer that silently ignores it. Each is
/// accepted where it asks for nothing (absent, null, empty, zero, false,
/// the default).
std::optional<FieldError> ParseUnsupported(const json &b, bool chat) {
  auto set = [&](const char *k) { return b.contains(k) && !b[k].is_null(); };
  auto refuse = [](const char *k, absl::string_view why) {
    return FieldError{k, absl::StrCat("'", k, "' is not supported by this "
                                      "server yet: ", why)};
  };
  const char *noTools = "tool calls are served on /v1/chat/completions "
                        "with 'tools' (send the request without it)";
  if (!chat && set("tools") && !(b["tools"].is_array() && b["tools"].empty()))
    return refuse("tools", noTools);
  if (!chat && set("tool_choice") && b["tool_choice"] != "none")
    return refuse("tool_choice", noTools);
  if (set("functions") && !(b["functions"].is_array() && b["functions"].empty()))
    return refuse("functions", noTools);
  if (set("function_call") && b["function_call"] != "none")
    return refuse("function_call", noTools);
  if (!chat) {
    if (set("echo") && b["echo"] != false)
      return refuse("echo", "the prompt is not echoed");
    if (set("best_of") && b["best_of"] != 1)
      return refuse("best_of", "only one completion is made");
    if (set("suffix") && b["suffix"] != "")
      return refuse("suffix", "there is no insertion mode");
  }
  return std::nullopt;
}

/// 'logprobs' and 'top_logprobs' (chat: a boolean and 0-20 alternatives);
/// 'logprobs' on completions: the number of alternatives, 0-20.
std::optional<FieldError> ParseLogprobs(const json &b, bool chat, Params *p) {
  auto set = [&](const char *k) { return b.contains(k) && !b[k].is_null(); };
  auto count = [&](const char *k) -> std::optional<FieldError> {
    if (!b[k].is_number_integer() || b[k].get<int64_t>() < 0 ||
        b[k].get<int64_t>() > 20)
      return FieldError{k, absl::StrCat("'", k, "' must be an integer in "
                                        "[0, 20]")};
    p->top_logprobs = (uint32_t)b[k].get<int64_t>();
    return std::nullopt;
  };
  if (!chat) {
    if (!set("logprobs"))
      return std::nullopt;
    p->logprobs = true;
    return count("logprobs");
  }
  if (set("logprobs")) {
    if (!b["logprobs"].is_boolean())
      return FieldError{"logprobs", "'logprobs' must be true or false"};
    p->logprobs = b["logprobs"].get<bool>();
  }
  if (set("top_logprobs")) {
    if (auto e = count("top_logprobs"))
      return e;
    if (!p->logprobs && p->top_logprobs > 0)
      return FieldError{"top_logprobs", "'top_logprobs' needs 'logprobs': true"};
  }
  return std::nullopt;
}

/// The sampling and length fields both endpoints share.
std::optional<FieldError> ParseCommon(const json &b, uint32_t context,
                                      Params *p) {
  auto number = [&](const char *k, double lo, double hi,
                    double *out) -> std::optional<FieldError> {
    if (!b.contains(k) || b[k].is_null())
      return std::nullopt;
    if (!b[k].is_number() || !std::isfinite(b[k].get<double>()) ||
        b[k].get<double>() < lo || b[k].get<double>() > hi)
      return FieldError{k, absl::StrCat("'", k, "' must be a number in [", lo,
                                        ", ", hi, "]")};
    *out = b[k].get<double>();
    return std::nullopt;
  };
  auto integer = [&](const char *k, int64_t lo, int64_t hi,
                     int64_t *out) -> std::optional<FieldError> {
    if (!b.contains(k) || b[k].is_null())
      return std::nullopt;
    if (!b[k].is_number_integer() || b[k].get<int64_t>() < lo ||
        b[k].get<int64_t>() > hi)
      return FieldError{k, absl::StrCat("'", k, "' must be an integer in [", lo,
                                        ", ", hi, "]")};
    *out = b[k].get<int64_t>();
    return std::nullopt;
  };
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0, seed = 0, n = 1, max_tokens = -1;
  if (auto e = number("temperature", 0, 2, &temperature))
    return e;
  if (auto e = number("top_p", 0, 1, &top_p))
    return e;
  if (b.contains("top_p") && b["top_p"].is_number() && top_p <= 0)
    return FieldError{"top_p", "'top_p' must be greater than 0"};
  if (auto e = integer("top_k", 0, 1 << 20, &top_k))
    return e;
  if (auto e = integer("seed", INT64_MIN, INT64_MAX, &seed))
    return e;
  if (auto e = integer("n", 1, 1, &n))
    return FieldError{"n", "only 'n': 1 is supported"};
  if (auto e = integer("max_tokens", 1, context, &max_tokens))
    return e;
  if (auto e = integer("max_completion_tokens", 1, context, &max_tokens))
    return e;
  p->sampler.temperature = (float)temperature;
  p->sampler.top_p = (float)top_p;
  p->sampler.top_k = (uint32_t)top_k;
  p->sampler.seed = (uint64_t)seed;
  if (max_tokens > 0)
    p->max_tokens = (uint32_t)max_tokens;
  if (auto e = ParseStops(b, p))
    return e;
  return ParseFlags(b, p);
}

//===----------------------------------------------------------------------===//
// The server
//===----------------------------------------------------------------------===//

enum class State { kPreparing, kReady, kStopping };

struct Reply;

class Server {
public:
  Server(const ServeOptions &o, std::ostream &log) : o_(o), log_(log) {}
  absl::Status Run();

private:
  /// Binds the port and sets the server up (routes, limits, threads); the
  /// listening itself is Run's thread.
  absl::Status Listen();
  /// The batcher over the started session, its prefix store sized by
  /// --kv-budget beside the caches (KvBudget): the store's bytes.
  absl::StatusOr<uint64_t> MakeBatcher(const SessionOptions &so);
  void Routes();
  bool Authorized(const httplib::Request &req, httplib::Response &res);
  bool Ready(httplib::Response &res);
  void Generate(const httplib::Request &req, httplib::Response &res,
                const httplib::ContentReader &reader, bool chat);
  // Generate's steps; each false or null when it has answered an error.
  /// Reads the body here, before anything is refused (left unread it would
  /// be taken for the connection's next request), so that
  /// --max-request-bytes bounds every framing: the library checks only a
  /// Content-Length, and would read a chunked body whole.
  bool ReadBody(const httplib::ContentReader &reader, httplib::Response &res,
                std::string *body);
  /// The prompt and the other fields, checked against this model's context.
  bool ParseRequest(const json &b, bool chat, httplib::Response &res,
                    Params *p);
  /// A chat request's prompt: its messages in the model's chat format.
  bool PromptFromMessages(const json &b, httplib::Response &res, Params *p);
  /// A completion's prompt: a string (encoded here) or the token ids.
  bool PromptFromCompletion(const json &b, httplib::Response &res, Params *p);
  /// Hands the request to the batcher as a job its callbacks fill.
  std::shared_ptr<Job> Submit(Params &p, bool chat, httplib::Response &res);
  /// ds_tools_ and how the grammars spell DeepSeek's tool-call markers.
  void SetUpDeepSeekTools();
  /// How a chat answer is split (reasoning, content, a tool call).
  AnswerParser::Options AnswerOptions(const Params &p, Job::Tools tools,
                                      const std::vector<int32_t> &prompt) const;
  /// The whole answer at once, when the job is done.
  void Answer(const httplib::Request &req, httplib::Response &res, Job &job,
              const Reply &r);
  /// Waits for the job, cancelling it when the client goes away (its slot
  /// is freed for others); true when it went.
  bool AwaitWatching(const httplib::Request &req, Job &job);
  /// Server-sent events: a chunk per batch of new text, then the end.
  void Stream(httplib::Response &res, std::shared_ptr<Job> job, Reply r,
              bool include_usage);
  /// A finished job's time to first token and time per token, for /metrics.
  void Record(const Job &job);
  void Models(httplib::Response &res);
  void MetricsText(httplib::Response &res);
  /// GET /v1/duck/status (StatusPage.h) and the page's files.
  void StatusJson(const httplib::Request &req, httplib::Response &res);
  void PageRoutes();

  const ServeOptions &o_;
  std::ostream &log_;
  std::mutex log_mu_;
  std::unique_ptr<Session> ses_;
  std::unique_ptr<Batcher> batcher_;
  httplib::Server http_;
  std::atomic<State> state_{State::kPreparing};
  std::atomic<uint64_t> next_id_{1};
  Metrics metrics_;
  ClusterStatus status_; // fed by the batcher's thread after each step
  int64_t created_ = 0;
  std::vector<int32_t> eos_, eos_chat_;
  int32_t think_open_ = -1, think_close_ = -1; // Qwen3's <think>, </think>
  // DeepSeek's tool calls (a DeepSeek checkpoint whose template reads
  // 'tools'): each marker as a grammar spells it, and the marker tokens'
  // bytes (ToolCalls.h).
  bool ds_tools_ = false;
  MarkerSpelling ds_spelling_;
  std::vector<std::pair<int32_t, unsigned char>> ds_markers_;
  int listen_fd_ = -1;       // the bound socket (Listen)
};

bool Server::Authorized(const httplib::Request &req, httplib::Response &res) {
  if (o_.api_key.empty())
    return true;
  const std::string want = "Bearer " + o_.api_key;
  if (req.get_header_value("Authorization") == want)
    return true;
  SetError(res, 401,
           req.has_header("Authorization")
               ? "Incorrect API key provided"
               : "Missing API key: send 'Authorization: Bearer <key>'",
           "authentication_error", nullptr, "invalid_api_key");
  return false;
}

bool Server::Ready(httplib::Response &res) {
  const State s = state_.load();
  if (s == State::kReady)
    return true;
  SetError(res, 503,
           s == State::kPreparing ? "the model is still being prepared"
                                  : "the server is shutting down",
           "server_error", nullptr, "unavailable");
  return false;
}

void Server::Models(httplib::Response &res) {
  json m = {{"id", ses_->name()},
            {"object", "model"},
            {"created", created_},
            {"owned_by", "duck"}};
  res.set_content(Dump(json{{"object", "list"}, {"data", json::array({m})}}),
                  "application/json");
}

/// A field's error, answered as a 400; false, for the parsers to return.
bool Bad(httplib::Response &res, const FieldError &e) {
  SetError(res, 400, e.message, "invalid_request_error", e.param.c_str());
  return false;
}

/// The token counts an answer reports.
json Usage(const Job &job) {
  return json{{"prompt_tokens", job.prompt_tokens},
              {"completion_tokens", job.completion_tokens},
              {"total_tokens", job.prompt_tokens + job.completion_tokens},
              {"prompt_tokens_details",
               {{"cached_tokens", job.cached_tokens.load()}}}};
}

/// What every part of one request's answer repeats: its id, time, model
/// and kind (chat or completion).
struct Reply {
  std::string id;
  int64_t created = 0;
  std::string model;
  bool chat = false;

  /// One server-sent event: new text (a completion) or a delta (chat).
  std::string Chunk(const json &delta_or_text, const json &finish,
                    json logprobs = nullptr) const {
    json choice = {{"index", 0}, {"finish_reason", finish}};
    if (chat) {
      choice["delta"] = delta_or_text;
      if (!logprobs.is_null())
        choice["logprobs"] = std::move(logprobs);
    } else {
      choice["text"] = delta_or_text;
      choice["logprobs"] = std::move(logprobs);
    }
    json c = {{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({choice})}};
    return absl::StrCat("data: ", Dump(c), "\n\n");
  }
};

/// The log probabilities of the tokens a stream has not sent yet (null
/// when the request asked for none); they go with the next chunk.
json PendingLogprobs(Job &job, bool chat) {
  if (!job.want_logprobs)
    return nullptr;
  json lp = LogprobsJson(chat, job.logprobs, job.lp_sent, job.logprobs.size(),
                         &job.lp_offset);
  job.lp_sent = job.logprobs.size();
  return lp;
}

/// A tool call's id, type and function name, with these arguments.
json ToolCallJson(const Job &job, const Reply &r, std::string arguments) {
  return json{{"id", absl::StrCat("call_", r.id.substr(r.id.find('-') + 1))},
              {"type", "function"},
              {"function",
               {{"name", job.call_name}, {"arguments", std::move(arguments)}}}};
}

/// The finish reason an answer reports: "tool_calls" once a call closed.
std::string FinishName(const Job &job) {
  return job.parser->call_complete() ? "tool_calls" : FinishReasonName(job.why);
}

/// The chat stream's deltas for the parts of the answer not sent yet:
/// reasoning and content together, then the tool call's first chunk (id,
/// type, name), then a piece of its arguments. The log probabilities of
/// the tokens since the last chunk go with the first.
std::string UnsentChunks(Job &job, const Reply &r) {
  std::string out;
  auto send = [&](json delta) {
    out += r.Chunk(std::move(delta), nullptr,
                   out.empty() ? PendingLogprobs(job, r.chat) : json());
  };
  json text = json::object();
  if (job.reasoning.size() > job.reasoning_sent)
    text["reasoning_content"] = job.reasoning.substr(job.reasoning_sent);
  if (job.content.size() > job.content_sent)
    text["content"] = job.content.substr(job.content_sent);
  job.reasoning_sent = job.reasoning.size();
  job.content_sent = job.content.size();
  if (!text.empty())
    send(std::move(text));
  if (job.call_started && !job.name_sent) {
    json c = ToolCallJson(job, r, "");
    c["index"] = 0;
    send(json{{"tool_calls", json::array({c})}});
    job.name_sent = true;
  }
  if (job.arguments.size() > job.arguments_sent) {
    json c = {{"index", 0},
              {"function",
               {{"arguments", job.arguments.substr(job.arguments_sent)}}}};
    send(json{{"tool_calls", json::array({c})}});
    job.arguments_sent = job.arguments.size();
  }
  return out;
}

/// The events that end a stream: the error, or the finish reason (and the
/// usage, when asked for); then [DONE].
std::string StreamEnd(Job &job, const Reply &r, bool include_usage) {
  std::string out;
  if (job.why == FinishReason::kError || job.why == FinishReason::kCancelled) {
    json e = {{"error",
               {{"message", job.why == FinishReason::kError
                                ? std::string(job.error.message())
                                : "the request was cancelled"},
                {"type", "server_error"},
                {"param", nullptr},
                {"code", job.why == FinishReason::kError
                             ? json(nullptr)
                             : json("unavailable")}}}};
    out += absl::StrCat("data: ", Dump(e), "\n\n");
  } else {
    out += r.Chunk(r.chat ? json::object() : json(""), FinishName(job),
                   PendingLogprobs(job, r.chat));
    if (include_usage) {
      json u = {{"id", r.id},
                {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", r.created},
                {"model", r.model},
                {"choices", json::array()},
                {"usage", Usage(job)}};
      out += absl::StrCat("data: ", Dump(u), "\n\n");
    }
  }
  out += "data: [DONE]\n\n";
  return out;
}

void Server::Generate(const httplib::Request &req, httplib::Response &res,
                      const httplib::ContentReader &reader, bool chat) {
  std::string body;
  if (!ReadBody(reader, res, &body) || !Authorized(req, res) || !Ready(res))
    return;
  json b = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (b.is_discarded() || !b.is_object()) {
    SetError(res, 400, "the request body is not a JSON object",
             "invalid_request_error");
    return;
  }
  Params p;
  p.ordered = Ordered(body);
  if (!ParseRequest(b, chat, res, &p))
    return;
  std::shared_ptr<Job> job = Submit(p, chat, res);
  if (!job)
    return;
  Reply r;
  r.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", next_id_.fetch_add(1));
  r.created = (int64_t)std::time(nullptr);
  r.model = ses_->name();
  r.chat = chat;
  if (p.stream)
    Stream(res, std::move(job), std::move(r), p.include_usage);
  else
    Answer(req, res, *job, r);
}

bool Server::ReadBody(const httplib::ContentReader &reader,
                      httplib::Response &res, std::string *body) {
  bool tooLarge = false;
  const bool read = reader([&](const char *data, size_t n) {
    if (body->size() + n > o_.max_body_bytes) {
      tooLarge = true;
      return false;
    }
    body->append(data, n);
    return true;
  });
  if (tooLarge || res.status == 413) {
    res.set_header("Connection", "close");
    SetError(res, 413, "the request body is too large", "invalid_request_error",
             nullptr, "request_too_large");
    return false;
  }
  if (!read) {
    res.set_header("Connection", "close");
    if (res.status == 415)
      SetError(res, 415, "the request body's Content-Encoding is not supported",
               "invalid_request_error");
    else
      SetError(res, 400, "the request body could not be read",
               "invalid_request_error");
    return false;
  }
  return true;
}

bool Server::ParseRequest(const json &b, bool chat, httplib::Response &res,
                          Params *p) {
  if (auto e = ParseResponseFormat(b, p))
    return Bad(res, *e);
  if (chat)
    if (auto e = ParseToolFields(ses_->chat_format(),
                                 ds_tools_ ? &ds_spelling_ : nullptr, p))
      return Bad(res, *e);
  if (chat)
    if (auto e = ParseReasoning(b, p))
      return Bad(res, *e);
  if (!(chat ? PromptFromMessages(b, res, p) : PromptFromCompletion(b, res, p)))
    return false;
  const uint32_t context = ses_->max_seq();
  const char *field = chat ? "messages" : "prompt";
  if (p->prompt.empty())
    return Bad(res, {field, "the prompt is empty"});
  if (p->prompt.size() + 1 > context)
    return Bad(res, {field, absl::StrCat("the prompt has ", p->prompt.size(),
                                         " tokens; this model's context here "
                                         "is ",
                                         context, " (duckrun serve --max-seq)")});
  if (auto e = ParseCommon(b, context, p))
    return Bad(res, *e);
  if (auto e = ParseUnsupported(b, chat))
    return Bad(res, *e);
  if (auto e = ParseLogprobs(b, chat, p))
    return Bad(res, *e);
  if (auto e = ParsePenalties(b, ses_->model().vocab(), p))
    return Bad(res, *e);
  const uint32_t room = context - (uint32_t)p->prompt.size();
  p->max_tokens = p->max_tokens ? std::min(p->max_tokens, room) : room;
  uint32_t shortest = p->grammar ? p->grammar->MinLength() : 0;
  if (!p->tool_grammars.empty() &&
      p->tools.choice != ToolRequest::Choice::kAuto) {
    shortest = UINT32_MAX;
    for (const auto &g : p->tool_grammars)
      shortest = std::min(shortest, g->MinLength());
  }
  if (p->max_tokens < shortest)
    return Bad(res, {b.contains("max_completion_tokens")
                         ? "max_completion_tokens"
                         : "max_tokens",
                     absl::StrCat("the shortest ",
                                  p->grammar ? "JSON that 'response_format' "
                                               "allows"
                                             : "tool call",
                                  " takes ", shortest,
                                  " tokens; the request allows ",
                                  p->max_tokens)});
  return true;
}

namespace {
/// What the checkpoint's chat template is rendered with: the messages as
/// sent (content as text, "" for null, as vLLM does; developer as
/// system), the tools, and 'chat_template_kwargs' (enable_thinking a
/// boolean).
std::optional<FieldError> TemplateInput(const json &b, const Params &p,
                                        nlohmann::ordered_json *out_messages,
                                        ChatTemplateArgs *out_args) {
  // The body in its members' order (tool-call arguments keep theirs).
  const nlohmann::ordered_json body =
      p.ordered.is_object() ? p.ordered
                            : nlohmann::ordered_json::parse(b.dump());
  *out_messages = body["messages"];
  // 'developer' speaks as 'system' (OpenAI's newer name for it), as in
  // the built-in formats: templates know only the older roles.
  for (auto &m : *out_messages) {
    m["content"] = *ContentText(json::parse(m["content"].dump()));
    if (m["role"] == "developer")
      m["role"] = "system";
  }
  if (!p.tools.tools.empty())
    out_args->tools = nlohmann::ordered_json(p.tools.tools);
  if (!body.contains("chat_template_kwargs") ||
      body["chat_template_kwargs"].is_null())
    return std::nullopt;
  const nlohmann::ordered_json &kw = body["chat_template_kwargs"];
  if (!kw.is_object())
    return FieldError{"chat_template_kwargs",
                      "'chat_template_kwargs' must be an object"};
  for (auto it = kw.begin(); it != kw.end(); ++it) {
    if (it.key() != "enable_thinking")
      return FieldError{"chat_template_kwargs",
                        absl::StrCat("chat_template_kwargs: '", it.key(),
                                     "' is not served (only "
                                     "'enable_thinking')")};
    if (!it.value().is_boolean())
      return FieldError{"chat_template_kwargs",
                        "chat_template_kwargs: 'enable_thinking' must be "
                        "true or false"};
    out_args->enable_thinking = it.value().get<bool>();
  }
  return std::nullopt;
}
} // namespace

bool Server::PromptFromMessages(const json &b, httplib::Response &res,
                                Params *p) {
  if (!b.contains("messages") || !b["messages"].is_array() ||
      b["messages"].empty())
    return Bad(res, {"messages", "'messages' must be a non-empty array"});
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < b["messages"].size(); ++i) {
    const json &m = b["messages"][i];
    std::optional<std::string> content;
    if (m.is_object() && m.contains("content"))
      content = ContentText(m["content"]);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
        !content)
      return Bad(res, {"messages",
                       absl::StrCat("messages[", i,
                                    "] needs a 'role' and a text 'content'")});
    messages.push_back({m["role"].get<std::string>(), *content});
  }
  // The checkpoint's own chat template, when it has one that says the
  // request's tools (if any); else the built-in format below.
  const CheckpointTemplate *tmpl = ses_->chat_template();
  if (tmpl && (p->tools.tools.empty() || tmpl->RendersTools())) {
    nlohmann::ordered_json msgs;
    ChatTemplateArgs args;
    if (auto e = TemplateInput(b, *p, &msgs, &args))
      return Bad(res, *e);
    auto ids = ses_->EncodeChatTemplate(msgs, args);
    if (!ids.ok())
      return Bad(res, {"messages", std::string(ids.status().message())});
    p->prompt = std::move(*ids);
    return true;
  }
  if (b.contains("chat_template_kwargs") &&
      !b["chat_template_kwargs"].is_null())
    return Bad(res, {"chat_template_kwargs",
                     "this model has no chat template of its own (or one "
                     "Duck cannot render), so 'chat_template_kwargs' has "
                     "nothing to go to"});
  // Qwen3's tools, tool calls and tool results (ToolCalls.h).
  if (ses_->chat_format() == ChatFormat::kChatMl)
    if (auto e = ChatMlMessages(b["messages"], ToolsSystemText(p->tools),
                                &messages))
      return Bad(res, {e->param, e->message});
  // The model's own chat format (ChatTemplate.h); a message it cannot
  // say is the client's error.
  auto ids = ses_->EncodeChat(messages);
  if (!ids.ok()) {
    if (absl::IsInvalidArgument(ids.status()))
      return Bad(res, {"messages", std::string(ids.status().message())});
    SetError(res, 500, std::string(ids.status().message()), "server_error");
    return false;
  }
  p->prompt = std::move(*ids);
  return true;
}

bool Server::PromptFromCompletion(const json &b, httplib::Response &res,
                                  Params *p) {
  if (!b.contains("prompt"))
    return Bad(res, {"prompt", "'prompt' is required"});
  const json &pr = b["prompt"];
  std::string text;
  if (pr.is_string()) {
    text = pr.get<std::string>();
  } else if (pr.is_array() && pr.size() == 1 && pr[0].is_string()) {
    text = pr[0].get<std::string>();
  } else if (pr.is_array() && !pr.empty() &&
             std::all_of(pr.begin(), pr.end(), [](const json &x) {
               return x.is_number_integer();
             })) {
    for (const json &x : pr) {
      const int64_t id = x.get<int64_t>();
      if (id < 0 || id >= (int64_t)ses_->model().vocab())
        return Bad(res, {"prompt", absl::StrCat("token id ", id,
                                                " is outside the vocabulary")});
      p->prompt.push_back((int32_t)id);
    }
  } else {
    return Bad(res, {"prompt", "'prompt' must be a string, one string in an "
                               "array, or an array of token ids"});
  }
  if (p->prompt.empty()) {
    auto ids = ses_->EncodePrompt(text);
    if (!ids.ok()) {
      SetError(res, 500, std::string(ids.status().message()), "server_error");
      return false;
    }
    p->prompt = std::move(*ids);
  }
  return true;
}

std::shared_ptr<Job> Server::Submit(Params &p, bool chat,
                                    httplib::Response &res) {
  auto job = std::make_shared<Job>();
  job->prompt_tokens = (uint32_t)p.prompt.size();
  job->stops = p.stops;
  job->decoder = std::make_unique<StreamDecoder>(*ses_->tokenizer());
  job->t_submit = now();
  GenRequest g;
  g.prompt = std::move(p.prompt);
  g.max_tokens = p.max_tokens;
  g.sampler = p.sampler;
  if (!p.ignore_eos)
    g.stop_ids = chat ? eos_chat_ : eos_;
  job->tools = p.tool_grammars.empty() ? Job::Tools::kNone
               : p.tools.choice == ToolRequest::Choice::kAuto
                   ? Job::Tools::kAuto
                   : Job::Tools::kForced;
  job->parser = std::make_unique<AnswerParser>(
      chat ? AnswerOptions(p, job->tools, g.prompt) : AnswerParser::Options());
  if (p.grammar || job->tools != Job::Tools::kNone ||
      p.presence_penalty != 0 ||
      p.frequency_penalty != 0 || !p.logit_bias.empty()) {
    ChooserOptions co;
    co.presence_penalty = p.presence_penalty;
    co.frequency_penalty = p.frequency_penalty;
    co.logit_bias = std::move(p.logit_bias);
    if (p.grammar)
      co.grammars.push_back(p.grammar);
    co.grammars.insert(co.grammars.end(), p.tool_grammars.begin(),
                       p.tool_grammars.end());
    if (job->tools == Job::Tools::kAuto)
      co.trigger = ds_tools_ ? ds_spelling_[kCallsBegin] : kToolCallMarker;
    if (ds_tools_ && job->tools != Job::Tools::kNone)
      co.markers = ds_markers_;
    co.sampler = p.sampler;
    co.stop_ids = g.stop_ids;
    g.chooser = std::make_shared<TokenChooser>(std::move(co),
                                               *ses_->tokenizer());
  }
  g.on_token = [job](int32_t id) { return OnToken(*job, id); };
  if (p.logprobs) {
    job->want_logprobs = true;
    job->tokenizer = ses_->tokenizer();
    g.top_logprobs = p.top_logprobs;
    g.on_logprobs = [job](int32_t id, const TokenLogprobs &lp) {
      OnLogprobs(*job, id, lp);
    };
  }
  g.speculative = p.speculative >= 0 ? (uint32_t)p.speculative
                                     : o_.speculative;
  g.on_admit = [job](uint32_t cached) { job->cached_tokens = cached; };
  g.on_done = [job](FinishReason why, const absl::Status &e) {
    OnDone(*job, why, e);
  };
  auto id = batcher_->Submit(std::move(g));
  if (!id.ok()) {
    const int status = absl::IsResourceExhausted(id.status()) ? 429
                       : absl::IsInvalidArgument(id.status()) ? 400
                                                              : 503;
    SetError(res, status, std::string(id.status().message()),
             status == 400 ? "invalid_request_error" : "server_error");
    return nullptr;
  }
  job->id = *id;
  return job;
}

void Server::SetUpDeepSeekTools() {
  const ChatFormat f = ses_->chat_format();
  const CheckpointTemplate *tmpl = ses_->chat_template();
  ds_tools_ = (f == ChatFormat::kDeepSeekV3 || f == ChatFormat::kDeepSeekV32) &&
              tmpl && tmpl->RendersTools();
  if (!ds_tools_)
    return;
  const Tokenizer &tok = *ses_->tokenizer();
  for (int m = 0; m < kDeepSeekMarkers; ++m) {
    const std::string_view text = DeepSeekMarkerText(m);
    const int32_t id = tok.TokenId(text);
    // One token: the grammar's byte for it; else its text, in pieces.
    if (id >= 0 && tok.TokenBytes(id) == text) {
      const unsigned char byte = (unsigned char)(kMarkerByte + m);
      ds_spelling_.push_back(std::string(1, (char)byte));
      ds_markers_.emplace_back(id, byte);
    } else {
      ds_spelling_.push_back(std::string(text));
    }
  }
}

AnswerParser::Options
Server::AnswerOptions(const Params &p, Job::Tools tools,
                      const std::vector<int32_t> &prompt) const {
  AnswerParser::Options o;
  o.calls = tools == Job::Tools::kForced ? AnswerParser::Calls::kForced
            : tools == Job::Tools::kAuto ? AnswerParser::Calls::kAuto
                                         : AnswerParser::Calls::kNone;
  if (ds_tools_)
    o.syntax = AnswerParser::Syntax::kDeepSeek;
  o.reasoning = p.reasoning && think_open_ >= 0 && think_close_ >= 0;
  const Tokenizer *tok = ses_->tokenizer();
  o.in_think = o.reasoning &&
               PromptOpensThink(prompt, think_open_, think_close_,
                                [tok](int32_t t) { return tok->IsSpecial(t); });
  return o;
}

void Server::Record(const Job &job) {
  std::lock_guard<std::mutex> lock(metrics_.mu);
  if (job.completion_tokens > 0)
    metrics_.ttft.Add(job.t_first - job.t_submit);
  if (job.completion_tokens > 1)
    metrics_.tpot.Add((job.t_last - job.t_first) /
                      (job.completion_tokens - 1));
}

bool Server::AwaitWatching(const httplib::Request &req, Job &job) {
  int fd = ConnectionFd(req);
  bool gone = false;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(job.mu);
      if (job.cv.wait_for(lock, std::chrono::milliseconds(200),
                          [&] { return job.done; }))
        break;
    }
    if (fd >= 0 && PeerGone(fd)) {
      batcher_->Cancel(job.id);
      gone = true;
      fd = -1;
    }
  }
  return gone;
}

void Server::Answer(const httplib::Request &req, httplib::Response &res,
                    Job &job, const Reply &r) {
  const bool gone = AwaitWatching(req, job);
  Record(job);
  if (job.why == FinishReason::kError) {
    SetError(res, 500, std::string(job.error.message()), "server_error");
    return;
  }
  if (job.why == FinishReason::kCancelled) {
    if (gone) // nobody reads this; it is counted as what it was
      SetError(res, 499, "the client closed the connection",
               "invalid_request_error");
    else
      SetError(res, 503,
               "the request was cancelled (the server is shutting down)",
               "server_error", nullptr, "unavailable");
    return;
  }
  json choice = {
      {"index", 0}, {"logprobs", nullptr}, {"finish_reason", FinishName(job)}};
  if (job.want_logprobs)
    choice["logprobs"] = LogprobsJson(r.chat, job.logprobs, 0,
                                      job.logprobs.size(), &job.lp_offset);
  if (r.chat) {
    // The parts a stream sends (AnswerParser.h), whole.
    json m = {{"role", "assistant"}, {"content", job.content}};
    if (job.parser->had_reasoning())
      m["reasoning_content"] = job.reasoning;
    if (job.call_started) {
      if (job.content.empty())
        m["content"] = nullptr;
      m["tool_calls"] = json::array({ToolCallJson(job, r, job.arguments)});
    }
    choice["message"] = std::move(m);
  } else {
    choice["text"] = job.text;
  }
  json out = {{"id", r.id},
              {"object", r.chat ? "chat.completion" : "text_completion"},
              {"created", r.created},
              {"model", r.model},
              {"choices", json::array({choice})},
              {"usage", Usage(job)}};
  res.set_content(Dump(out), "application/json");
}

void Server::Stream(httplib::Response &res, std::shared_ptr<Job> job, Reply r,
                    bool include_usage) {
  struct StreamState {
    bool first = true, finished = false;
  };
  auto st = std::make_shared<StreamState>();
  Batcher *batcher = batcher_.get();
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [=](size_t, httplib::DataSink &sink) -> bool {
        // Nothing may escape into the library's writer thread.
        try {
          std::unique_lock<std::mutex> lock(job->mu);
          job->cv.wait_for(lock, std::chrono::milliseconds(200),
                           [&] { return job->done || Unsent(*job); });
          std::string out;
          if (st->first && r.chat)
            out += r.Chunk(json{{"role", "assistant"},
                                {"content", job->tools == Job::Tools::kForced
                                                ? json()
                                                : json("")}},
                           nullptr);
          st->first = false;
          if (r.chat) {
            out += UnsentChunks(*job, r);
          } else if (Unsent(*job)) {
            std::string piece = job->content.substr(job->content_sent);
            job->content_sent = job->content.size();
            out += r.Chunk(json(piece), nullptr, PendingLogprobs(*job, false));
          }
          const bool done = job->done;
          lock.unlock();
          if (done) {
            lock.lock(); // the last entries go with the finish chunk
            out += StreamEnd(*job, r, include_usage);
            lock.unlock();
          }
          // A client that went away frees its slot.
          if (!sink.is_writable() ||
              (!out.empty() && !sink.write(out.data(), out.size()))) {
            batcher->Cancel(job->id);
            return false;
          }
          if (done) {
            st->finished = true;
            Record(*job);
            sink.done();
          }
          return true;
        } catch (const std::exception &) {
          batcher->Cancel(job->id);
          return false;
        }
      },
      [=](bool) {
        if (!st->finished)
          batcher->Cancel(job->id); // the connection ended early
      });
}

/// One Prometheus metric: its help, type and value.
void AppendMetric(std::string *out, const char *name, const char *help,
                  double v, const char *type = "gauge") {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type,
                  "\n", name, " ", v, "\n");
}

/// Speculative decoding's metrics: drafts, verify steps, and the rates
/// they make.
void AppendSpeculativeMetrics(std::string *out, const BatcherStats &bs) {
  AppendMetric(out, "duck_drafts_proposed_total",
               "Speculative drafts sent with a next token.",
               (double)bs.drafts_proposed, "counter");
  AppendMetric(out, "duck_drafts_accepted_total",
               "Speculative drafts the model would have produced (accepted).",
               (double)bs.drafts_accepted, "counter");
  AppendMetric(out, "duck_verify_steps_total",
               "A sequence's next token and its drafts verified in one step.",
               (double)bs.verify_steps, "counter");
  AppendMetric(out, "duck_draft_acceptance",
               "Drafts accepted of those proposed so far (0 before any).",
               bs.drafts_proposed
                   ? (double)bs.drafts_accepted / bs.drafts_proposed
                   : 0.0);
  AppendMetric(out, "duck_tokens_per_verify_step",
               "Tokens a verify step gave a sequence: its accepted drafts "
               "and the token after them (0 before any).",
               bs.verify_steps
                   ? (double)(bs.drafts_accepted + bs.verify_steps) /
                         bs.verify_steps
                   : 0.0);
}

void Server::MetricsText(httplib::Response &res) {
  std::string out;
  const BatcherStats bs = batcher_ ? batcher_->Stats() : BatcherStats();
  std::lock_guard<std::mutex> lock(metrics_.mu);
  out += "# HELP duck_requests_total Generation requests by endpoint and "
         "status.\n# TYPE duck_requests_total counter\n";
  for (const auto &[k, v] : metrics_.requests) {
    const size_t c = k.find(',');
    absl::StrAppend(&out, "duck_requests_total{endpoint=\"", k.substr(0, c),
                    "\",status=\"", k.substr(c + 1), "\"} ", v, "\n");
  }
  auto gauge = [&](const char *name, const char *help, double v,
                   const char *type = "gauge") {
    AppendMetric(&out, name, help, v, type);
  };
  gauge("duck_prompt_tokens_total", "Prompt tokens prefilled.",
        (double)bs.prompt_tokens, "counter");
  gauge("duck_cached_prompt_tokens_total",
        "Prompt tokens taken from a slot's KV cache or the prefix store "
        "(prefix reuse).",
        (double)bs.cached_tokens, "counter");
  gauge("duck_prefix_store_bytes",
        "KV cache bytes the prefix store holds (at most --kv-budget).",
        (double)bs.store.bytes);
  gauge("duck_prefix_store_budget_bytes", "The prefix store's --kv-budget.",
        (double)bs.store.budget);
  gauge("duck_prefix_store_entries",
        "Entries (radix tree nodes, each a run of tokens) in the prefix "
        "store.",
        (double)bs.store.entries);
  gauge("duck_prefix_store_tokens", "Positions the prefix store holds.",
        (double)bs.store.tokens);
  gauge("duck_prefix_store_evicted_tokens_total",
        "Positions evicted from the prefix store (least recently used).",
        (double)bs.store.evicted_tokens, "counter");
  AppendSpeculativeMetrics(&out, bs);
  gauge("duck_generated_tokens_total", "Tokens generated.",
        (double)bs.generated_tokens, "counter");
  gauge("duck_steps_total",
        "Engine steps (each one step on the ducks per "
        "FFN layer).",
        (double)bs.steps, "counter");
  gauge("duck_step_rows_total", "Rows carried by the steps.", (double)bs.rows,
        "counter");
  gauge("duck_queue_depth", "Requests waiting for a sequence slot.", bs.queued);
  gauge("duck_active_sequences", "Sequences prefilling or decoding.",
        bs.active);
  gauge("duck_batch_decode_rows_max",
        "Most sequences decoded together in "
        "one step so far.",
        bs.max_decode_rows);
  gauge("duck_ready", "1 when the ducks are prepared and serving.",
        state_.load() == State::kReady ? 1 : 0);
  gauge("duck_judge_gap_us",
        "Median dispatch gap of the recent duck steps "
        "(microseconds).",
        std::max(0.0, status_.JudgeGapUs()));
  out += "# HELP duck_kernel_gparam_per_second fp9 weights a second in each "
         "duck's kernels (billions).\n# TYPE duck_kernel_gparam_per_second "
         "gauge\n";
  const std::vector<double> gps = status_.Gparams();
  for (size_t r = 0; r < gps.size(); ++r)
    absl::StrAppend(&out, "duck_kernel_gparam_per_second{duck=\"", r, "\"} ",
                    std::max(0.0, gps[r]), "\n");
  metrics_.ttft.Write(out, "duck_ttft_seconds",
                      "Time to first token, from the request's arrival.");
  metrics_.tpot.Write(out, "duck_tpot_seconds",
                      "Time a generated token after the first, a request.");
  res.set_content(out, "text/plain; version=0.0.4");
}

void Server::StatusJson(const httplib::Request &req, httplib::Response &res) {
  if (!Authorized(req, res))
    return;
  const BatcherStats bs = batcher_ ? batcher_->Stats() : BatcherStats();
  const State s = state_.load();
  const char *state = s == State::kReady       ? "ok"
                      : s == State::kPreparing ? "preparing"
                                               : "stopping";
  json out = status_.Json(bs, state, now());
  out["model"] = ses_->name();
  res.set_header("Cache-Control", "no-store");
  res.set_content(Dump(out), "application/json");
}

void Server::PageRoutes() {
  // The page's files hold no data: they are served without the key, and
  // the page asks for it to call /v1/duck/status and the API.
  for (const char *path : {"/", "/app.js", "/style.css"})
    http_.Get(path, [](const httplib::Request &req, httplib::Response &res) {
      const PageFile *f = FindPageFile(req.path);
      if (!f) {
        SetError(res, 404, "no such file", "invalid_request_error");
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_content(reinterpret_cast<const char *>(f->data), f->size,
                      f->type);
    });
  http_.Get("/v1/duck/status",
            [this](const httplib::Request &req, httplib::Response &res) {
              StatusJson(req, res);
            });
}

void Server::Routes() {
  http_.Get(
      "/health", [this](const httplib::Request &, httplib::Response &res) {
        const State s = state_.load();
        res.status = s == State::kReady ? 200 : 503;
        res.set_content(json{{"status", s == State::kReady       ? "ok"
                                        : s == State::kPreparing ? "preparing"
                                                                 : "stopping"}}
                            .dump(),
                        "application/json");
      });
  http_.Get("/metrics", [this](const httplib::Request &,
                               httplib::Response &res) { MetricsText(res); });
  http_.Get("/v1/models",
            [this](const httplib::Request &req, httplib::Response &res) {
              if (Authorized(req, res))
                Models(res);
            });
  // Every generation request is counted, whatever its status (a stream's
  // is 200: its status line goes out before the answer).
  http_.Post("/v1/chat/completions",
             [this](const httplib::Request &req, httplib::Response &res,
                    const httplib::ContentReader &reader) {
               Generate(req, res, reader, /*chat=*/true);
               metrics_.Count("chat", res.status == -1 ? 200 : res.status);
             });
  http_.Post("/v1/completions", [this](const httplib::Request &req,
                                       httplib::Response &res,
                                       const httplib::ContentReader &reader) {
    Generate(req, res, reader, /*chat=*/false);
    metrics_.Count("completions", res.status == -1 ? 200 : res.status);
  });
  // Called once an answer is written.
  http_.set_logger(
      [](const httplib::Request &req, const httplib::Response &res) {
        if (res.get_header_value("Connection") == "close")
          StopReading(req);
      });
  // A body without a Content-Length on any other route the library would
  // read whole before routing (no --max-request-bytes): refused unread.
  http_.set_pre_routing_handler([](const httplib::Request &req,
                                   httplib::Response &res) {
    const bool generation =
        req.method == "POST" &&
        (req.path == "/v1/chat/completions" || req.path == "/v1/completions");
    const bool hasBody =
        req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
        (req.method == "DELETE" && req.has_header("Content-Length")) ||
        req.has_header("Transfer-Encoding");
    if (generation || !hasBody ||
        (req.has_header("Content-Length") &&
         !req.has_header("Transfer-Encoding")))
      return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("Connection", "close");
    SetError(res, 411,
             absl::StrCat("no route ", req.method, " ", req.path,
                          " takes a body without a Content-Length"),
             "invalid_request_error", nullptr, "length_required");
    return httplib::Server::HandlerResponse::Handled;
  });
  // Whatever the library answers on its own (404, 413, 400 for a bad
  // request line) gets an OpenAI-shaped body too.
  http_.set_error_handler([](const httplib::Request &req,
                             httplib::Response &res) {
    if (!res.body.empty())
      return;
    if (res.status == 404)
      SetError(res, 404, absl::StrCat("no route ", req.method, " ", req.path),
               "invalid_request_error", nullptr, "not_found");
    else if (res.status == 413)
      SetError(res, 413, "the request body is too large",
               "invalid_request_error", nullptr, "request_too_large");
    else
      SetError(res, res.status, "bad request", "invalid_request_error");
  });
  http_.set_exception_handler(
      [](const httplib::Request &, httplib::Response &res, std::exception_ptr) {
        SetError(res, 500, "internal error", "server_error");
      });
}

absl::Status Server::Listen() {
  Routes();
  PageRoutes();
  http_.set_payload_max_length(o_.max_body_bytes);
  const size_t threads = o_.parallel + o_.queue_limit + 1024;
  http_.set_socket_options([this](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd_ = sock;
  });
  int port = o_.port;
  if (o_.port == 0)
    port = http_.bind_to_any_port(o_.host);
  else if (!http_.bind_to_port(o_.host, o_.port))
    port = -1;
  if (port <= 0)
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", o_.host, ":", o_.port,
                     " (taken, or not an address of this machine)"));
  if (listen_fd_ >= 0)
    ::listen(listen_fd_, 512); // the library's backlog of 5 drops bursts of clients
  http_.new_task_queue = [threads, port] {
    return new ConnectionPool(threads, port);
  };
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    log_ << "duckrun serve: listening on http://" << o_.host << ":" << port
         << " (model '" << ses_->name() << "', preparing the ducks)"
         << std::endl;
  }
  return absl::OkStatus();
}

/// --kv-budget beside the KV caches at full length (`caches` bytes): the
/// bytes asked for, or (kKvBudgetAuto) 2 GiB but at most a quarter of the
/// memory this machine has available now and what the caches leave of it.
/// A budget asked for that does not fit beside the caches is refused
/// unless `overcommit` (--kv-overcommit).
absl::StatusOr<uint64_t> KvBudget(uint64_t asked, uint64_t caches,
                                  bool overcommit) {
  const uint64_t available = MemAvailableBytes(); // 0: unknown
  const uint64_t left = available > caches ? available - caches : 0;
  if (asked == kKvBudgetAuto)
    return available ? std::min({uint64_t{2} << 30, available / 4, left})
                     : uint64_t{2} << 30;
  if (overcommit || available == 0 || asked <= left)
    return asked;
  const double gib = double(1ull << 30);
  return absl::ResourceExhaustedError(absl::StrFormat(
      "--kv-budget %.2f GiB does not fit beside the KV caches (%.2f GiB at "
      "full length) in the %.2f GiB this machine has available; lower "
      "--kv-budget (at most %.2f GiB here, or auto), or pass "
      "--kv-overcommit to start anyway",
      double(asked) / gib, double(caches) / gib, double(available) / gib,
      double(left) / gib));
}

absl::StatusOr<uint64_t> Server::MakeBatcher(const SessionOptions &so) {
  DUCK_ASSIGN_OR_RETURN(const uint64_t budget,
                        KvBudget(o_.kv_budget,
                                 ses_->engine().saved_kv_bytes_per_token() *
                                     ses_->max_seq() * so.max_seqs,
                                 so.kv_overcommit));
  BatcherOptions bo;
  bo.parallel = so.max_seqs;
  bo.queue_limit = o_.queue_limit;
  bo.prefill_chunk = so.prefill_chunk;
  bo.kv_budget = budget;
  bo.mtp = o_.speculative_mtp;
  bo.mtp_drafts = std::max(1u, o_.speculative);
  batcher_ = std::make_unique<Batcher>(ses_->engine(), bo);
  status_.Start(*ses_, now());
  batcher_->SetAfterStep(
      [this] { status_.AfterStep(*ses_, batcher_->Stats(), now()); });
  return budget;
}

absl::Status Server::Run() {
  SessionOptions so = o_.session;
  so.max_seqs = std::max(1u, o_.parallel);
  so.keep_steps = 4096;
  auto ses = Session::Load(so);
  if (!ses.ok())
    return ses.status();
  ses_ = std::move(*ses);
  if (o_.speculative_mtp && !ses_->plan().def().mtp())
    return absl::FailedPreconditionError(
        "--speculative mtp: the plan has no MTP module (only DeepSeek "
        "checkpoints with num_nextn_predict_layers carry one; duckc compile "
        "--mtp on says what is missing)");
  if (!ses_->chat_template_note().empty())
    log_ << "duckrun serve: warning: " << ses_->chat_template_note() << "\n";
  if (!ses_->tokenizer())
    return absl::FailedPreconditionError(
        "duckrun serve needs a tokenizer (tokenizer.json next to the "
        "checkpoint, or --tokenizer FILE)");
  created_ = (int64_t)std::time(nullptr);
  eos_ = ses_->StopTokens(false);
  eos_chat_ = ses_->StopTokens(true);
  think_open_ = ses_->tokenizer()->TokenId("<think>");
  think_close_ = ses_->tokenizer()->TokenId("</think>");
  SetUpDeepSeekTools();

  // Listen first: /health says 503 while the ducks are prepared.
  if (absl::Status s = Listen(); !s.ok())
    return s;
  std::thread listener([this] { http_.listen_after_bind(); });
  auto stopHttp = [&] {
    http_.stop();
    listener.join();
  };

  if (absl::Status s = ses_->Start(log_); !s.ok()) {
    stopHttp();
    // Stopped while the ducks were prepared: a stop, not a failure.
    if (absl::IsCancelled(s) && o_.stop && o_.stop->load()) {
      ses_->Close();
      log_ << "duckrun serve: stopped while preparing the ducks ("
           << s.message() << ")" << std::endl;
      return absl::OkStatus();
    }
    return s;
  }
  auto budget = MakeBatcher(so);
  if (!budget.ok()) {
    stopHttp();
    ses_->Close();
    return budget.status();
  }
  std::thread worker([this] { batcher_->Run(); });
  state_.store(State::kReady);
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    log_ << absl::StrFormat("duckrun serve: ready (%u sequences at once, "
                            "context %u tokens); prefix store up to %.0f "
                            "MiB",
                            so.max_seqs, ses_->max_seq(),
                            (double)*budget / (1 << 20))
         << std::endl;
  }

  while (!(o_.stop && o_.stop->load()))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));

  // Graceful: no new requests, the running ones get the grace period.
  state_.store(State::kStopping);
  log_ << "duckrun serve: stopping; finishing running requests" << std::endl;
  const double deadline = now() + o_.shutdown_grace_seconds;
  while (batcher_->Busy() && now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  batcher_->Stop(); // cancels whatever is left
  worker.join();
  stopHttp();
  ses_->Close();
  log_ << "duckrun serve: stopped" << std::endl;
  return absl::OkStatus();
}

} // namespace

absl::Status Serve(const ServeOptions &opts, std::ostream &log) {
  Server s(opts, log);
  return s.Run();
}

} // namespace duck::runtime
