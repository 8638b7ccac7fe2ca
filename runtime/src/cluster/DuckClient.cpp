//===- DuckClient.cpp - the host's connection to a cluster of ducks -------===//
//
// All ducks are driven from the calling thread: requests are queued per
// connection and one loop (Pump) writes and reads every connection as it
// becomes ready (the transport's Wait: poll(2) over TCP), so a step
// reaches all ducks at once and the slowest one decides the wait. The
// bytes move through a DuckTransport (DuckTransport.h); the protocol
// (requests, replies, hello and its keys) is all here, through the frame
// codec (duck_rt/wire_codec.h).
//===----------------------------------------------------------------------===//
#include "duck/runtime/cluster/DuckClient.h"

#include "duck_rt/cast.h"
#include "duck_rt/wire_codec.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <unistd.h>

namespace duck::runtime {

using duckd::Part;

namespace {

const char *StatusName(int32_t s) {
  switch (s) {
  case DUCK_STATUS_OK: return "OK";
  case DUCK_STATUS_BAD_ABI: return "BAD_ABI";
  case DUCK_STATUS_BAD_INPUT: return "BAD_INPUT";
  case DUCK_STATUS_BAD_WEIGHTS: return "BAD_WEIGHTS";
  case DUCK_STATUS_OB_TOO_SMALL: return "OB_TOO_SMALL";
  case DUCK_STATUS_SCRATCH_TOO_SMALL: return "SCRATCH_TOO_SMALL";
  case DUCK_STATUS_BAD_MODE: return "BAD_MODE";
  default: return "UNKNOWN";
  }
}

absl::Status ErrorFor(uint32_t code, std::string message) {
  switch (code) {
  case DUCKD_ERR_BAD_ABI: return absl::FailedPreconditionError(message);
  case DUCKD_ERR_UNAUTHORIZED: return absl::PermissionDeniedError(message);
  case DUCKD_ERR_BUSY: return absl::UnavailableError(message);
  case DUCKD_ERR_NO_SESSION: return absl::FailedPreconditionError(message);
  case DUCKD_ERR_BAD_ELF: return absl::InvalidArgumentError(message);
  case DUCKD_ERR_STEP_CRASHED: return absl::AbortedError(message);
  case DUCKD_ERR_STEP_TIMEOUT: return absl::DeadlineExceededError(message);
  case DUCKD_ERR_CACHE: return absl::DataLossError(message);
  case DUCKD_ERR_TOO_LARGE: return absl::ResourceExhaustedError(message);
  default: return absl::InternalError(message);
  }
}

/// Sizes `outs` to `n` ducks with nothing of an earlier step in them.
void ClearOutputs(size_t n, std::vector<DuckOutput> *outs) {
  outs->resize(n);
  for (DuckOutput &o : *outs) {
    o.status = 0;
    o.ob.clear();
    o.kernel_ns.clear();
    o.worker_ns = 0;
    o.log.clear();
  }
}

/// This thread's CPU time (user and system), ns.
uint64_t ThreadCpuNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

/// A frame waiting to be written (header + payload parts).
struct OutFrame {
  duckd_frame_header header{};
  std::vector<uint8_t> owned;  // bytes this frame owns (prefix, chunk)
  std::vector<Part> parts;     // the payload, in order
  uint64_t total = 0, sent = 0;
  std::vector<std::vector<uint8_t>> *recycle = nullptr; // gets `owned` back
};

/// One duck connection.
struct Conn {
  DuckEndpoint ep;
  std::unique_ptr<DuckConnection> link; // null: closed
  std::string broken; // why the connection is unusable, if it is
  uint32_t next_id = 1;
  std::deque<OutFrame> out;
  std::deque<uint32_t> expect; // request ids awaiting replies, in order
  ReceivedFrame frame;         // the last whole frame (valid until the next)
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t session_id = 0;
  duckd::FrameKeys keys;   // frame authentication (docs/protocol.md)
  duckd::HostHello hello;  // the hello in flight, if any
  bool awaiting_hello = false;
  uint32_t cast_misses = 0; // cast steps missed in a row
  bool cast_off = false;    // plain steps only (missed cast_give_up)
  bool stage_cast = false;  // the pending stage reached it as a cast only
};

struct PrepareJob;

} // namespace

struct DuckClient::Impl {
  // The connections close with the Impl, also when Create fails halfway
  // (a duck that answered must not stay held by a client that gave up).
  DuckClientOptions opt;
  std::shared_ptr<DuckTransport> transport;
  std::vector<Conn> conns;
  std::vector<DuckHello> hellos;
  std::vector<uint8_t> elf; // one-shot mode: sent with every step
  bool opened = false;
  // Cast steps (opt.cast_address): the sender, the next batch's id (from a
  // random start, so that a batch of an earlier host is never taken for
  // one of ours) and what it did.
  std::unique_ptr<duckd::CastSender> cast;
  uint64_t next_cast_id = 0;
  CastStats cast_stats;
  DuckClient::StageStats stage_stats;
  // The bytes moved before the last Stage (its step's metrics count them).
  uint64_t stage_sent0 = 0, stage_recv0 = 0, stage_cast_bytes0 = 0;
  bool stage_pending = false;
  // The pending stage's cast batch (step_staged names it), if it went so.
  struct StageCast {
    bool sent = false;
    uint64_t id = 0, ib_bytes = 0;
    duckd::CastShape shape;
    uint8_t digest[DUCKD_CAST_DIGEST_BYTES] = {};
  } stage_cast;
  /// During a cast step: answers a duck's cast_missed by queueing the step
  /// again plainly (true: handled).
  using RetryFn = std::function<bool(size_t, const duckd_frame_header &,
                                     uint32_t, const std::string &)>;
  RetryFn retry;
  /// The step in flight's IBs, and each duck's whole step when staged
  /// (RetryStep's; valid during Step).
  absl::Span<const absl::Span<const uint8_t>> step_ibs, step_whole;
  /// A Step's retry: a stage's error absorbed, a missed cast or stage
  /// answered by sending the step again (its whole step when staged).
  bool RetryStep(size_t d, const duckd_frame_header &h, uint32_t code,
                 const std::string &why);

  using ReplyFn = std::function<absl::Status(size_t, const duckd_frame_header &,
                                             absl::Span<const uint8_t>)>;
  using RefillFn = std::function<absl::Status(size_t)>;

  std::string Name(size_t d) const {
    return absl::StrCat("duck ", conns[d].ep.ToString());
  }

  void Break(size_t d, const std::string &why) {
    Conn &c = conns[d];
    c.link.reset();
    c.broken = why;
    c.out.clear();
    c.expect.clear();
    c.frame = ReceivedFrame{};
    c.session_id = 0;
    c.keys = duckd::FrameKeys{};
    c.awaiting_hello = false;
  }

  absl::Status Usable(size_t d) const {
    if (!conns[d].link)
      return absl::UnavailableError(absl::StrCat(
          Name(d), ": connection closed earlier: ", conns[d].broken));
    return absl::OkStatus();
  }

  /// Queues a request; the payload parts must stay valid until Pump ends
  /// (or point into `owned`). A quiet one (`flags` DUCKD_FLAG_QUIET, a
  /// stage) awaits no reply.
  uint32_t Queue(size_t d, uint16_t type, std::vector<uint8_t> owned,
                 std::vector<Part> parts,
                 std::vector<std::vector<uint8_t>> *recycle = nullptr,
                 uint32_t flags = 0) {
    Conn &c = conns[d];
    OutFrame f;
    f.owned = std::move(owned);
    f.parts = std::move(parts);
    const uint32_t id = c.next_id++;
    f.header = duckd::MakeHeader(type, flags, id, f.parts, &c.keys);
    f.total = sizeof f.header + f.header.payload_bytes;
    f.recycle = recycle;
    c.out.push_back(std::move(f));
    if (!(flags & DUCKD_FLAG_QUIET))
      c.expect.push_back(id);
    return id;
  }

  /// Writes as much of the queue as the link takes.
  absl::Status SendSome(Conn &c) {
    while (!c.out.empty()) {
      OutFrame &f = c.out.front();
      absl::StatusOr<uint64_t> w = c.link->Send(f.header, f.parts, &f.sent);
      if (!w.ok())
        return w.status();
      if (*w == 0)
        return absl::OkStatus(); // the link takes no more now
      c.bytes_sent += *w;
      if (f.sent == f.total) {
        if (f.recycle && !f.owned.empty())
          f.recycle->push_back(std::move(f.owned));
        c.out.pop_front();
      }
    }
    return absl::OkStatus();
  }

  /// Reads what is available; true when a whole frame, checked against
  /// the connection's keys (or hello's), is in c.frame.
  absl::StatusOr<bool> RecvSome(Conn &c, bool wait = false) {
    absl::StatusOr<bool> got = c.link->Receive(wait, c.expect.size() == 1,
                                               &c.frame, &c.bytes_received);
    if (!got.ok() || !*got)
      return got;
    if (c.awaiting_hello) {
      c.awaiting_hello = false;
      if (absl::Status s =
              duckd::FinishHello(c.hello, c.frame.header, c.frame.payload,
                                 &c.keys);
          !s.ok())
        return s;
    } else if (absl::Status s = duckd::CheckPayload(
                   c.frame.header, c.frame.payload, &c.keys);
               !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("reply: ", s.message()));
    }
    return true;
  }

  /// One Pump call: what it is for, its first error and its deadline.
  struct PumpState {
    absl::Duration timeout;
    absl::string_view what;
    const ReplyFn &on_reply;
    const RefillFn &refill;
    bool idle;
    int64_t timeout_ns;
    uint64_t deadline;
    absl::Status first;
    /// With `idle`, bytes that moved restart the timeout.
    void Moved(uint64_t before, uint64_t after) {
      if (idle && after != before)
        deadline = NowNs() + uint64_t(timeout_ns);
    }
  };

  /// Pumps `ducks` (every connection, in order) for one fixed-size reply
  /// each, `what` naming the request in errors.
  template <typename Reply>
  absl::StatusOr<std::vector<Reply>>
  PumpReplies(const std::vector<size_t> &ducks, absl::string_view what) {
    std::vector<Reply> out(conns.size());
    absl::Status s = Pump(ducks, opt.call_timeout, what,
                          [&](size_t d, const duckd_frame_header &,
                              absl::Span<const uint8_t> pl) -> absl::Status {
                            if (pl.size() < sizeof(Reply))
                              return absl::InternalError(
                                  absl::StrCat(what, " reply too short"));
                            std::memcpy(&out[d], pl.data(), sizeof(Reply));
                            return absl::OkStatus();
                          });
    if (!s.ok())
      return s;
    return out;
  }

  /// Drives every listed connection until all queued requests are answered.
  /// With `idle`, the timeout restarts whenever bytes move (long uploads).
  absl::Status Pump(const std::vector<size_t> &ducks, absl::Duration timeout,
                    absl::string_view what, const ReplyFn &on_reply,
                    const RefillFn &refill = nullptr, bool idle = false,
                    absl::Duration spin = absl::ZeroDuration()) {
    const uint64_t spinUntil = NowNs() + uint64_t(absl::ToInt64Nanoseconds(spin));
    const int64_t timeoutNs = absl::ToInt64Nanoseconds(timeout);
    PumpState p{timeout, what,      on_reply, refill,
                idle,    timeoutNs, NowNs() + uint64_t(timeoutNs), {}};
    std::vector<DuckWait> waits;
    std::vector<size_t> who;
    for (;;) {
      SendAndList(p, ducks, &waits, &who);
      if (waits.empty())
        return p.first;
      const uint64_t now = NowNs();
      if (now >= p.deadline) {
        for (size_t d : who)
          PumpFail(p, d,
                   absl::DeadlineExceededError(absl::StrCat(
                       "no reply within ", absl::FormatDuration(timeout),
                       "; connection closed")),
                   true);
        return p.first;
      }
      const bool spinning = now < spinUntil;
      if (!spinning && waits.size() == 1 && !waits[0].write &&
          conns[who[0]].expect.size() == 1) {
        AwaitOne(p, who[0]);
        continue; // partial or nothing yet: round again
      }
      const int64_t ms = spinning ? 0
                                  : int64_t(std::min<uint64_t>(
                                        (p.deadline - now + 999999) / 1000000,
                                        1000));
      absl::StatusOr<int> r =
          transport->Wait(absl::MakeSpan(waits), absl::Milliseconds(ms));
      if (!r.ok())
        return r.status();
      if (*r <= 0)
        continue;
      for (size_t i = 0; i < waits.size(); ++i)
        if (waits[i].readable)
          ReadReplies(p, who[i]);
    }
  }

  /// Names a Pump's error by duck and request and keeps the first; a
  /// fatal one breaks the connection.
  void PumpFail(PumpState &p, size_t d, const absl::Status &s, bool fatal) {
    absl::Status named(s.code(), absl::StrCat(Name(d), ": ", p.what, ": ",
                                              s.message()));
    if (fatal)
      Break(d, std::string(named.message()));
    if (p.first.ok())
      p.first = named;
  }

  /// Writes what each connection has queued and lists, in `waits` and
  /// `who`, those that still wait to write or for a reply.
  void SendAndList(PumpState &p, const std::vector<size_t> &ducks,
                   std::vector<DuckWait> *waits, std::vector<size_t> *who) {
    waits->clear();
    who->clear();
    for (size_t d : ducks) {
      Conn &c = conns[d];
      if (!c.link)
        continue;
      if (!c.out.empty()) {
        const uint64_t before = c.bytes_sent;
        if (absl::Status s = SendSome(c); !s.ok()) {
          PumpFail(p, d, s, true);
          continue;
        }
        p.Moved(before, c.bytes_sent);
      }
      if (c.out.empty() && c.expect.empty())
        continue;
      DuckWait w;
      w.conn = c.link.get();
      w.read = !c.expect.empty();
      w.write = !c.out.empty();
      waits->push_back(w);
      who->push_back(d);
    }
  }

  /// One reply awaited: waits for it in the receive itself (over TCP no
  /// poll: a recvmsg bounded by the socket's 100 ms receive timeout).
  void AwaitOne(PumpState &p, size_t d) {
    Conn &c = conns[d];
    const uint64_t before = c.bytes_received;
    absl::StatusOr<bool> got = RecvSome(c, /*wait=*/true);
    p.Moved(before, c.bytes_received);
    if (!got.ok())
      PumpFail(p, d, got.status(), true);
    else if (*got)
      HandleReply(p, d);
  }

  /// Reads and handles the replies a readable connection has in full.
  void ReadReplies(PumpState &p, size_t d) {
    Conn &c = conns[d];
    while (c.link && !c.expect.empty()) {
      const uint64_t before = c.bytes_received;
      absl::StatusOr<bool> got = RecvSome(c);
      p.Moved(before, c.bytes_received);
      if (!got.ok()) {
        PumpFail(p, d, got.status(), true);
        break;
      }
      if (!*got)
        break;
      HandleReply(p, d);
    }
  }

  /// A whole frame is in conns[d].frame: matches it to its request and
  /// hands it on (then lets `refill` queue more).
  void HandleReply(PumpState &p, size_t d) {
    Conn &c = conns[d];
    const duckd_frame_header h = c.frame.header;
    if (h.type == DUCKD_MSG_NOTICE || !(h.flags & DUCKD_FLAG_REPLY) ||
        c.expect.empty() || h.request_id != c.expect.front()) {
      std::string why = "unexpected frame from duckd";
      if (h.flags & DUCKD_FLAG_ERROR)
        if (auto e = duckd::DecodeError(c.frame.payload); e.ok())
          why = e->message;
      PumpFail(p, d, absl::UnavailableError(why), true);
      return;
    }
    c.expect.pop_front();
    if (h.flags & DUCKD_FLAG_ERROR) {
      auto e = duckd::DecodeError(c.frame.payload);
      if (e.ok() && retry && retry(d, h, e->code, e->message))
        return;
      PumpFail(p, d,
               e.ok() ? ErrorFor(e->code, e->message)
                      : absl::InternalError("malformed error reply"),
               false);
    } else if (absl::Status s = p.on_reply(d, h, c.frame.payload); !s.ok()) {
      PumpFail(p, d, s, false);
    }
    if (p.refill && c.link)
      if (absl::Status s = p.refill(d); !s.ok())
        PumpFail(p, d, s, false);
  }

  /// Whether a step can go to `ducks` with `n_ibs` IBs: the bytes moved
  /// so far on their connections in sent0 and recv0.
  absl::Status Steppable(const std::vector<size_t> &ducks, size_t n_ibs,
                         uint64_t *sent0, uint64_t *recv0) const;
  /// A duck's cast step (or stage) missed: counted, and after cast_give_up in a
  /// row the duck gets plain steps.
  void CastMissed(size_t d, const std::string &why);
  /// Queues duck d's step: a STEP on its session (persistent), else a RUN
  /// that carries the ELF too.
  void QueueStep(size_t d, absl::Span<const uint8_t> ib, uint32_t flags = 0);
  /// Queues duck d's step_cast for the batch just sent.
  void QueueStepCast(size_t d, uint64_t cast_id, const duckd::CastShape &shape,
                     uint64_t ib_bytes, const uint8_t *digest,
                     uint32_t flags = 0);
  /// Sends `ib` once as batch datagrams when the step can go that way
  /// (every duck the same IB, small enough, a cast address); false: send
  /// it plainly. Queues every duck's step (cast or plain).
  bool QueueCastSteps(const std::vector<size_t> &ducks,
                      absl::Span<const absl::Span<const uint8_t>> ibs,
                      uint32_t flags = 0);
  /// Whether `ibs` can go as one cast batch to `ducks`.
  bool Castable(const std::vector<size_t> &ducks,
                absl::Span<const absl::Span<const uint8_t>> ibs) const;
  /// A stage as one cast batch and no frame (stage_cast); false: it did
  /// not go so.
  bool CastStage(const std::vector<size_t> &ducks,
                 absl::Span<const absl::Span<const uint8_t>> ibs);
  /// Queues duck d's staged step as a step_staged naming stage_cast.
  void QueueStepStaged(size_t d, absl::Span<const uint8_t> ib);
  /// Queues every duck's step (one cast batch where it can go so, with
  /// `flags`) and starts writing; a duck whose connection breaks on the
  /// way is closed (its step then fails). Whether it went as a cast.
  bool StartStep(const std::vector<size_t> &ducks,
                 absl::Span<const absl::Span<const uint8_t>> ibs,
                 uint32_t flags);
  /// A step's metrics: the judge's wait against the slowest duck's kernel
  /// time, and the bytes that moved.
  void MeasureStep(const std::vector<size_t> &ducks,
                   const std::vector<DuckOutput> &outputs, uint64_t t0,
                   uint64_t t1, uint64_t sent0, uint64_t recv0,
                   StepMetrics *mt) const;

  /// Measures the listed ducks' rates, all of them at once.
  absl::Status MeasureRates(const MeasureOptions &o,
                            const std::vector<size_t> &ducks,
                            std::vector<DuckRates> *out);
  /// Times `o.pings` pings to every duck at once (DuckRates::fan_rtt_us_p50).
  absl::Status TimeFanTrips(const MeasureOptions &o,
                            std::vector<DuckRates> *out);
  /// Times round trips to `ducks`, one round in flight at a time: `make`
  /// queues one request to a duck; their replies, whatever they say, end
  /// the round.
  /// `cpu50`, if given: the median of this thread's CPU time a round.
  absl::Status TimeTrips(const std::vector<size_t> &ducks, uint32_t trips,
                         const char *what,
                         const std::function<void(size_t)> &make, double *p50,
                         double *p90, double *cpu50 = nullptr);
  /// Queues a measure ping to duck d (o.busy_us keeps it busy first).
  void QueuePing(size_t d, const MeasureOptions &o);
  /// The median of `trips` rounds of link probes to `ducks` at once
  /// (DUCKD_MEASURE_LINK), `out` bytes of `zeros` to each and `back` from
  /// each, us; a reply of another size is an error (a duckd before the
  /// probe answers bad_request).
  absl::StatusOr<double> TimeLinkTrips(const std::vector<size_t> &ducks,
                                       uint64_t out, uint64_t back,
                                       const std::vector<uint8_t> &zeros,
                                       uint32_t trips);

  // Prepare's phases, after the images are open.
  /// 1. Cache sessions: hit, partial or miss per duck, with what it has.
  absl::Status PrepareBegin(PrepareJob &j, bool invalidate);
  /// 3. Streams the chunks each duck lacks, two in flight per duck.
  absl::Status PrepareUpload(PrepareJob &j);
  /// Queues a duck's next chunks while fewer than two are in flight
  /// (none after a cancel): Pump's refill during the upload.
  absl::Status RefillUpload(PrepareJob &j, size_t d);
  /// 4. Verifies and marks finished every duck that was not a hit.
  absl::Status PrepareFinish(PrepareJob &j);

  std::vector<size_t> All() const {
    std::vector<size_t> v(conns.size());
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = i;
    return v;
  }

  absl::Status Connect(size_t d) {
    Conn &c = conns[d];
    absl::StatusOr<std::unique_ptr<DuckConnection>> link =
        transport->Connect(c.ep, opt.connect_timeout, opt.max_payload);
    if (!link.ok())
      return absl::Status(link.status().code(),
                          absl::StrCat(Name(d), ": ", link.status().message()));
    c.link = std::move(*link);
    c.broken.clear();
    return absl::OkStatus();
  }

  absl::Status Hello() {
    std::vector<size_t> ducks = All();
    for (size_t d : ducks) {
      if (absl::Status s = Usable(d); !s.ok())
        return s;
      // A hello (re)starts the connection's authentication.
      auto hello = duckd::BeginHello(opt.token);
      if (!hello.ok())
        return hello.status();
      Conn &c = conns[d];
      c.hello = *hello;
      c.keys = hello->keys;
      c.awaiting_hello = true;
      std::vector<uint8_t> owned(sizeof c.hello.request);
      std::memcpy(owned.data(), &c.hello.request, owned.size());
      Part p{owned.data(), owned.size()};
      Queue(d, DUCKD_MSG_HELLO, std::move(owned), {p});
    }
    hellos.resize(conns.size());
    return Pump(ducks, opt.call_timeout, "hello",
                [&](size_t d, const duckd_frame_header &,
                    absl::Span<const uint8_t> pl) -> absl::Status {
                  duckd_hello_reply rep;
                  if (pl.size() < sizeof rep)
                    return absl::InternalError("short hello reply");
                  std::memcpy(&rep, pl.data(), sizeof rep);
                  if (rep.abi_version != DUCK_ABI_VERSION)
                    return absl::FailedPreconditionError(absl::StrCat(
                        "duck abi ", rep.abi_version, ", host abi ",
                        DUCK_ABI_VERSION));
                  DuckHello &h = hellos[d];
                  h.endpoint = conns[d].ep;
                  h.name = std::string(rep.name, strnlen(rep.name,
                                                         sizeof rep.name));
                  h.cores = rep.cores;
                  h.pid = rep.pid;
                  h.memory_bytes = rep.memory_bytes;
                  h.weights_capacity = rep.weights_capacity;
                  h.tsc_hz = rep.tsc_hz;
                  h.cache_valid = rep.cache_valid;
                  h.head_finished = rep.head_finished;
                  h.image = rep.image;
                  h.finished_slots = rep.finished_slots;
                  h.finished_bitmap.assign(pl.begin() + sizeof rep, pl.end());
                  return absl::OkStatus();
                });
  }
};

DuckClient::DuckClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DuckClient::~DuckClient() {
  if (impl_->opened)
    (void)Close();
  // ~Impl closes the connections.
}

absl::StatusOr<std::unique_ptr<DuckClient>>
DuckClient::Create(const DuckClientOptions &options) {
  if (options.ducks.empty())
    return absl::InvalidArgumentError("no ducks given");
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->transport = options.transport ? options.transport : TcpDuckTransport();
  if (options.read_environment)
    if (const char *p = std::getenv("DUCK_PERSISTENT"); p && std::string(p) == "0")
      impl->opt.persistent = false;
  impl->conns.resize(options.ducks.size());
  for (size_t d = 0; d < options.ducks.size(); ++d) {
    impl->conns[d].ep = options.ducks[d];
    if (absl::Status s = impl->Connect(d); !s.ok())
      return s;
  }
  if (absl::Status s = impl->Hello(); !s.ok())
    return s;
  if (!options.cast_address.empty()) {
    duckd::CastSenderOptions co;
    co.address = options.cast_address;
    co.port = options.cast_port;
    co.interface_address = options.cast_interface;
    co.datagram_bytes = options.cast_datagram_bytes;
    co.drop_every = options.cast_drop_every;
    auto sender = duckd::CastSender::Open(co);
    if (!sender.ok())
      return sender.status();
    impl->cast = std::move(*sender);
    uint8_t seed[DUCKD_NONCE_BYTES];
    if (absl::Status st = duckd::RandomNonce(seed); !st.ok())
      return st;
    std::memcpy(&impl->next_cast_id, seed, sizeof impl->next_cast_id);
  }
  return std::unique_ptr<DuckClient>(new DuckClient(std::move(impl)));
}

size_t DuckClient::size() const { return impl_->conns.size(); }
bool DuckClient::persistent() const { return impl_->opt.persistent; }
const DuckHello &DuckClient::hello(size_t duck) const {
  return impl_->hellos[duck];
}
const DuckEndpoint &DuckClient::endpoint(size_t duck) const {
  return impl_->conns[duck].ep;
}

absl::Status DuckClient::Refresh() { return impl_->Hello(); }

absl::Status DuckClient::Open(absl::Span<const uint8_t> elf) {
  Impl &m = *impl_;
  m.elf.assign(elf.begin(), elf.end());
  m.opened = true;
  if (!m.opt.persistent)
    return absl::OkStatus();
  std::vector<size_t> ducks = m.All();
  for (size_t d : ducks) {
    if (absl::Status s = m.Usable(d); !s.ok())
      return s;
    duckd_open_request r{};
    r.cores = m.opt.cores;
    r.ib_limit = m.opt.ib_limit;
    r.ob_limit = m.opt.ob_limit;
    r.scratch_bytes = m.opt.scratch_bytes;
    r.elf_bytes = m.elf.size();
    std::vector<uint8_t> owned(sizeof r);
    std::memcpy(owned.data(), &r, sizeof r);
    std::vector<Part> parts = {{owned.data(), owned.size()},
                               {m.elf.data(), m.elf.size()}};
    m.Queue(d, DUCKD_MSG_OPEN, std::move(owned), std::move(parts));
  }
  return m.Pump(ducks, m.opt.call_timeout, "open",
                [&](size_t d, const duckd_frame_header &,
                    absl::Span<const uint8_t> pl) -> absl::Status {
                  duckd_open_reply rep;
                  if (pl.size() != sizeof rep)
                    return absl::InternalError("bad open reply");
                  std::memcpy(&rep, pl.data(), sizeof rep);
                  m.conns[d].session_id = rep.session_id;
                  // Room for the largest step reply (its OB, the cores'
                  // times, a log) before the first prompt's.
                  m.conns[d].link->Reserve(sizeof(duckd_step_reply) +
                                           DUCKD_MAX_CORES * 8ull +
                                           m.opt.ob_limit + (64u << 10));
                  return absl::OkStatus();
                });
}

namespace {

/// A step's (or run's) reply, into the duck's output: its status, times,
/// output buffer and log; an ELF status other than OK is the step's error.
absl::Status ReadStepReply(absl::Span<const uint8_t> pl, DuckOutput *o) {
  duckd_step_reply rep;
  if (pl.size() < sizeof rep)
    return absl::InternalError("short step reply");
  std::memcpy(&rep, pl.data(), sizeof rep);
  const uint64_t need =
      sizeof rep + uint64_t(rep.cores) * 8 + rep.ob_bytes + rep.log_bytes;
  if (rep.cores > DUCKD_MAX_CORES || need != pl.size())
    return absl::InternalError("step reply sizes do not add up");
  o->status = rep.status;
  o->worker_ns = rep.worker_ns;
  o->kernel_ns.resize(rep.cores);
  const uint8_t *p = pl.data() + sizeof rep;
  std::memcpy(o->kernel_ns.data(), p, rep.cores * 8ull);
  p += rep.cores * 8ull;
  o->ob.assign(p, p + rep.ob_bytes);
  p += rep.ob_bytes;
  o->log.assign(reinterpret_cast<const char *>(p), rep.log_bytes);
  if (rep.status != DUCK_STATUS_OK)
    return absl::InvalidArgumentError(
        absl::StrCat("ELF status ", StatusName(rep.status), " (", rep.status,
                     ")", o->log.empty() ? "" : ": ", o->log));
  return absl::OkStatus();
}

} // namespace

void DuckClient::Impl::QueueStepCast(size_t d, uint64_t cast_id,
                                     const duckd::CastShape &shape,
                                     uint64_t ib_bytes, const uint8_t *digest,
                                     uint32_t flags) {
  duckd_step_cast_request r{};
  r.session_id = conns[d].session_id;
  r.cast_id = cast_id;
  r.ib_bytes = ib_bytes;
  r.datagrams = shape.datagrams;
  r.datagram_bytes = shape.datagram_bytes;
  std::memcpy(r.digest, digest, sizeof r.digest);
  std::vector<uint8_t> owned(sizeof r);
  std::memcpy(owned.data(), &r, sizeof r);
  Part p{owned.data(), owned.size()};
  Queue(d, DUCKD_MSG_STEP_CAST, std::move(owned), {p}, nullptr, flags);
}

bool DuckClient::Impl::Castable(
    const std::vector<size_t> &ducks,
    absl::Span<const absl::Span<const uint8_t>> ibs) const {
  // An IB no larger than its step_cast frame (a staged step's slots) goes
  // plainly: the cast would only add its datagrams.
  if (!cast || !opt.persistent || ibs.empty() ||
      ibs[0].size() <=
          sizeof(duckd_frame_header) + sizeof(duckd_step_cast_request) ||
      ibs[0].size() > opt.cast_max_ib_bytes)
    return false;
  size_t castable = 0;
  for (size_t d : ducks) {
    if (ibs[d].data() != ibs[0].data() || ibs[d].size() != ibs[0].size())
      return false;
    castable += !conns[d].cast_off;
  }
  return castable >= 2; // else one copy either way
}

bool DuckClient::Impl::CastStage(
    const std::vector<size_t> &ducks,
    absl::Span<const absl::Span<const uint8_t>> ibs) {
  stage_cast.sent = false;
  for (size_t d : ducks)
    conns[d].stage_cast = false;
  if (!opt.cast_stages || !Castable(ducks, ibs))
    return false;
  const absl::Span<const uint8_t> ib = ibs[0];
  const uint64_t id = next_cast_id++;
  const uint64_t sent0 = cast->bytes_sent(), dropped0 = cast->dropped();
  absl::StatusOr<duckd::CastShape> shape =
      cast->Send(id, ib, DUCKD_CAST_STAGE_MAGIC);
  if (!shape.ok())
    return false; // the stage goes in frames
  cast_stats.datagram_bytes += cast->bytes_sent() - sent0;
  cast_stats.dropped += cast->dropped() - dropped0;
  stage_cast.sent = true;
  stage_cast.id = id;
  stage_cast.ib_bytes = ib.size();
  stage_cast.shape = *shape;
  duckd::CastDigest(ib, conns[ducks[0]].keys.keyed, stage_cast.digest);
  for (size_t d : ducks)
    conns[d].stage_cast = !conns[d].cast_off;
  ++stage_stats.cast;
  return true;
}

void DuckClient::Impl::QueueStepStaged(size_t d, absl::Span<const uint8_t> ib) {
  duckd_step_staged_request r{};
  r.session_id = conns[d].session_id;
  r.ib_bytes = ib.size();
  r.cast_id = stage_cast.id;
  r.stage_ib_bytes = stage_cast.ib_bytes;
  r.datagrams = stage_cast.shape.datagrams;
  r.datagram_bytes = stage_cast.shape.datagram_bytes;
  std::memcpy(r.digest, stage_cast.digest, sizeof r.digest);
  if (opt.stage_digest_flip_every &&
      stage_stats.cast % opt.stage_digest_flip_every == 0)
    r.digest[0] ^= 1;
  std::vector<uint8_t> owned(sizeof r);
  std::memcpy(owned.data(), &r, sizeof r);
  std::vector<Part> parts = {{owned.data(), owned.size()},
                             {ib.data(), ib.size()}};
  Queue(d, DUCKD_MSG_STEP_STAGED, std::move(owned), std::move(parts));
}

bool DuckClient::Impl::QueueCastSteps(
    const std::vector<size_t> &ducks,
    absl::Span<const absl::Span<const uint8_t>> ibs, uint32_t flags) {
  if (!Castable(ducks, ibs))
    return false;
  const absl::Span<const uint8_t> ib = ibs[0];
  const uint64_t id = next_cast_id++;
  const uint64_t sent0 = cast->bytes_sent(), dropped0 = cast->dropped();
  absl::StatusOr<duckd::CastShape> shape = cast->Send(id, ib);
  if (!shape.ok())
    return false; // this step goes plainly
  ++cast_stats.steps;
  cast_stats.datagram_bytes += cast->bytes_sent() - sent0;
  cast_stats.dropped += cast->dropped() - dropped0;
  // Every connection of one client has the same token: keyed alike.
  uint8_t digest[DUCKD_CAST_DIGEST_BYTES];
  duckd::CastDigest(ib, conns[ducks[0]].keys.keyed, digest);
  for (size_t d : ducks) {
    if (conns[d].cast_off)
      QueueStep(d, ib, flags);
    else
      QueueStepCast(d, id, *shape, ib.size(), digest, flags);
    if (absl::Status s = SendSome(conns[d]); !s.ok())
      Break(d, std::string(s.message()));
  }
  return true;
}

bool DuckClient::Impl::StartStep(
    const std::vector<size_t> &ducks,
    absl::Span<const absl::Span<const uint8_t>> ibs, uint32_t flags) {
  // A staged step after a cast stage: a step_staged to each duck it
  // reached (the stage's only frame), plain to the others.
  const bool named = std::exchange(stage_cast.sent, false) && flags == 0;
  if (!named && QueueCastSteps(ducks, ibs, flags))
    return true;
  for (size_t d : ducks) {
    if (named && conns[d].stage_cast)
      QueueStepStaged(d, ibs[d]);
    else
      QueueStep(d, ibs[d], flags);
    // Start writing at once: the first duck begins while the others queue.
    if (absl::Status s = SendSome(conns[d]); !s.ok())
      Break(d, std::string(s.message()));
  }
  return false;
}

void DuckClient::Impl::QueueStep(size_t d, absl::Span<const uint8_t> ib,
                                 uint32_t flags) {
  std::vector<uint8_t> owned;
  std::vector<Part> parts;
  if (opt.persistent) {
    duckd_step_request r{conns[d].session_id, ib.size()};
    owned.resize(sizeof r);
    std::memcpy(owned.data(), &r, sizeof r);
    parts = {{owned.data(), owned.size()}, {ib.data(), ib.size()}};
    Queue(d, DUCKD_MSG_STEP, std::move(owned), std::move(parts), nullptr,
          flags);
  } else {
    duckd_run_request r{};
    r.cores = opt.cores;
    r.ob_limit = opt.ob_limit;
    r.scratch_bytes = opt.scratch_bytes;
    r.elf_bytes = elf.size();
    r.ib_bytes = ib.size();
    owned.resize(sizeof r);
    std::memcpy(owned.data(), &r, sizeof r);
    parts = {{owned.data(), owned.size()},
             {elf.data(), elf.size()},
             {ib.data(), ib.size()}};
    Queue(d, DUCKD_MSG_RUN, std::move(owned), std::move(parts));
  }
}

void DuckClient::Impl::MeasureStep(const std::vector<size_t> &ducks,
                                   const std::vector<DuckOutput> &outputs,
                                   uint64_t t0, uint64_t t1, uint64_t sent0,
                                   uint64_t recv0, StepMetrics *mt) const {
  *mt = StepMetrics{};
  mt->judge_wait_us = double(t1 - t0) / 1e3;
  uint64_t maxNs = 0;
  for (const DuckOutput &o : outputs)
    for (uint64_t k : o.kernel_ns)
      maxNs = std::max(maxNs, k);
  mt->duck_max_us = double(maxNs) / 1e3;
  mt->judge_gap_us = mt->judge_wait_us - mt->duck_max_us;
  mt->judge_ratio = maxNs ? mt->judge_wait_us / mt->duck_max_us : 0;
  for (size_t d : ducks) {
    mt->bytes_sent += conns[d].bytes_sent;
    mt->bytes_received += conns[d].bytes_received;
  }
  mt->bytes_sent -= sent0;
  mt->bytes_received -= recv0;
}

absl::Status DuckClient::Impl::Steppable(const std::vector<size_t> &ducks,
                                         size_t n_ibs, uint64_t *sent0,
                                         uint64_t *recv0) const {
  if (n_ibs != conns.size())
    return absl::InvalidArgumentError(absl::StrCat(
        "step needs one IB per duck: ", n_ibs, " for ", conns.size()));
  if (!opened)
    return absl::FailedPreconditionError("step before open");
  *sent0 = *recv0 = 0;
  for (size_t d : ducks) {
    if (absl::Status s = Usable(d); !s.ok())
      return s;
    if (opt.persistent && !conns[d].session_id)
      return absl::FailedPreconditionError(
          absl::StrCat(Name(d), ": no open session (it was closed after an "
                                "earlier error); open again"));
    *sent0 += conns[d].bytes_sent;
    *recv0 += conns[d].bytes_received;
  }
  return absl::OkStatus();
}

absl::Status
DuckClient::Stage(absl::Span<const absl::Span<const uint8_t>> ibs) {
  Impl &m = *impl_;
  const std::vector<size_t> ducks = m.All();
  uint64_t sent0 = 0, recv0 = 0;
  if (absl::Status s = m.Steppable(ducks, ibs.size(), &sent0, &recv0); !s.ok())
    return s;
  if (!m.opt.persistent)
    return absl::FailedPreconditionError("staged steps need sessions");
  m.stage_sent0 = sent0;
  m.stage_recv0 = recv0;
  m.stage_cast_bytes0 = m.cast_stats.datagram_bytes;
  m.stage_pending = true;
  ++m.stage_stats.stages;
  const uint64_t cpu0 = ThreadCpuNs();
  // One cast batch and no frame where it can; else quiet frames: duckd
  // answers nothing, the staged step learns the outcome (a duck whose
  // stage could not be sent fails it).
  if (!m.CastStage(ducks, ibs))
    m.StartStep(ducks, ibs, DUCKD_FLAG_QUIET);
  else
    for (size_t d : ducks) // the ducks the batch does not reach
      if (!m.conns[d].stage_cast) {
        m.QueueStep(d, ibs[d], DUCKD_FLAG_QUIET);
        if (absl::Status s = m.SendSome(m.conns[d]); !s.ok())
          m.Break(d, std::string(s.message()));
      }
  m.stage_stats.host_cpu_us += double(ThreadCpuNs() - cpu0) / 1e3;
  return absl::OkStatus();
}

absl::Status
DuckClient::Step(absl::Span<const absl::Span<const uint8_t>> ibs,
                 std::vector<DuckOutput> *out_outputs, StepMetrics *out_metrics,
                 const std::function<void()> &after_send,
                 absl::Span<const absl::Span<const uint8_t>> whole) {
  Impl &m = *impl_;
  std::vector<size_t> ducks = m.All();
  uint64_t sent0 = 0, recv0 = 0;
  if (absl::Status s = m.Steppable(ducks, ibs.size(), &sent0, &recv0); !s.ok())
    return s;
  if (!whole.empty() && whole.size() != ibs.size())
    return absl::InvalidArgumentError(
        "a staged step needs a whole step a duck");
  uint64_t castBytes0 = m.cast_stats.datagram_bytes;
  if (m.stage_pending) {
    sent0 = m.stage_sent0;
    recv0 = m.stage_recv0;
    castBytes0 = m.stage_cast_bytes0;
    m.stage_pending = false;
  }
  if (whole.empty())
    m.stage_cast.sent = false; // no staged step: the batch goes unnamed
  ClearOutputs(m.conns.size(), out_outputs);
  const uint64_t t0 = NowNs();
  const bool cast = m.StartStep(ducks, ibs, 0);
  m.step_ibs = ibs;
  m.step_whole = whole;
  // Captures only `this`: no allocation a step.
  m.retry = [im = &m](size_t d, const duckd_frame_header &h, uint32_t code,
                      const std::string &why) {
    return im->RetryStep(d, h, code, why);
  };
  uint64_t stageNs = 0; // the stage's slowest duck (staged OBs carry it)
  const bool staged = !whole.empty();
  if (after_send)
    after_send();
  absl::Status s = m.Pump(
      ducks, m.opt.step_timeout, m.opt.persistent ? "step" : "run",
      [&](size_t d, const duckd_frame_header &h,
          absl::Span<const uint8_t> pl) -> absl::Status {
        Conn &c = m.conns[d];
        if (h.type == DUCKD_MSG_STEP_CAST || h.type == DUCKD_MSG_STEP_STAGED)
          c.cast_misses = 0; // the batch came whole
        DuckOutput &o = (*out_outputs)[d];
        absl::Status s = ReadStepReply(pl, &o);
        duck_ob_header oh;
        if (s.ok() && staged && o.ob.size() >= sizeof oh) {
          std::memcpy(&oh, o.ob.data(), sizeof oh);
          stageNs = std::max(stageNs, oh.stage_ns);
          m.stage_stats.ahead += oh.stage_ahead_ns > 0;
          m.stage_stats.ahead_us += double(oh.stage_ahead_ns) / 1e3;
        }
        return s;
      },
      nullptr, false, m.opt.reply_spin);
  const uint64_t t1 = NowNs();
  m.retry = nullptr;
  m.step_ibs = m.step_whole = {};
  // A duck whose step could not be sent (its connection broken on the way
  // out, before the Pump) has not answered: the step fails.
  for (size_t d : ducks)
    if (s.ok() && !m.conns[d].link)
      s = absl::UnavailableError(
          absl::StrCat(m.Name(d), ": step: ", m.conns[d].broken));
  m.stage_stats.kernel_us += double(stageNs) / 1e3;
  if (out_metrics) {
    m.MeasureStep(ducks, *out_outputs, t0, t1, sent0, recv0, out_metrics);
    out_metrics->bytes_sent += m.cast_stats.datagram_bytes - castBytes0;
    out_metrics->cast = cast;
  }
  return s;
}

bool DuckClient::Impl::RetryStep(size_t d, const duckd_frame_header &h,
                                 uint32_t code, const std::string &why) {
  // A cast step that missed goes again plainly, a staged one (its stage
  // spent on arrival) as its whole step, as does one that found no stage
  // (its quiet stage failed or never came).
  if ((h.type == DUCKD_MSG_STEP_CAST && code == DUCKD_ERR_CAST_MISSED) ||
      (h.type == DUCKD_MSG_STEP_STAGED && code == DUCKD_ERR_STAGE_MISSED))
    CastMissed(d, why);
  if (code == DUCKD_ERR_STAGE_MISSED && !step_whole.empty()) {
    ++stage_stats.resent;
    QueueStep(d, step_whole[d]);
    return true;
  }
  if (h.type != DUCKD_MSG_STEP_CAST || code != DUCKD_ERR_CAST_MISSED)
    return false;
  ++cast_stats.resent;
  if (!step_whole.empty())
    ++stage_stats.resent;
  QueueStep(d, step_whole.empty() ? step_ibs[d] : step_whole[d]);
  return true;
}

CastStats DuckClient::cast_stats() const { return impl_->cast_stats; }
DuckClient::StageStats DuckClient::stage_stats() const {
  return impl_->stage_stats;
}

void DuckClient::Impl::CastMissed(size_t d, const std::string &why) {
  Conn &c = conns[d];
  if (++c.cast_misses >= opt.cast_give_up && !c.cast_off) {
    c.cast_off = true;
    ++cast_stats.ducks_off;
    std::fprintf(stderr,
                 "duckrun: %s missed %u cast steps in a row (%s): plain "
                 "steps to it from now on\n",
                 Name(d).c_str(), c.cast_misses, why.c_str());
  }
}

absl::Status DuckClient::Close() {
  Impl &m = *impl_;
  m.opened = false;
  if (!m.opt.persistent)
    return absl::OkStatus();
  std::vector<size_t> ducks;
  for (size_t d = 0; d < m.conns.size(); ++d) {
    if (!m.conns[d].link || !m.conns[d].session_id)
      continue;
    duckd_close_request r{m.conns[d].session_id};
    std::vector<uint8_t> owned(sizeof r);
    std::memcpy(owned.data(), &r, sizeof r);
    Part p{owned.data(), owned.size()};
    m.Queue(d, DUCKD_MSG_CLOSE, std::move(owned), {p});
    ducks.push_back(d);
  }
  absl::Status s = m.Pump(ducks, m.opt.call_timeout, "close",
                          [&](size_t d, const duckd_frame_header &,
                              absl::Span<const uint8_t>) -> absl::Status {
                            m.conns[d].session_id = 0;
                            return absl::OkStatus();
                          });
  for (size_t d : ducks)
    m.conns[d].session_id = 0;
  return s;
}

namespace {

/// A measure request's bytes: the rates (flags 0), or a ping.
std::vector<uint8_t> MeasureRequest(const MeasureOptions &o, uint32_t flags) {
  duckd_measure_request r{};
  r.cores = o.cores;
  r.flags = flags;
  r.arena_bytes = o.arena_bytes;
  r.millis = o.millis;
  r.busy_us = flags & DUCKD_MEASURE_PING ? o.busy_us : 0;
  std::vector<uint8_t> owned(sizeof r);
  std::memcpy(owned.data(), &r, sizeof r);
  return owned;
}

/// A measure reply's figures, into a duck's rates.
absl::Status ReadRates(absl::Span<const uint8_t> pl, DuckRates *r) {
  duckd_measure_reply rep;
  if (pl.size() != sizeof rep)
    return absl::InternalError("measure reply of the wrong size");
  std::memcpy(&rep, pl.data(), sizeof rep);
  r->cores = rep.cores;
  r->read_gbs = rep.read_gbs;
  for (uint32_t k = 0; k < DUCK_KERNEL_COUNT && k < rep.kernels; ++k) {
    r->gparam_s[k] = rep.gparam_s[k];
    r->rows[k] = rep.rows[k];
    r->k[k] = rep.k[k];
  }
  r->other_load = rep.other_load;
  r->gemm_gmac_s = rep.gemm_gmac_s;
  r->gemm_tokens = rep.gemm_tokens;
  r->gemv_call_us = rep.gemv_call_ns / 1e3;
  r->seconds = rep.seconds;
  return absl::OkStatus();
}

/// An empty step's IB: header only (a dense prepare of slot 0).
std::vector<uint8_t> EmptyStepIb() {
  duck_ib_header ib{};
  ib.magic = DUCK_IB_MAGIC;
  ib.abi_version = DUCK_ABI_VERSION;
  ib.mode = DUCK_MODE_DENSE_PREPARE;
  ib.x_offset = duck_ib_x_offset(0);
  std::vector<uint8_t> ibBytes(ib.x_offset, 0);
  std::memcpy(ibBytes.data(), &ib, sizeof ib);
  return ibBytes;
}

} // namespace

absl::Status DuckClient::Impl::MeasureRates(const MeasureOptions &o,
                                            const std::vector<size_t> &ducks,
                                            std::vector<DuckRates> *out) {
  for (size_t d : ducks) {
    if (absl::Status s = Usable(d); !s.ok())
      return s;
    std::vector<uint8_t> owned = MeasureRequest(o, 0);
    Part p{owned.data(), owned.size()};
    Queue(d, DUCKD_MSG_MEASURE, std::move(owned), {p});
  }
  return Pump(ducks, opt.call_timeout, "measure",
              [&](size_t d, const duckd_frame_header &,
                  absl::Span<const uint8_t> pl) -> absl::Status {
                return ReadRates(pl, &(*out)[d]);
              });
}

void DuckClient::Impl::QueuePing(size_t d, const MeasureOptions &o) {
  std::vector<uint8_t> owned = MeasureRequest(o, DUCKD_MEASURE_PING);
  Part p{owned.data(), owned.size()};
  Queue(d, DUCKD_MSG_MEASURE, std::move(owned), {p});
}

absl::Status
DuckClient::Impl::TimeTrips(const std::vector<size_t> &ducks, uint32_t trips,
                            const char *what,
                            const std::function<void(size_t)> &make,
                            double *p50, double *p90, double *cpu50) {
  std::vector<double> us, cpu;
  for (uint32_t i = 0; i < trips; ++i) {
    const uint64_t c0 = ThreadCpuNs(), t0 = NowNs();
    for (size_t d : ducks)
      make(d);
    if (absl::Status s = Pump(ducks, opt.call_timeout, what,
                              [](size_t, const duckd_frame_header &,
                                 absl::Span<const uint8_t>) {
                                return absl::OkStatus();
                              });
        !s.ok())
      return s;
    us.push_back(double(NowNs() - t0) / 1e3);
    cpu.push_back(double(ThreadCpuNs() - c0) / 1e3);
  }
  if (!us.empty()) {
    std::sort(us.begin(), us.end());
    std::sort(cpu.begin(), cpu.end());
    *p50 = us[us.size() / 2];
    *p90 = us[std::min(us.size() - 1, us.size() * 9 / 10)];
    if (cpu50)
      *cpu50 = cpu[cpu.size() / 2];
  }
  return absl::OkStatus();
}

absl::Status DuckClient::Impl::TimeFanTrips(const MeasureOptions &o,
                                            std::vector<DuckRates> *out) {
  const std::vector<size_t> all = All();
  if (all.size() < 2)
    return absl::OkStatus();
  MeasureOptions idle = o; // frames alone: no duck kept busy
  idle.busy_us = 0;
  const auto ping = [&](size_t d) { QueuePing(d, idle); };
  // One duck's pings and the pings to all of them in alternating blocks of
  // kBlock (each block back to back, as when a set was timed whole), so
  // that both medians come from the same minutes: timed one set after the
  // other, a VM's drift between the sets made the fan's CPU the smaller
  // now and then (22.4 against 27.6 us, 2026-12-07), a frame costing less
  // than nothing.
  constexpr uint32_t kBlock = 25;
  std::vector<double> one, oneCpus, fan, fanCpus;
  const std::vector<size_t> first = {all[0]};
  for (uint32_t done = 0; done < o.pings; done += kBlock) {
    const uint32_t n = std::min(kBlock, o.pings - done);
    for (int pass = 0; pass < 2; ++pass)
      for (uint32_t i = 0; i < n; ++i) {
        double us = 0, p90 = 0, cpu = 0;
        const std::vector<size_t> &to = pass ? all : first;
        if (absl::Status s = TimeTrips(to, 1, "ping", ping, &us, &p90, &cpu);
            !s.ok())
          return s;
        (pass ? fan : one).push_back(us);
        (pass ? fanCpus : oneCpus).push_back(cpu);
      }
  }
  const auto median = [](std::vector<double> v) {
    if (v.empty())
      return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double one50 = median(one), fan50 = median(fan),
               oneCpu = median(oneCpus), fanCpu = median(fanCpus);
  for (DuckRates &r : *out) {
    r.fan_rtt_us_p50 = fan50;
    r.rtt_idle_us_p50 = one50;
    r.fan_cpu_us_p50 = fanCpu;
    r.cpu_idle_us_p50 = oneCpu;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<DuckRates>>
DuckClient::Measure(const MeasureOptions &options) {
  Impl &m = *impl_;
  std::vector<DuckRates> out(m.conns.size());
  const std::vector<size_t> all = m.All();
  if (options.one_at_a_time) {
    for (size_t d : all)
      if (absl::Status s = m.MeasureRates(options, {d}, &out); !s.ok())
        return s;
  } else if (absl::Status s = m.MeasureRates(options, all, &out); !s.ok()) {
    return s;
  }
  for (size_t d : all)
    if (absl::Status s = m.TimeTrips(
            {d}, options.pings, "ping",
            [&](size_t to) { m.QueuePing(to, options); }, &out[d].rtt_us_p50,
            &out[d].rtt_us_p90);
        !s.ok())
      return s;
  if (absl::Status s = m.TimeFanTrips(options, &out); !s.ok())
    return s;
  for (DuckRates &r : out) {
    r.rtt_us_p50 = std::max(0.0, r.rtt_us_p50 - options.busy_us);
    r.rtt_us_p90 = std::max(0.0, r.rtt_us_p90 - options.busy_us);
  }
  if (options.elf.empty() || !m.opt.persistent)
    return out;
  // Empty steps: whatever status the ELF returns (a duck without weights
  // says BAD_WEIGHTS), the step went host -> duckd -> worker -> ELF and
  // back.
  if (absl::Status s = Open(options.elf); !s.ok())
    return s;
  const std::vector<uint8_t> ibBytes = EmptyStepIb();
  for (size_t d : all)
    if (absl::Status s = m.TimeTrips(
            {d}, options.pings, "empty step",
            [&](size_t to) {
              duckd_step_request r{m.conns[to].session_id, ibBytes.size()};
              std::vector<uint8_t> owned(sizeof r);
              std::memcpy(owned.data(), &r, sizeof r);
              std::vector<Part> parts = {{owned.data(), owned.size()},
                                         {ibBytes.data(), ibBytes.size()}};
              m.Queue(to, DUCKD_MSG_STEP, std::move(owned), std::move(parts));
            },
            &out[d].step_us_p50, &out[d].step_us_p90);
        !s.ok())
      return s;
  if (absl::Status s = Close(); !s.ok())
    return s;
  return out;
}

absl::StatusOr<double> DuckClient::Impl::TimeLinkTrips(
    const std::vector<size_t> &ducks, uint64_t out, uint64_t back,
    const std::vector<uint8_t> &zeros, uint32_t trips) {
  std::vector<double> us;
  for (uint32_t i = 0; i < trips; ++i) {
    const uint64_t t0 = NowNs();
    for (size_t d : ducks) {
      if (absl::Status s = Usable(d); !s.ok())
        return s;
      duckd_measure_request r{};
      r.flags = DUCKD_MEASURE_PING | DUCKD_MEASURE_LINK;
      std::vector<uint8_t> owned(sizeof r + sizeof back);
      std::memcpy(owned.data(), &r, sizeof r);
      std::memcpy(owned.data() + sizeof r, &back, sizeof back);
      std::vector<Part> parts = {{owned.data(), owned.size()}};
      if (out > 0)
        parts.push_back({zeros.data(), size_t(out)});
      Queue(d, DUCKD_MSG_MEASURE, std::move(owned), std::move(parts));
    }
    absl::Status s =
        Pump(ducks, opt.call_timeout, "link probe",
             [&](size_t d, const duckd_frame_header &,
                 absl::Span<const uint8_t> pl) -> absl::Status {
               if (pl.size() != sizeof(duckd_measure_reply) + back)
                 return absl::FailedPreconditionError(absl::StrCat(
                     Name(d), ": a link probe's reply of ", pl.size(),
                     " bytes, not ", sizeof(duckd_measure_reply) + back));
               return absl::OkStatus();
             });
    if (!s.ok())
      return s;
    us.push_back(double(NowNs() - t0) / 1e3);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

absl::StatusOr<LinkRates>
DuckClient::MeasureLinks(const LinkProbeOptions &options) {
  Impl &m = *impl_;
  if (options.bytes == 0 || options.bytes > DUCKD_LINK_PROBE_MAX_BYTES ||
      options.trips == 0)
    return absl::InvalidArgumentError(
        absl::StrCat("link probe: ", options.bytes, " bytes and ",
                     options.trips, " trips; the bytes must be within [1, ",
                     DUCKD_LINK_PROBE_MAX_BYTES, "] and the trips at least 1"));
  const std::vector<uint8_t> zeros(options.bytes);
  const uint64_t n = options.bytes;
  // Gbit/s of `bytes` to each of `ducks` (out, back) from the round trips
  // with them and without; 0 where they took no measurable time more.
  auto rates = [&](const std::vector<size_t> &ducks, double *outGbps,
                   double *inGbps, double *emptyUs) -> absl::Status {
    double t[3];
    const uint64_t sizes[3][2] = {{0, 0}, {n, 0}, {0, n}};
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<double> us = m.TimeLinkTrips(
          ducks, sizes[i][0], sizes[i][1], zeros, options.trips);
      if (!us.ok())
        return us.status();
      t[i] = *us;
    }
    const double bits = 8.0 * double(n) * double(ducks.size());
    *outGbps = t[1] > t[0] ? bits / ((t[1] - t[0]) * 1e3) : 0.0;
    *inGbps = t[2] > t[0] ? bits / ((t[2] - t[0]) * 1e3) : 0.0;
    *emptyUs = t[0];
    return absl::OkStatus();
  };
  LinkRates r;
  const std::vector<size_t> all = m.All();
  r.out_gbps.resize(all.size());
  r.in_gbps.resize(all.size());
  for (size_t d : all) {
    double empty = 0;
    if (absl::Status s = rates({d}, &r.out_gbps[d], &r.in_gbps[d], &empty);
        !s.ok())
      return s;
    r.empty_us = std::max(r.empty_us, empty);
  }
  double empty = 0;
  if (all.size() >= 2)
    if (absl::Status s = rates(all, &r.all_out_gbps, &r.all_in_gbps, &empty);
        !s.ok())
      return s;
  return r;
}

absl::StatusOr<std::vector<duckd_stats_reply>> DuckClient::Stats() {
  Impl &m = *impl_;
  std::vector<duckd_stats_reply> out(m.conns.size());
  std::vector<size_t> all;
  for (size_t d = 0; d < m.conns.size(); ++d) {
    if (absl::Status s = m.Usable(d); !s.ok())
      return s;
    m.Queue(d, DUCKD_MSG_STATS, {}, {});
    all.push_back(d);
  }
  absl::Status s = m.Pump(
      all, m.opt.call_timeout, "stats",
      [&](size_t d, const duckd_frame_header &,
          absl::Span<const uint8_t> pl) -> absl::Status {
        // Fields are only appended: a longer reply starts with these.
        if (pl.size() < sizeof(duckd_stats_reply))
          return absl::InternalError("stats reply shorter than protocol 3's");
        std::memcpy(&out[d], pl.data(), sizeof(duckd_stats_reply));
        return absl::OkStatus();
      });
  if (!s.ok())
    return s;
  return out;
}

absl::StatusOr<std::vector<duckd_mesh_reply>>
DuckClient::JoinMesh(absl::Span<const DuckEndpoint> mesh,
                     absl::Span<const float> checks, uint64_t session,
                     uint32_t groups, uint32_t transport) {
  Impl &m = *impl_;
  const size_t n = m.conns.size();
  if (mesh.size() != n || checks.size() != n)
    return absl::InvalidArgumentError(
        absl::StrCat("mesh: ", mesh.size(), " mesh endpoints and ",
                     checks.size(), " checks for ", n, " ducks"));
  std::vector<duckd_mesh_peer> peers(n);
  for (size_t j = 0; j < n; ++j) {
    const std::string host =
        mesh[j].host == "localhost" ? "127.0.0.1" : mesh[j].host;
    if (host.size() >= sizeof peers[j].host)
      return absl::InvalidArgumentError(
          absl::StrCat("mesh: duck ", j, "'s host '", host, "' is too long"));
    std::memcpy(peers[j].host, host.data(), host.size());
    peers[j].port = mesh[j].port;
  }
  const uint32_t timeout_ms =
      uint32_t(absl::ToInt64Milliseconds(m.opt.call_timeout) / 2);
  std::vector<size_t> all;
  for (size_t d = 0; d < n; ++d) {
    if (absl::Status s = m.Usable(d); !s.ok())
      return s;
    duckd_mesh_request r{};
    r.rank = uint32_t(d);
    r.ducks = uint32_t(n);
    r.groups = groups;
    r.timeout_ms = timeout_ms;
    r.session = session;
    r.check = checks[d];
    r.transport = transport;
    std::vector<uint8_t> owned(sizeof r + n * sizeof(duckd_mesh_peer));
    std::memcpy(owned.data(), &r, sizeof r);
    std::memcpy(owned.data() + sizeof r, peers.data(),
                n * sizeof(duckd_mesh_peer));
    Part p{owned.data(), owned.size()};
    m.Queue(d, DUCKD_MSG_MESH, std::move(owned), {p});
    all.push_back(d);
  }
  return m.PumpReplies<duckd_mesh_reply>(all, "mesh");
}

absl::StatusOr<std::vector<duckd_mesh_probe_reply>>
DuckClient::ProbeMesh(const duckd_mesh_probe_request &request) {
  Impl &m = *impl_;
  std::vector<size_t> all;
  for (size_t d = 0; d < m.conns.size(); ++d) {
    if (absl::Status s = m.Usable(d); !s.ok())
      return s;
    std::vector<uint8_t> owned(sizeof request);
    std::memcpy(owned.data(), &request, sizeof request);
    Part p{owned.data(), owned.size()};
    m.Queue(d, DUCKD_MSG_MESH_PROBE, std::move(owned), {p});
    all.push_back(d);
  }
  return m.PumpReplies<duckd_mesh_probe_reply>(all, "mesh_probe");
}

namespace {

/// A weight image file as the compiler writes it, opened for streaming.
struct ImageFile {
  int fd = -1;
  duck_image_header header{};
  std::vector<duck_slot_entry> table;
  ~ImageFile() {
    if (fd >= 0)
      ::close(fd);
  }
};

absl::Status ReadAt(int fd, void *dst, uint64_t bytes, uint64_t offset) {
  auto *p = static_cast<uint8_t *>(dst);
  while (bytes) {
    ssize_t r = ::pread(fd, p, bytes, off_t(offset));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return absl::DataLossError(absl::StrCat(
          "read at ", offset, ": ", r < 0 ? std::strerror(errno) : "end of file"));
    p += r;
    bytes -= uint64_t(r);
    offset += uint64_t(r);
  }
  return absl::OkStatus();
}

absl::Status OpenImage(const std::string &path, ImageFile *img) {
  img->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (img->fd < 0)
    return absl::NotFoundError(
        absl::StrCat(path, ": ", std::strerror(errno)));
  if (absl::Status s = ReadAt(img->fd, &img->header, sizeof img->header, 0);
      !s.ok())
    return absl::DataLossError(absl::StrCat(path, ": ", s.message()));
  const duck_image_header &h = img->header;
  if (h.magic != DUCK_IMAGE_MAGIC)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a duck weight image"));
  const off_t size = ::lseek(img->fd, 0, SEEK_END);
  if (size < 0 || uint64_t(size) != h.total_bytes)
    return absl::DataLossError(absl::StrCat(
        path, ": file has ", size, " bytes, its header says ", h.total_bytes));
  if (h.slot_count > (1u << 20) ||
      h.slot_table_offset + uint64_t(h.slot_count) * sizeof(duck_slot_entry) >
          h.total_bytes)
    return absl::DataLossError(absl::StrCat(path, ": slot table out of bounds"));
  img->table.resize(h.slot_count);
  return ReadAt(img->fd, img->table.data(),
                img->table.size() * sizeof(duck_slot_entry),
                h.slot_table_offset);
}

/// A byte range of an image that a duck lacks.
struct Range {
  uint64_t offset, bytes;
};

/// One duck's upload: the ranges it lacks, where the stream is in them,
/// and the chunk buffers its sent frames give back.
struct Upload {
  std::vector<Range> ranges;
  size_t next = 0;
  uint64_t pos = 0; // inside ranges[next]
  int inflight = 0;
  std::vector<std::vector<uint8_t>> pool;
};

/// One Prepare call, shared by its phases: the images, what each duck
/// said and lacks, the upload's progress.
struct PrepareJob {
  PrepareJob(absl::Span<const std::string> images,
             const PrepareOptions &options)
      : images(images), options(options), files(images.size()) {}
  absl::Span<const std::string> images;
  const PrepareOptions &options;
  const uint64_t start = NowNs();
  std::vector<ImageFile> files;
  PrepareReport report;
  std::vector<duckd_prepare_reply> begin;
  std::vector<std::vector<uint8_t>> bitmaps;
  std::vector<Upload> up;
  PrepareProgress prog;
  uint64_t last_report = 0;
  bool cancelled = false;

  /// Tells options.progress, at most once a progress_interval unless forced.
  void ReportProgress(bool force) {
    if (!options.progress)
      return;
    const uint64_t now = NowNs();
    if (!force && now - last_report < uint64_t(absl::ToInt64Nanoseconds(
                                          options.progress_interval)))
      return;
    last_report = now;
    prog.seconds = double(now - start) / 1e9;
    prog.bytes_per_second =
        prog.seconds > 0 ? double(prog.bytes_done) / prog.seconds : 0;
    prog.eta_seconds =
        prog.bytes_per_second > 0
            ? double(prog.bytes_total - prog.bytes_done) / prog.bytes_per_second
            : 0;
    options.progress(prog);
  }
};

/// 2. What each duck lacks: the head, then every unfinished slot.
void PlanUploads(PrepareJob &j) {
  const size_t n = j.files.size();
  j.up.resize(n);
  for (size_t d = 0; d < n; ++d) {
    if (j.report.result[d] == DUCKD_CACHE_HIT)
      continue;
    const ImageFile &f = j.files[d];
    Upload &u = j.up[d];
    const uint64_t tableEnd =
        f.header.slot_table_offset +
        uint64_t(f.header.slot_count) * sizeof(duck_slot_entry);
    if (!j.begin[d].head_finished)
      u.ranges.push_back({0, tableEnd});
    const std::vector<uint8_t> &bitmap = j.bitmaps[d];
    for (uint32_t s = 0; s < f.header.slot_count; ++s) {
      const bool done = s / 8 < bitmap.size() && (bitmap[s / 8] >> (s % 8)) & 1;
      if (!done && f.table[s].bytes)
        u.ranges.push_back({f.table[s].offset, f.table[s].bytes});
    }
    for (const Range &r : u.ranges)
      j.prog.bytes_total += r.bytes;
  }
}

} // namespace

absl::Status DuckClient::Impl::PrepareBegin(PrepareJob &j, bool invalidate) {
  const size_t n = conns.size();
  j.report.result.assign(n, DUCKD_CACHE_MISS);
  j.report.bytes_uploaded.assign(n, 0);
  j.begin.resize(n);
  j.bitmaps.resize(n);
  std::vector<size_t> ducks = All();
  for (size_t d : ducks) {
    duckd_prepare_begin_request r{};
    r.flags = invalidate ? DUCKD_PREPARE_INVALIDATE : 0;
    r.image = j.files[d].header;
    std::vector<uint8_t> owned(sizeof r);
    std::memcpy(owned.data(), &r, sizeof r);
    Part p{owned.data(), owned.size()};
    Queue(d, DUCKD_MSG_PREPARE_BEGIN, std::move(owned), {p});
  }
  return Pump(ducks, opt.call_timeout, "prepare_begin",
              [&](size_t d, const duckd_frame_header &,
                  absl::Span<const uint8_t> pl) -> absl::Status {
                if (pl.size() < sizeof(duckd_prepare_reply))
                  return absl::InternalError("short prepare_begin reply");
                std::memcpy(&j.begin[d], pl.data(), sizeof j.begin[d]);
                j.bitmaps[d].assign(pl.begin() + sizeof(duckd_prepare_reply),
                                    pl.end());
                j.report.result[d] = duckd_cache_result(j.begin[d].result);
                return absl::OkStatus();
              });
}

absl::Status DuckClient::Impl::RefillUpload(PrepareJob &j, size_t d) {
  Upload &u = j.up[d];
  if (j.options.cancel && j.options.cancel->load())
    j.cancelled = true; // no more chunks; those in flight are answered
  while (!j.cancelled && u.inflight < 2 && u.next < u.ranges.size()) {
    const Range &r = u.ranges[u.next];
    const uint64_t bytes =
        std::min<uint64_t>(opt.prepare_chunk_bytes, r.bytes - u.pos);
    const uint64_t offset = r.offset + u.pos;
    std::vector<uint8_t> buf;
    if (!u.pool.empty()) {
      buf = std::move(u.pool.back());
      u.pool.pop_back();
    }
    buf.resize(sizeof(duckd_prepare_write_request) + bytes);
    duckd_prepare_write_request w{offset, bytes};
    std::memcpy(buf.data(), &w, sizeof w);
    if (absl::Status s =
            ReadAt(j.files[d].fd, buf.data() + sizeof w, bytes, offset);
        !s.ok())
      return absl::DataLossError(absl::StrCat(j.images[d], ": ", s.message()));
    Part p{buf.data(), buf.size()};
    Queue(d, DUCKD_MSG_PREPARE_WRITE, std::move(buf), {p}, &u.pool);
    ++u.inflight;
    u.pos += bytes;
    if (u.pos == r.bytes) {
      ++u.next;
      u.pos = 0;
    }
  }
  return absl::OkStatus();
}

absl::Status DuckClient::Impl::PrepareUpload(PrepareJob &j) {
  std::vector<size_t> ducks;
  for (size_t d = 0; d < j.up.size(); ++d)
    if (!j.up[d].ranges.empty()) {
      ducks.push_back(d);
      if (absl::Status s = RefillUpload(j, d); !s.ok())
        return s;
    }
  j.ReportProgress(true);
  return Pump(
      ducks, opt.call_timeout, "prepare_write",
      [&](size_t d, const duckd_frame_header &,
          absl::Span<const uint8_t> pl) -> absl::Status {
        duckd_prepare_write_reply rep;
        if (pl.size() != sizeof rep)
          return absl::InternalError("bad prepare_write reply");
        std::memcpy(&rep, pl.data(), sizeof rep);
        --j.up[d].inflight;
        j.report.bytes_uploaded[d] += rep.bytes;
        j.prog.bytes_done += rep.bytes;
        j.ReportProgress(false);
        return absl::OkStatus();
      },
      [&](size_t d) { return RefillUpload(j, d); }, /*idle=*/true);
}

absl::Status DuckClient::Impl::PrepareFinish(PrepareJob &j) {
  std::vector<size_t> ducks;
  for (size_t d = 0; d < conns.size(); ++d)
    if (j.report.result[d] != DUCKD_CACHE_HIT) {
      ducks.push_back(d);
      Queue(d, DUCKD_MSG_PREPARE_FINISH, {}, {});
    }
  return Pump(ducks, opt.call_timeout, "prepare_finish",
              [&](size_t, const duckd_frame_header &,
                  absl::Span<const uint8_t> pl) -> absl::Status {
                if (j.cancelled)
                  return absl::OkStatus();
                duckd_prepare_reply rep;
                if (pl.size() < sizeof rep)
                  return absl::InternalError("short prepare_finish reply");
                std::memcpy(&rep, pl.data(), sizeof rep);
                if (!rep.head_finished || rep.finished_slots != rep.slot_count)
                  return absl::DataLossError(absl::StrCat(
                      rep.finished_slots, "/", rep.slot_count,
                      " slots finished after the upload"));
                return absl::OkStatus();
              });
}

absl::StatusOr<PrepareReport>
DuckClient::Prepare(absl::Span<const std::string> images,
                    const PrepareOptions &options) {
  Impl &m = *impl_;
  const size_t n = m.conns.size();
  if (images.size() != n)
    return absl::InvalidArgumentError(absl::StrCat(
        "prepare needs one image per duck: ", images.size(), " for ", n));
  PrepareJob j(images, options);
  for (size_t d = 0; d < n; ++d) {
    if (absl::Status s = OpenImage(images[d], &j.files[d]); !s.ok())
      return s;
    if (absl::Status s = m.Usable(d); !s.ok())
      return s;
  }
  // DUCK_INVALIDATE=1: the host switch that forces a miss without code.
  bool invalidate = options.invalidate;
  if (m.opt.read_environment)
    if (const char *e = std::getenv("DUCK_INVALIDATE"); e && std::string(e) == "1")
      invalidate = true;
  if (absl::Status s = m.PrepareBegin(j, invalidate); !s.ok())
    return s;
  PlanUploads(j);
  if (absl::Status s = m.PrepareUpload(j); !s.ok())
    return s;
  // After a cancel too: each duck keeps the slots that arrived whole, so
  // the next prepare sends only the rest; its answer then says the others
  // stay unfinished, which is expected (the connections are closed after).
  absl::Status finished = m.PrepareFinish(j);
  if (j.cancelled)
    return absl::CancelledError(absl::StrFormat(
        "interrupted: the weight upload stopped at %.1f of %.1f MiB (the "
        "ducks keep the slots that arrived whole; the next prepare sends "
        "the rest)",
        j.prog.bytes_done / 1048576.0, j.prog.bytes_total / 1048576.0));
  if (!finished.ok())
    return finished;
  j.ReportProgress(true);
  j.report.seconds = double(NowNs() - j.start) / 1e9;
  if (absl::Status s = m.Hello(); !s.ok())
    return s;
  return std::move(j.report);
}

} // namespace duck::runtime
