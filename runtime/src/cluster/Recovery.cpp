//===- Recovery.cpp - bringing a cluster's ducks back after a failure -----===//
#include "duck/runtime/cluster/Recovery.h"
#include "duck/runtime/StatusMacros.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <netinet/in.h>
#include <ostream>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace duck::runtime {
namespace {

/// A duck of a cluster file that stays unreachable this long is replaced
/// by the next spare (when the file lists any).
constexpr absl::Duration kSpareAfter = absl::Seconds(3);

/// Whether anything accepts a TCP connection at `ep` within `timeout`: a
/// duckd that answers, even "busy", is alive; a refused or unanswered
/// connect is a duck that is gone.
bool TcpReachable(const DuckEndpoint &ep, absl::Duration timeout) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return false;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(ep.port);
  if (::inet_pton(AF_INET,
                  ep.host == "localhost" ? "127.0.0.1" : ep.host.c_str(),
                  &sa.sin_addr) != 1) {
    ::close(fd);
    return false;
  }
  bool ok = ::connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) == 0;
  if (!ok && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    ok = ::poll(&p, 1, (int)absl::ToInt64Milliseconds(timeout)) == 1 &&
         ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
  }
  ::close(fd);
  return ok;
}

/// A cluster file's ducks that stay unreachable for kSpareAfter give their
/// place to the next spares (`down_since`: when each was first found
/// unreachable, kept across attempts).
void SwapInSpares(DuckClientOptions &co, std::vector<DuckEndpoint> *spares,
                  std::vector<absl::Time> &down_since, bool quiet,
                  std::ostream &err) {
  for (size_t r = 0; r < co.ducks.size() && !spares->empty(); ++r) {
    if (TcpReachable(co.ducks[r], absl::Seconds(1))) {
      down_since[r] = absl::InfiniteFuture();
      continue;
    }
    const absl::Time now = absl::Now();
    if (down_since[r] == absl::InfiniteFuture())
      down_since[r] = now;
    if (now - down_since[r] < kSpareAfter)
      continue;
    if (!quiet)
      err << "duckrun: duck " << r << " (" << co.ducks[r].ToString()
          << ") is still unreachable; spare " << spares->front().ToString()
          << " takes its place\n";
    co.ducks[r] = spares->front();
    spares->erase(spares->begin());
    down_since[r] = absl::InfiniteFuture();
  }
}

} // namespace

absl::StatusOr<std::unique_ptr<DuckClient>>
RecoverDucks(const absl::Status &why, DuckClientOptions &co,
             LocalCluster *local, std::vector<DuckEndpoint> *spares,
             const std::vector<std::string> &images,
             const std::vector<uint8_t> &elf, absl::Duration budget, bool quiet,
             const std::atomic<bool> *cancel, std::ostream &err) {
  if (!quiet)
    err << "\nduckrun: " << why.message() << "; bringing the ducks back\n";
  const absl::Time start = absl::Now(), deadline = start + budget;
  absl::Duration wait = absl::Milliseconds(100);
  absl::Status last = why;
  std::vector<absl::Time> downSince(co.ducks.size(), absl::InfiniteFuture());
  // Ctrl-C or SIGTERM ends the wait for the ducks too.
  auto cancelled = [&] {
    return cancel && cancel->load()
               ? absl::CancelledError("interrupted while bringing the ducks "
                                      "back")
               : absl::OkStatus();
  };
  for (int attempt = 1;; ++attempt) {
    DUCK_RETURN_IF_ERROR(cancelled());
    if (!local && spares)
      SwapInSpares(co, spares, downSince, quiet, err);
    if (local) {
      std::vector<size_t> dead;
      for (size_t i = 0; i < local->endpoints().size(); ++i)
        if (local->Exited(i))
          dead.push_back(i);
      if (dead.empty()) // a hung duck: restart them all
        for (size_t i = 0; i < local->endpoints().size(); ++i)
          dead.push_back(i);
      for (size_t i : dead)
        if (absl::Status s = local->Restart(i); !s.ok())
          last = s;
      co.ducks = local->endpoints();
    }
    auto client = DuckClient::Create(co);
    absl::StatusOr<PrepareReport> prep =
        client.ok() ? (*client)->Prepare(images) : client.status();
    absl::Status open = prep.ok() ? (*client)->Open(elf) : prep.status();
    if (open.ok()) {
      uint64_t uploaded = 0;
      for (uint64_t b : prep->bytes_uploaded)
        uploaded += b;
      if (!quiet)
        err << absl::StrFormat(
            "duckrun: ducks back after %.2f s (attempt %d, %llu bytes "
            "uploaded); resending the step\n",
            absl::ToDoubleSeconds(absl::Now() - start), attempt,
            (unsigned long long)uploaded);
      return std::move(*client);
    }
    last = open;
    if (absl::Now() + wait > deadline)
      return absl::UnavailableError(absl::StrCat(
          "gave up after ", absl::ToDoubleSeconds(absl::Now() - start),
          " s of trying to bring the ducks back (", attempt,
          " attempts): ", last.message()));
    for (absl::Time until = absl::Now() + wait; absl::Now() < until;) {
      DUCK_RETURN_IF_ERROR(cancelled());
      absl::SleepFor(std::min(wait, absl::Milliseconds(50)));
    }
    wait = std::min(wait * 2, absl::Seconds(2));
  }
}


} // namespace duck::runtime
