//===- LinkSim.cpp - a userspace link simulator in front of duckd's -------===//
//
// A thread accepts on every duck's port; each connection gets two
// directions, each a reader thread (reads a chunk, reserves its path's
// links, queues it with its release time) and a writer thread (sleeps until
// the release time, writes). See LinkSim.h for what is modelled.
//===----------------------------------------------------------------------===//
#include "duck/runtime/cluster/LinkSim.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <mutex>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <thread>
#include <time.h>
#include <unistd.h>

namespace duck::runtime {

namespace {

double NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}

void SleepUntilNs(double ns) {
  timespec ts;
  ts.tv_sec = time_t(ns / 1e9);
  ts.tv_nsec = long(ns - double(ts.tv_sec) * 1e9);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) ==
         EINTR) {
  }
}

/// One direction of one link: a FIFO server at its rate.
struct Link {
  std::mutex mu;
  double ns_per_byte = 0; // 0: unlimited
  double next_free = 0;
  /// The time the link has carried `bytes` arriving at `now`.
  double Reserve(double now, size_t bytes) {
    if (ns_per_byte <= 0)
      return now;
    std::lock_guard<std::mutex> lock(mu);
    next_free = std::max(next_free, now) + double(bytes) * ns_per_byte;
    return next_free;
  }
};

double NsPerByte(double gbps) { return gbps > 0 ? 8.0 / gbps : 0; }

struct Chunk {
  double release = 0;
  std::vector<char> data; // empty: end of stream
};

/// One direction of a connection: src -> [links] -> dst.
struct Direction {
  int src = -1, dst = -1;
  Link *first = nullptr, *second = nullptr;
  double latency_ns = 0;
  size_t chunk_bytes = 0, queue_bytes = 0;
  std::atomic<uint64_t> *counter = nullptr, *counter2 = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Chunk> queue;
  size_t held = 0;
  bool dead = false;
  std::thread reader, writer;

  void Push(Chunk c);
  bool Pop(Chunk *c);
  void Kill();
  void ReadLoop();
  void WriteLoop();
};

void Direction::Push(Chunk c) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return dead || held + c.data.size() <= queue_bytes; });
  if (dead)
    return;
  held += c.data.size();
  queue.push_back(std::move(c));
  cv.notify_all();
}

bool Direction::Pop(Chunk *c) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return dead || !queue.empty(); });
  if (queue.empty())
    return false;
  *c = std::move(queue.front());
  queue.pop_front();
  held -= c->data.size();
  cv.notify_all();
  return true;
}

void Direction::Kill() {
  {
    std::lock_guard<std::mutex> lock(mu);
    dead = true;
  }
  cv.notify_all();
  shutdown(src, SHUT_RDWR);
  shutdown(dst, SHUT_RDWR);
}

void Direction::ReadLoop() {
  for (;;) {
    Chunk c;
    c.data.resize(chunk_bytes);
    ssize_t n = read(src, c.data.data(), c.data.size());
    if (n < 0 && errno == EINTR)
      continue;
    const double now = NowNs();
    c.data.resize(n > 0 ? size_t(n) : 0);
    if (n > 0) {
      double done = first->Reserve(now, size_t(n));
      done = std::max(done, second->Reserve(now, size_t(n)));
      c.release = done + latency_ns;
      counter->fetch_add(uint64_t(n), std::memory_order_relaxed);
      if (counter2)
        counter2->fetch_add(uint64_t(n), std::memory_order_relaxed);
    } else {
      c.release = now; // end of stream (or error): after what came before
    }
    Push(std::move(c));
    if (n <= 0)
      return;
    std::lock_guard<std::mutex> lock(mu);
    if (dead)
      return;
  }
}

void Direction::WriteLoop() {
  // Wake at the release time, not up to the default 50 us timer slack
  // later: that would be a latency the link does not have.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  Chunk c;
  while (Pop(&c)) {
    if (c.data.empty()) {
      shutdown(dst, SHUT_WR); // the peer sees the end of stream
      return;
    }
    SleepUntilNs(c.release);
    size_t off = 0;
    while (off < c.data.size()) {
      ssize_t n = send(dst, c.data.data() + off, c.data.size() - off,
                       MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        Kill(); // the other side is gone: stop reading too
        return;
      }
      off += size_t(n);
    }
  }
}

struct Conn {
  int client = -1, backend = -1;
  Direction up, down; // up: client (host) -> duckd; down: duckd -> host
  std::atomic<int> finished{0}; // threads that have returned (4: reapable)
  ~Conn() {
    for (Direction *d : {&up, &down}) {
      if (d->reader.joinable())
        d->reader.join();
      if (d->writer.joinable())
        d->writer.join();
    }
    close(client);
    close(backend);
  }
  void Kill() {
    up.Kill();
    down.Kill();
  }
};

int ListenLoopback(uint16_t port, uint16_t *bound) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  socklen_t len = sizeof a;
  if (bind(fd, (sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, (sockaddr *)&a, &len) != 0) {
    close(fd);
    return -1;
  }
  *bound = ntohs(a.sin_port);
  return fd;
}

int ConnectTo(const DuckEndpoint &e) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(e.port);
  const std::string host = e.host == "localhost" ? "127.0.0.1" : e.host;
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1 ||
      connect(fd, (sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

} // namespace

struct LinkSim::Impl {
  LinkSimOptions o;
  /// What a listener stands for: the host's connections to duck `to`, or
  /// (peer) duck `from`'s to duck `to`.
  struct Route {
    size_t from = 0, to = 0;
    bool peer = false;
  };
  std::vector<int> listen_fds;
  std::vector<Route> routes; // as listen_fds
  std::vector<uint16_t> ports;
  std::vector<std::vector<uint16_t>> peer_ports;
  int wake[2] = {-1, -1};
  Link host_out, host_in;                 // the host's port, each way
  std::vector<std::unique_ptr<Link>> duck_in, duck_out; // duck i's link
  std::unique_ptr<std::atomic<uint64_t>[]> to_duck, from_duck, conns;
  std::unique_ptr<std::atomic<uint64_t>[]> peer_out, peer_in;
  std::mutex mu;
  std::vector<std::unique_ptr<Conn>> live;
  std::thread acceptor;
  bool stopped = false;

  absl::Status Open();
  absl::Status Listen(uint16_t want, Route route, uint16_t *bound);
  void AcceptLoop();
  void Accept(size_t listener);
};

absl::Status LinkSim::Impl::Listen(uint16_t want, Route route,
                                   uint16_t *bound) {
  int fd = ListenLoopback(want, bound);
  if (fd < 0)
    return absl::UnavailableError(
        absl::StrCat("linksim: cannot listen on 127.0.0.1:", want, ": ",
                     std::strerror(errno)));
  listen_fds.push_back(fd);
  routes.push_back(route);
  return absl::OkStatus();
}

absl::Status LinkSim::Impl::Open() {
  const size_t n = o.backends.size();
  host_out.ns_per_byte = host_in.ns_per_byte = NsPerByte(o.host_link_gbps);
  to_duck.reset(new std::atomic<uint64_t>[n]());
  from_duck.reset(new std::atomic<uint64_t>[n]());
  conns.reset(new std::atomic<uint64_t>[n]());
  peer_out.reset(new std::atomic<uint64_t>[n]());
  peer_in.reset(new std::atomic<uint64_t>[n]());
  for (size_t i = 0; i < n; ++i) {
    duck_in.push_back(std::make_unique<Link>());
    duck_out.push_back(std::make_unique<Link>());
    duck_in.back()->ns_per_byte = duck_out.back()->ns_per_byte =
        NsPerByte(o.duck_link_gbps);
    uint16_t bound = 0;
    const uint16_t want = o.port_base ? uint16_t(o.port_base + i) : 0;
    if (absl::Status s = Listen(want, {0, i, false}, &bound); !s.ok())
      return s;
    ports.push_back(bound);
  }
  peer_ports.assign(n, std::vector<uint16_t>(n, 0));
  for (size_t i = 0; i < n && !o.peer_backends.empty(); ++i)
    for (size_t j = i + 1; j < n; ++j)
      if (absl::Status s = Listen(0, {i, j, true}, &peer_ports[i][j]); !s.ok())
        return s;
  if (pipe2(wake, O_CLOEXEC) != 0)
    return absl::InternalError("linksim: pipe failed");
  return absl::OkStatus();
}

void LinkSim::Impl::Accept(size_t listener) {
  int client = accept4(listen_fds[listener], nullptr, nullptr, SOCK_CLOEXEC);
  if (client < 0)
    return;
  const Route r = routes[listener];
  const size_t duck = r.to;
  int backend = ConnectTo(r.peer ? o.peer_backends[duck] : o.backends[duck]);
  if (backend < 0) {
    close(client); // the host sees its duck refuse, as it would
    return;
  }
  NoDelay(client);
  NoDelay(backend);
  auto c = std::make_unique<Conn>();
  c->client = client;
  c->backend = backend;
  auto setup = [&](Direction &d, int src, int dst, Link *a, Link *b,
                   std::atomic<uint64_t> *counter,
                   std::atomic<uint64_t> *counter2 = nullptr) {
    d.src = src;
    d.dst = dst;
    d.first = a;
    d.second = b;
    d.latency_ns = o.latency_us * 1e3;
    d.chunk_bytes = o.chunk_bytes;
    d.queue_bytes = std::max(o.queue_bytes, o.chunk_bytes);
    d.counter = counter;
    d.counter2 = counter2;
  };
  if (r.peer) { // up: from -> to; down: to -> from
    setup(c->up, client, backend, duck_out[r.from].get(), duck_in[duck].get(),
          &peer_out[r.from], &peer_in[duck]);
    setup(c->down, backend, client, duck_out[duck].get(), duck_in[r.from].get(),
          &peer_out[duck], &peer_in[r.from]);
  } else {
    setup(c->up, client, backend, &host_out, duck_in[duck].get(),
          &to_duck[duck]);
    setup(c->down, backend, client, duck_out[duck].get(), &host_in,
          &from_duck[duck]);
  }
  Conn *raw = c.get();
  for (Direction *d : {&c->up, &c->down}) {
    d->reader = std::thread([d, raw] { d->ReadLoop(); raw->finished++; });
    d->writer = std::thread([d, raw] { d->WriteLoop(); raw->finished++; });
  }
  if (!r.peer)
    conns[duck].fetch_add(1);
  std::lock_guard<std::mutex> lock(mu);
  // Connections whose four threads have returned are joined and closed
  // here, so a long run holds only its live ones.
  live.erase(std::remove_if(live.begin(), live.end(),
                            [](const std::unique_ptr<Conn> &x) {
                              return x->finished.load() == 4;
                            }),
             live.end());
  live.push_back(std::move(c));
}

void LinkSim::Impl::AcceptLoop() {
  std::vector<pollfd> fds;
  for (int fd : listen_fds)
    fds.push_back({fd, POLLIN, 0});
  fds.push_back({wake[0], POLLIN, 0});
  for (;;) {
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR)
        continue;
      return;
    }
    if (fds.back().revents)
      return;
    for (size_t i = 0; i + 1 < fds.size(); ++i)
      if (fds[i].revents & POLLIN)
        Accept(i);
  }
}

LinkSim::LinkSim(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<LinkSim>>
LinkSim::Start(const LinkSimOptions &options) {
  if (options.backends.empty())
    return absl::InvalidArgumentError("linksim: no ducks");
  if (!options.peer_backends.empty() &&
      options.peer_backends.size() != options.backends.size())
    return absl::InvalidArgumentError(absl::StrCat(
        "linksim: ", options.peer_backends.size(), " peer listeners for ",
        options.backends.size(), " ducks"));
  if (options.host_link_gbps < 0 || options.duck_link_gbps < 0 ||
      options.latency_us < 0)
    return absl::InvalidArgumentError(
        "linksim: rates and latency must not be negative");
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  impl->o.chunk_bytes = std::max<size_t>(impl->o.chunk_bytes, 512);
  if (absl::Status s = impl->Open(); !s.ok()) {
    for (int fd : impl->listen_fds)
      close(fd);
    return s;
  }
  Impl *p = impl.get();
  impl->acceptor = std::thread([p] { p->AcceptLoop(); });
  return std::unique_ptr<LinkSim>(new LinkSim(std::move(impl)));
}

LinkSim::~LinkSim() { Stop(); }

const std::vector<uint16_t> &LinkSim::ports() const { return impl_->ports; }

const std::vector<std::vector<uint16_t>> &LinkSim::peer_ports() const {
  return impl_->peer_ports;
}

std::vector<LinkSimDuckStats> LinkSim::stats() const {
  std::vector<LinkSimDuckStats> s(impl_->ports.size());
  for (size_t i = 0; i < s.size(); ++i) {
    s[i].bytes_to_duck = impl_->to_duck[i].load();
    s[i].bytes_from_duck = impl_->from_duck[i].load();
    s[i].connections = impl_->conns[i].load();
    s[i].bytes_to_peers = impl_->peer_out[i].load();
    s[i].bytes_from_peers = impl_->peer_in[i].load();
  }
  return s;
}

void LinkSim::Stop() {
  Impl &m = *impl_;
  if (m.stopped)
    return;
  m.stopped = true;
  char b = 0;
  (void)!write(m.wake[1], &b, 1);
  m.acceptor.join();
  std::vector<std::unique_ptr<Conn>> live;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    live.swap(m.live);
  }
  for (auto &c : live)
    c->Kill();
  live.clear(); // joins every thread
  for (int fd : m.listen_fds)
    close(fd);
  close(m.wake[0]);
  close(m.wake[1]);
}

const char *LinkSimModelText() {
  return "Models: every duck's link and the host's port (shared by all "
         "ducks' traffic)\n"
         "at a rate each way (a FIFO server: b bytes take b*8/rate after the "
         "link's\n"
         "previous bytes, a token bucket with a burst of one chunk), a chunk "
         "done when\n"
         "every link on its path carried it (cut-through), then released "
         "after the\n"
         "one-way latency; each direction stays in order (FIFO). With the "
         "ducks' mesh,\n"
         "a duck-to-duck byte passes the sender's link and the receiver's "
         "(one switch).\n"
         "Does not model: TCP's own congestion control and windows (they "
         "run over\n"
         "loopback underneath), loss, jitter, switch buffers (no drops; a "
         "direction\n"
         "holds at most its queue and then stops reading), header "
         "overheads (payload\n"
         "bytes only), and the CPU the simulator itself takes.\n";
}

} // namespace duck::runtime
