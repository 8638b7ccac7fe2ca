// duckd's connection handling and request dispatch (Server.h).
#include "Server.h"

#include "Measure.h"

#include "duck_rt/cast.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <netinet/in.h>
#include <optional>
#include <poll.h>
#include <sched.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace duck::duckd {
namespace {

std::string Errno(const char *what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

bool IsLoopback(const in_addr &a) { return (ntohl(a.s_addr) >> 24) == 127; }

absl::Status MakeDirs(const std::string &path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        return absl::PermissionDeniedError(Errno(cur.c_str()));
    }
    if (i < path.size())
      cur.push_back(path[i]);
  }
  return absl::OkStatus();
}

std::string DefaultCacheDir() {
  if (const char *x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return absl::StrCat(x, "/duck");
  if (const char *h = std::getenv("HOME"); h && *h)
    return absl::StrCat(h, "/.cache/duck");
  return "/tmp/duck-cache";
}

duckd_error_code CodeFor(const absl::Status &s) {
  switch (s.code()) {
  case absl::StatusCode::kResourceExhausted: return DUCKD_ERR_TOO_LARGE;
  case absl::StatusCode::kFailedPrecondition: return DUCKD_ERR_BAD_ABI;
  default: return DUCKD_ERR_BAD_FRAME;
  }
}

uint64_t PhysicalMemory() {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? uint64_t(pages) * uint64_t(size) : 0;
}

// The options that can be refused before anything is opened: the address,
// a token where it is needed, the port.
absl::Status CheckBind(const ServerOptions &options, in_addr &addr) {
  if (::inet_pton(AF_INET, options.bind.c_str(), &addr) != 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--bind ", options.bind, " is not an IPv4 address"));
  if (!IsLoopback(addr) && options.token.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("--bind ", options.bind,
                     " is not loopback: it needs --token (or DUCKD_TOKEN)"));
  if (options.token.size() > DUCKD_MAX_TOKEN_BYTES)
    return absl::InvalidArgumentError("--token longer than 256 bytes");
  if (options.port < 0 || options.port > 65535)
    return absl::InvalidArgumentError("--port outside [0, 65535]");
  return absl::OkStatus();
}

} // namespace

// Signals arrive through a signalfd; workers unblock them after fork.
absl::Status Server::OpenSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  signal_fd_ = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0)
    return absl::InternalError(Errno("signalfd"));
  return absl::OkStatus();
}

namespace {
/// A listening socket bound to `addr`:`port` (0: any) into *fd, and the
/// port it got; `what` names it in errors ("" or "the mesh ").
absl::Status BindListen(const in_addr &addr, int port, int backlog,
                        const std::string &what, const std::string &bind,
                        int *fd, uint16_t *bound) {
  *fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (*fd < 0)
    return absl::InternalError(Errno("socket"));
  int one = 1;
  ::setsockopt(*fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr = addr;
  sa.sin_port = htons(uint16_t(port));
  if (::bind(*fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0)
    return absl::UnavailableError(
        Errno(absl::StrCat("bind ", what, bind, ":", port).c_str()));
  if (::listen(*fd, backlog) != 0)
    return absl::InternalError(Errno("listen"));
  socklen_t len = sizeof sa;
  ::getsockname(*fd, reinterpret_cast<sockaddr *>(&sa), &len);
  *bound = ntohs(sa.sin_port);
  return absl::OkStatus();
}
} // namespace

// The listening socket, bound to the address and port (0: any), and the
// port it got; with --mesh-port the ducks' mesh listener on the same
// address (the lower ranks of a mesh connect there when the host asks this
// duck to join).
absl::Status Server::Listen(const in_addr &addr) {
  if (absl::Status s =
          BindListen(addr, opt_.port, 16, "", opt_.bind, &listen_fd_, &port_);
      !s.ok())
    return s;
  if (opt_.mesh_port >= 0)
    if (absl::Status s = BindListen(addr, opt_.mesh_port, 128, "the mesh ",
                                    opt_.bind, &mesh_fd_, &mesh_port_);
        !s.ok())
      return s;
  if (opt_.cast_address.empty())
    return absl::OkStatus();
  if (opt_.cast_port < 0 || opt_.cast_port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("--cast: port ", opt_.cast_port, " is out of range"));
  auto cast =
      OpenCastSocket(opt_.cast_address, uint16_t(opt_.cast_port), opt_.bind);
  if (!cast.ok())
    return absl::Status(cast.status().code(),
                        absl::StrCat("--cast: ", cast.status().message()));
  cast_fd_ = cast->fd;
  cast_port_ = cast->port;
  return absl::OkStatus();
}

// The CPUs this process may run on, and the cores it uses of them (all, up
// to DUCKD_MAX_CORES, unless --cores says).
absl::Status Server::PickCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set))
        cpus_.push_back(c);
  if (cpus_.empty())
    cpus_.push_back(0);
  if (!opt_.cores)
    opt_.cores = std::min<uint32_t>(uint32_t(cpus_.size()), DUCKD_MAX_CORES);
  if (opt_.cores > DUCKD_MAX_CORES)
    return absl::InvalidArgumentError(
        absl::StrCat("--cores at most ", DUCKD_MAX_CORES));
  return absl::OkStatus();
}

// The weight cache file (named by --name, else the port) and its scrub.
absl::Status Server::OpenCache() {
  const std::string dir =
      opt_.cache_dir.empty() ? DefaultCacheDir() : opt_.cache_dir;
  if (absl::Status st = MakeDirs(dir); !st.ok())
    return st;
  cache_path_ = absl::StrCat(
      dir, "/duckd-", opt_.name.empty() ? absl::StrCat(port_) : opt_.name,
      ".weights");
  WeightCache::Options co;
  co.path = cache_path_;
  co.capacity = opt_.weights_size;
  co.sync = opt_.sync;
  auto cache = WeightCache::Open(co, &cache_note_);
  if (!cache.ok())
    return cache.status();
  cache_ = std::move(*cache);
  Scrubber::Options so;
  so.bytes_per_second = opt_.scrub_bytes_per_second;
  scrub_ = std::make_unique<Scrubber>(cache_.get(), so);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Server>>
Server::Create(const ServerOptions &options) {
  std::unique_ptr<Server> s(new Server());
  s->opt_ = options;
  in_addr addr{};
  if (absl::Status st = CheckBind(options, addr); !st.ok())
    return st;
  if (absl::Status st = s->OpenSignals(); !st.ok())
    return st;
  if (absl::Status st = s->Listen(addr); !st.ok())
    return st;
  if (absl::Status st = s->PickCores(); !st.ok())
    return st;
  if (absl::Status st = s->OpenCache(); !st.ok())
    return st;
  s->tsc_hz_ = CalibrateTsc();
  return s;
}

Server::~Server() {
  StopWorkers();
  if (conn_.fd >= 0)
    ::close(conn_.fd);
  if (listen_fd_ >= 0)
    ::close(listen_fd_);
  mesh_.reset();
  if (mesh_fd_ >= 0)
    ::close(mesh_fd_);
  if (cast_fd_ >= 0)
    ::close(cast_fd_);
  if (signal_fd_ >= 0)
    ::close(signal_fd_);
}

std::string Server::address() const {
  return absl::StrCat(opt_.bind, ":", port_);
}

void Server::Log(const std::string &line) const {
  std::fprintf(stderr, "duckd[%u] %s\n", unsigned(port_), line.c_str());
  std::fflush(stderr);
}

void Server::StopWorkers() {
  if (session_)
    CloseSession("connection closed");
  session_id_ = 0;
  if (run_worker_) {
    run_worker_->Stop(absl::Milliseconds(500));
    run_worker_.reset();
  }
}

// The descriptors the loop waits on: signals and new connections always,
// the connection unless a session worker holds it and the host has hung up,
// and the session worker's event and pid fds.
void Server::WatchFds(std::vector<pollfd> &p, bool lent, PollIndex &at) const {
  p.clear();
  p.push_back({signal_fd_, POLLIN, 0});
  p.push_back({listen_fd_, POLLIN, 0});
  if (conn_.fd >= 0 && (!lent || !conn_.hangup)) {
    at.conn = int(p.size());
    // While a session worker holds the connection, duckd only watches
    // for the host hanging up (a hung step must not outlive its host).
    p.push_back({conn_.fd, short(lent ? POLLRDHUP : POLLIN), 0});
  }
  if (session_) {
    at.event = int(p.size());
    p.push_back({session_->event_fd(), POLLIN, 0});
    at.pid = int(p.size());
    p.push_back({session_->pid_fd(), POLLIN, 0});
  }
}

// How long the loop may sleep: until the step timeout while a worker holds
// the connection, and no later than the scrub's next chunk.
absl::Duration Server::PollWait(bool lent) const {
  // A step may start at any moment while the worker holds the
  // connection: wake up at least once per step timeout to check.
  int timeout = -1;
  if (lent) {
    const absl::Duration left =
        session_->in_step() ? opt_.step_timeout - session_->step_elapsed()
                            : opt_.step_timeout;
    timeout = int(std::max<int64_t>(1, absl::ToInt64Milliseconds(left) + 1));
  }
  // The scrub's next chunk, to the microsecond: at 64 MB/s a chunk is
  // due every 4.1 ms, and whole milliseconds would slow it by a fifth.
  absl::Duration wait = timeout < 0 ? absl::InfiniteDuration()
                                    : absl::Milliseconds(timeout);
  return std::min(wait, ScrubWait(absl::Now()));
}

// SIGTERM or SIGINT: logs the scrub's totals, drops the connection and
// stops the workers.
void Server::OnSignal() {
  signalfd_siginfo si;
  ssize_t n = ::read(signal_fd_, &si, sizeof si);
  (void)n;
  const Scrubber::Stats &st = scrub_->stats();
  Log(absl::StrFormat(
      "signal %u: shutting down (scrub: %llu passes, %llu slots, %.1f MiB "
      "hashed, %llu damaged found)",
      si.ssi_signo, (unsigned long long)st.passes,
      (unsigned long long)st.slots, double(st.bytes) / 1048576.0,
      (unsigned long long)st.damaged));
  if (conn_.fd >= 0)
    Drop("shutdown");
  StopWorkers();
}

// The connection's events: a frame to read, or, while a worker holds it,
// the host hanging up. True when the session was closed for it (nothing
// more this turn).
bool Server::OnConnEvents(short revents, bool lent) {
  if (!lent) {
    OnReadable();
  } else if (revents & (POLLRDHUP | POLLHUP | POLLERR)) {
    conn_.hangup = true;
    if (session_->in_step()) { // the worker cannot notice: stop it
      CloseSession("host hung up during a step");
      Drop("host hung up during a step");
      return true;
    }
    // Otherwise the worker sees the end of the stream and hands back.
  }
  return false;
}

absl::Status Server::Serve() {
  Log(absl::StrCat(
      "listening on ", address(), ", ", opt_.cores, " cores, weights ",
      cache_path_, " (", cache_note_, "), scrub ",
      scrub_->enabled()
          ? absl::StrFormat("%.0f MB/s",
                            double(scrub_->bytes_per_second()) / 1e6)
          : std::string("off")));
  std::vector<pollfd> p;
  for (;;) {
    const bool lent = session_ && session_->lent();
    PollIndex at;
    WatchFds(p, lent, at);
    const absl::Duration wait = PollWait(lent);
    const timespec ts = absl::ToTimespec(wait);
    int r = ::ppoll(p.data(), p.size(),
                    wait == absl::InfiniteDuration() ? nullptr : &ts,
                    nullptr);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return absl::InternalError(Errno("poll"));
    }
    // Nothing else to do: the scrub's turn, one chunk (every event is
    // served first, and the loop checks for work again after each chunk).
    if (r == 0 && ScrubMayRun() && absl::Now() >= scrub_->due())
      ScrubChunk(absl::Now());
    if (p[0].revents & POLLIN) {
      OnSignal();
      return absl::OkStatus();
    }
    if (at.pid >= 0 && (p[at.pid].revents & POLLIN)) {
      OnSessionDied();
      continue;
    }
    if (at.event >= 0 && (p[at.event].revents & POLLIN)) {
      OnSessionEvent();
      continue;
    }
    if (session_ && session_->lent() && session_->in_step() &&
        session_->step_elapsed() >= opt_.step_timeout) {
      OnStepTimeout();
      continue;
    }
    if (at.conn >= 0 && p[at.conn].revents &&
        OnConnEvents(p[at.conn].revents, lent))
      continue;
    if (p[1].revents & POLLIN)
      Accept();
  }
}

void Server::LendToSession() {
  if (session_ && conn_.fd >= 0 && !session_->lent())
    session_->Lend(cache_->usable_bytes(), cache_->generation(), conn_.keys);
}

void Server::CloseSession(const std::string &why) {
  if (!session_)
    return;
  session_->Stop(absl::ZeroDuration());
  session_.reset();
  Log(absl::StrCat("session ", session_id_, " closed: ", why));
  session_id_ = 0;
}

void Server::OnSessionEvent() {
  Handback b = session_->TakeBack();
  if (b.kind == Handback::kNone)
    return; // still lent (a stale wake-up)
  conn_.keys = b.keys;
  if (b.kind == Handback::kDrop) {
    Drop(b.message);
    return;
  }
  OnFrame(b.header);
}

void Server::OnSessionDied() {
  const bool lent = session_->lent(), stepping = session_->in_step();
  const uint32_t id = session_->step_request_id();
  const uint64_t number = session_->step_number();
  if (lent)
    conn_.keys = session_->keys(); // the worker read the step's frame
  const std::string how = session_->Reap(false);
  const uint64_t sid = session_id_;
  session_.reset();
  session_id_ = 0;
  Log(absl::StrCat("session ", sid, " worker ", how));
  if (!lent || conn_.fd < 0)
    return; // idle worker gone: the host learns at its next step
  if (!stepping) {
    Drop(absl::StrCat("session worker died outside a step (", how, ")"));
    return;
  }
  ReplyError(DUCKD_MSG_STEP, id, DUCKD_ERR_STEP_CRASHED,
             absl::StrCat("the ELF crashed in step ", number, ": worker ", how,
                          "; session ", sid, " closed"));
}

void Server::OnStepTimeout() {
  const uint32_t id = session_->step_request_id();
  const uint64_t number = session_->step_number();
  const uint64_t sid = session_id_;
  session_->Reap(true);
  conn_.keys = session_->keys();
  const bool stillStepping = session_->in_step();
  session_.reset();
  session_id_ = 0;
  Log(absl::StrCat("session ", sid, ": step ", number, " timed out"));
  if (!stillStepping) { // it finished as it was killed: stream state unknown
    Drop("step finished while being timed out");
    return;
  }
  ReplyError(DUCKD_MSG_STEP, id, DUCKD_ERR_STEP_TIMEOUT,
             absl::StrCat("step ", number, " did not finish within ",
                          absl::FormatDuration(opt_.step_timeout),
                          "; worker killed; session ", sid, " closed"));
}

void Server::Accept() {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr *>(&sa), &len,
                     SOCK_CLOEXEC);
  if (fd < 0)
    return;
  char ip[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  const std::string peer = absl::StrCat(ip, ":", ntohs(sa.sin_port));
  TuneSocket(fd);
  if (conn_.fd >= 0 && !session_) {
    // A host that already left (its close not yet seen: a health check's
    // connect-and-close, a client that gave up) does not hold the duck.
    char c;
    if (::recv(conn_.fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
      Drop(absl::StrCat("the host left; the duck goes to ", peer));
  }
  if (conn_.fd >= 0) {
    // A connection that never said hello, or an idle one without a
    // session, yields the duck; a working host keeps it.
    const absl::Time now = absl::Now();
    if (!conn_.proven && now - conn_.since >= opt_.hello_timeout)
      Drop(absl::StrCat("no hello within ",
                        absl::FormatDuration(opt_.hello_timeout),
                        "; the duck goes to ", peer));
    else if (!session_ && now - conn_.last_request >= opt_.idle_timeout)
      Drop(absl::StrCat("idle for ",
                        absl::FormatDuration(now - conn_.last_request),
                        " without a session; the duck goes to ", peer));
  }
  if (conn_.fd >= 0) {
    const std::string msg =
        session_ ? absl::StrCat("busy: serving session ", session_id_,
                                " from ", conn_.peer)
                 : absl::StrCat("busy: serving a host from ", conn_.peer,
                                " (no session open)");
    const std::string payload = EncodeError(DUCKD_ERR_BUSY, msg);
    Part part{payload.data(), payload.size()};
    (void)WriteFrame(fd, DUCKD_MSG_NOTICE, DUCKD_FLAG_REPLY | DUCKD_FLAG_ERROR,
                     0, {&part, 1}, absl::Now() + absl::Milliseconds(200));
    ::close(fd);
    Log(absl::StrCat("refused ", peer, ": ", msg));
    return;
  }
  conn_ = Conn{};
  conn_.fd = fd;
  conn_.peer = peer;
  conn_.since = conn_.last_request = absl::Now();
  Log(absl::StrCat("host ", peer, " connected"));
}

void Server::Drop(const std::string &why) {
  Log(absl::StrCat("host ", conn_.peer, ": ", why, "; connection closed"));
  ::close(conn_.fd);
  conn_ = Conn{};
  preparing_ = false; // an upload cut off: what it wrote is unfinished
  StopWorkers();
}

bool Server::ScrubMayRun() const {
  return scrub_->HasWork() && !preparing_ &&
         !(session_ && session_->in_step());
}

absl::Duration Server::ScrubWait(absl::Time now) const {
  if (!scrub_->HasWork() || preparing_)
    return absl::InfiniteDuration(); // a prepare's frames or end wake us
  // A session worker serves steps without duckd: while one runs, look
  // again shortly (steps are milliseconds).
  if (session_ && session_->in_step())
    return absl::Milliseconds(2);
  return std::clamp(scrub_->due() - now, absl::ZeroDuration(),
                    absl::Seconds(1));
}

void Server::ScrubChunk(absl::Time now) {
  static const char *kKinds[] = {"dense", "moe", "head"};
  if (std::optional<Scrubber::Damage> d = scrub_->Chunk(now)) {
    const std::string what =
        d->slot < 0
            ? absl::StrCat("the image head (header and slot table, ",
                           d->bytes, " bytes)")
            : absl::StrCat("slot ", d->slot, " (layer ", d->layer, ", ",
                           d->kind < 3 ? kKinds[d->kind] : "?", "; ",
                           d->bytes, " bytes at image offset ", d->offset,
                           ")");
    Log(absl::StrCat(
        "scrub: ", what, " is damaged: its bytes hash to 0x",
        absl::Hex(d->got, absl::kZeroPad16), ", finished as 0x",
        absl::Hex(d->want, absl::kZeroPad16), "; ",
        d->slot < 0 ? "every slot is unfinished" : "it is unfinished",
        " (", d->unfinished,
        " part(s)): the next prepare uploads it again, and steps on it are "
        "refused until then"));
  }
  if (scrub_->TakePassEnded()) {
    const Scrubber::Stats &st = scrub_->stats();
    // The first pass says the scrub works; later ones only when they
    // found something (an idle duck passes every few seconds or minutes).
    if (st.passes == 1 || st.last_pass_damaged)
      Log(absl::StrFormat(
          "scrub: pass %llu done in %.2f s (%llu damaged in it); %llu slots, "
          "%.1f MiB hashed so far",
          (unsigned long long)st.passes,
          absl::ToDoubleSeconds(st.last_pass_took),
          (unsigned long long)st.last_pass_damaged,
          (unsigned long long)st.slots, double(st.bytes) / 1048576.0));
  }
}

void Server::Reply(uint16_t type, uint32_t request_id,
                   std::initializer_list<Part> parts) {
  absl::Status s =
      WriteFrame(conn_.fd, type, DUCKD_FLAG_REPLY, request_id,
                 absl::MakeConstSpan(parts.begin(), parts.size()),
                 absl::Now() + opt_.io_timeout, &conn_.keys);
  if (!s.ok())
    Drop(absl::StrCat("reply failed: ", s.message()));
}

void Server::ReplyError(uint16_t type, uint32_t request_id,
                        duckd_error_code code, const std::string &message) {
  Log(absl::StrCat(MessageTypeName(type), " from ", conn_.peer, " -> ",
                   ErrorCodeName(code), ": ", message));
  const std::string payload = EncodeError(code, message);
  Part part{payload.data(), payload.size()};
  absl::Status s = WriteFrame(conn_.fd, type,
                              DUCKD_FLAG_REPLY | DUCKD_FLAG_ERROR, request_id,
                              {&part, 1}, absl::Now() + opt_.io_timeout,
                              &conn_.keys);
  if (!s.ok())
    Drop(absl::StrCat("error reply failed: ", s.message()));
}

absl::Status Server::Drain(uint64_t bytes) {
  uint8_t tmp[65536];
  const absl::Time deadline = absl::Now() + opt_.io_timeout;
  while (bytes) {
    size_t n = std::min<uint64_t>(bytes, sizeof tmp);
    if (absl::Status s = ReadFull(conn_.fd, tmp, n, deadline); !s.ok())
      return s;
    check_.Update(tmp, n);
    bytes -= n;
  }
  return absl::OkStatus();
}

bool Server::Verify(const duckd_frame_header &h) {
  absl::Status s = check_.Finish();
  if (s.ok()) {
    if (conn_.hello)
      conn_.proven = true;
    return true;
  }
  if (!conn_.keys.keyed) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_FRAME,
               std::string(s.message()));
    return false;
  }
  // Whoever sent it does not hold this connection's key: answer (sealed,
  // so the real host can read why) and end the connection.
  ReplyError(h.type, h.request_id, DUCKD_ERR_UNAUTHORIZED,
             std::string(s.message()));
  if (conn_.fd >= 0)
    Drop(std::string(s.message()));
  return false;
}

bool Server::DrainAndVerify(const duckd_frame_header &h, uint64_t bytes) {
  if (!Drain(bytes).ok()) {
    Drop(absl::StrCat("truncated ", MessageTypeName(h.type), " frame"));
    return false;
  }
  return Verify(h);
}

bool Server::ReadPayload(const duckd_frame_header &h) {
  buf_.resize(h.payload_bytes);
  absl::Status s = ReadFull(conn_.fd, buf_.data(), buf_.size(),
                            absl::Now() + opt_.io_timeout);
  if (!s.ok()) {
    Drop(absl::StrCat("truncated ", MessageTypeName(h.type), " frame: ",
                      s.message()));
    return false;
  }
  check_.Update(buf_.data(), buf_.size());
  return Verify(h);
}

void Server::OnReadable() {
  duckd_frame_header h{};
  const int fd = conn_.fd;
  conn_.last_request = absl::Now();
  // A frame, once started, must arrive within io_timeout.
  uint8_t first;
  ssize_t n = ::recv(fd, &first, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) {
    Drop("disconnected");
    return;
  }
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    Drop(Errno("recv"));
    return;
  }
  if (n < 0)
    return;
  if (absl::Status s =
          ReadFull(fd, &h, sizeof h, absl::Now() + opt_.io_timeout);
      !s.ok()) {
    Drop(absl::StrCat("truncated frame header: ", s.message()));
    return;
  }
  OnFrame(h);
}

void Server::OnFrame(const duckd_frame_header &h) {
  if (absl::Status s = ValidateHeader(h, opt_.max_payload); !s.ok()) {
    const uint16_t type = h.type > 0 && h.type < DUCKD_MSG_COUNT
                              ? h.type
                              : uint16_t(DUCKD_MSG_NOTICE);
    ReplyError(type, h.request_id, CodeFor(s), std::string(s.message()));
    if (conn_.fd >= 0)
      Drop("unusable frame");
    return;
  }
  ++conn_.requests;
  // Every frame counts in the connection's sequence: its check covers all
  // of it, read or drained (OnHello checks a hello on its own: it starts a
  // new sequence).
  check_.Begin(h, &conn_.keys);
  const bool step = h.type == DUCKD_MSG_STEP || h.type == DUCKD_MSG_STEP_CAST;
  if ((h.flags != 0 && !(step && h.flags == DUCKD_FLAG_QUIET)) ||
      h.type == DUCKD_MSG_NOTICE) {
    if (DrainAndVerify(h, h.payload_bytes))
      ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
                 "hosts send requests: no flags (but quiet on a step), no "
                 "notices");
  } else if (!conn_.hello && h.type != DUCKD_MSG_HELLO) {
    if (DrainAndVerify(h, h.payload_bytes))
      ReplyError(h.type, h.request_id, DUCKD_ERR_UNAUTHORIZED,
                 absl::StrCat(MessageTypeName(h.type),
                              " before hello: send hello first"));
  } else {
    switch (h.type) {
    case DUCKD_MSG_HELLO: OnHello(h); break;
    case DUCKD_MSG_OPEN: OnOpen(h); break;
    case DUCKD_MSG_STEP: OnStep(h); break;
    case DUCKD_MSG_STEP_CAST:
    case DUCKD_MSG_STEP_STAGED:
      OnStepCast(h);
      break;
    case DUCKD_MSG_RUN: OnRun(h); break;
    case DUCKD_MSG_PREPARE_BEGIN: OnPrepareBegin(h); break;
    case DUCKD_MSG_PREPARE_WRITE: OnPrepareWrite(h); break;
    case DUCKD_MSG_PREPARE_FINISH: OnPrepareFinish(h); break;
    case DUCKD_MSG_CLOSE: OnClose(h); break;
    case DUCKD_MSG_MEASURE: OnMeasure(h); break;
    case DUCKD_MSG_STATS: OnStats(h); break;
    case DUCKD_MSG_MESH_PROBE:
      OnMeshProbe(h);
      break;
    case DUCKD_MSG_MESH:
      OnMesh(h);
      break;
    default: break; // ValidateHeader refused every other type
    }
  }
  LendToSession();
}

namespace {

/// Why a well-formed hello is refused, and whether the connection goes too.
struct HelloRefusal {
  duckd_error_code code;
  std::string message;
  const char *drop = nullptr; // the reason to drop the connection, if so
};

/// A hello this duckd cannot take: another abi or protocol, an unknown
/// auth, or a token on one side only.
std::optional<HelloRefusal> RefuseHello(const duckd_hello_request &r,
                                        bool hasToken) {
  const bool keyed = r.auth == DUCKD_AUTH_HMAC_SHA256;
  if (r.abi_version != DUCK_ABI_VERSION ||
      r.protocol_version != DUCKD_PROTOCOL_VERSION)
    return HelloRefusal{
        DUCKD_ERR_BAD_ABI,
        absl::StrCat("host speaks abi ", r.abi_version, " protocol ",
                     r.protocol_version, "; duckd speaks abi ",
                     DUCK_ABI_VERSION, " protocol ", DUCKD_PROTOCOL_VERSION)};
  if (r.auth > DUCKD_AUTH_HMAC_SHA256)
    return HelloRefusal{DUCKD_ERR_BAD_REQUEST,
                        absl::StrCat("hello: unknown auth ", r.auth)};
  if (hasToken && !keyed)
    return HelloRefusal{DUCKD_ERR_UNAUTHORIZED,
                        "this duckd has a token: the host must have it too "
                        "(the cluster file's \"token\")",
                        "hello without the token"};
  if (!hasToken && keyed)
    return HelloRefusal{
        DUCKD_ERR_UNAUTHORIZED,
        "the host authenticates with a token but this duckd has none: "
        "start duckd with the same --token"};
  return std::nullopt;
}

} // namespace

void Server::OnHello(const duckd_frame_header &h) {
  // A hello (re)starts the connection's authentication: until it succeeds
  // nothing is authenticated, and refusals go out unsealed.
  conn_.hello = conn_.proven = false;
  conn_.keys = FrameKeys{};
  buf_.resize(h.payload_bytes);
  if (absl::Status s = ReadFull(conn_.fd, buf_.data(), buf_.size(),
                                absl::Now() + opt_.io_timeout);
      !s.ok()) {
    Drop(absl::StrCat("truncated hello frame: ", s.message()));
    return;
  }
  duckd_hello_request r{};
  if (buf_.size() != sizeof r) {
    if (CheckPayload(h, buf_, nullptr).ok())
      ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
                 absl::StrCat("hello of ", buf_.size(), " bytes; protocol ",
                              DUCKD_PROTOCOL_VERSION, "'s hello has ",
                              sizeof r));
    else
      ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
                 absl::StrCat("hello of ", buf_.size(),
                              " bytes with a bad check: not a protocol ",
                              DUCKD_PROTOCOL_VERSION, " hello"));
    return;
  }
  std::memcpy(&r, buf_.data(), sizeof r);
  const bool keyed = r.auth == DUCKD_AUTH_HMAC_SHA256;
  FrameKeys hk;
  if (keyed && !opt_.token.empty())
    hk = HelloKeys(opt_.token, r.nonce, kRoleDuck);
  if (absl::Status s = CheckPayload(h, buf_, keyed ? &hk : nullptr);
      !s.ok() && (!keyed || !opt_.token.empty())) {
    const bool auth = s.code() == absl::StatusCode::kPermissionDenied;
    ReplyError(h.type, h.request_id,
               auth ? DUCKD_ERR_UNAUTHORIZED : DUCKD_ERR_BAD_FRAME,
               auth ? "wrong token (the hello's tag does not verify)"
                    : std::string(s.message()));
    if (auth && conn_.fd >= 0)
      Drop("wrong token");
    return;
  }
  if (std::optional<HelloRefusal> no = RefuseHello(r, !opt_.token.empty())) {
    ReplyError(h.type, h.request_id, no->code, no->message);
    if (no->drop && conn_.fd >= 0)
      Drop(no->drop);
    return;
  }
  uint8_t nonce[kNonceBytes] = {};
  if (keyed)
    if (absl::Status s = RandomNonce(nonce); !s.ok()) {
      ReplyError(h.type, h.request_id, DUCKD_ERR_INTERNAL,
                 std::string(s.message()));
      return;
    }
  conn_.hello = true;
  const duckd_hello_reply rep = HelloReply(keyed, nonce);
  std::vector<uint8_t> bits = rep.cache_valid ? cache_->FinishedBitmap()
                                              : std::vector<uint8_t>();
  if (keyed) { // from here on every frame is sealed, this reply first
    conn_.keys = ConnectionKeys(opt_.token, r.nonce, nonce, kRoleDuck);
    conn_.keys.send_seq = 0;
  } else {
    conn_.proven = true;
  }
  Reply(h.type, h.request_id, {{&rep, sizeof rep}, {bits.data(), bits.size()}});
}

duckd_hello_reply Server::HelloReply(bool keyed, const uint8_t *nonce) const {
  const duckd_cache_header &c = cache_->header();
  duckd_hello_reply rep{};
  rep.abi_version = DUCK_ABI_VERSION;
  rep.protocol_version = DUCKD_PROTOCOL_VERSION;
  rep.cores = opt_.cores;
  rep.pid = uint32_t(getpid());
  rep.memory_bytes = PhysicalMemory();
  rep.weights_capacity = cache_->capacity();
  rep.max_payload = opt_.max_payload;
  rep.tsc_hz = tsc_hz_;
  rep.weights_generation = cache_->generation();
  if (c.valid)
    rep.image = c.image;
  rep.cache_valid = c.valid;
  rep.head_finished = c.head_finished;
  rep.finished_slots = c.finished_slots;
  rep.auth = keyed ? DUCKD_AUTH_HMAC_SHA256 : DUCKD_AUTH_NONE;
  std::memcpy(rep.nonce, nonce, kNonceBytes);
  const std::string name =
      opt_.name.empty() ? absl::StrCat(port_) : opt_.name;
  std::strncpy(rep.name, name.c_str(), sizeof rep.name - 1);
  return rep;
}

WorkerConfig Server::BaseWorkerConfig(uint32_t cores) const {
  WorkerConfig wc;
  wc.cores = cores;
  for (uint32_t c = 0; c < cores; ++c)
    wc.cpus.push_back(opt_.pin ? cpus_[(opt_.cpu_offset + c) % cpus_.size()]
                               : -1);
  wc.spin_ns = opt_.spin_ns;
  wc.yield = opt_.yield;
  wc.tsc_hz = tsc_hz_;
  wc.weights_map = cache_->mapping();
  wc.weights_map_bytes = cache_->mapping_bytes();
  wc.image = cache_->image();
  const duckd_cache_header &c = cache_->header();
  if (c.valid && c.head_finished && c.finished_slots == c.image.slot_count)
    wc.populate_bytes =
        std::min<uint64_t>(c.image.total_bytes, cache_->capacity());
  wc.close_in_child = {listen_fd_,   signal_fd_, conn_.fd,
                       cache_->fd(), mesh_fd_,   cast_fd_};
  wc.sandbox = opt_.sandbox;
  wc.elf_limits = opt_.elf_limits;
  return wc;
}

void Server::OnOpen(const duckd_frame_header &h) {
  if (!ReadPayload(h))
    return;
  duckd_open_request r{};
  if (buf_.size() < sizeof r) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               "open shorter than its header");
    return;
  }
  std::memcpy(&r, buf_.data(), sizeof r);
  const uint32_t cores = r.cores ? r.cores : opt_.cores;
  std::string bad;
  if (r.elf_bytes != buf_.size() - sizeof r)
    bad = "open: elf_bytes does not match the payload";
  else if (cores > opt_.cores)
    bad = absl::StrCat("open: ", cores, " cores asked, duckd has ", opt_.cores);
  else if (r.ib_limit > opt_.max_payload || r.ob_limit > opt_.max_payload ||
           r.ob_limit < sizeof(duck_ob_header))
    bad = absl::StrCat("open: ib_limit/ob_limit must be within [64, ",
                       opt_.max_payload, "]");
  else if (r.scratch_bytes > opt_.max_scratch)
    bad = absl::StrCat("open: scratch of ", r.scratch_bytes,
                       " bytes exceeds ", opt_.max_scratch);
  if (!bad.empty()) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST, bad);
    return;
  }
  CloseSession("replaced by a new open");
  WorkerConfig wc = BaseWorkerConfig(cores);
  wc.persistent = true;
  wc.ib_limit = r.ib_limit;
  wc.ob_limit = r.ob_limit;
  wc.scratch_bytes = r.scratch_bytes;
  wc.conn_fd = conn_.fd;
  wc.cast_fd = cast_fd_;
  wc.cast_wait_ns = uint64_t(absl::ToInt64Nanoseconds(opt_.cast_wait));
  wc.session_id = next_session_id_;
  wc.max_payload = opt_.max_payload;
  wc.io_timeout = opt_.io_timeout;
  wc.log_prefix = absl::StrCat("duckd[", port_, "] session ", next_session_id_);
  auto w = Worker::Spawn(
      wc, absl::MakeConstSpan(buf_.data() + sizeof r, r.elf_bytes));
  if (!w.ok()) {
    ReplyError(h.type, h.request_id,
               w.status().code() == absl::StatusCode::kInvalidArgument
                   ? DUCKD_ERR_BAD_ELF
                   : DUCKD_ERR_INTERNAL,
               std::string(w.status().message()));
    return;
  }
  session_ = std::move(*w);
  session_id_ = next_session_id_++;
  Log(absl::StrCat("session ", session_id_, " opened for ", conn_.peer, ": ",
                   r.elf_bytes, "-byte ELF, ", cores, " cores, worker pid ",
                   session_->pid()));
  duckd_open_reply rep{};
  rep.session_id = session_id_;
  rep.cores = cores;
  rep.tsc_hz = tsc_hz_;
  Reply(h.type, h.request_id, {{&rep, sizeof rep}});
}

void Server::StepAndReply(Worker *w, const duckd_frame_header &h,
                          uint64_t ib_bytes, uint64_t elf_bytes) {
  auto out = w->Step(ib_bytes, elf_bytes, cache_->usable_bytes(),
                     cache_->generation(), opt_.step_timeout, conn_.fd);
  if (!out.ok()) {
    const absl::StatusCode code = out.status().code();
    if (code == absl::StatusCode::kInvalidArgument) { // the ELF was refused
      ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_ELF,
                 std::string(out.status().message()));
      return;
    }
    const std::string what = "run";
    run_worker_.reset();
    if (code == absl::StatusCode::kCancelled) {
      Drop(absl::StrCat(what, ": ", out.status().message()));
      return;
    }
    ReplyError(h.type, h.request_id,
               code == absl::StatusCode::kAborted ? DUCKD_ERR_STEP_CRASHED
               : code == absl::StatusCode::kDeadlineExceeded
                   ? DUCKD_ERR_STEP_TIMEOUT
                   : DUCKD_ERR_INTERNAL,
               absl::StrCat(out.status().message(), "; ", what, " closed"));
    return;
  }
  duckd_step_reply rep{};
  rep.status = out->status;
  rep.cores = uint32_t(out->kernel_ns.size());
  rep.ob_bytes = out->ob_bytes;
  rep.log_bytes = out->log.size();
  rep.worker_ns = out->worker_ns;
  Reply(h.type, h.request_id,
        {{&rep, sizeof rep},
         {out->kernel_ns.data(), out->kernel_ns.size() * sizeof(uint64_t)},
         {w->ob(), out->ob_bytes},
         {out->log.data(), out->log.size()}});
}

void Server::OnStep(const duckd_frame_header &h) {
  // Session workers serve steps themselves; duckd sees a step only when no
  // session is open (or its worker died).
  duckd_step_request r{};
  const uint64_t head = std::min<uint64_t>(h.payload_bytes, sizeof r);
  if (!ReadFull(conn_.fd, &r, head, absl::Now() + opt_.io_timeout).ok()) {
    Drop("truncated step");
    return;
  }
  check_.Update(&r, head);
  if (!DrainAndVerify(h, h.payload_bytes - head))
    return;
  if (h.flags & DUCKD_FLAG_QUIET)
    return; // no stage: the staged step after it is answered
  if (head < sizeof r || r.ib_bytes != h.payload_bytes - sizeof r)
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               head < sizeof r ? "step shorter than its header"
                               : "step: ib_bytes does not match the payload");
  else
    ReplyError(h.type, h.request_id, DUCKD_ERR_NO_SESSION,
               "step without an open session (open first)");
}

void Server::OnStepCast(const duckd_frame_header &h) {
  // As OnStep: the session's worker serves these (and step_staged); here
  // there is none.
  if (!DrainAndVerify(h, h.payload_bytes) || (h.flags & DUCKD_FLAG_QUIET))
    return;
  const bool cast = h.type == DUCKD_MSG_STEP_CAST;
  const bool short_ = cast
                          ? h.payload_bytes != sizeof(duckd_step_cast_request)
                          : h.payload_bytes < sizeof(duckd_step_staged_request);
  const char *name = MessageTypeName(h.type);
  ReplyError(h.type, h.request_id,
             short_ ? DUCKD_ERR_BAD_REQUEST : DUCKD_ERR_NO_SESSION,
             short_
                 ? absl::StrCat(name, ": the payload is not ",
                                cast ? "one request" : "a request and an IB")
                 : absl::StrCat(name, " without an open session (open first)"));
}

void Server::OnRun(const duckd_frame_header &h) {
  if (!ReadPayload(h))
    return;
  duckd_run_request r{};
  if (buf_.size() < sizeof r) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               "run shorter than its header");
    return;
  }
  std::memcpy(&r, buf_.data(), sizeof r);
  const uint32_t cores = r.cores ? r.cores : opt_.cores;
  std::string bad;
  if (r.elf_bytes > buf_.size() - sizeof r ||
      r.ib_bytes != buf_.size() - sizeof r - r.elf_bytes)
    bad = "run: elf_bytes + ib_bytes do not match the payload";
  else if (cores > opt_.cores)
    bad = absl::StrCat("run: ", cores, " cores asked, duckd has ", opt_.cores);
  else if (r.ob_limit > opt_.max_payload ||
           r.ob_limit < sizeof(duck_ob_header))
    bad = absl::StrCat("run: ob_limit must be within [64, ", opt_.max_payload,
                       "]");
  else if (r.scratch_bytes > opt_.max_scratch)
    bad = absl::StrCat("run: scratch of ", r.scratch_bytes, " bytes exceeds ",
                       opt_.max_scratch);
  if (!bad.empty()) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST, bad);
    return;
  }
  if (std::string why =
          DamagedSlotRefusal(cache_->mapping(),
                             buf_.data() + sizeof r + r.elf_bytes, r.ib_bytes);
      !why.empty()) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_CACHE, why);
    return;
  }
  // One sandbox process serves every run whose sizes it can hold.
  const WorkerConfig *cur = run_worker_ ? &run_worker_->config() : nullptr;
  if (!cur || cur->cores != cores || cur->ib_limit < r.ib_bytes ||
      cur->ob_limit != r.ob_limit || cur->scratch_bytes != r.scratch_bytes ||
      cur->elf_limit < r.elf_bytes) {
    WorkerConfig wc = BaseWorkerConfig(cores);
    wc.persistent = false;
    wc.ib_limit = std::max<uint64_t>(r.ib_bytes, cur ? cur->ib_limit : 0);
    wc.ob_limit = r.ob_limit;
    wc.scratch_bytes = r.scratch_bytes;
    wc.elf_limit = std::max<uint64_t>(
        {r.elf_bytes, cur ? cur->elf_limit : 0, uint64_t(1) << 20});
    run_worker_.reset();
    auto w = Worker::Spawn(wc, {});
    if (!w.ok()) {
      ReplyError(h.type, h.request_id, DUCKD_ERR_INTERNAL,
                 std::string(w.status().message()));
      return;
    }
    run_worker_ = std::move(*w);
  }
  std::memcpy(run_worker_->elf_area(), buf_.data() + sizeof r, r.elf_bytes);
  std::memcpy(run_worker_->ib(), buf_.data() + sizeof r + r.elf_bytes,
              r.ib_bytes);
  StepAndReply(run_worker_.get(), h, r.ib_bytes, r.elf_bytes);
}

void Server::OnPrepareBegin(const duckd_frame_header &h) {
  if (!ReadPayload(h))
    return;
  duckd_prepare_begin_request r{};
  if (buf_.size() != sizeof r) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               "prepare_begin has the wrong size");
    return;
  }
  std::memcpy(&r, buf_.data(), sizeof r);
  auto res = cache_->Begin(r.image, r.flags & DUCKD_PREPARE_INVALIDATE);
  // An upload follows (the scrub waits for its finish); a hit sends none,
  // and no prepare_finish either.
  preparing_ = res.ok() && res->result != DUCKD_CACHE_HIT;
  if (!res.ok()) {
    ReplyError(h.type, h.request_id,
               res.status().code() == absl::StatusCode::kResourceExhausted
                   ? DUCKD_ERR_TOO_LARGE
                   : DUCKD_ERR_CACHE,
               std::string(res.status().message()));
    return;
  }
  static const char *kNames[] = {"hit", "partial", "miss"};
  Log(absl::StrCat("prepare_begin: cache ", kNames[res->result],
                   (r.flags & DUCKD_PREPARE_INVALIDATE) ? " (invalidated)" : "",
                   ", ", res->reply.finished_slots, "/", res->reply.slot_count,
                   " slots finished",
                   res->damaged ? absl::StrCat(", ", res->damaged,
                                               " damaged part(s) unfinished")
                                : "",
                   res->result == DUCKD_CACHE_HIT ? PagesNote() : ""));
  Reply(h.type, h.request_id,
        {{&res->reply, sizeof res->reply},
         {res->bitmap.data(), res->bitmap.size()}});
}

void Server::OnPrepareWrite(const duckd_frame_header &h) {
  const absl::Time deadline = absl::Now() + opt_.io_timeout;
  duckd_prepare_write_request r{};
  if (h.payload_bytes < sizeof r) {
    if (DrainAndVerify(h, h.payload_bytes))
      ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
                 "prepare_write shorter than its header");
    return;
  }
  if (absl::Status s = ReadFull(conn_.fd, &r, sizeof r, deadline); !s.ok()) {
    Drop(absl::StrCat("truncated prepare_write: ", s.message()));
    return;
  }
  check_.Update(&r, sizeof r);
  const uint64_t rest = h.payload_bytes - sizeof r;
  absl::StatusOr<uint8_t *> dst =
      r.bytes != rest
          ? absl::InvalidArgumentError(
                "prepare_write: bytes does not match the payload")
          : cache_->BeginWrite(r.offset, r.bytes);
  if (!dst.ok()) {
    if (DrainAndVerify(h, rest))
      ReplyError(h.type, h.request_id, DUCKD_ERR_CACHE,
                 std::string(dst.status().message()));
    return;
  }
  // Straight into the weight buffer: the parts it covers are already
  // marked unfinished, so a bad or cut-off payload cannot be mistaken for
  // verified data.
  if (absl::Status s = ReadFull(conn_.fd, *dst, rest, deadline); !s.ok()) {
    Drop(absl::StrCat("truncated prepare_write: ", s.message()));
    return;
  }
  check_.Update(*dst, rest);
  if (!Verify(h))
    return;
  duckd_prepare_write_reply rep{r.offset, r.bytes};
  Reply(h.type, h.request_id, {{&rep, sizeof rep}});
}

std::string Server::PagesNote() const {
  const std::string note = cache_->PagesNote();
  return note.empty() ? note : absl::StrCat("; weights file: ", note);
}

void Server::OnPrepareFinish(const duckd_frame_header &h) {
  if (!ReadPayload(h))
    return;
  preparing_ = false;
  auto res = cache_->Finish();
  if (!res.ok()) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_CACHE,
               std::string(res.status().message()));
    return;
  }
  Log(absl::StrCat("prepare_finish: ", res->reply.finished_slots, "/",
                   res->reply.slot_count, " slots finished", PagesNote()));
  Reply(h.type, h.request_id,
        {{&res->reply, sizeof res->reply},
         {res->bitmap.data(), res->bitmap.size()}});
}

void Server::OnClose(const duckd_frame_header &h) {
  if (!ReadPayload(h))
    return;
  duckd_close_request r{};
  if (buf_.size() != sizeof r) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               "close has the wrong size");
    return;
  }
  std::memcpy(&r, buf_.data(), sizeof r);
  if (!session_ || r.session_id != session_id_) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_NO_SESSION,
               absl::StrCat("close: session ", r.session_id, " is not open"));
    return;
  }
  CloseSession("closed by the host");
  Reply(h.type, h.request_id, {});
}

void Server::OnLinkProbe(const duckd_frame_header &h) {
  uint64_t replyBytes = 0;
  if (buf_.size() < sizeof(duckd_measure_request) + sizeof replyBytes) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               "measure: a link probe without its reply_bytes");
    return;
  }
  std::memcpy(&replyBytes, buf_.data() + sizeof(duckd_measure_request),
              sizeof replyBytes);
  const duckd_measure_reply rep{};
  if (replyBytes > DUCKD_LINK_PROBE_MAX_BYTES ||
      replyBytes + sizeof rep > opt_.max_payload) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               absl::StrCat("measure: a link probe's reply of ", replyBytes,
                            " bytes; at most ",
                            std::min<uint64_t>(DUCKD_LINK_PROBE_MAX_BYTES,
                                               opt_.max_payload - sizeof rep)));
    return;
  }
  if (link_zeros_.size() < replyBytes)
    link_zeros_.resize(replyBytes);
  Reply(h.type, h.request_id,
        {{&rep, sizeof rep}, {link_zeros_.data(), size_t(replyBytes)}});
}

void Server::OnMeasure(const duckd_frame_header &h) {
  if (!ReadPayload(h))
    return;
  duckd_measure_request r{};
  if (buf_.size() >= sizeof r) {
    std::memcpy(&r, buf_.data(), sizeof r);
    if (r.flags & DUCKD_MEASURE_LINK) {
      OnLinkProbe(h);
      return;
    }
  }
  if (buf_.size() != sizeof r) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               "measure has the wrong size");
    return;
  }
  std::memcpy(&r, buf_.data(), sizeof r);
  duckd_measure_reply rep{};
  if (r.flags & DUCKD_MEASURE_PING) {
    // Busy, not asleep: the host's wait is what a step's would be.
    const absl::Time until =
        absl::Now() + absl::Microseconds(std::min(r.busy_us, 100000u));
    while (absl::Now() < until) {
    }
    Reply(h.type, h.request_id, {{&rep, sizeof rep}});
    return;
  }
  const uint32_t cores = r.cores ? r.cores : opt_.cores;
  const uint64_t arena = r.arena_bytes ? r.arena_bytes : 1ull << 30;
  const uint32_t millis = r.millis ? r.millis : 150;
  std::string bad;
  if (r.flags & ~uint32_t(DUCKD_MEASURE_PING))
    bad = absl::StrCat("measure: unknown flags 0x", absl::Hex(r.flags));
  else if (cores > opt_.cores)
    bad = absl::StrCat("measure: ", cores, " cores asked, duckd has ",
                       opt_.cores);
  else if (arena < (16ull << 20) || arena > opt_.max_scratch)
    bad = absl::StrCat("measure: arena of ", arena,
                       " bytes; it must be within [16 MiB, ", opt_.max_scratch,
                       "]");
  else if (millis > 10000)
    bad = absl::StrCat("measure: ", millis,
                       " ms a measurement; at most 10000");
  if (!bad.empty()) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST, bad);
    return;
  }
  bench::DuckMeasureOptions mo;
  mo.cores = cores;
  if (opt_.pin)
    for (uint32_t c = 0; c < cores; ++c)
      mo.cpus.push_back(cpus_[(opt_.cpu_offset + c) % cpus_.size()]);
  mo.arena_bytes = arena;
  mo.seconds = millis / 1000.0;
  const absl::Time start = absl::Now();
  const bench::DuckRates rates = bench::measureDuck(mo);
  rep.cores = cores;
  rep.kernels = DUCK_KERNEL_COUNT;
  rep.read_gbs = rates.read_gbs;
  for (uint32_t k = 0; k < DUCK_KERNEL_COUNT && k < DUCKD_MEASURE_KERNELS;
       ++k) {
    rep.gparam_s[k] = rates.gparam_s[k];
    rep.rows[k] = rates.rows[k];
    rep.k[k] = rates.k[k];
  }
  rep.other_load = rates.other_load;
  rep.gemm_gmac_s = rates.gemm_gmac_s;
  rep.gemm_tokens = rates.gemm_tokens;
  rep.gemm_hidden = rates.gemm_hidden;
  rep.gemm_inter = rates.gemm_inter;
  rep.gemv_call_ns = (uint32_t)std::lround(
      std::min(rates.gemv_call_us * 1e3, 4e9)); // a word of nanoseconds
  rep.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Log(absl::StrFormat("measure: %u cores, read %.1f GB/s, general128 %.2f "
                      "Gparam/s (+%.1f us a call), GEMM %.1f GMAC/s (%.1f s)",
                      cores, rep.read_gbs, rep.gparam_s[DUCK_KERNEL_GENERAL128],
                      rates.gemv_call_us, rep.gemm_gmac_s, rep.seconds));
  Reply(h.type, h.request_id, {{&rep, sizeof rep}});
}

void Server::OnStats(const duckd_frame_header &h) {
  if (!ReadPayload(h))
    return;
  if (!buf_.empty()) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               "stats takes no payload");
    return;
  }
  const Scrubber::Stats &st = scrub_->stats();
  duckd_stats_reply rep{};
  rep.scrub_bytes_per_second = scrub_->bytes_per_second();
  rep.scrub_passes = st.passes;
  rep.scrub_slots = st.slots;
  rep.scrub_bytes = st.bytes;
  rep.scrub_damaged = st.damaged;
  rep.scrub_last_pass_unix_ms =
      st.passes ? uint64_t(absl::ToUnixMillis(st.last_pass)) : 0;
  rep.scrub_last_pass_ms = uint64_t(absl::ToInt64Milliseconds(st.last_pass_took));
  rep.damaged_slots = cache_->DamagedSlots();
  rep.finished_slots = cache_->header().finished_slots;
  Reply(h.type, h.request_id, {{&rep, sizeof rep}});
}

void Server::OnMesh(const duckd_frame_header &h) {
  if (!ReadPayload(h))
    return;
  duckd_mesh_request r{};
  if (buf_.size() >= sizeof r)
    std::memcpy(&r, buf_.data(), sizeof r);
  const size_t want = sizeof r + size_t(r.ducks) * sizeof(duckd_mesh_peer);
  if (buf_.size() < sizeof r || r.ducks == 0 || r.ducks > 4096 ||
      buf_.size() != want || r.rank >= r.ducks) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               "mesh: a request, then one peer for each of its ducks, and "
               "a rank below their count");
    return;
  }
  if (r.transport != DUCKD_MESH_TCP && r.transport != DUCKD_MESH_UDP) {
    ReplyError(
        h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
        absl::StrCat("mesh: transport ", r.transport, " (0: tcp, 1: udp)"));
    return;
  }
  if (mesh_fd_ < 0) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               "mesh: this duckd was started without --mesh-port");
    return;
  }
  std::vector<duckd_mesh_peer> peers(r.ducks);
  std::memcpy(peers.data(), buf_.data() + sizeof r,
              peers.size() * sizeof(duckd_mesh_peer));
  absl::StatusOr<duckd_mesh_reply> rep = JoinMesh(r, peers.data());
  if (!rep.ok()) {
    Log(absl::StrCat("mesh: ", rep.status().message()));
    ReplyError(h.type, h.request_id, DUCKD_ERR_INTERNAL,
               std::string(rep.status().message()));
    return;
  }
  Log(absl::StrCat("mesh: rank ", r.rank, " of ", r.ducks, " joined"));
  Reply(h.type, h.request_id, {{&*rep, sizeof *rep}});
}

// Connects this duck into the request's mesh (the previous one, if any,
// closes first), then sums every duck's check over it. Blocks the server
// for up to the request's timeout: the other ducks join at the same time.
absl::StatusOr<duckd_mesh_reply>
Server::JoinMesh(const duckd_mesh_request &r, const duckd_mesh_peer *peers) {
  mesh_.reset();
  PeerMeshOptions o;
  o.rank = r.rank;
  o.ducks = r.ducks;
  o.groups = r.groups ? r.groups : 1;
  o.session = r.session;
  o.token = opt_.token;
  o.listen_fd = mesh_fd_;
  o.transport =
      r.transport == DUCKD_MESH_UDP ? PeerTransport::udp : PeerTransport::tcp;
  // At most a minute: the server serves nothing else (signals included)
  // while it joins.
  o.timeout = absl::Milliseconds(
      std::min<uint32_t>(r.timeout_ms ? r.timeout_ms : 30000, 60000));
  for (uint32_t j = 0; j < r.ducks; ++j) {
    const duckd_mesh_peer &p = peers[j];
    o.peers.push_back({std::string(p.host, strnlen(p.host, sizeof p.host)),
                       uint16_t(p.port)});
  }
  absl::StatusOr<std::unique_ptr<PeerMesh>> m = PeerMesh::Connect(o);
  if (!m.ok())
    return m.status();
  float sum = 0;
  if (absl::Status s = (*m)->AllReduce(absl::MakeConstSpan(&r.check, 1),
                                       PeerWire::f32, absl::MakeSpan(&sum, 1));
      !s.ok())
    return s;
  // Over udp: no peer may still want this duck's datagram once it serves
  // the host again.
  if (absl::Status s = (*m)->Settle(); !s.ok())
    return s;
  duckd_mesh_reply rep{};
  rep.check_sum = sum;
  rep.groups = o.groups;
  rep.bytes_sent = (*m)->bytes_sent();
  mesh_ = std::move(*m);
  return rep;
}

void Server::OnMeshProbe(const duckd_frame_header &h) {
  if (!ReadPayload(h))
    return;
  duckd_mesh_probe_request r{};
  if (buf_.size() != sizeof r) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               absl::StrCat("mesh_probe: a request of ", sizeof r,
                            " bytes, got ", buf_.size()));
    return;
  }
  std::memcpy(&r, buf_.data(), sizeof r);
  if (r.rounds == 0 || r.rounds > 100000 || r.values == 0 ||
      r.values > (1u << 20) || r.wire > 1) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               "mesh_probe: 1 to 100000 rounds of 1 to 1048576 values, "
               "wire 0 (fp32) or 1 (bf16)");
    return;
  }
  if (!mesh_) {
    ReplyError(h.type, h.request_id, DUCKD_ERR_BAD_REQUEST,
               "mesh_probe: this duckd holds no mesh (send mesh first)");
    return;
  }
  absl::StatusOr<duckd_mesh_probe_reply> rep = ProbeMesh(r);
  if (!rep.ok()) {
    Log(absl::StrCat("mesh_probe: ", rep.status().message()));
    const bool bad = absl::IsInvalidArgument(rep.status());
    ReplyError(h.type, h.request_id,
               bad ? DUCKD_ERR_BAD_REQUEST : DUCKD_ERR_INTERNAL,
               absl::StrCat("mesh_probe: ", rep.status().message()));
    if (!bad)
      mesh_.reset(); // a collective failed midway: the mesh is gone
    return;
  }
  Reply(h.type, h.request_id, {{&*rep, sizeof *rep}});
}

namespace {
uint64_t ThreadCpuNs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return uint64_t(t.tv_sec) * 1000000000u + uint64_t(t.tv_nsec);
}
} // namespace

// Runs the probe's collectives on the held mesh in the requested groups
// (the mesh's own again afterwards) and times them.
absl::StatusOr<duckd_mesh_probe_reply>
Server::ProbeMesh(const duckd_mesh_probe_request &r) {
  const uint32_t own = mesh_->groups();
  if (absl::Status s = mesh_->SetGroups(r.groups ? r.groups : own); !s.ok())
    return s;
  const uint32_t n = mesh_->ducks(), slice = mesh_->OwnedSlice();
  const size_t lo = PeerSliceBegin(r.values, n, slice);
  const size_t len = PeerSliceBegin(r.values, n, slice + 1) - lo;
  std::vector<float> full(r.values, 0.5f), part(len), gathered(r.values);
  const PeerWire wire = r.wire ? PeerWire::bf16 : PeerWire::f32;
  duckd_mesh_probe_reply rep{};
  rep.groups = mesh_->groups();
  const uint64_t sent = mesh_->bytes_sent(), cpu0 = ThreadCpuNs();
  const absl::Time t0 = absl::Now();
  absl::Status s;
  for (uint32_t i = 0; i < r.rounds && s.ok(); ++i) {
    s = mesh_->ReduceScatter(full, wire, absl::MakeSpan(part));
    if (s.ok())
      s = mesh_->AllGather(part, wire, absl::MakeSpan(gathered));
  }
  if (s.ok())
    s = mesh_->Settle();
  rep.wall_ns = uint64_t(absl::ToInt64Nanoseconds(absl::Now() - t0));
  rep.cpu_ns = ThreadCpuNs() - cpu0;
  rep.collectives = 2 * r.rounds;
  rep.bytes_sent = mesh_->bytes_sent() - sent;
  if (absl::Status g = mesh_->SetGroups(own); s.ok())
    s = g;
  if (!s.ok())
    return absl::UnavailableError(s.message());
  return rep;
}

} // namespace duck::duckd
