// duckd: the node daemon of a duck. Serves one host connection at a time
// over the duckd protocol (docs/protocol.md): hello, open/step/close of a
// persistent ELF session, one-shot run, and weight prepare into the
// file-backed weight cache. The ELF always runs in a worker process
// (Worker.h); the daemon survives every bad client and every bad ELF.
#ifndef DUCK_RT_DUCKD_SERVER_H
#define DUCK_RT_DUCKD_SERVER_H

#include "ElfLoader.h"
#include "Scrubber.h"
#include "WeightCache.h"
#include "Worker.h"
#include "duck_rt/peer_mesh.h"
#include "duck_rt/wire.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include <cstdint>
#include <netinet/in.h>
#include <poll.h>
#include <memory>
#include <string>
#include <vector>

namespace duck::duckd {

struct ServerOptions {
  std::string bind = "127.0.0.1"; // other addresses need a token
  int port = 0;                    // 0: any free port
  int mesh_port = -1; // the ducks' mesh listener: -1 none, 0 any free port
  /// The cast socket (duck_rt/cast.h), where step_cast IBs arrive as
  /// datagrams: an IP multicast group (joined on `bind`) or a unicast
  /// address; empty: none. cast_port 0 picks a free one (unicast only).
  std::string cast_address;
  int cast_port = 0;
  /// How long a step_cast waits for its batch to be whole once its frame
  /// is in (then it answers cast_missed and the host sends it plainly).
  /// The datagrams leave the host before the frame: a frame that comes
  /// first means datagrams were lost (or reordered: microseconds), so the
  /// wait is short; a miss costs it and a plain copy.
  absl::Duration cast_wait = absl::Milliseconds(2);
  std::string token;               // checked at hello when set
  std::string name;                // cache file name; default: the port
  std::string cache_dir;           // default $XDG_CACHE_HOME/duck
  uint64_t weights_size = 1ull << 30;
  bool sync = true; // msync data before finish flags
  uint32_t cores = 0; // 0: every CPU this process may run on
  int cpu_offset = 0; // first CPU to pin core 0 to (index into the mask)
  bool pin = true;
  bool yield = true; // the ELF's spin loops call sched_yield now and then
  uint64_t spin_ns = 200000;
  uint64_t max_payload = DUCKD_DEFAULT_MAX_PAYLOAD;
  uint64_t max_scratch = 16ull << 30;
  absl::Duration io_timeout = absl::Seconds(10); // a frame in flight
  /// One host at a time; a newcomer takes the duck from a connection that
  /// has not said hello within hello_timeout, or that has no session open
  /// and has sent nothing for idle_timeout (else it is refused as busy).
  absl::Duration hello_timeout = absl::Seconds(5);
  absl::Duration idle_timeout = absl::Seconds(30);
  absl::Duration step_timeout = absl::Seconds(120);
  ElfLimits elf_limits;
  bool sandbox = true; // workers run under seccomp and rlimits (Sandbox.h)
  /// The memory scrub's rate (Scrubber.h), bytes a second; 0: off. 64 MB/s
  /// goes over a 28 GB duck in 7-8 minutes for well under 1 % of its read
  /// bandwidth.
  uint64_t scrub_bytes_per_second = 64'000'000;
};

class Server {
public:
  /// Binds the socket, opens the weight cache and calibrates the TSC.
  static absl::StatusOr<std::unique_ptr<Server>>
  Create(const ServerOptions &options);
  ~Server();

  uint16_t port() const { return port_; }
  uint16_t mesh_port() const { return mesh_port_; } // 0: no mesh listener
  uint16_t cast_port() const { return cast_port_; } // 0: no cast socket
  std::string address() const;
  const std::string &cache_path() const { return cache_path_; }
  const std::string &cache_note() const { return cache_note_; }

  /// Serves until SIGTERM or SIGINT (blocked by Create, read by signalfd).
  absl::Status Serve();

private:
  Server() = default;
  // Create's steps, in order.
  absl::Status OpenSignals();
  absl::Status Listen(const in_addr &addr);
  absl::Status PickCores();
  absl::Status OpenCache();
  // Serve's loop: where each descriptor sits in the poll set (-1: absent).
  struct PollIndex {
    int conn = -1, event = -1, pid = -1;
  };
  void WatchFds(std::vector<pollfd> &p, bool lent, PollIndex &at) const;
  absl::Duration PollWait(bool lent) const;
  void OnSignal();
  bool OnConnEvents(short revents, bool lent);
  void Log(const std::string &line) const;
  void Accept();
  void OnReadable();
  /// Handles one frame whose header was read (by duckd or a session
  /// worker that handed it back), then lends the connection back to the
  /// session worker, if any.
  void OnFrame(const duckd_frame_header &h);
  void LendToSession();
  /// Session worker events: a handed-back connection, death, step timeout.
  void OnSessionEvent();
  void OnSessionDied();
  void OnStepTimeout();
  void CloseSession(const std::string &why);
  void Drop(const std::string &why);
  void StopWorkers();

  // Replies; a failed write drops the connection.
  void Reply(uint16_t type, uint32_t request_id,
             std::initializer_list<Part> parts);
  void ReplyError(uint16_t type, uint32_t request_id, duckd_error_code code,
                  const std::string &message);
  /// Reads and discards `bytes` of the frame being read (they count
  /// towards its check).
  absl::Status Drain(uint64_t bytes);
  /// Ends the check of the frame being read (check_). A checksum mismatch
  /// gets a bad_frame reply; a tag that fails on an authenticated
  /// connection gets an unauthorized reply and the connection is dropped.
  /// False in both cases: the frame must not be acted on.
  bool Verify(const duckd_frame_header &h);
  /// Drain(bytes), then Verify; a cut-off frame drops the connection.
  bool DrainAndVerify(const duckd_frame_header &h, uint64_t bytes);
  /// Reads a whole payload into buf_ and verifies it.
  bool ReadPayload(const duckd_frame_header &h);

  void OnHello(const duckd_frame_header &h);
  /// The hello's reply: what this duckd and its weight cache are, and
  /// (keyed) its half of the connection's nonce.
  duckd_hello_reply HelloReply(bool keyed, const uint8_t *nonce) const;
  void OnOpen(const duckd_frame_header &h);
  void OnStep(const duckd_frame_header &h);
  void OnStepCast(const duckd_frame_header &h);
  void OnRun(const duckd_frame_header &h);
  void OnPrepareBegin(const duckd_frame_header &h);
  void OnPrepareWrite(const duckd_frame_header &h);
  void OnPrepareFinish(const duckd_frame_header &h);
  /// "; weights file: ..." (WeightCache::PagesNote) for the prepare logs.
  std::string PagesNote() const;
  void OnClose(const duckd_frame_header &h);
  void OnMeasure(const duckd_frame_header &h);
  /// A measure request with DUCKD_MEASURE_LINK (its payload in buf_): the
  /// zero reply of the size it asks for.
  void OnLinkProbe(const duckd_frame_header &h);
  void OnStats(const duckd_frame_header &h);
  /// Whether the scrub may hash now: it has work, and the duck is idle (no
  /// step inside the ELF, no prepare between its begin and finish).
  bool ScrubMayRun() const;
  /// How long until the scrub wants the loop back (infinite: never).
  absl::Duration ScrubWait(absl::Time now) const;
  /// Hashes one chunk and logs what it found.
  void ScrubChunk(absl::Time now);
  void OnMesh(const duckd_frame_header &h);
  void OnMeshProbe(const duckd_frame_header &h);
  absl::StatusOr<duckd_mesh_probe_reply>
  ProbeMesh(const duckd_mesh_probe_request &r);
  absl::StatusOr<duckd_mesh_reply> JoinMesh(const duckd_mesh_request &r,
                                            const duckd_mesh_peer *peers);
  void StepAndReply(Worker *w, const duckd_frame_header &h, uint64_t ib_bytes,
                    uint64_t elf_bytes);
  WorkerConfig BaseWorkerConfig(uint32_t cores) const;

  ServerOptions opt_;
  int listen_fd_ = -1, signal_fd_ = -1;
  uint16_t port_ = 0;
  int mesh_fd_ = -1; // the ducks' mesh listener (--mesh-port)
  int cast_fd_ = -1; // the cast socket (--cast)
  uint16_t cast_port_ = 0;
  uint16_t mesh_port_ = 0;
  std::unique_ptr<PeerMesh> mesh_;
  std::string cache_path_, cache_note_;
  std::unique_ptr<WeightCache> cache_;
  std::unique_ptr<Scrubber> scrub_;
  bool preparing_ = false; // between prepare_begin and its finish
  uint64_t tsc_hz_ = 0;
  std::vector<int> cpus_; // the affinity mask, in order

  struct Conn {
    int fd = -1;
    std::string peer;
    bool hello = false;
    /// The host has shown it holds the token: a hello without one, or a
    /// keyed frame after hello whose tag verified (a replayed hello alone
    /// does not hold the duck past the hello timeout).
    bool proven = false;
    FrameKeys keys; // the connection's frame authentication
    bool hangup = false; // seen while a session worker held it
    uint64_t requests = 0;
    absl::Time since, last_request; // accepted; last frame read
  } conn_;
  std::unique_ptr<Worker> session_;
  uint64_t session_id_ = 0, next_session_id_ = 1;
  std::unique_ptr<Worker> run_worker_;
  std::vector<uint8_t> buf_;
  std::vector<uint8_t> link_zeros_; // a link probe's reply bytes
  FrameCheck check_; // of the frame being read
};

} // namespace duck::duckd

#endif // DUCK_RT_DUCKD_SERVER_H
