// The ducks' mesh over datagrams (PeerMeshOptions::transport = udp): a
// collective's messages leave as UDP datagrams of at most datagram_bytes,
// every peer's at once with one sendmmsg, and come in by the batch with
// recvmmsg, where the stream transport makes a send and a receive (and a
// poll) of each message. Internal to duck_wire (PeerMesh.cpp uses it).
//
// A datagram carries the pair's tag (from the hellos' nonces, and with a
// token from the pair's key: a stranger off the path cannot forge one),
// the collective's sequence number, the message's length and the chunk's
// offset. A lost datagram is asked for again: a duck missing a peer's
// message after a wait with nothing coming in (10 ms or 4 times a
// collective's smoothed time, whichever is longer; doubling), or at once
// when a later datagram
// of the same peer shows one went missing (a pair's datagrams leave in
// order), sends that peer a resend request, answered from the last
// collectives' messages it keeps. The pair's TCP
// connection stays open beside the datagrams: a peer that closes it or
// says it left (Finish) and still owes a message ends the collective with
// an error naming it. A duck that returns from a collective may still owe
// a peer a lost datagram: Settle (every duck says it has everything) makes
// a pause safe, Finish a departure.
#ifndef DUCK_WIRE_PEER_DATAGRAMS_H
#define DUCK_WIRE_PEER_DATAGRAMS_H

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include <cstdint>
#include <memory>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <vector>

namespace duck::duckd {

class PeerDatagrams {
public:
  struct Header; // a datagram's (24 bytes)
  struct Peer {
    sockaddr_in addr{}; // its datagram socket
    uint64_t tag = 0;   // the pair's
    int tcp_fd = -1;    // the pair's connection (not owned)
  };
  /// Binds a datagram socket on `host` (port 0). datagram_bytes: the
  /// largest datagram's UDP payload (header included); drop_every > 0
  /// drops every that many first sends (the loss tests); fd >= 0: that
  /// bound socket instead (owned from here on).
  static absl::StatusOr<std::unique_ptr<PeerDatagrams>>
  Open(uint32_t rank, uint32_t ducks, in_addr host, uint32_t datagram_bytes,
       uint32_t drop_every, int fd = -1);
  ~PeerDatagrams();

  uint16_t port() const { return port_; }
  /// How long a collective looks for its datagrams before it sleeps.
  void set_spin(absl::Duration spin) { spin_ = spin; }
  /// The peers by rank (this duck's entry unused); their TCP connections
  /// join the wait.
  absl::Status Start(std::vector<Peer> peers);

  /// Sends out[j] to every j in `with` and takes in[j] (its length known)
  /// from each, as collective `seq`.
  absl::Status Exchange(uint32_t seq, const std::vector<std::vector<char>> &out,
                        std::vector<std::vector<char>> &in,
                        const std::vector<uint32_t> &with, absl::Time deadline);
  /// Tells every peer this duck has all of collective `seq` and before,
  /// then answers resend requests until every peer has said the same
  /// (after that no peer needs what this one sent).
  absl::Status Settle(uint32_t seq, absl::Time deadline);
  /// Tells every peer this duck's last collective was `last_seq`, then
  /// answers resend requests until every peer has said so too or closed
  /// (or `deadline`).
  void Finish(uint32_t last_seq, absl::Time deadline);

  /// A message of `payload` bytes as datagrams: headers and payload.
  size_t WireBytes(size_t payload) const;
  uint64_t datagrams_sent() const { return datagrams_sent_; }
  uint64_t datagrams_resent() const { return datagrams_resent_; }
  uint64_t resend_requests() const { return resend_requests_; }

private:
  PeerDatagrams() = default;
  struct Wait; // one Exchange's receiving state
  struct Sent {
    uint32_t seq = 0;
    std::vector<std::vector<char>> to; // by rank; empty: not sent
    std::vector<bool> sent;
  };
  size_t PayloadMax() const;
  absl::Status Send(uint32_t seq, const std::vector<std::vector<char>> &out,
                    const std::vector<uint32_t> &to, bool first);
  void Resend(uint32_t to, uint32_t seq);
  void Ask(uint32_t to, uint32_t seq);
  /// Asks `from` for this collective's message at once (once) if it is
  /// not all in: a later datagram of it came first.
  void AskNowIfMissing(uint32_t from, Wait *w);
  /// Takes in what has arrived (without waiting); each datagram to Take.
  absl::Status Drain(Wait *w);
  absl::Status Take(const Header &h, const char *payload, size_t len, Wait *w);
  void Keep(uint32_t seq, const std::vector<std::vector<char>> &out,
            const std::vector<uint32_t> &with);
  /// Takes the datagrams kept for w's collective (and keeps later ones).
  absl::Status TakeEarly(Wait *w);
  /// Reads peer j's connection: a control message or its close.
  void ReadControl(uint32_t j);
  void Tell(uint32_t magic, uint32_t seq); // to every peer
  absl::Status WaitForEvents(absl::Time until);

  uint32_t rank_ = 0, ducks_ = 0, datagram_bytes_ = 0, drop_every_ = 0;
  absl::Duration spin_;
  absl::Duration usual_; // a collective's smoothed time here
  int fd_ = -1, epoll_fd_ = -1;
  uint16_t port_ = 0;
  std::vector<Peer> peers_;
  std::vector<Sent> history_ = std::vector<Sent>(16); // by seq % 16
  struct Early { // a datagram of a collective still ahead
    uint32_t seq, from, bytes, offset;
    std::vector<char> payload;
  };
  std::vector<Early> early_;
  std::vector<char> recv_buf_;
  std::vector<iovec> recv_iov_, send_iov_, send_parts_;
  std::vector<mmsghdr> recv_msgs_, send_msgs_;
  std::vector<Header> send_headers_;
  std::vector<uint32_t> send_dest_;
  // Per peer: the collective it left after and the last it said it has
  // settled (UINT32_MAX: none yet), whether its connection closed, its
  // control bytes so far.
  std::vector<uint32_t> left_seq_, settled_seq_;
  std::vector<bool> closed_;
  std::vector<std::vector<char>> control_;
  uint32_t settled_ = UINT32_MAX; // the last collective Settle saw through
  uint64_t datagrams_sent_ = 0, datagrams_resent_ = 0, resend_requests_ = 0,
           first_sends_ = 0;
};

} // namespace duck::duckd

#endif // DUCK_WIRE_PEER_DATAGRAMS_H
