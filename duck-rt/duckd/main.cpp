// duckd: the node daemon of a duck (Server.h). A thin main over duckd_lib.
#include "Server.h"

#include "absl/flags/flag.h"
#include "duck_rt/tool_flags.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

ABSL_FLAG(int, port, 7411, "TCP port; 0 picks a free one (printed on stdout)");
ABSL_FLAG(int, mesh_port, -1,
          "the ducks' mesh listener, on the same address (-1: none; 0: a "
          "free port, printed on stdout): other ducks connect here when "
          "the host asks this duck to join a mesh");
ABSL_FLAG(std::string, cast, "",
          "ADDR:PORT where steps' IBs may arrive as datagrams, sent once "
          "for every duck (duckrun with a multicast plan): an IP multicast "
          "group (224.0.0.0/4, joined on --bind's address; every duck of "
          "the group listens on the same port) or a unicast address (port 0: "
          "a free one, printed on stdout); empty: none, and such steps are "
          "answered cast_missed (the host then sends them plainly). A staged "
          "plan's stages come here alone, with no frame: the duck runs one "
          "as soon as its datagrams are all in, and uses it when its staged "
          "step's frame names it");
ABSL_FLAG(int, cast_wait_us, 2000,
          "how long a cast step (or a staged step whose stage has not come "
          "whole) waits for its datagrams once its frame is in (they leave "
          "the host before it: a frame that comes first means datagrams were "
          "lost, or reordered by a NIC's queues)");
ABSL_FLAG(std::string, bind, "127.0.0.1",
          "IPv4 address to listen on; non-loopback needs --token");
ABSL_FLAG(std::string, token, "",
          "secret shared with the host: it authenticates hello and every "
          "frame after it, and never crosses the wire (default: "
          "$DUCKD_TOKEN)");
ABSL_FLAG(std::string, name, "",
          "name of this duck (cache file duckd-<name>.weights; default: port)");
ABSL_FLAG(std::string, cache_dir, "",
          "weight cache directory (default $XDG_CACHE_HOME/duck or "
          "~/.cache/duck)");
ABSL_FLAG(std::string, weights_size, "1G",
          "bytes of the weight buffer (suffixes K, M, G)");
ABSL_FLAG(bool, sync, true,
          "msync weight data before marking it finished (crash-safe cache)");
ABSL_FLAG(int, cores, 0, "cores a step runs on (0: every allowed CPU)");
ABSL_FLAG(int, cpu_offset, 0, "index of the first CPU to pin core 0 to");
ABSL_FLAG(bool, pin, true, "pin worker threads one per CPU");
ABSL_FLAG(bool, yield, true,
          "let spinning cores yield the CPU (for shared machines)");
ABSL_FLAG(int, spin_us, 200,
          "microseconds a worker spins for the next step before sleeping");
ABSL_FLAG(std::string, max_payload, "256M", "largest frame payload accepted");
ABSL_FLAG(int, step_timeout_ms, 120000,
          "a step running longer is killed and reported");
ABSL_FLAG(int, io_timeout_ms, 10000,
          "a frame must arrive completely within this time once started");
ABSL_FLAG(int, hello_timeout_ms, 5000,
          "a connection that has not said hello by then gives the duck to "
          "the next host that connects");
ABSL_FLAG(int, idle_timeout_ms, 30000,
          "a host with no session open that has sent nothing for this long "
          "gives the duck to the next host that connects");
ABSL_FLAG(std::string, token_file, "",
          "read the token from this file (its first line; e.g. a systemd "
          "credential, $CREDENTIALS_DIRECTORY/token) instead of --token");
ABSL_FLAG(bool, sandbox, true,
          "run the ELF's worker under a seccomp filter (only the system calls "
          "a step needs: no open, socket, fork or exec) and rlimits; "
          "--nosandbox for debugging and profiling only");
ABSL_FLAG(int, scrub_mbps, 64,
          "MB/s at which the finished slots of the weight cache are hashed "
          "again while the duck is idle (no step, no prepare), to find bytes "
          "changed under a running duck: a damaged slot is logged, refused "
          "to steps and re-uploaded by the next prepare; 0: off");
ABSL_FLAG(std::string, check_elf, "",
          "only validate this duck ELF with duckd's loader and exit");

namespace {

bool ParseSize(const std::string &text, uint64_t *out) {
  if (text.empty())
    return false;
  uint64_t mul = 1;
  std::string digits = text;
  switch (text.back()) {
  case 'K': case 'k': mul = 1ull << 10; break;
  case 'M': case 'm': mul = 1ull << 20; break;
  case 'G': case 'g': mul = 1ull << 30; break;
  default: break;
  }
  if (mul != 1)
    digits.pop_back();
  uint64_t v;
  if (!absl::SimpleAtoi(digits, &v) || v > (~0ull) / mul)
    return false;
  *out = v * mul;
  return true;
}

int CheckElfFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "duckd: cannot read %s\n", path.c_str());
    return 1;
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  auto elf = duck::duckd::LoadedElf::Load(bytes);
  if (!elf.ok()) {
    std::fprintf(stderr, "duckd: %s: %s\n", path.c_str(),
                 std::string(elf.status().message()).c_str());
    return 1;
  }
  std::printf("ok: %s: %zu bytes, %llu mapped, %llu relocations\n",
              path.c_str(), bytes.size(),
              (unsigned long long)(*elf)->mapped_bytes(),
              (unsigned long long)(*elf)->relocations());
  return 0;
}

/// --cast ADDR:PORT and --cast-wait-us into `o`; false (said on stderr)
/// when --cast is not ADDR:PORT.
bool CastFromFlags(duck::duckd::ServerOptions &o) {
  o.cast_wait =
      absl::Microseconds(std::max(1, absl::GetFlag(FLAGS_cast_wait_us)));
  const std::string cast = absl::GetFlag(FLAGS_cast);
  if (cast.empty())
    return true;
  const size_t colon = cast.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(cast.substr(colon + 1), &o.cast_port) ||
      o.cast_port < 0 || o.cast_port > 65535) {
    std::fprintf(stderr,
                 "duckd: --cast %s: expected ADDR:PORT (e.g. "
                 "239.77.0.1:7420, or 127.0.0.1:0)\n",
                 cast.c_str());
    return false;
  }
  o.cast_address = cast.substr(0, colon);
  return true;
}

} // namespace

int main(int argc, char **argv) {
  absl::SetProgramUsageMessage(
      "the node daemon of a duck. Serves one host at a time over the "
      "duckd protocol (docs/protocol.md).");
  duck::ToolFlags flags(argc, argv);
  if (!absl::GetFlag(FLAGS_check_elf).empty())
    return CheckElfFile(absl::GetFlag(FLAGS_check_elf));

  duck::duckd::ServerOptions o;
  o.port = absl::GetFlag(FLAGS_port);
  o.mesh_port = absl::GetFlag(FLAGS_mesh_port);
  o.bind = absl::GetFlag(FLAGS_bind);
  if (!CastFromFlags(o))
    return 2;
  o.token = absl::GetFlag(FLAGS_token);
  if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) {
    std::ifstream in(file);
    if (!in || !std::getline(in, o.token) || o.token.empty()) {
      std::fprintf(stderr,
                   "duckd: --token-file %s: cannot read a token from it\n",
                   file.c_str());
      return 2;
    }
  }
  if (o.token.empty())
    if (const char *t = std::getenv("DUCKD_TOKEN"))
      o.token = t;
  o.name = absl::GetFlag(FLAGS_name);
  o.cache_dir = absl::GetFlag(FLAGS_cache_dir);
  if (!ParseSize(absl::GetFlag(FLAGS_weights_size), &o.weights_size) ||
      !ParseSize(absl::GetFlag(FLAGS_max_payload), &o.max_payload)) {
    std::fprintf(stderr, "duckd: bad --weights-size or --max-payload\n");
    return 2;
  }
  o.sync = absl::GetFlag(FLAGS_sync);
  o.cores = uint32_t(std::max(0, absl::GetFlag(FLAGS_cores)));
  o.cpu_offset = std::max(0, absl::GetFlag(FLAGS_cpu_offset));
  o.pin = absl::GetFlag(FLAGS_pin);
  o.yield = absl::GetFlag(FLAGS_yield);
  o.spin_ns = uint64_t(std::max(0, absl::GetFlag(FLAGS_spin_us))) * 1000;
  o.step_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_step_timeout_ms));
  o.sandbox = absl::GetFlag(FLAGS_sandbox);
  o.io_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_io_timeout_ms));
  o.hello_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_hello_timeout_ms));
  o.idle_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_idle_timeout_ms));
  if (absl::GetFlag(FLAGS_scrub_mbps) < 0) {
    std::fprintf(stderr, "duckd: --scrub-mbps must be 0 (off) or more\n");
    return 2;
  }
  o.scrub_bytes_per_second =
      uint64_t(absl::GetFlag(FLAGS_scrub_mbps)) * 1000000;

  auto server = duck::duckd::Server::Create(o);
  if (!server.ok()) {
    std::fprintf(stderr, "duckd: %s\n",
                 std::string(server.status().message()).c_str());
    return 1;
  }
  // LocalCluster and scripts read the chosen ports from these lines.
  if ((*server)->mesh_port())
    std::printf("duckd: mesh on %s:%u\n", o.bind.c_str(),
                unsigned((*server)->mesh_port()));
  if ((*server)->cast_port())
    std::printf("duckd: cast on %s:%u\n", o.cast_address.c_str(),
                unsigned((*server)->cast_port()));
  std::printf("duckd: listening on %s\n", (*server)->address().c_str());
  std::fflush(stdout);
  absl::Status s = (*server)->Serve();
  if (!s.ok()) {
    std::fprintf(stderr, "duckd: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
