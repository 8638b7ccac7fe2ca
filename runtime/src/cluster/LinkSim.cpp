//===- LinkSim.cpp - a userspace link simulator in front of duckd's -------===//
//
// One thread runs everything: an epoll loop over the listeners and both
// sockets of every connection, and a timerfd armed at the earliest release
// time of any queued chunk. A chunk read (up to chunk_bytes) reserves its
// path's links at once and is written on at its release time (or as soon
// after as the receiver takes it). One thread, not two a direction: on a
// small box the simulator's own wake-ups would otherwise delay chunks by
// more than the links do. See LinkSim.h for what is modelled.
//===----------------------------------------------------------------------===//
#include "duck/runtime/cluster/LinkSim.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <memory>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
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

/// One direction of one link: a FIFO server at its rate.
struct Link {
  double ns_per_byte = 0; // 0: unlimited
  double next_free = 0;
  /// The time the link has carried `bytes` arriving at `now`.
  double Reserve(double now, size_t bytes) {
    if (ns_per_byte <= 0)
      return now;
    next_free = std::max(next_free, now) + double(bytes) * ns_per_byte;
    return next_free;
  }
};

double NsPerByte(double gbps) { return gbps > 0 ? 8.0 / gbps : 0; }

struct Chunk {
  double release = 0;
  std::vector<char> data;
  size_t off = 0;
  bool eof = false; // the source's end of stream, after what came before
};

/// One direction of a connection: src -> [links] -> dst.
struct Direction {
  int src = -1, dst = -1;
  Link *first = nullptr, *second = nullptr;
  double latency_ns = 0;
  std::atomic<uint64_t> *counter = nullptr, *counter2 = nullptr;
  std::deque<Chunk> queue;
  size_t held = 0;
  bool src_eof = false; // nothing more to read
  bool done = false;    // the end of stream passed on
  bool blocked = false; // the receiver took no more: wait for EPOLLOUT
};

/// A connection: side 0 the client, side 1 the backend; dir[s] reads
/// side s and writes the other side.
struct Conn;
struct Tag {
  Conn *conn;
  int side;
};
struct Conn {
  int fd[2] = {-1, -1};
  Direction dir[2];
  Tag tag[2];
  uint32_t interest[2] = {0, 0};
  bool registered[2] = {false, false};
  bool dead = false;
  ~Conn() {
    close(fd[0]);
    close(fd[1]);
  }
  bool Finished() const { return dead || (dir[0].done && dir[1].done); }
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
  if (bind(fd, (sockaddr *)&a, sizeof a) != 0 || listen(fd, 128) != 0 ||
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

void NoDelayNonBlocking(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

} // namespace

/// A relay of duck `from`'s datagrams to duck `to`: each one shaped over
/// both links, then sent on from this socket in order.
struct Relay {
  int fd = -1;
  size_t from = 0, to = 0;
  sockaddr_in dest{};
  struct Datagram {
    double release;
    std::vector<char> data;
  };
  std::deque<Datagram> queue;
  ~Relay() {
    if (fd >= 0)
      close(fd);
  }
};

/// The host's cast datagrams: each one read once, then a copy a duck,
/// each released when its duck's link has carried it.
struct CastRelay {
  int fd = -1;
  uint16_t port = 0;
  std::vector<sockaddr_in> dests; // duck i's cast socket
  struct Copy {
    double release;
    std::shared_ptr<const std::vector<char>> data;
  };
  std::vector<std::deque<Copy>> queues; // by duck
  ~CastRelay() {
    if (fd >= 0)
      close(fd);
  }
};

struct LinkSim::Impl {
  LinkSimOptions o;
  std::unique_ptr<CastRelay> cast;
  std::unique_ptr<std::atomic<uint64_t>[]> cast_to;
  std::atomic<uint64_t> cast_from_host{0};
  std::vector<std::unique_ptr<Relay>> relays;
  std::vector<std::vector<uint16_t>> relay_ports;
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
  int epoll_fd = -1, timer_fd = -1;
  double armed = -1;      // the timer's release time (0: disarmed)
  Link host_out, host_in; // the host's port
  std::vector<std::unique_ptr<Link>> duck_in, duck_out; // duck i's link
  std::unique_ptr<std::atomic<uint64_t>[]> to_duck, from_duck, conns;
  std::unique_ptr<std::atomic<uint64_t>[]> peer_out, peer_in;
  std::vector<std::unique_ptr<Conn>> live;
  std::vector<char> scratch; // one read's bytes
  std::thread loop;
  bool stopped = false;

  absl::Status Open();
  absl::Status Listen(uint16_t want, Route route, uint16_t *bound);
  void Loop();
  void Accept(size_t listener);
  void ReadFrom(Conn &c, int side, double now);
  void Flush(Conn &c, int side, double now);
  void Interest(Conn &c);
  void ArmTimer();
  absl::Status OpenRelays();
  void ReadDatagrams(Relay &r, double now);
  void FlushDatagrams(double now);
  absl::Status OpenCast();
  void ReadCast(double now);
  void FlushCast(double now);
};

absl::Status LinkSim::Impl::OpenCast() {
  const size_t n = o.cast_ports.size();
  cast_to.reset(new std::atomic<uint64_t>[o.backends.size()]());
  if (n == 0)
    return absl::OkStatus();
  cast = std::make_unique<CastRelay>();
  cast->fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (cast->fd < 0 || bind(cast->fd, (sockaddr *)&a, sizeof a) != 0 ||
      getsockname(cast->fd, (sockaddr *)&a, &len) != 0)
    return absl::UnavailableError(absl::StrCat(
        "linksim: cannot open the cast relay: ", std::strerror(errno)));
  const int big = 4 << 20;
  setsockopt(cast->fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  setsockopt(cast->fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  cast->port = ntohs(a.sin_port);
  cast->queues.resize(n);
  for (uint16_t port : o.cast_ports) {
    sockaddr_in d{};
    d.sin_family = AF_INET;
    d.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    d.sin_port = htons(port);
    cast->dests.push_back(d);
  }
  return absl::OkStatus();
}

void LinkSim::Impl::ReadCast(double now) {
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(cast->fd, buf, sizeof buf, 0);
    if (n < 0)
      return; // drained (EAGAIN) or failed: epoll says when more comes
    const double out = host_out.Reserve(now, size_t(n));
    cast_from_host.fetch_add(uint64_t(n), std::memory_order_relaxed);
    auto data = std::make_shared<const std::vector<char>>(buf, buf + n);
    for (size_t i = 0; i < cast->queues.size(); ++i) {
      const double done = std::max(out, duck_in[i]->Reserve(now, size_t(n)));
      cast->queues[i].push_back({done + o.latency_us * 1e3, data});
      cast_to[i].fetch_add(uint64_t(n), std::memory_order_relaxed);
    }
  }
}

void LinkSim::Impl::FlushCast(double now) {
  if (!cast)
    return;
  for (size_t i = 0; i < cast->queues.size(); ++i) {
    auto &q = cast->queues[i];
    while (!q.empty() && q.front().release <= now) {
      const std::vector<char> &d = *q.front().data;
      // A full receiver drops it, as a switch port would.
      (void)sendto(cast->fd, d.data(), d.size(), 0,
                   (const sockaddr *)&cast->dests[i], sizeof cast->dests[i]);
      q.pop_front();
    }
  }
}

absl::Status LinkSim::Impl::OpenRelays() {
  const size_t n = o.peer_datagram_ports.size();
  relay_ports.resize(n);
  for (std::vector<uint16_t> &row : relay_ports)
    row.resize(n, 0);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) {
      if (i == j)
        continue;
      auto r = std::make_unique<Relay>();
      r->from = i;
      r->to = j;
      r->fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t len = sizeof a;
      if (r->fd < 0 || bind(r->fd, (sockaddr *)&a, sizeof a) != 0 ||
          getsockname(r->fd, (sockaddr *)&a, &len) != 0)
        return absl::UnavailableError(absl::StrCat(
            "linksim: cannot open a datagram relay: ", std::strerror(errno)));
      const int big = 4 << 20;
      setsockopt(r->fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
      relay_ports[i][j] = ntohs(a.sin_port);
      r->dest.sin_family = AF_INET;
      r->dest.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      r->dest.sin_port = htons(o.peer_datagram_ports[j]);
      relays.push_back(std::move(r));
    }
  return absl::OkStatus();
}

void LinkSim::Impl::ReadDatagrams(Relay &r, double now) {
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(r.fd, buf, sizeof buf, 0);
    if (n < 0)
      return; // drained (EAGAIN) or failed: epoll says when more comes
    const double done = std::max(duck_out[r.from]->Reserve(now, size_t(n)),
                                 duck_in[r.to]->Reserve(now, size_t(n)));
    r.queue.push_back({done + o.latency_us * 1e3, {buf, buf + n}});
    peer_out[r.from].fetch_add(uint64_t(n), std::memory_order_relaxed);
    peer_in[r.to].fetch_add(uint64_t(n), std::memory_order_relaxed);
  }
}

void LinkSim::Impl::FlushDatagrams(double now) {
  for (const auto &r : relays)
    while (!r->queue.empty() && r->queue.front().release <= now) {
      const std::vector<char> &d = r->queue.front().data;
      // A full receiver drops it, as a switch port would.
      (void)sendto(r->fd, d.data(), d.size(), 0, (const sockaddr *)&r->dest,
                   sizeof r->dest);
      r->queue.pop_front();
    }
}

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
  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (pipe2(wake, O_CLOEXEC) != 0 || epoll_fd < 0 || timer_fd < 0)
    return absl::InternalError("linksim: pipe, epoll or timerfd failed");
  // Listener i is tagged i, the wake pipe and the timer after them.
  auto add = [&](int fd, uint64_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  };
  for (size_t i = 0; i < listen_fds.size(); ++i)
    add(listen_fds[i], i);
  add(wake[0], listen_fds.size());
  add(timer_fd, listen_fds.size() + 1);
  if (absl::Status s = OpenRelays(); !s.ok())
    return s;
  for (size_t k = 0; k < relays.size(); ++k) // after the timer's tag
    add(relays[k]->fd, listen_fds.size() + 2 + k);
  if (absl::Status s = OpenCast(); !s.ok())
    return s;
  if (cast) // after the relays
    add(cast->fd, listen_fds.size() + 2 + relays.size());
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
  NoDelayNonBlocking(client);
  NoDelayNonBlocking(backend);
  auto c = std::make_unique<Conn>();
  c->fd[0] = client;
  c->fd[1] = backend;
  auto setup = [&](int side, Link *a, Link *b, std::atomic<uint64_t> *counter,
                   std::atomic<uint64_t> *counter2) {
    Direction &d = c->dir[side];
    d.src = c->fd[side];
    d.dst = c->fd[1 - side];
    d.first = a;
    d.second = b;
    d.latency_ns = o.latency_us * 1e3;
    d.counter = counter;
    d.counter2 = counter2;
    c->tag[side] = {c.get(), side};
  };
  if (r.peer) { // 0: from -> to; 1: to -> from
    setup(0, duck_out[r.from].get(), duck_in[duck].get(), &peer_out[r.from],
          &peer_in[duck]);
    setup(1, duck_out[duck].get(), duck_in[r.from].get(), &peer_out[duck],
          &peer_in[r.from]);
  } else {
    setup(0, &host_out, duck_in[duck].get(), &to_duck[duck], nullptr);
    setup(1, duck_out[duck].get(), &host_in, &from_duck[duck], nullptr);
    conns[duck].fetch_add(1);
  }
  live.push_back(std::move(c));
  Interest(*live.back());
}

void LinkSim::Impl::ReadFrom(Conn &c, int side, double now) {
  Direction &d = c.dir[side];
  const size_t limit = std::max(o.queue_bytes, o.chunk_bytes);
  scratch.resize(o.chunk_bytes);
  while (!d.src_eof && d.held < limit) {
    Chunk ch;
    const ssize_t n = read(d.src, scratch.data(), scratch.size());
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN)
      return;
    if (n <= 0) { // end of stream (or error): after what came before
      d.src_eof = true;
      ch.eof = true;
      ch.release = now;
      d.queue.push_back(std::move(ch));
      return;
    }
    ch.data.assign(scratch.data(), scratch.data() + n);
    const double done = std::max(d.first->Reserve(now, size_t(n)),
                                 d.second->Reserve(now, size_t(n)));
    ch.release = done + d.latency_ns;
    d.counter->fetch_add(uint64_t(n), std::memory_order_relaxed);
    if (d.counter2)
      d.counter2->fetch_add(uint64_t(n), std::memory_order_relaxed);
    d.held += size_t(n);
    d.queue.push_back(std::move(ch));
    if (size_t(n) < o.chunk_bytes)
      return; // drained for now: epoll says when more comes
  }
}

void LinkSim::Impl::Flush(Conn &c, int side, double now) {
  Direction &d = c.dir[side];
  while (!d.queue.empty() && !d.blocked && !c.dead) {
    Chunk &ch = d.queue.front();
    if (ch.eof) {
      shutdown(d.dst, SHUT_WR); // the peer sees the end of stream
      d.done = true;
      d.queue.pop_front();
      return;
    }
    if (ch.release > now)
      return;
    const ssize_t n = send(d.dst, ch.data.data() + ch.off,
                           ch.data.size() - ch.off, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      d.blocked = errno == EAGAIN;
      continue;
    }
    if (n <= 0) { // the other side is gone: stop the whole connection
      c.dead = true;
      return;
    }
    ch.off += size_t(n);
    if (ch.off == ch.data.size()) {
      d.held -= ch.data.size();
      d.queue.pop_front();
    }
  }
}

/// What each socket of `c` waits for: reading while its direction may read
/// (not at its end, under the queue's bound), writing while the other
/// direction is blocked on it.
void LinkSim::Impl::Interest(Conn &c) {
  const size_t limit = std::max(o.queue_bytes, o.chunk_bytes);
  for (int s = 0; s < 2; ++s) {
    const Direction &in = c.dir[s], &out = c.dir[1 - s];
    const uint32_t want =
        (!in.src_eof && in.held < limit ? uint32_t(EPOLLIN) : 0u) |
        (out.blocked ? uint32_t(EPOLLOUT) : 0u);
    if (c.registered[s] && want == c.interest[s])
      continue;
    epoll_event ev{};
    ev.events = want;
    ev.data.ptr = &c.tag[s];
    if (!c.registered[s] && want == 0)
      continue;
    if (c.registered[s] && want == 0) {
      // Deregistered: a socket at its end would report EPOLLHUP forever.
      epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd[s], nullptr);
      c.registered[s] = false;
    } else {
      epoll_ctl(epoll_fd, c.registered[s] ? EPOLL_CTL_MOD : EPOLL_CTL_ADD,
                c.fd[s], &ev);
      c.registered[s] = true;
    }
    c.interest[s] = want;
  }
}

void LinkSim::Impl::ArmTimer() {
  double next = 0;
  for (const auto &c : live)
    for (const Direction &d : c->dir)
      if (!d.queue.empty() && !d.blocked &&
          (next == 0 || d.queue.front().release < next))
        next = d.queue.front().release;
  for (const auto &r : relays)
    if (!r->queue.empty() && (next == 0 || r->queue.front().release < next))
      next = r->queue.front().release;
  if (cast)
    for (const auto &q : cast->queues)
      if (!q.empty() && (next == 0 || q.front().release < next))
        next = q.front().release;
  if (next == armed)
    return;
  armed = next;
  itimerspec t{};
  if (next > 0) { // absolute; a time passed fires at once
    t.it_value.tv_sec = time_t(next / 1e9);
    t.it_value.tv_nsec = long(next - double(t.it_value.tv_sec) * 1e9);
    if (t.it_value.tv_sec == 0 && t.it_value.tv_nsec == 0)
      t.it_value.tv_nsec = 1;
  }
  timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &t, nullptr);
}

void LinkSim::Impl::Loop() {
  // Wake at the release time, not up to the default 50 us timer slack
  // later: that would be a latency the link does not have.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  const uint64_t wake_tag = listen_fds.size(), timer_tag = wake_tag + 1;
  epoll_event events[64];
  for (;;) {
    ArmTimer();
    const int n = epoll_wait(epoll_fd, events, 64, -1);
    if (n < 0 && errno != EINTR)
      return;
    const double now = NowNs();
    // The host sends a cast step's datagrams before its frames: take them
    // first, so that they keep that order on every duck's link whatever
    // order epoll reports the sockets in.
    if (cast)
      ReadCast(now);
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == wake_tag)
        return;
      if (tag == timer_tag) {
        uint64_t expirations;
        (void)!read(timer_fd, &expirations, sizeof expirations);
        armed = -1; // fired: arm again
      } else if (tag < wake_tag) {
        Accept(size_t(tag));
      } else if (tag > timer_tag && tag - timer_tag - 1 < relays.size()) {
        ReadDatagrams(*relays[tag - timer_tag - 1], now);
      } else if (cast && tag == timer_tag + 1 + relays.size()) {
        ReadCast(now);
      } else {
        const Tag *t = static_cast<const Tag *>(events[i].data.ptr);
        if (events[i].events & EPOLLOUT)
          t->conn->dir[1 - t->side].blocked = false;
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
          ReadFrom(*t->conn, t->side, now);
      }
    }
    for (const auto &c : live)
      for (int s = 0; s < 2; ++s)
        Flush(*c, s, NowNs());
    FlushDatagrams(NowNs());
    FlushCast(NowNs());
    // Finished connections are closed here, so a long run holds only its
    // live ones; the rest wait for their next event. Their sockets leave
    // the epoll set first: a fork elsewhere in the process (a tool started
    // by system()) may hold them open past close(), and epoll would then
    // still report events carrying the freed connection.
    live.erase(std::remove_if(live.begin(), live.end(),
                              [&](const std::unique_ptr<Conn> &c) {
                                if (!c->Finished())
                                  return false;
                                for (int s = 0; s < 2; ++s)
                                  if (c->registered[s])
                                    epoll_ctl(epoll_fd, EPOLL_CTL_DEL,
                                              c->fd[s], nullptr);
                                return true;
                              }),
               live.end());
    for (const auto &c : live)
      Interest(*c);
  }
}

LinkSim::LinkSim(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<LinkSim>>
LinkSim::Start(const LinkSimOptions &options) {
  if (options.backends.empty())
    return absl::InvalidArgumentError("linksim: no ducks");
  if (!options.peer_datagram_ports.empty() &&
      options.peer_datagram_ports.size() != options.backends.size())
    return absl::InvalidArgumentError(absl::StrCat(
        "linksim: ", options.peer_datagram_ports.size(),
        " peer datagram ports for ", options.backends.size(), " ducks"));
  if (!options.cast_ports.empty() &&
      options.cast_ports.size() != options.backends.size())
    return absl::InvalidArgumentError(
        absl::StrCat("linksim: ", options.cast_ports.size(), " cast ports for ",
                     options.backends.size(), " ducks"));
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
    for (int fd :
         {impl->wake[0], impl->wake[1], impl->epoll_fd, impl->timer_fd})
      if (fd >= 0)
        close(fd);
    return s;
  }
  Impl *p = impl.get();
  impl->loop = std::thread([p] { p->Loop(); });
  return std::unique_ptr<LinkSim>(new LinkSim(std::move(impl)));
}

LinkSim::~LinkSim() { Stop(); }

const std::vector<uint16_t> &LinkSim::ports() const { return impl_->ports; }

const std::vector<std::vector<uint16_t>> &LinkSim::peer_ports() const {
  return impl_->peer_ports;
}

const std::vector<std::vector<uint16_t>> &
LinkSim::peer_datagram_relays() const {
  return impl_->relay_ports;
}

uint16_t LinkSim::cast_relay_port() const {
  return impl_->cast ? impl_->cast->port : 0;
}

uint64_t LinkSim::cast_bytes_from_host() const {
  return impl_->cast_from_host.load();
}

std::vector<LinkSimDuckStats> LinkSim::stats() const {
  std::vector<LinkSimDuckStats> s(impl_->ports.size());
  for (size_t i = 0; i < s.size(); ++i) {
    s[i].bytes_to_duck = impl_->to_duck[i].load();
    s[i].bytes_from_duck = impl_->from_duck[i].load();
    s[i].connections = impl_->conns[i].load();
    s[i].bytes_to_peers = impl_->peer_out[i].load();
    s[i].bytes_from_peers = impl_->peer_in[i].load();
    s[i].cast_bytes_to_duck = impl_->cast_to[i].load();
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
  m.loop.join();
  m.live.clear(); // closes every connection's sockets
  m.relays.clear();
  m.cast.reset();
  for (int fd : m.listen_fds)
    close(fd);
  for (int fd : {m.wake[0], m.wake[1], m.epoll_fd, m.timer_fd})
    close(fd);
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
         "(one switch);\n"
         "the mesh's UDP datagrams too, each through a relay port for its "
         "pair of ducks;\n"
         "the host's cast datagrams through one relay port: the host's "
         "port carries each\n"
         "once, every duck's link a copy (a switch's multicast).\n"
         "Does not model: TCP's own congestion control and windows (they "
         "run over\n"
         "loopback underneath), loss, jitter, switch buffers (no drops; a "
         "direction\n"
         "holds at most its queue and then stops reading), header "
         "overheads (payload\n"
         "bytes only: a datagram's UDP payload), and the CPU the simulator "
         "itself takes.\n";
}

} // namespace duck::runtime
