// The mesh's datagram transport (PeerDatagrams.h).
#include "PeerDatagrams.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

namespace duck::duckd {

struct PeerDatagrams::Header {
  uint64_t tag;    // the pair's
  uint32_t seq;    // the collective
  uint32_t bytes;  // the whole message's payload
  uint32_t offset; // this chunk's first byte in it
  uint16_t from;   // the sender's rank
  uint16_t kind;   // kData or kResend
};
static_assert(sizeof(PeerDatagrams::Header) == 24, "datagram header layout");

namespace {
constexpr uint16_t kData = 0, kResend = 1;
// Control messages on the pair's connection: {magic, seq}.
constexpr uint32_t kLeftMagic = 0x5446454c; // "LEFT": no collective after seq
constexpr uint32_t kSettledMagic = 0x4c544553; // "SETL": has all through seq
constexpr size_t kKeep = 16;    // collectives whose messages are kept
constexpr uint32_t kAhead = 16; // how far ahead an early datagram may be
constexpr size_t kBatch = 64;   // datagrams a recvmmsg
constexpr int kBufferBytes = 4 << 20;
constexpr absl::Duration kFirstAsk = absl::Milliseconds(10);
constexpr absl::Duration kLongestAsk = absl::Milliseconds(320);
constexpr uint32_t kNone = UINT32_MAX; // no such message yet
} // namespace

/// One Exchange's receiving state: per peer, the message's buffer, which
/// of its chunks are in, and how many.
struct PeerDatagrams::Wait {
  uint32_t seq = 0;
  std::vector<std::vector<char>> *in = nullptr;
  std::vector<std::vector<bool>> got; // by rank; empty: not expected
  std::vector<size_t> have;
  size_t missing = 0;      // peers whose message is not all in
  bool settling = false;   // Settle's: nothing of seq itself is wanted
  size_t taken = 0;        // chunks taken in so far (progress)
  std::vector<bool> asked; // by rank: asked on evidence of a loss
};

absl::StatusOr<std::unique_ptr<PeerDatagrams>>
PeerDatagrams::Open(uint32_t rank, uint32_t ducks, in_addr host,
                    uint32_t datagram_bytes, uint32_t drop_every, int fd) {
  if (datagram_bytes <= sizeof(Header) || datagram_bytes > 65507)
    return absl::InvalidArgumentError(
        absl::StrCat("peer mesh: datagrams of ", datagram_bytes,
                     " bytes (more than ", sizeof(Header), ", at most 65507)"));
  std::unique_ptr<PeerDatagrams> d(new PeerDatagrams());
  d->rank_ = rank;
  d->ducks_ = ducks;
  d->datagram_bytes_ = datagram_bytes;
  d->drop_every_ = drop_every;
  d->fd_ = fd >= 0 ? fd : socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  d->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (d->fd_ < 0 || d->epoll_fd_ < 0)
    return absl::InternalError("peer mesh: cannot open a datagram socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr = host;
  socklen_t len = sizeof a;
  if ((fd < 0 && bind(d->fd_, (sockaddr *)&a, sizeof a) != 0) ||
      getsockname(d->fd_, (sockaddr *)&a, &len) != 0)
    return absl::UnavailableError(
        absl::StrCat("peer mesh: rank ", rank,
                     " cannot bind a datagram socket: ", std::strerror(errno)));
  d->port_ = ntohs(a.sin_port);
  // As much buffer as the system allows (a burst of every peer's chunks).
  setsockopt(d->fd_, SOL_SOCKET, SO_RCVBUF, &kBufferBytes, sizeof kBufferBytes);
  setsockopt(d->fd_, SOL_SOCKET, SO_SNDBUF, &kBufferBytes, sizeof kBufferBytes);
  d->recv_buf_.resize(kBatch * size_t(datagram_bytes));
  d->recv_iov_.resize(kBatch);
  d->recv_msgs_.resize(kBatch);
  for (size_t i = 0; i < kBatch; ++i) {
    d->recv_iov_[i] = {d->recv_buf_.data() + i * datagram_bytes,
                       datagram_bytes};
    d->recv_msgs_[i].msg_hdr.msg_iov = &d->recv_iov_[i];
    d->recv_msgs_[i].msg_hdr.msg_iovlen = 1;
  }
  d->left_seq_.assign(ducks, kNone);
  d->settled_seq_.assign(ducks, kNone);
  d->closed_.assign(ducks, false);
  d->control_.resize(ducks);
  return d;
}

PeerDatagrams::~PeerDatagrams() {
  if (fd_ >= 0)
    close(fd_);
  if (epoll_fd_ >= 0)
    close(epoll_fd_);
}

absl::Status PeerDatagrams::Start(std::vector<Peer> peers) {
  peers_ = std::move(peers);
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.u32 = ducks_; // the datagram socket
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd_, &e) != 0)
    return absl::InternalError("peer mesh: epoll_ctl failed");
  for (uint32_t j = 0; j < ducks_; ++j) {
    if (j == rank_)
      continue;
    e.data.u32 = j;
    e.events = EPOLLIN | EPOLLRDHUP;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, peers_[j].tcp_fd, &e) != 0)
      return absl::InternalError("peer mesh: epoll_ctl failed");
  }
  return absl::OkStatus();
}

size_t PeerDatagrams::PayloadMax() const {
  return datagram_bytes_ - sizeof(Header);
}

size_t PeerDatagrams::WireBytes(size_t payload) const {
  const size_t pm = PayloadMax();
  return std::max<size_t>(1, (payload + pm - 1) / pm) * sizeof(Header) +
         payload;
}

/// Every chunk of out[j] to each j in `to` (a message of 0 bytes is one
/// header), with as few sendmmsg calls as the socket takes.
absl::Status PeerDatagrams::Send(uint32_t seq,
                                 const std::vector<std::vector<char>> &out,
                                 const std::vector<uint32_t> &to, bool first) {
  const size_t pm = PayloadMax();
  // Members, so that a collective allocates nothing here once warm.
  std::vector<Header> &headers = send_headers_;
  std::vector<iovec> &iov = send_iov_, &parts = send_parts_;
  std::vector<uint32_t> &dest = send_dest_;
  std::vector<mmsghdr> &msgs = send_msgs_;
  headers.clear();
  iov.clear();
  dest.clear();
  msgs.clear();
  for (uint32_t j : to) {
    const std::vector<char> &m = out[j];
    for (size_t off = 0; off == 0 || off < m.size(); off += pm) {
      headers.push_back({peers_[j].tag, seq, uint32_t(m.size()), uint32_t(off),
                         uint16_t(rank_), kData});
      dest.push_back(j);
      iov.push_back({(void *)(m.data() + off), std::min(pm, m.size() - off)});
    }
  }
  parts.resize(2 * headers.size());
  for (size_t i = 0; i < headers.size(); ++i) {
    if (first && drop_every_ > 0 && ++first_sends_ % drop_every_ == 0)
      continue; // the loss tests: this one never leaves
    parts[2 * i] = {&headers[i], sizeof(Header)};
    parts[2 * i + 1] = iov[i];
    mmsghdr m{};
    m.msg_hdr.msg_name = &peers_[dest[i]].addr;
    m.msg_hdr.msg_namelen = sizeof(sockaddr_in);
    m.msg_hdr.msg_iov = &parts[2 * i];
    m.msg_hdr.msg_iovlen = 2;
    msgs.push_back(m);
  }
  // A full send buffer (EAGAIN, ENOBUFS) waits for room, for at most
  // about a second in all.
  for (size_t done = 0, waits = 0; done < msgs.size();) {
    const int n =
        sendmmsg(fd_, msgs.data() + done,
                 unsigned(std::min<size_t>(msgs.size() - done, 1024)), 0);
    const bool full = n < 0 && (errno == EAGAIN || errno == ENOBUFS);
    if ((n < 0 && errno != EINTR && !full) || (full && ++waits > 1000))
      return absl::UnavailableError(absl::StrCat(
          "peer mesh: rank ", rank_, " cannot send: ", std::strerror(errno)));
    if (full) {
      pollfd p{fd_, POLLOUT, 0};
      poll(&p, 1, 1);
    }
    if (n > 0)
      done += size_t(n);
  }
  (first ? datagrams_sent_ : datagrams_resent_) += headers.size();
  return absl::OkStatus();
}

void PeerDatagrams::Resend(uint32_t to, uint32_t seq) {
  const Sent &s = history_[seq % kKeep];
  if (s.seq == seq && to < s.sent.size() && s.sent[to])
    (void)Send(seq, s.to, {to}, /*first=*/false);
}

void PeerDatagrams::Ask(uint32_t to, uint32_t seq) {
  const Header h{peers_[to].tag, seq, 0, 0, uint16_t(rank_), kResend};
  sendto(fd_, &h, sizeof h, 0, (const sockaddr *)&peers_[to].addr,
         sizeof(sockaddr_in));
  ++resend_requests_;
}

absl::Status PeerDatagrams::Take(const Header &h, const char *payload,
                                 size_t len, Wait *w) {
  if (h.from >= ducks_ || h.from == rank_ || peers_[h.from].tag != h.tag)
    return absl::OkStatus(); // not from this mesh's peers: dropped
  if (h.kind == kResend) {
    Resend(h.from, h.seq);
    return absl::OkStatus();
  }
  if (w == nullptr || h.seq != w->seq || w->settling) {
    if (w != nullptr && h.seq > w->seq && h.seq - w->seq <= kAhead) {
      early_.push_back(
          {h.seq, h.from, h.bytes, h.offset, {payload, payload + len}});
      // A peer's datagrams leave in order: one of a later collective
      // while this one's are not all in means they were lost.
      if (!w->settling)
        AskNowIfMissing(h.from, w);
    }
    return absl::OkStatus(); // a stale duplicate, or nothing waited for
  }
  std::vector<bool> &got = w->got[h.from];
  std::vector<char> &in = (*w->in)[h.from];
  if (got.empty() || h.bytes != in.size())
    return absl::DataLossError(absl::StrCat(
        "peer mesh: rank ", rank_, " got collective ", h.seq, " of ", h.bytes,
        " bytes from rank ", h.from, ", expected ", w->seq, " of ",
        got.empty() ? 0 : in.size()));
  const size_t pm = PayloadMax();
  const size_t k = h.offset / pm;
  if (h.offset % pm != 0 || k >= got.size() ||
      len != std::min(pm, in.size() - std::min<size_t>(h.offset, in.size())))
    return absl::DataLossError(absl::StrCat("peer mesh: rank ", rank_,
                                            " got a malformed datagram from "
                                            "rank ",
                                            h.from));
  if (got[k])
    return absl::OkStatus(); // a resent duplicate
  if (k > 0 && !got[k - 1] && w->have[h.from] < k)
    AskNowIfMissing(h.from, w); // an earlier chunk went missing
  got[k] = true;
  if (len > 0)
    std::memcpy(in.data() + h.offset, payload, len);
  ++w->taken;
  if (++w->have[h.from] == got.size())
    --w->missing;
  return absl::OkStatus();
}

void PeerDatagrams::AskNowIfMissing(uint32_t from, Wait *w) {
  if (from < w->got.size() && !w->got[from].empty() && !w->asked[from] &&
      w->have[from] < w->got[from].size()) {
    w->asked[from] = true; // once a collective; the timer asks again
    Ask(from, w->seq);
  }
}

absl::Status PeerDatagrams::Drain(Wait *w) {
  std::vector<mmsghdr> &msgs = recv_msgs_; // set up by Open
  for (;;) {
    const int n = recvmmsg(fd_, msgs.data(), kBatch, MSG_DONTWAIT, nullptr);
    if (n <= 0)
      return absl::OkStatus(); // nothing more now
    for (int i = 0; i < n; ++i) {
      const char *d = recv_buf_.data() + size_t(i) * datagram_bytes_;
      if (msgs[i].msg_len < sizeof(Header))
        continue; // not ours
      Header h;
      std::memcpy(&h, d, sizeof h);
      if (absl::Status s = Take(h, d + sizeof h, msgs[i].msg_len - sizeof h, w);
          !s.ok())
        return s;
    }
    if (size_t(n) < kBatch)
      return absl::OkStatus();
  }
}

void PeerDatagrams::ReadControl(uint32_t j) {
  if (closed_[j])
    return;
  char buf[64];
  const ssize_t n = recv(peers_[j].tcp_fd, buf, sizeof buf, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR))
    return;
  if (n <= 0) { // closed (or failed): it sends nothing more
    closed_[j] = true;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, peers_[j].tcp_fd, nullptr);
    return;
  }
  std::vector<char> &c = control_[j];
  c.insert(c.end(), buf, buf + n);
  while (c.size() >= 8) {
    uint32_t magic, seq;
    std::memcpy(&magic, c.data(), 4);
    std::memcpy(&seq, c.data() + 4, 4);
    c.erase(c.begin(), c.begin() + 8);
    if (magic == kLeftMagic)
      left_seq_[j] = seq;
    else if (magic == kSettledMagic)
      settled_seq_[j] = seq;
    else { // not a duck peer's: as good as gone
      closed_[j] = true;
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, peers_[j].tcp_fd, nullptr);
      return;
    }
  }
}

absl::Status PeerDatagrams::WaitForEvents(absl::Time until) {
  const int64_t ms =
      std::max<int64_t>(0, absl::ToInt64Milliseconds(until - absl::Now() +
                                                     absl::Microseconds(999)));
  epoll_event ev[16];
  const int n =
      epoll_wait(epoll_fd_, ev, 16, int(std::min<int64_t>(ms, INT_MAX)));
  if (n < 0 && errno != EINTR)
    return absl::InternalError("peer mesh: epoll_wait failed");
  for (int i = 0; i < n; ++i)
    if (ev[i].data.u32 < ducks_)
      ReadControl(ev[i].data.u32);
  return absl::OkStatus();
}

/// Kept for resend requests in a ring whose buffers are reused.
void PeerDatagrams::Keep(uint32_t seq,
                         const std::vector<std::vector<char>> &out,
                         const std::vector<uint32_t> &with) {
  Sent &kept = history_[seq % kKeep];
  kept.seq = seq;
  kept.to.resize(ducks_);
  kept.sent.assign(ducks_, false);
  for (uint32_t j : with) {
    kept.sent[j] = true;
    kept.to[j].assign(out[j].begin(), out[j].end());
  }
}

absl::Status PeerDatagrams::TakeEarly(Wait *w) {
  std::vector<Early> early;
  early.swap(early_);
  for (const Early &e : early) {
    if (e.seq != w->seq) {
      if (e.seq > w->seq)
        early_.push_back(e);
      continue;
    }
    const Header h{peers_[e.from].tag, e.seq, e.bytes, e.offset,
                   uint16_t(e.from),   kData};
    if (absl::Status s = Take(h, e.payload.data(), e.payload.size(), w);
        !s.ok())
      return s;
  }
  return absl::OkStatus();
}

absl::Status PeerDatagrams::Exchange(uint32_t seq,
                                     const std::vector<std::vector<char>> &out,
                                     std::vector<std::vector<char>> &in,
                                     const std::vector<uint32_t> &with,
                                     absl::Time deadline) {
  Keep(seq, out, with);
  if (absl::Status s = Send(seq, out, with, /*first=*/true); !s.ok())
    return s;
  Wait w;
  w.seq = seq;
  w.in = &in;
  w.got.resize(ducks_);
  w.have.assign(ducks_, 0);
  w.asked.assign(ducks_, false);
  const size_t pm = PayloadMax();
  for (uint32_t j : with) {
    w.got[j].assign(std::max<size_t>(1, (in[j].size() + pm - 1) / pm), false);
    ++w.missing;
  }
  // What came early for this collective, then the socket.
  if (absl::Status s = TakeEarly(&w); !s.ok())
    return s;
  // Peers are asked again only after a wait in which nothing came, of at
  // least 10 ms and 4 times a collective's usual time (slow links: a
  // collective's datagrams trickle in, and a peer may start late).
  const absl::Time start = absl::Now();
  absl::Duration ask_wait = std::max(kFirstAsk, 4 * usual_);
  absl::Time ask_at = start + ask_wait;
  const absl::Time spin_until = start + spin_;
  for (size_t seen = w.taken;;) {
    if (absl::Status s = Drain(&w); !s.ok())
      return s;
    if (w.missing == 0) {
      // A smoothed collective time (1/8 of the newest, as TCP's RTT).
      usual_ += (absl::Now() - start - usual_) / 8;
      return absl::OkStatus();
    }
    const absl::Time now = absl::Now();
    if (w.taken != seen) {
      seen = w.taken;
      ask_at = std::max(ask_at, now + ask_wait);
    }
    for (uint32_t j : with)
      if (w.have[j] < w.got[j].size()) {
        if (closed_[j] || (left_seq_[j] != kNone && left_seq_[j] < seq))
          return absl::UnavailableError(absl::StrCat(
              "peer mesh: rank ", j, " closed its link to rank ", rank_,
              left_seq_[j] != kNone
                  ? absl::StrCat(" (it left after collective ", left_seq_[j],
                                 ")")
                  : ""));
        if (now >= ask_at)
          Ask(j, seq);
      }
    if (now >= deadline) {
      std::string owing;
      for (uint32_t j : with)
        if (w.have[j] < w.got[j].size())
          absl::StrAppend(&owing, owing.empty() ? "" : ", ", j);
      return absl::DeadlineExceededError(
          absl::StrCat("peer mesh: rank ", rank_, " timed out in collective ",
                       seq, " waiting for rank(s) ", owing));
    }
    if (now >= ask_at) {
      ask_wait = std::min(2 * ask_wait, std::max(kLongestAsk, 16 * usual_));
      ask_at = now + ask_wait;
    }
    if (now < spin_until)
      continue; // a dedicated core: look again instead of sleeping
    if (absl::Status s = WaitForEvents(std::min(deadline, ask_at)); !s.ok())
      return s;
  }
}

void PeerDatagrams::Tell(uint32_t magic, uint32_t seq) {
  const uint32_t msg[2] = {magic, seq};
  for (uint32_t j = 0; j < ducks_; ++j)
    if (j != rank_ && !closed_[j])
      (void)send(peers_[j].tcp_fd, msg, sizeof msg, MSG_NOSIGNAL);
}

absl::Status PeerDatagrams::Settle(uint32_t seq, absl::Time deadline) {
  if (peers_.empty())
    return absl::OkStatus();
  Tell(kSettledMagic, seq);
  // Datagrams of later collectives (a peer that settled first may be on)
  // are kept for them; this one's duplicates dropped.
  Wait w;
  w.seq = seq;
  w.settling = true;
  for (;;) {
    if (absl::Status s = Drain(&w); !s.ok())
      return s;
    std::string waiting;
    for (uint32_t j = 0; j < ducks_; ++j) {
      if (j == rank_ || (left_seq_[j] != kNone && left_seq_[j] >= seq) ||
          (settled_seq_[j] != kNone && settled_seq_[j] >= seq))
        continue;
      if (closed_[j] || left_seq_[j] != kNone)
        return absl::UnavailableError(
            absl::StrCat("peer mesh: rank ", j, " closed its link to rank ",
                         rank_, " before collective ", seq, " settled"));
      absl::StrAppend(&waiting, waiting.empty() ? "" : ", ", j);
    }
    if (waiting.empty()) {
      settled_ = seq;
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline)
      return absl::DeadlineExceededError(
          absl::StrCat("peer mesh: rank ", rank_, " timed out settling ",
                       "collective ", seq, " waiting for rank(s) ", waiting));
    if (absl::Status s = WaitForEvents(deadline); !s.ok())
      return s;
  }
}

void PeerDatagrams::Finish(uint32_t last_seq, absl::Time deadline) {
  if (peers_.empty())
    return; // never started: no peer knows this socket
  Tell(kLeftMagic, last_seq);
  if (settled_ == last_seq)
    return; // every peer has all this duck sent
  for (;;) {
    // Answer resend requests (and drop data nobody waits for).
    (void)Drain(nullptr);
    bool all = true;
    for (uint32_t j = 0; j < ducks_; ++j)
      all = all && (j == rank_ || closed_[j] || left_seq_[j] != kNone);
    if (all || absl::Now() >= deadline)
      return;
    if (!WaitForEvents(deadline).ok())
      return;
  }
}

} // namespace duck::duckd
