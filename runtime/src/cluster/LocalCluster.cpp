//===- LocalCluster.cpp - N duckd processes on this machine ---------------===//
#include "duck/runtime/cluster/LocalCluster.h"

#include "duck_rt/wire_codec.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#include <arpa/inet.h>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <netinet/in.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace duck::runtime {

std::string ExecutableDir() {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    return ".";
  std::string path(self, size_t(n));
  return path.substr(0, path.rfind('/'));
}

std::string DefaultElfPath() {
  if (const char *e = std::getenv("DUCK_ELF"); e && *e)
    return e;
  return ExecutableDir() + "/../lib/duck.elf";
}

absl::StatusOr<std::vector<uint8_t>> ReadDuckElf(const std::string &path) {
  const std::string p = path.empty() ? DefaultElfPath() : path;
  std::ifstream in(p, std::ios::binary);
  std::vector<uint8_t> elf((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
  if (elf.empty())
    return absl::NotFoundError(
        absl::StrCat("cannot read the duck ELF '", p, "' (set DUCK_ELF)"));
  return elf;
}

namespace {

std::string FindDuckd(const std::string &given) {
  if (!given.empty())
    return given;
  if (const char *e = std::getenv("DUCKD"); e && *e)
    return e;
  std::string cand = ExecutableDir() + "/duckd";
  if (::access(cand.c_str(), X_OK) == 0)
    return cand;
  return "duckd"; // execvp searches PATH
}

/// Waits until a child exits or `timeout` passes; true when reaped.
bool WaitExit(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int st;
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD))
      return true;
    if (absl::Now() >= deadline)
      return false;
    ::usleep(2000);
  }
}

void RemoveTree(const std::string &dir) {
  if (DIR *d = ::opendir(dir.c_str())) {
    while (dirent *e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..")
        continue;
      ::unlink((dir + "/" + name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

} // namespace

absl::Status PingDuck(const DuckEndpoint &endpoint, absl::Duration timeout,
                      const std::string &token,
                      std::shared_ptr<DuckTransport> transport) {
  const absl::Time deadline = absl::Now() + timeout;
  if (!transport)
    transport = TcpDuckTransport();
  absl::StatusOr<std::unique_ptr<DuckConnection>> link =
      transport->Connect(endpoint, timeout, 1 << 20);
  if (!link.ok())
    return link.status();
  auto hello = duckd::BeginHello(token);
  if (!hello.ok())
    return hello.status();
  duckd::Part p{&hello->request, sizeof hello->request};
  const duckd_frame_header h =
      duckd::MakeHeader(DUCKD_MSG_HELLO, 0, 1, {&p, 1}, &hello->keys);
  if (absl::Status s = SendFrame(*transport, **link, h, {&p, 1}, deadline);
      !s.ok())
    return s;
  absl::StatusOr<ReceivedFrame> f = ReceiveFrame(*transport, **link, deadline);
  if (!f.ok())
    return f.status();
  duckd::FrameKeys keys;
  if (absl::Status s = duckd::FinishHello(*hello, f->header, f->payload, &keys);
      !s.ok())
    return s;
  if (f->header.flags & DUCKD_FLAG_ERROR) {
    auto e = duckd::DecodeError(f->payload);
    return absl::UnavailableError(
        absl::StrCat("hello refused: ", e.ok() ? e->message : "?"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalCluster>>
LocalCluster::Start(const LocalClusterOptions &options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->opt_ = options;
  c->duckd_ = FindDuckd(options.duckd_path);
  if (options.cache_dir.empty()) {
    char tmpl[] = "/tmp/duck-cluster-XXXXXX";
    if (!::mkdtemp(tmpl))
      return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
    c->cache_dir_ = tmpl;
    c->own_cache_dir_ = true;
  } else {
    c->cache_dir_ = options.cache_dir;
  }
  if (options.claim_slot)
    if (absl::Status s = c->ClaimSlot(); !s.ok())
      return s;
  c->pids_.assign(options.ducks, -1);
  c->endpoints_.resize(options.ducks);
  c->mesh_endpoints_.resize(options.ducks);
  c->cast_ports_.resize(options.ducks);
  for (size_t i = 0; i < options.ducks; ++i)
    if (absl::Status s = c->StartOne(i); !s.ok())
      return s; // the destructor stops the ones already running
  return c;
}

absl::Status LocalCluster::ClaimSlot() {
  constexpr int kSlots = 64;
  for (int k = 0; k < kSlots; ++k) {
    const std::string path = absl::StrCat(cache_dir_, "/slot-", k, ".lock");
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      return absl::InternalError(absl::StrCat("cannot open ", path, ": ",
                                              std::strerror(errno)));
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      slot_fd_ = fd;
      slot_ = k;
      if (k > 0)
        opt_.name_prefix = absl::StrCat("s", k, "-", opt_.name_prefix);
      return absl::OkStatus();
    }
    ::close(fd);
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "all ", kSlots, " local cluster slots of ", cache_dir_,
      " are in use by running clusters"));
}

std::string LocalCluster::cache_file(size_t duck) const {
  return absl::StrCat(cache_dir_, "/duckd-", opt_.name_prefix, duck,
                      ".weights");
}

namespace {

/// duckd's command line for local duck i: its name, cache, cores, and
/// port 0 (it says on stdout which port it took).
std::vector<std::string> DuckdArgs(const LocalClusterOptions &o,
                                   const std::string &duckd,
                                   const std::string &cacheDir, size_t i,
                                   const std::string &name) {
  std::vector<std::string> args = {
      duckd,
      "--port=0",
      absl::StrCat("--name=", name),
      absl::StrCat("--cache_dir=", cacheDir),
      absl::StrCat("--weights_size=", o.weights_size),
      absl::StrCat("--cores=", o.cores),
      absl::StrCat("--cpu_offset=", i * o.cores),
      absl::StrCat("--pin=", o.pin ? "true" : "false"),
      absl::StrCat("--sync=", o.sync ? "true" : "false")};
  if (!o.token.empty())
    args.push_back(absl::StrCat("--token=", o.token));
  // Several ducks on this box: a duck whose workers spin for the next step
  // holds a core the host, the other ducks and a server's HTTP threads
  // need (two ducks x 1 core, Qwen3-0.6B shape: 20.1 tok/s spinning 200
  // us, 21.5 not spinning; with the host's threads parked after a step,
  // spinning gained 2-5 % in decode, but under load it starved a server's
  // HTTP threads for seconds; docs/perf.md). One duck keeps duckd's
  // default: its spin saves the wake-up (24.4 against 23.2). Extra args
  // come later and win.
  if (o.ducks > 1)
    args.push_back("--spin_us=0");
  args.insert(args.end(), o.extra_args.begin(), o.extra_args.end());
  return args;
}

/// A started duckd: its pid and the read end of its stdout.
struct Spawned {
  pid_t pid;
  int out;
};

/// Forks and runs duckd in a process group of its own that dies with this
/// process; its stderr is appended to `logPath` (when given).
absl::StatusOr<Spawned> SpawnDuckd(std::vector<std::string> &args,
                                   const std::string &logPath) {
  std::vector<char *> argv;
  for (std::string &a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out[0]);
    ::close(out[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // The daemon must not outlive the process that started it.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent)
      ::_exit(1);
    // Its own process group, with its worker: Signal() reaches both.
    ::setpgid(0, 0);
    ::dup2(out[1], STDOUT_FILENO);
    if (!logPath.empty()) {
      int fd = ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0)
        ::dup2(fd, STDERR_FILENO);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execvp(argv[0], argv.data());
    dprintf(STDERR_FILENO,
            "cannot run '%s': %s (give its path with DUCKD=PATH, or put it "
            "beside this program or on PATH)\n",
            argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(out[1]);
  return Spawned{pid, out[0]};
}

/// Reads "duckd: listening on HOST:PORT" from a starting duckd's stdout
/// until `deadline`: the port (0 when it did not say; `text` is what it
/// said), and its host in `host`.
uint16_t ReadListening(int fd, absl::Time deadline, std::string *text,
                       std::string *host) {
  uint16_t port = 0;
  while (!port) {
    const int ms = int(absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{fd, POLLIN, 0};
    if (ms <= 0 || ::poll(&p, 1, ms) <= 0)
      break;
    char buf[256];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0)
      break;
    text->append(buf, size_t(n));
    const std::string key = "duckd: listening on ";
    size_t at = text->find(key);
    size_t eol = at == std::string::npos ? at : text->find('\n', at);
    if (eol != std::string::npos) {
      std::string addr = text->substr(at + key.size(), eol - at - key.size());
      size_t colon = addr.rfind(':');
      uint32_t v = 0;
      if (colon != std::string::npos &&
          absl::SimpleAtoi(addr.substr(colon + 1), &v) && v && v < 65536) {
        *host = addr.substr(0, colon);
        port = uint16_t(v);
      }
      break;
    }
  }
  return port;
}

/// The port of "duckd: <what> on HOST:PORT" in what a starting duckd said
/// (duckd prints its mesh and cast lines before its listening line; 0
/// without --mesh-port or --cast).
uint16_t AnnouncedPort(const std::string &text, const char *what) {
  const std::string key = absl::StrCat("duckd: ", what, " on ");
  const size_t at = text.find(key);
  const size_t eol = at == std::string::npos ? at : text.find('\n', at);
  if (eol == std::string::npos)
    return 0;
  const std::string addr = text.substr(at + key.size(), eol - at - key.size());
  const size_t colon = addr.rfind(':');
  uint32_t v = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(addr.substr(colon + 1), &v) || v >= 65536)
    return 0;
  return uint16_t(v);
}

/// The last non-empty line of the log from byte `from` on: what this start
/// wrote last, which usually says why it failed (a weights file in use by
/// another local cluster sharing the cache directory, ...).
std::string LastLogLine(const std::string &logPath, uint64_t from) {
  std::string why;
  std::ifstream log(logPath);
  log.seekg(std::streamoff(from));
  for (std::string line; std::getline(log, line);)
    if (!line.empty())
      why = line;
  return why;
}

} // namespace

absl::Status LocalCluster::StartOne(size_t i) {
  const std::string name = absl::StrCat(opt_.name_prefix, i);
  std::vector<std::string> args = DuckdArgs(opt_, duckd_, cache_dir_, i, name);
  std::string logPath;
  if (!opt_.log_dir.empty())
    logPath = absl::StrCat(opt_.log_dir, "/duckd-", name, ".log");

  // Only what this start writes to the log can say why it failed.
  uint64_t logStart = 0;
  if (struct stat st; !logPath.empty() && ::stat(logPath.c_str(), &st) == 0)
    logStart = uint64_t(st.st_size);

  absl::StatusOr<Spawned> sp = SpawnDuckd(args, logPath);
  if (!sp.ok())
    return sp.status();
  const pid_t pid = sp->pid;
  pids_[i] = pid;

  const absl::Time deadline = absl::Now() + opt_.start_timeout;
  std::string text;
  std::string host = "127.0.0.1";
  const uint16_t port = ReadListening(sp->out, deadline, &text, &host);
  ::close(sp->out);
  if (!port) {
    ::kill(pid, SIGKILL);
    WaitExit(pid, absl::Seconds(5));
    pids_[i] = -1;
    const std::string why =
        logPath.empty() ? std::string() : LastLogLine(logPath, logStart);
    return absl::UnavailableError(absl::StrCat(
        "duckd ", name, " (", duckd_, ") did not start",
        why.empty() ? absl::StrCat("; stdout: '", text, "'")
                    : absl::StrCat(": ", why, " (log: ", logPath, ")")));
  }
  endpoints_[i].host = host;
  endpoints_[i].port = port;
  mesh_endpoints_[i] = {host, AnnouncedPort(text, "mesh")};
  cast_ports_[i] = AnnouncedPort(text, "cast");
  // Ready when it answers hello.
  absl::Status last;
  while (absl::Now() < deadline) {
    last = PingDuck(endpoints_[i], absl::Seconds(2), opt_.token);
    if (last.ok())
      return absl::OkStatus();
    ::usleep(5000);
  }
  return absl::UnavailableError(absl::StrCat(
      "duckd ", name, " at ", endpoints_[i].ToString(),
      " never answered hello: ", last.message()));
}

absl::Status LocalCluster::Stop() {
  for (pid_t pid : pids_)
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::kill(-pid, SIGCONT); // a stopped (hung) duck must run to exit
    }
  const absl::Time deadline = absl::Now() + opt_.stop_timeout;
  absl::Status s;
  for (pid_t &pid : pids_) {
    if (pid <= 0)
      continue;
    absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    if (!WaitExit(pid, left)) {
      ::kill(pid, SIGKILL);
      WaitExit(pid, absl::Seconds(5));
      s = absl::DeadlineExceededError(
          "a duckd ignored SIGTERM and was killed");
    }
    pid = -1;
  }
  return s;
}

absl::Status LocalCluster::Kill(size_t duck, int sig) {
  if (duck >= pids_.size() || pids_[duck] <= 0)
    return absl::NotFoundError("no such running duck");
  ::kill(pids_[duck], sig);
  ::kill(-pids_[duck], SIGCONT); // a stopped (hung) duck must run to exit
  if (!WaitExit(pids_[duck], absl::Seconds(10))) {
    ::kill(pids_[duck], SIGKILL);
    WaitExit(pids_[duck], absl::Seconds(5));
  }
  pids_[duck] = -1;
  return absl::OkStatus();
}

void LocalCluster::Signal(size_t duck, int sig) {
  if (duck < pids_.size() && pids_[duck] > 0)
    ::kill(-pids_[duck], sig); // duckd and its worker
}

bool LocalCluster::Exited(size_t duck) {
  if (duck >= pids_.size() || pids_[duck] <= 0)
    return true;
  int status = 0;
  if (::waitpid(pids_[duck], &status, WNOHANG) == pids_[duck]) {
    pids_[duck] = -1;
    return true;
  }
  return false;
}

absl::Status LocalCluster::Restart(size_t duck) {
  if (duck >= pids_.size())
    return absl::NotFoundError("no such duck");
  if (pids_[duck] > 0)
    if (absl::Status s = Kill(duck, SIGTERM); !s.ok())
      return s;
  return StartOne(duck);
}

LocalCluster::~LocalCluster() {
  (void)Stop();
  if (slot_fd_ >= 0)
    ::close(slot_fd_); // after the ducks are gone: the slot is free again
  if (own_cache_dir_)
    RemoveTree(cache_dir_);
}

} // namespace duck::runtime
