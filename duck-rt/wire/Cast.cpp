// A step's IB as UDP datagrams: duck_rt/cast.h.
#include "duck_rt/cast.h"

#include "duck_rt/wire_codec.h"

#include "absl/strings/str_cat.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace duck::duckd {
namespace {

constexpr uint32_t kHeader = sizeof(duckd_cast_datagram);

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

std::string Errno(const std::string &what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

/// OpenSSL's SHA-256, fetched once per process.
EVP_MD *Sha256() {
  static EVP_MD *md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  if (!md) {
    std::fprintf(stderr, "duck wire: OpenSSL has no SHA-256\n");
    std::abort();
  }
  return md;
}

absl::StatusOr<in_addr> ParseAddress(const std::string &text,
                                     const char *what) {
  in_addr a{};
  if (inet_pton(AF_INET, text.c_str(), &a) != 1)
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", text, "' is not a dotted IPv4 address"));
  return a;
}

} // namespace

absl::StatusOr<CastShape> CastShapeFor(uint64_t ib_bytes,
                                       uint32_t datagram_limit) {
  if (datagram_limit <= kHeader || datagram_limit > DUCKD_CAST_MAX_DATAGRAM)
    return absl::InvalidArgumentError(absl::StrCat(
        "a cast datagram of ", datagram_limit, " bytes: it must be within [",
        kHeader + 1, ", ", int(DUCKD_CAST_MAX_DATAGRAM), "]"));
  if (ib_bytes == 0)
    return absl::InvalidArgumentError("an empty IB is not cast");
  CastShape s;
  s.datagram_bytes = datagram_limit - kHeader;
  const uint64_t n = (ib_bytes + s.datagram_bytes - 1) / s.datagram_bytes;
  if (n > UINT32_MAX)
    return absl::InvalidArgumentError(
        absl::StrCat("an IB of ", ib_bytes, " bytes is too large to cast"));
  s.datagrams = uint32_t(n);
  return s;
}

void CastDigest(absl::Span<const uint8_t> ib, bool keyed,
                uint8_t out[DUCKD_CAST_DIGEST_BYTES]) {
  std::memset(out, 0, DUCKD_CAST_DIGEST_BYTES);
  if (!keyed) {
    const uint64_t h = Checksum(ib.data(), ib.size());
    std::memcpy(out, &h, sizeof h);
    return;
  }
  unsigned int len = 0;
  if (!EVP_Digest(ib.data(), ib.size(), out, &len, Sha256(), nullptr) ||
      len != DUCKD_CAST_DIGEST_BYTES) {
    std::fprintf(stderr, "duck wire: SHA-256 failed\n");
    std::abort();
  }
}

void WarmUpCastDigest() {
  uint8_t d[DUCKD_CAST_DIGEST_BYTES];
  const uint8_t b[1] = {0};
  CastDigest(absl::MakeConstSpan(b, 1), true, d);
  CastDigest(absl::MakeConstSpan(b, 1), false, d);
}

bool IsMulticastAddress(const std::string &address) {
  in_addr a{};
  return inet_pton(AF_INET, address.c_str(), &a) == 1 &&
         IN_MULTICAST(ntohl(a.s_addr));
}

absl::StatusOr<CastSocket>
OpenCastSocket(const std::string &address, uint16_t port,
               const std::string &interface_address) {
  auto group = ParseAddress(address, "the cast address");
  if (!group.ok())
    return group.status();
  const bool multicast = IN_MULTICAST(ntohl(group->s_addr));
  if (multicast && port == 0)
    return absl::InvalidArgumentError(
        "a multicast cast address needs a port: every duck of the group "
        "listens on the same one");
  in_addr iface{};
  if (multicast && !interface_address.empty()) {
    auto i = ParseAddress(interface_address, "the cast interface");
    if (!i.ok())
      return i.status();
    iface = *i;
  }
  CastSocket out;
  out.fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (out.fd < 0)
    return absl::InternalError(Errno("cast socket"));
  auto fail = [&](const std::string &what) {
    const std::string m = Errno(what);
    ::close(out.fd);
    return absl::UnavailableError(m);
  };
  const int one = 1;
  if (multicast &&
      ::setsockopt(out.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    return fail("cast socket SO_REUSEADDR");
  const int want = 4 << 20;
  ::setsockopt(out.fd, SOL_SOCKET, SO_RCVBUF, &want, sizeof want); // capped
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr = *group;
  if (::bind(out.fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0)
    return fail(absl::StrCat("cast socket bind ", address, ":", port));
  if (multicast) {
    ip_mreq m{};
    m.imr_multiaddr = *group;
    m.imr_interface = iface;
    if (::setsockopt(out.fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof m) != 0)
      return fail(absl::StrCat("cast socket joining ", address));
  }
  socklen_t len = sizeof sa;
  if (::getsockname(out.fd, reinterpret_cast<sockaddr *>(&sa), &len) != 0)
    return fail("cast socket getsockname");
  out.port = ntohs(sa.sin_port);
  return out;
}

absl::StatusOr<std::unique_ptr<CastSender>>
CastSender::Open(const CastSenderOptions &options) {
  if (auto shape = CastShapeFor(1, options.datagram_bytes); !shape.ok())
    return shape.status();
  auto dest = ParseAddress(options.address, "the cast address");
  if (!dest.ok())
    return dest.status();
  if (options.port == 0)
    return absl::InvalidArgumentError("the cast address needs a port");
  std::unique_ptr<CastSender> s(new CastSender(options));
  s->fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s->fd_ < 0)
    return absl::InternalError(Errno("cast sender socket"));
  const int want = 4 << 20;
  ::setsockopt(s->fd_, SOL_SOCKET, SO_SNDBUF, &want, sizeof want); // capped
  if (IN_MULTICAST(ntohl(dest->s_addr))) {
    const unsigned char ttl = 1, loop = 1; // one switch; ducks on this box
    ::setsockopt(s->fd_, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof ttl);
    ::setsockopt(s->fd_, IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof loop);
    if (!options.interface_address.empty()) {
      auto iface =
          ParseAddress(options.interface_address, "the cast interface");
      if (!iface.ok())
        return iface.status();
      if (::setsockopt(s->fd_, IPPROTO_IP, IP_MULTICAST_IF, &*iface,
                       sizeof *iface) != 0)
        return absl::UnavailableError(Errno("cast sender IP_MULTICAST_IF"));
    }
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(options.port);
  sa.sin_addr = *dest;
  if (::connect(s->fd_, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0)
    return absl::UnavailableError(Errno(absl::StrCat(
        "cast sender connect ", options.address, ":", options.port)));
  return s;
}

CastSender::~CastSender() {
  if (fd_ >= 0)
    ::close(fd_);
}

absl::StatusOr<CastShape> CastSender::Send(uint64_t cast_id,
                                           absl::Span<const uint8_t> ib,
                                           uint32_t magic) {
  auto shape = CastShapeFor(ib.size(), opt_.datagram_bytes);
  if (!shape.ok())
    return shape.status();
  const uint32_t n = shape->datagrams, per = shape->datagram_bytes;
  headers_.resize(n);
  iov_.resize(2 * size_t(n));
  std::vector<iovec> &iov = iov_;
  std::vector<mmsghdr> &msgs = msgs_;
  msgs.clear();
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t off = uint64_t(i) * per;
    const uint32_t bytes = uint32_t(std::min<uint64_t>(per, ib.size() - off));
    headers_[i] = {magic, i, n, bytes, cast_id};
    ++counter_;
    if (opt_.drop_every && counter_ % opt_.drop_every == 0) {
      ++dropped_;
      continue;
    }
    iov[2 * i] = {&headers_[i], kHeader};
    iov[2 * i + 1] = {const_cast<uint8_t *>(ib.data() + off), bytes};
    mmsghdr m{};
    m.msg_hdr.msg_iov = &iov[2 * i];
    m.msg_hdr.msg_iovlen = 2;
    msgs.push_back(m);
    sent_ += kHeader + bytes;
  }
  size_t done = 0;
  while (done < msgs.size()) {
    const int r =
        ::sendmmsg(fd_, msgs.data() + done, unsigned(msgs.size() - done), 0);
    if (r > 0) {
      done += size_t(r);
      continue;
    }
    if (r < 0 && errno != EINTR && errno != EAGAIN && errno != ENOBUFS)
      return absl::UnavailableError(Errno("cast sendmmsg"));
    if (r < 0 && errno == ENOBUFS) {
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, 1);
    }
  }
  return *shape;
}

void CastBatch::Begin(uint64_t cast_id, const CastShape &shape,
                      uint64_t ib_bytes, uint8_t *ib, uint32_t magic) {
  cast_id_ = cast_id;
  magic_ = magic;
  shape_ = shape;
  ib_bytes_ = ib_bytes;
  ib_ = ib;
  have_.assign(shape.datagrams, 0);
  missing_ = shape.datagrams;
}

CastBatch::Took CastBatch::Offer(absl::Span<const uint8_t> d, bool truncated) {
  duckd_cast_datagram h;
  if (d.size() < kHeader || truncated)
    return Took::malformed;
  std::memcpy(&h, d.data(), kHeader);
  if ((h.magic != DUCKD_CAST_MAGIC && h.magic != DUCKD_CAST_STAGE_MAGIC) ||
      uint64_t(d.size()) != kHeader + uint64_t(h.bytes))
    return Took::malformed;
  if (h.cast_id != cast_id_)
    return Took::stale;
  if (h.magic != magic_)
    return Took::malformed;
  if (h.count != shape_.datagrams || h.index >= shape_.datagrams)
    return Took::malformed;
  const uint64_t off = uint64_t(h.index) * shape_.datagram_bytes;
  if (off >= ib_bytes_ ||
      h.bytes != std::min<uint64_t>(shape_.datagram_bytes, ib_bytes_ - off))
    return Took::malformed;
  if (have_[h.index])
    return Took::duplicate;
  std::memcpy(ib_ + off, d.data() + kHeader, h.bytes);
  have_[h.index] = 1;
  --missing_;
  return Took::placed;
}

namespace {
/// Reads up to `n` datagrams (never waiting), each into its `slot` bytes
/// of `buf`: recvmmsg's count (msgs[k].msg_len each one's length).
int ReceiveBurst(int fd, uint8_t *buf, size_t slot, uint32_t n, iovec *iov,
                 mmsghdr *msgs) {
  for (uint32_t k = 0; k < n; ++k) {
    iov[k] = {buf + k * slot, slot};
    msgs[k] = mmsghdr{};
    msgs[k].msg_hdr.msg_iov = &iov[k];
    msgs[k].msg_hdr.msg_iovlen = 1;
  }
  return ::recvmmsg(fd, msgs, n, MSG_DONTWAIT, nullptr);
}

// Intake's reads: a burst of datagrams of any size UDP carries.
constexpr uint32_t kIntakeBurst = 8;
constexpr size_t kIntakeSlot = DUCKD_CAST_MAX_DATAGRAM + 1;
} // namespace

CastHeld::CastHeld(uint64_t limit) : limit_(limit) {
  bytes_.reserve(limit);
  at_.reserve(limit / (kHeader + 1));
}

void CastHeld::Forget() {
  bytes_.clear();
  count_ = have_ = 0;
}

bool CastHeld::Keep(absl::Span<const uint8_t> d, bool truncated,
                    uint64_t *stale) {
  duckd_cast_datagram h;
  if (d.size() < kHeader || truncated)
    return false;
  std::memcpy(&h, d.data(), kHeader);
  if ((h.magic != DUCKD_CAST_MAGIC && h.magic != DUCKD_CAST_STAGE_MAGIC) ||
      uint64_t(d.size()) != kHeader + uint64_t(h.bytes) || h.count == 0 ||
      h.index >= h.count || h.count > limit_ / (kHeader + 1))
    return false;
  if (!count_ || h.cast_id != id_) { // a new batch
    *stale += have_;
    Forget();
    id_ = h.cast_id;
    magic_ = h.magic;
    count_ = h.count;
    at_.assign(h.count, 0);
  }
  if (h.magic != magic_ || h.count != count_ ||
      bytes_.size() + d.size() > limit_)
    return false;
  if (at_[h.index])
    return true; // a duplicate
  at_[h.index] = uint32_t(bytes_.size()) + 1;
  bytes_.insert(bytes_.end(), d.begin(), d.end());
  ++have_;
  return true;
}

bool CastHeld::Shape(uint64_t ib_limit, CastShape *shape,
                     uint64_t *ib_bytes) const {
  if (!whole())
    return false;
  uint64_t total = 0;
  uint32_t per = 0;
  for (uint32_t i = 0; i < count_; ++i) {
    duckd_cast_datagram h;
    std::memcpy(&h, bytes_.data() + at_[i] - 1, kHeader);
    total += h.bytes;
    if (i == 0)
      per = h.bytes;
  }
  if (total == 0 || total > ib_limit || per == 0)
    return false;
  *shape = CastShape{count_, per};
  *ib_bytes = total;
  return true;
}

void CastHeld::Replay(CastBatch &batch,
                      absl::FunctionRef<void(CastBatch::Took)> took) {
  for (uint32_t i = 0; i < count_; ++i) {
    if (!at_[i])
      continue;
    duckd_cast_datagram h;
    const uint8_t *d = bytes_.data() + at_[i] - 1;
    std::memcpy(&h, d, kHeader);
    took(batch.Offer(absl::MakeConstSpan(d, kHeader + size_t(h.bytes))));
  }
  Forget();
}

CastReceiver::CastReceiver(int fd, uint64_t held_bytes)
    : fd_(fd), held_(held_bytes) {
  if (held_bytes)
    intake_buf_.resize(kIntakeBurst * kIntakeSlot);
}

void CastReceiver::Count(CastBatch::Took took) {
  switch (took) {
  case CastBatch::Took::placed:
    ++stats_.datagrams;
    break;
  case CastBatch::Took::stale:
    ++stats_.stale;
    break;
  case CastBatch::Took::malformed:
    ++stats_.malformed;
    break;
  case CastBatch::Took::duplicate:
    break;
  }
}

bool CastReceiver::Intake() {
  if (intake_buf_.empty())
    return false;
  iovec iov[kIntakeBurst];
  mmsghdr msgs[kIntakeBurst];
  for (;;) {
    const int got = ReceiveBurst(fd_, intake_buf_.data(), kIntakeSlot,
                                 kIntakeBurst, iov, msgs);
    if (got <= 0)
      break;
    for (int k = 0; k < got; ++k)
      if (!held_.Keep(absl::MakeConstSpan(
                          intake_buf_.data() + size_t(k) * kIntakeSlot,
                          std::min<size_t>(msgs[k].msg_len, kIntakeSlot)),
                      msgs[k].msg_hdr.msg_flags & MSG_TRUNC, &stats_.stale))
        ++stats_.malformed;
    if (got < int(kIntakeBurst))
      break;
  }
  return held_.whole() && held_.magic() == DUCKD_CAST_STAGE_MAGIC;
}

void CastReceiver::Replay() {
  held_.Replay(batch_, [this](CastBatch::Took t) { Count(t); });
}

bool CastReceiver::TakeHeldStage(uint8_t *ib, uint64_t ib_limit,
                                 uint64_t *cast_id, uint64_t *ib_bytes) {
  CastShape shape;
  if (held_.magic() != DUCKD_CAST_STAGE_MAGIC ||
      !held_.Shape(ib_limit, &shape, ib_bytes)) {
    stats_.malformed += held_.whole() ? held_.have() : 0;
    held_.Forget();
    return false;
  }
  ++stats_.batches;
  *cast_id = held_.cast_id();
  batch_.Begin(held_.cast_id(), shape, *ib_bytes, ib, DUCKD_CAST_STAGE_MAGIC);
  Replay(); // Offer checks every datagram against the shape read off them
  if (batch_.missing())
    ++stats_.missed;
  return batch_.missing() == 0;
}

bool CastReceiver::Take(uint64_t cast_id, const CastShape &shape,
                        uint64_t ib_bytes, uint8_t *ib, uint64_t wait_ns,
                        uint64_t spin_ns, uint32_t magic) {
  ++stats_.batches;
  batch_.Begin(cast_id, shape, ib_bytes, ib, magic);
  if (held_.any() && held_.cast_id() == cast_id) {
    Replay();
  } else {
    stats_.stale += held_.have();
    held_.Forget();
  }
  // Up to kBurst datagrams a call, each into a slot one byte larger than
  // the shape's datagrams (a longer one is malformed: MSG_TRUNC).
  constexpr uint32_t kBurst = 64;
  const size_t slot = kHeader + size_t(shape.datagram_bytes) + 1;
  buf_.resize(slot * kBurst);
  iovec iov[kBurst];
  mmsghdr msgs[kBurst];
  const uint64_t start = NowNs();
  for (uint32_t spins = 0; batch_.missing();) {
    const int got = ReceiveBurst(fd_, buf_.data(), slot,
                                 std::min(batch_.missing(), kBurst), iov, msgs);
    if (got <= 0) {
      if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        break;
      const uint64_t now = NowNs();
      if (now - start >= wait_ns)
        break;
      if (now - start < spin_ns) {
        if (++spins % 64 == 0)
          sched_yield();
        continue;
      }
      pollfd p{fd_, POLLIN, 0};
      const uint64_t left = wait_ns - (now - start);
      ::poll(&p, 1, int(std::max<uint64_t>(1, left / 1000000)));
      continue;
    }
    for (int k = 0; k < got; ++k)
      Count(batch_.Offer(
          absl::MakeConstSpan(buf_.data() + size_t(k) * slot,
                              std::min<size_t>(msgs[k].msg_len, slot)),
          msgs[k].msg_hdr.msg_flags & MSG_TRUNC));
  }
  if (batch_.missing())
    ++stats_.missed;
  return batch_.missing() == 0;
}

} // namespace duck::duckd
