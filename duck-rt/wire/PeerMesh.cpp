// The ducks' mesh and its collectives (duck_rt/peer_mesh.h): blocking
// setup, then every collective one non-blocking exchange driven by poll.
#include "duck_rt/peer_mesh.h"

#include "PeerDatagrams.h"

#include "duck_rt/abi.h"
#include "duck_rt/fp9.h"
#include "duck_rt/wire_socket.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <thread>
#include <unistd.h>

namespace duck::duckd {

namespace {

constexpr char kMagic[4] = {'D', 'K', 'P', 'M'};
constexpr uint32_t kVersion = 2;
constexpr uint32_t kHelloKeyed = 1; // Hello::flags: a token proof follows
// udp; Hello::port: its socket's, and the flags' upper 16 bits the size of
// its largest datagram.
constexpr uint32_t kHelloDatagrams = 2;
constexpr absl::Duration kHelloWait = absl::Seconds(1);

struct Hello {
  char magic[4];
  uint32_t version, rank, ducks;
  uint64_t session;
  uint32_t flags, port;
  uint8_t nonce[kNonceBytes];
};
static_assert(sizeof(Hello) == 48, "hello layout");

/// Every message of a collective: its sequence number and payload bytes.
struct MsgHeader {
  uint32_t seq, bytes;
};

absl::StatusOr<Hello> MakeHello(const PeerMeshOptions &o, uint16_t udp_port) {
  Hello h{};
  std::memcpy(h.magic, kMagic, 4);
  h.version = kVersion;
  h.rank = o.rank;
  h.ducks = o.ducks;
  h.session = o.session;
  h.flags = (o.token.empty() ? 0 : kHelloKeyed) |
            (o.transport == PeerTransport::udp
                 ? kHelloDatagrams | (o.datagram_bytes << 16)
                 : 0);
  h.port = udp_port;
  if (absl::Status s = RandomNonce(h.nonce); !s.ok())
    return s;
  return h;
}

/// With a token, after the hellos: each side sends its proof (the
/// connector first) and checks the other's against the one it expects.
absl::Status Prove(int fd, const PeerMeshOptions &o, const Hello &connector,
                   const Hello &acceptor, bool is_connector, uint32_t peer,
                   absl::Time deadline) {
  if (o.token.empty())
    return absl::OkStatus();
  uint8_t key[kKeyBytes], mine[kKeyBytes], want[kKeyBytes], got[kKeyBytes];
  MeshKey(o.token, connector.nonce, acceptor.nonce, key);
  MeshProof(key, is_connector ? 'C' : 'A', mine);
  MeshProof(key, is_connector ? 'A' : 'C', want);
  const Part part{mine, sizeof mine};
  absl::Status s = is_connector ? WriteFull(fd, {&part, 1}, deadline)
                                : ReadFull(fd, got, sizeof got, deadline);
  if (s.ok())
    s = is_connector ? ReadFull(fd, got, sizeof got, deadline)
                     : WriteFull(fd, {&part, 1}, deadline);
  if (!s.ok())
    return s;
  uint8_t diff = 0; // constant time
  for (size_t i = 0; i < kKeyBytes; ++i)
    diff |= uint8_t(got[i] ^ want[i]);
  if (diff != 0)
    return absl::PermissionDeniedError(absl::StrCat(
        "peer mesh: rank ", peer, " failed authentication with rank ", o.rank,
        " (another token)"));
  return absl::OkStatus();
}

/// The tag a pair's datagrams carry: with a token from the pair's key
/// (unknown off the path), without one from both nonces.
uint64_t PairTag(const PeerMeshOptions &o, const Hello &connector,
                 const Hello &acceptor) {
  uint8_t t[kKeyBytes];
  if (!o.token.empty()) {
    uint8_t key[kKeyBytes];
    MeshKey(o.token, connector.nonce, acceptor.nonce, key);
    MeshProof(key, 'U', t);
  } else {
    for (size_t i = 0; i < 8; ++i)
      t[i] = connector.nonce[i] ^ acceptor.nonce[8 + i];
  }
  uint64_t tag;
  std::memcpy(&tag, t, sizeof tag);
  return tag;
}

/// Checks a peer's hello; `want` is the rank expected (-1: any lower one).
absl::Status CheckHello(const Hello &h, const PeerMeshOptions &o,
                        int64_t want) {
  if (std::memcmp(h.magic, kMagic, 4) != 0 || h.version != kVersion)
    return absl::InvalidArgumentError("peer mesh: not a duck peer (bad hello)");
  if (((h.flags & kHelloKeyed) != 0) != !o.token.empty())
    return absl::PermissionDeniedError(absl::StrCat(
        "peer mesh: rank ", h.rank,
        (h.flags & kHelloKeyed) ? " authenticates with a token and rank "
                                : " has no token and rank ",
        o.rank, (h.flags & kHelloKeyed) ? " has none" : " does"));
  const bool udp = o.transport == PeerTransport::udp;
  if (((h.flags & kHelloDatagrams) != 0) != udp)
    return absl::InvalidArgumentError(
        absl::StrCat("peer mesh: rank ", h.rank, " sends ", udp ? "tcp" : "udp",
                     " and rank ", o.rank, " ", udp ? "udp" : "tcp"));
  if (udp && (h.flags >> 16) != (o.datagram_bytes & 0xffff))
    return absl::InvalidArgumentError(absl::StrCat(
        "peer mesh: rank ", h.rank, " sends datagrams of ", h.flags >> 16,
        " bytes and rank ", o.rank, " of ", o.datagram_bytes));
  if (h.ducks != o.ducks || h.session != o.session)
    return absl::InvalidArgumentError(
        absl::StrCat("peer mesh: rank ", h.rank, " belongs to another mesh (",
                     h.ducks, " ducks, session ", h.session, "; this one ",
                     o.ducks, ", ", o.session, ")"));
  if (want >= 0 ? h.rank != uint64_t(want) : h.rank >= o.rank)
    return absl::InvalidArgumentError(
        absl::StrCat("peer mesh: rank ", o.rank, " expected ",
                     want >= 0 ? absl::StrCat("rank ", want) : "a lower rank",
                     ", got rank ", h.rank));
  return absl::OkStatus();
}

absl::StatusOr<int> Dial(const PeerAddress &a, absl::Time deadline) {
  sockaddr_in s{};
  s.sin_family = AF_INET;
  s.sin_port = htons(a.port);
  const std::string host = a.host == "localhost" ? "127.0.0.1" : a.host;
  if (inet_pton(AF_INET, host.c_str(), &s.sin_addr) != 1)
    return absl::InvalidArgumentError(
        absl::StrCat("peer mesh: bad address '", a.host, "'"));
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return absl::InternalError("peer mesh: socket failed");
    if (connect(fd, (sockaddr *)&s, sizeof s) == 0) {
      TuneSocket(fd);
      return fd;
    }
    const int err = errno;
    close(fd);
    if (err != ECONNREFUSED || absl::Now() > deadline)
      return absl::UnavailableError(absl::StrCat("peer mesh: cannot reach ",
                                                 a.host, ":", a.port, ": ",
                                                 std::strerror(err)));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

absl::StatusOr<int> AcceptOne(int listen_fd, absl::Time deadline) {
  for (;;) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0)
      return absl::DeadlineExceededError(
          "peer mesh: a lower rank never connected");
    pollfd p{listen_fd, POLLIN, 0};
    if (poll(&p, 1, int(ms)) <= 0)
      continue;
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      TuneSocket(fd);
      return fd;
    }
  }
}

/// The values of `v` as the wire carries them, appended to `bytes`.
void Encode(absl::Span<const float> v, PeerWire wire,
            std::vector<char> *bytes) {
  if (wire == PeerWire::f32) {
    bytes->insert(bytes->end(), (const char *)v.data(),
                  (const char *)(v.data() + v.size()));
    return;
  }
  const size_t at = bytes->size();
  if (wire == PeerWire::q8) {
    bytes->resize(at + duck_q8_row_bytes(v.size()));
    duck_q8_encode_row(v.data(), v.size(),
                       reinterpret_cast<uint8_t *>(bytes->data() + at));
    return;
  }
  bytes->resize(at + 2 * v.size());
  char *p = bytes->data() + at;
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t b = duck_f32_to_bf16(v[i]);
    std::memcpy(p + 2 * i, &b, 2);
  }
}

/// Adds (add) or writes the values Encode wrote into `out`, one loop a
/// wire kind (an element's additions stay in the callers' order).
void DecodeInto(const std::vector<char> &bytes, PeerWire wire, bool add,
                float *out, size_t n) {
  const char *p = bytes.data();
  if (wire == PeerWire::q8) {
    float v[DUCK_Q8_BLOCK];
    for (size_t b = 0; b < n; b += DUCK_Q8_BLOCK) {
      const size_t m = std::min<size_t>(DUCK_Q8_BLOCK, n - b);
      duck_q8_decode_row(reinterpret_cast<const uint8_t *>(p), m, v);
      for (size_t i = 0; i < m; ++i)
        out[b + i] = add ? out[b + i] + v[i] : v[i];
      p += 2 + m;
    }
    return;
  }
  if (wire == PeerWire::f32) {
    for (size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      out[i] = add ? out[i] + f : f;
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    const float f = duck_bf16_to_f32(b);
    out[i] = add ? out[i] + f : f;
  }
}

size_t WireBytes(size_t n, PeerWire wire) {
  return wire == PeerWire::q8 ? duck_q8_row_bytes(n)
                              : n * (wire == PeerWire::f32 ? 4 : 2);
}

/// One peer's side of an exchange: the message out (header and payload)
/// and the one in.
struct Flow {
  MsgHeader out_hdr{}, in_hdr{};
  const std::vector<char> *out = nullptr;
  std::vector<char> *in = nullptr;
  size_t out_off = 0, in_off = 0; // header bytes included
  bool checked = false;           // in_hdr is in and was checked
  size_t OutTotal() const { return sizeof(MsgHeader) + out->size(); }
  size_t InTotal() const { return sizeof(MsgHeader) + in->size(); }
};

/// Moves what `fd` takes of the flow's bytes (offset off of header h and
/// payload p) with one writev/readv; false on a closed or failed socket.
bool Move(int fd, bool write, void *hdr, char *payload, size_t payload_bytes,
          size_t *off) {
  iovec iov[2];
  int n = 0;
  if (*off < sizeof(MsgHeader))
    iov[n++] = {(char *)hdr + *off, sizeof(MsgHeader) - *off};
  const size_t p = *off > sizeof(MsgHeader) ? *off - sizeof(MsgHeader) : 0;
  if (payload_bytes > p)
    iov[n++] = {payload + p, payload_bytes - p};
  const ssize_t r = write ? writev(fd, iov, n) : readv(fd, iov, n);
  if (r > 0) {
    *off += size_t(r);
    return true;
  }
  return r < 0 && (errno == EAGAIN || errno == EINTR);
}

/// Accepts every lower rank into fds[rank]. A connection that fails its
/// hello or proof (a stranger, a stale one, another mesh, another token)
/// is closed and the wait goes on; if the lower ranks do not all come, the
/// error names the missing ones and, when there was one, the first
/// refusal (with its code).
absl::Status AcceptLower(const PeerMeshOptions &o, const Hello &mine,
                         absl::Time deadline, std::vector<int> &fds,
                         std::vector<Hello> &hellos) {
  absl::Status refused;
  for (uint32_t accepted = 0; accepted < o.rank;) {
    absl::StatusOr<int> fd = AcceptOne(o.listen_fd, deadline);
    if (!fd.ok()) {
      std::string missing;
      for (uint32_t j = 0; j < o.rank; ++j)
        if (fds[j] < 0)
          absl::StrAppend(&missing, missing.empty() ? "" : ", ", j);
      const std::string waited = absl::StrCat(
          "rank ", o.rank, " waited ", absl::FormatDuration(o.timeout),
          " for rank(s) ", missing, " to connect");
      return refused.ok() ? absl::DeadlineExceededError("peer mesh: " + waited)
                          : absl::Status(refused.code(),
                                         absl::StrCat(refused.message(), " (",
                                                      waited, ")"));
    }
    // Answer before checking, so that a mismatched peer can name what
    // did not match too. A peer sends its hello as soon as it connects: a
    // connection that stays silent gets a second, not the whole wait.
    Hello theirs;
    const Part part{&mine, sizeof mine};
    const absl::Time hello_by = std::min(deadline, absl::Now() + kHelloWait);
    absl::Status s = ReadFull(*fd, &theirs, sizeof theirs, hello_by);
    if (s.ok())
      s = WriteFull(*fd, {&part, 1}, deadline);
    if (s.ok())
      s = CheckHello(theirs, o, -1);
    if (s.ok() && fds[theirs.rank] >= 0)
      s = absl::InvalidArgumentError(
          absl::StrCat("peer mesh: rank ", theirs.rank, " connected twice"));
    if (s.ok())
      s = Prove(*fd, o, theirs, mine, false, theirs.rank, deadline);
    if (!s.ok()) {
      close(*fd);
      if (refused.ok())
        refused = s;
      continue;
    }
    fds[theirs.rank] = *fd;
    hellos[theirs.rank] = theirs;
    ++accepted;
  }
  return absl::OkStatus();
}

} // namespace

size_t PeerSliceBegin(size_t n, uint32_t ducks, uint32_t j) {
  const size_t base = n / ducks, extra = n % ducks;
  return j * base + std::min<size_t>(j, extra);
}

namespace {

/// The address this duck's listener is bound to (its datagrams' too).
in_addr ListenerAddress(int listen_fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (getsockname(listen_fd, (sockaddr *)&a, &len) != 0)
    a.sin_addr.s_addr = htonl(INADDR_ANY);
  return a.sin_addr;
}

/// The peers' datagram sockets: a higher rank's at the address this duck
/// dialed, a lower one's at its connection's source; each at the port its
/// hello named.
absl::StatusOr<std::vector<PeerDatagrams::Peer>>
DatagramPeers(const PeerMeshOptions &o, const Hello &mine,
              const std::vector<Hello> &hellos, const std::vector<int> &fds) {
  std::vector<PeerDatagrams::Peer> peers(o.ducks);
  for (uint32_t j = 0; j < o.ducks; ++j) {
    if (j == o.rank)
      continue;
    PeerDatagrams::Peer &p = peers[j];
    p.tcp_fd = fds[j];
    p.tag =
        j > o.rank ? PairTag(o, mine, hellos[j]) : PairTag(o, hellos[j], mine);
    socklen_t len = sizeof p.addr;
    if (j < o.rank) {
      if (getpeername(fds[j], (sockaddr *)&p.addr, &len) != 0)
        return absl::UnavailableError(absl::StrCat(
            "peer mesh: rank ", j, " closed its link to rank ", o.rank));
    } else {
      const std::string host =
          o.peers[j].host == "localhost" ? "127.0.0.1" : o.peers[j].host;
      p.addr.sin_family = AF_INET;
      inet_pton(AF_INET, host.c_str(), &p.addr.sin_addr); // Dial checked it
    }
    p.addr.sin_port = htons(uint16_t(hellos[j].port));
    if (!o.datagram_peers.empty()) { // a relay's, checked by Connect
      inet_pton(AF_INET, o.datagram_peers[j].host.c_str(), &p.addr.sin_addr);
      p.addr.sin_port = htons(o.datagram_peers[j].port);
    }
  }
  return peers;
}

} // namespace

absl::Status PeerMesh::Validate(const PeerMeshOptions &o) {
  if (o.ducks == 0 || o.rank >= o.ducks || o.peers.size() != o.ducks)
    return absl::InvalidArgumentError(
        absl::StrCat("peer mesh: rank ", o.rank, " of ", o.ducks, " with ",
                     o.peers.size(), " peer addresses"));
  if (o.groups == 0 || o.ducks % o.groups != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "peer mesh: ", o.groups, " groups do not divide ", o.ducks, " ducks"));
  in_addr a;
  for (const PeerAddress &p : o.datagram_peers)
    if (o.datagram_peers.size() != o.ducks ||
        inet_pton(AF_INET, p.host.c_str(), &a) != 1)
      return absl::InvalidArgumentError(
          "peer mesh: datagram peers must be one IPv4 address a duck");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PeerMesh>>
PeerMesh::Connect(const PeerMeshOptions &o) {
  const absl::Status valid = Validate(o);
  if (o.udp_fd >= 0 && (!valid.ok() || o.transport != PeerTransport::udp))
    close(o.udp_fd); // owned from here on, used only over udp
  if (!valid.ok())
    return valid;
  std::unique_ptr<PeerMesh> m(new PeerMesh());
  m->rank_ = o.rank;
  m->ducks_ = o.ducks;
  m->groups_ = o.groups < o.ducks ? o.groups : 1; // N groups: direct
  m->timeout_ = o.timeout;
  m->fds_.assign(o.ducks, -1);
  const absl::Time deadline = absl::Now() + o.timeout;
  if (o.transport == PeerTransport::udp) {
    absl::StatusOr<std::unique_ptr<PeerDatagrams>> d =
        PeerDatagrams::Open(o.rank, o.ducks, ListenerAddress(o.listen_fd),
                            o.datagram_bytes, o.drop_every, o.udp_fd);
    if (!d.ok())
      return d.status();
    (*d)->set_spin(o.spin);
    m->udp_ = std::move(*d);
  }
  const absl::StatusOr<Hello> hello =
      MakeHello(o, m->udp_ ? m->udp_->port() : 0);
  if (!hello.ok())
    return hello.status();
  const Hello &mine = *hello;
  std::vector<Hello> hellos(o.ducks);
  for (uint32_t j = o.rank + 1; j < o.ducks; ++j) {
    absl::StatusOr<int> fd = Dial(o.peers[j], deadline);
    if (!fd.ok())
      return fd.status();
    m->fds_[j] = *fd;
    Hello &theirs = hellos[j];
    const Part part{&mine, sizeof mine};
    if (absl::Status s = WriteFull(*fd, {&part, 1}, deadline); !s.ok())
      return s;
    if (absl::Status s = ReadFull(*fd, &theirs, sizeof theirs, deadline);
        !s.ok())
      return s;
    if (absl::Status s = CheckHello(theirs, o, j); !s.ok())
      return s;
    if (absl::Status s = Prove(*fd, o, mine, theirs, true, j, deadline);
        !s.ok())
      return s;
  }
  if (absl::Status s = AcceptLower(o, mine, deadline, m->fds_, hellos); !s.ok())
    return s;
  for (int fd : m->fds_)
    if (fd >= 0)
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (m->udp_) {
    absl::StatusOr<std::vector<PeerDatagrams::Peer>> peers =
        DatagramPeers(o, mine, hellos, m->fds_);
    if (!peers.ok())
      return peers.status();
    if (absl::Status s = m->udp_->Start(std::move(*peers)); !s.ok())
      return s;
  }
  return m;
}

PeerMesh::~PeerMesh() {
  // Over udp a peer may still ask for this duck's last messages: answer
  // until every peer is done too.
  if (udp_)
    udp_->Finish(seq_, absl::Now() + timeout_);
  for (int fd : fds_)
    if (fd >= 0)
      close(fd);
}

absl::Status PeerMesh::SetGroups(uint32_t groups) {
  if (groups == 0 || ducks_ % groups != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "peer mesh: ", groups, " groups do not divide ", ducks_, " ducks"));
  groups_ = groups < ducks_ ? groups : 1; // N groups: direct
  return absl::OkStatus();
}

absl::Status PeerMesh::Settle() {
  return udp_ ? udp_->Settle(seq_, absl::Now() + timeout_) : absl::OkStatus();
}

uint64_t PeerMesh::datagrams_resent() const {
  return udp_ ? udp_->datagrams_resent() : 0;
}

uint32_t PeerMesh::OwnedSlice() const {
  if (groups_ <= 1)
    return rank_;
  const uint32_t members = ducks_ / groups_;
  return (rank_ % members) * groups_ + rank_ / members;
}

absl::Status PeerMesh::Exchange(const std::vector<std::vector<char>> &out,
                                std::vector<std::vector<char>> &in,
                                const std::vector<uint32_t> &with) {
  const uint32_t seq = ++seq_;
  if (udp_) {
    const std::vector<uint32_t> to = with.empty() ? Others() : with;
    for (uint32_t j : to) { // the datagrams' headers and payload
      sent_ += udp_->WireBytes(out[j].size());
      received_ += udp_->WireBytes(in[j].size());
    }
    return udp_->Exchange(seq, out, in, to, absl::Now() + timeout_);
  }
  std::vector<Flow> flows(ducks_);
  std::vector<pollfd> fds;
  std::vector<uint32_t> peer_of;
  for (uint32_t j : with.empty() ? Others() : with) {
    Flow &f = flows[j];
    f.out = &out[j];
    f.in = &in[j];
    f.out_hdr = {seq, uint32_t(out[j].size())};
    fds.push_back({fds_[j], 0, 0});
    peer_of.push_back(j);
    // Send at once: a socket usually takes a message without a poll.
    if (!Move(fds_[j], true, &f.out_hdr, (char *)f.out->data(), f.out->size(),
              &f.out_off))
      return absl::UnavailableError(absl::StrCat(
          "peer mesh: rank ", j, " closed its link to rank ", rank_));
    sent_ += f.out_off;
  }
  const absl::Time deadline = absl::Now() + timeout_;
  for (;;) {
    size_t busy = 0;
    for (size_t i = 0; i < fds.size(); ++i) {
      const Flow &f = flows[peer_of[i]];
      fds[i].events = short((f.out_off < f.OutTotal() ? POLLOUT : 0) |
                            (f.in_off < f.InTotal() ? POLLIN : 0));
      busy += fds[i].events != 0;
    }
    if (busy == 0)
      return absl::OkStatus();
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0)
      return absl::DeadlineExceededError(absl::StrCat(
          "peer mesh: rank ", rank_, " timed out in collective ", seq));
    if (poll(fds.data(), fds.size(), int(ms)) < 0 && errno != EINTR)
      return absl::InternalError("peer mesh: poll failed");
    for (size_t i = 0; i < fds.size(); ++i) {
      const uint32_t j = peer_of[i];
      Flow &f = flows[j];
      const short ev = fds[i].revents;
      bool ok = true;
      if ((ev & POLLOUT) && f.out_off < f.OutTotal()) {
        const size_t before = f.out_off;
        ok = Move(fds[i].fd, true, &f.out_hdr, (char *)f.out->data(),
                  f.out->size(), &f.out_off);
        sent_ += f.out_off - before;
      }
      if (ok && (ev & (POLLIN | POLLHUP | POLLERR)) && f.in_off < f.InTotal()) {
        const size_t before = f.in_off;
        // Header and the payload expected in one read; the header is
        // checked as soon as it is in (a mismatch ends the collective).
        ok = Move(fds[i].fd, false, &f.in_hdr, f.in->data(), f.in->size(),
                  &f.in_off);
        received_ += f.in_off - before;
        if (ok && !f.checked && f.in_off >= sizeof(MsgHeader)) {
          if (f.in_hdr.seq != seq || f.in_hdr.bytes != f.in->size())
            return absl::DataLossError(absl::StrCat(
                "peer mesh: rank ", rank_, " got collective ", f.in_hdr.seq,
                " of ", f.in_hdr.bytes, " bytes from rank ", j, ", expected ",
                seq, " of ", f.in->size()));
          f.checked = true;
        }
        ok = ok && !(ev & (POLLHUP | POLLERR) && f.in_off == before);
      }
      if (!ok)
        return absl::UnavailableError(absl::StrCat(
            "peer mesh: rank ", j, " closed its link to rank ", rank_));
    }
  }
}

absl::Status PeerMesh::ReduceScatterAmong(const std::vector<uint32_t> &ranks,
                                          size_t me, absl::Span<const float> in,
                                          const std::vector<size_t> &bounds,
                                          PeerWire wire,
                                          std::vector<float> *out) {
  const size_t len = bounds[me + 1] - bounds[me];
  std::vector<std::vector<char>> &msg_out = scratch_out_, &msg_in = scratch_in_;
  msg_out.resize(ducks_);
  msg_in.resize(ducks_);
  std::vector<uint32_t> with;
  for (size_t k = 0; k < ranks.size(); ++k) {
    msg_out[ranks[k]].clear();
    Encode(in.subspan(bounds[k], bounds[k + 1] - bounds[k]), wire,
           &msg_out[ranks[k]]);
    if (k != me) {
      with.push_back(ranks[k]);
      msg_in[ranks[k]].resize(WireBytes(len, wire));
    }
  }
  if (absl::Status s = Exchange(msg_out, msg_in, with); !s.ok())
    return s;
  msg_in[rank_].swap(msg_out[rank_]); // the own part as the wire has it
  // Each value's sum in rank order, from 0 (rank by rank over the slice).
  out->assign(len, 0.0f);
  for (uint32_t r : ranks)
    DecodeInto(msg_in[r], wire, /*add=*/true, out->data(), len);
  return absl::OkStatus();
}

absl::Status PeerMesh::AllGatherAmong(const std::vector<uint32_t> &ranks,
                                      size_t me, absl::Span<const float> mine,
                                      const std::vector<size_t> &bounds,
                                      PeerWire wire, absl::Span<float> all) {
  std::vector<std::vector<char>> &msg_out = scratch_out_, &msg_in = scratch_in_;
  msg_out.resize(ducks_);
  msg_in.resize(ducks_);
  std::vector<uint32_t> with;
  std::vector<char> encoded;
  Encode(mine, wire, &encoded);
  for (size_t k = 0; k < ranks.size(); ++k)
    if (k != me) {
      msg_out[ranks[k]].assign(encoded.begin(), encoded.end());
      with.push_back(ranks[k]);
      msg_in[ranks[k]].resize(WireBytes(bounds[k + 1] - bounds[k], wire));
    }
  if (absl::Status s = Exchange(msg_out, msg_in, with); !s.ok())
    return s;
  msg_in[rank_].swap(encoded);
  for (size_t k = 0; k < ranks.size(); ++k)
    DecodeInto(msg_in[ranks[k]], wire, /*add=*/false, all.data() + bounds[k],
               bounds[k + 1] - bounds[k]);
  return absl::OkStatus();
}

absl::Status PeerMesh::ReduceScatter(absl::Span<const float> in, PeerWire wire,
                                     absl::Span<float> out) {
  const size_t n = in.size();
  auto S = [&](uint32_t k) { return PeerSliceBegin(n, ducks_, k); };
  const uint32_t own = OwnedSlice();
  if (out.size() != S(own + 1) - S(own))
    return absl::InvalidArgumentError("peer mesh: reduce-scatter's slice");
  const Levels l = LevelsOf(n);
  // Each level sums its ranks' parts of what the level before left.
  absl::Span<const float> cur = in;
  std::vector<float> part;
  for (size_t v = 0; v < l.ranks.size(); ++v) {
    std::vector<float> next;
    if (absl::Status s = ReduceScatterAmong(l.ranks[v], l.me[v], cur,
                                            l.bounds[v], wire, &next);
        !s.ok())
      return s;
    part.swap(next);
    cur = part;
  }
  std::copy(part.begin(), part.end(), out.begin());
  return absl::OkStatus();
}

absl::Status PeerMesh::AllGather(absl::Span<const float> mine, PeerWire wire,
                                 absl::Span<float> all) {
  const size_t n = all.size();
  auto S = [&](uint32_t k) { return PeerSliceBegin(n, ducks_, k); };
  const uint32_t own = OwnedSlice();
  if (mine.size() != S(own + 1) - S(own))
    return absl::InvalidArgumentError("peer mesh: all-gather's slice");
  const Levels l = LevelsOf(n);
  // The levels in reverse: each gathers the parts of the one before it.
  std::vector<float> have(mine.begin(), mine.end());
  for (size_t v = l.ranks.size(); v-- > 0;) {
    std::vector<float> gathered(l.bounds[v].back());
    if (absl::Status s = AllGatherAmong(l.ranks[v], l.me[v], have, l.bounds[v],
                                        wire, absl::MakeSpan(gathered));
        !s.ok())
      return s;
    have.swap(gathered);
  }
  std::copy(have.begin(), have.end(), all.begin());
  return absl::OkStatus();
}

absl::Status PeerMesh::AllReduce(absl::Span<const float> in, PeerWire wire,
                                 absl::Span<float> out) {
  if (out.size() != in.size())
    return absl::InvalidArgumentError("peer mesh: all-reduce's lengths");
  std::vector<std::vector<char>> msg_out(ducks_), msg_in(ducks_);
  std::vector<char> encoded;
  Encode(in, wire, &encoded);
  for (uint32_t j = 0; j < ducks_; ++j)
    if (j != rank_) {
      msg_out[j] = encoded;
      msg_in[j].resize(encoded.size());
    }
  if (absl::Status s = Exchange(msg_out, msg_in); !s.ok())
    return s;
  msg_in[rank_] = std::move(encoded);
  std::fill(out.begin(), out.end(), 0.0f); // sums in rank order, from 0
  for (uint32_t j = 0; j < ducks_; ++j)
    DecodeInto(msg_in[j], wire, /*add=*/true, out.data(), in.size());
  return absl::OkStatus();
}

std::vector<uint32_t> PeerMesh::Others() const {
  std::vector<uint32_t> all;
  for (uint32_t j = 0; j < ducks_; ++j)
    if (j != rank_)
      all.push_back(j);
  return all;
}

PeerMesh::Levels PeerMesh::LevelsOf(size_t n) const {
  auto S = [&](uint32_t k) { return PeerSliceBegin(n, ducks_, k); };
  Levels l;
  if (groups_ <= 1) { // every duck at once, a slice each
    l.ranks.emplace_back();
    l.bounds.emplace_back();
    l.me.push_back(rank_);
    for (uint32_t k = 0; k <= ducks_; ++k) {
      if (k < ducks_)
        l.ranks[0].push_back(k);
      l.bounds[0].push_back(S(k));
    }
    return l;
  }
  // Within the group: member p's part is slices p G .. p G + G - 1; then
  // among member m of every group: group h's slice m G + h of that part.
  const uint32_t M = ducks_ / groups_, G = groups_, g = rank_ / M,
                 m = rank_ % M;
  l.ranks.resize(2);
  l.bounds.resize(2);
  l.me = {m, g};
  for (uint32_t p = 0; p < M; ++p)
    l.ranks[0].push_back(g * M + p);
  for (uint32_t p = 0; p <= M; ++p)
    l.bounds[0].push_back(S(p * G));
  for (uint32_t h = 0; h < G; ++h)
    l.ranks[1].push_back(h * M + m);
  for (uint32_t h = 0; h <= G; ++h)
    l.bounds[1].push_back(S(m * G + h) - S(m * G));
  return l;
}

} // namespace duck::duckd
