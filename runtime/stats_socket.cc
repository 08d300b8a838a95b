#include "runtime/stats_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/log.h"

namespace farmem {
namespace {

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool name_char(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (!first && c >= '0' && c <= '9');
}

// A metric name that the format accepts: bad characters become '_'.
std::string clean_name(std::string_view in) {
  std::string s(in.empty() ? "_" : in);
  for (size_t i = 0; i < s.size(); ++i)
    if (!name_char(s[i], i == 0)) s[i] = '_';
  return s;
}

// Labels: no blanks or line breaks anywhere, "-" means none.
std::string clean_labels(std::string_view in) {
  std::string s(in);
  for (char& c : s)
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') c = '_';
  return s;
}

std::string clean_help(std::string_view in) {
  std::string s(in);
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

bool parse_u64(std::string_view t, uint64_t* v) {
  if (t.empty()) return false;
  auto r = std::from_chars(t.data(), t.data() + t.size(), *v);
  return r.ec == std::errc() && r.ptr == t.data() + t.size();
}

bool parse_i64(std::string_view t, int64_t* v) {
  if (t.empty()) return false;
  auto r = std::from_chars(t.data(), t.data() + t.size(), *v);
  return r.ec == std::errc() && r.ptr == t.data() + t.size();
}

// Splits off the next space-separated field.
std::string_view next_field(std::string_view* rest) {
  size_t sp = rest->find(' ');
  std::string_view f = rest->substr(0, sp);
  *rest = sp == std::string_view::npos ? std::string_view() : rest->substr(sp + 1);
  return f;
}

bool valid_name(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i)
    if (!name_char(n[i], i == 0)) return false;
  return true;
}

// Ensures `dir` exists, is a real directory owned by `uid`, and is private.
Status private_dir(const std::string& dir, uid_t uid) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return make_error(Errc::kIo, "cannot create the stats socket directory %s: %s", dir.c_str(),
                      strerror(errno));
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0)
    return make_error(Errc::kIo, "cannot inspect %s: %s", dir.c_str(), strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return make_error(Errc::kPermissionDenied,
                      "%s is not a directory (a symlink or file someone planted?): remove it",
                      dir.c_str());
  if (st.st_uid != uid)
    return make_error(Errc::kPermissionDenied,
                      "%s belongs to uid %u, not to this process's uid %u: remove it (or set "
                      "XDG_RUNTIME_DIR to a directory of your own)",
                      dir.c_str(), static_cast<unsigned>(st.st_uid), static_cast<unsigned>(uid));
  if ((st.st_mode & 077) != 0)
    return make_error(Errc::kPermissionDenied,
                      "%s has mode %03o: others could reach the stats socket; chmod 700 it",
                      dir.c_str(), static_cast<unsigned>(st.st_mode & 0777));
  return ok_status();
}

Result<sockaddr_un> unix_addr(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path)
    return make_error(Errc::kInvalidArgument,
                      "stats socket path %s is %zu bytes, longer than a Unix socket allows "
                      "(%zu): use a shorter XDG_RUNTIME_DIR",
                      path.c_str(), path.size(), sizeof a.sun_path - 1);
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

// read(2), not std::ifstream: in the preload library (libstdc++ linked in
// statically) an iostream would bring the whole locale machinery with it,
// ~0.4 MiB of text that a program under farmem pays in resident set.
std::string comm_of_self() {
  char buf[64];
  ssize_t n = -1;
  int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    n = read(fd, buf, sizeof buf);
    close(fd);
  }
  std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
  if (size_t nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s.empty() ? "?" : clean_labels(s);
}

}  // namespace

// ---- StatsHistogram / StatsSnapshot ---------------------------------------

uint64_t StatsHistogram::total() const {
  uint64_t n = 0;
  for (const auto& b : buckets) n += b.count;
  return n;
}

uint64_t StatsHistogram::quantile_bound(double q) const {
  uint64_t n = total();
  if (n == 0) return 0;
  // The rank of the q-quantile, 1-based, rounded up.
  double want = q * static_cast<double>(n);
  uint64_t rank = static_cast<uint64_t>(want);
  if (static_cast<double>(rank) < want) ++rank;
  if (rank == 0) rank = 1;
  uint64_t seen = 0;
  for (const auto& b : buckets) {
    seen += b.count;
    if (seen >= rank) return b.le;
  }
  return buckets.back().le;
}

void StatsSnapshot::counter(std::string_view name, uint64_t value, std::string_view help,
                            std::string_view labels) {
  samples.push_back({StatsSample::Kind::kCounter, clean_name(name), clean_labels(labels), value,
                     clean_help(help)});
}

void StatsSnapshot::gauge(std::string_view name, uint64_t value, std::string_view help,
                          std::string_view labels) {
  samples.push_back(
      {StatsSample::Kind::kGauge, clean_name(name), clean_labels(labels), value, clean_help(help)});
}

void StatsSnapshot::histogram(std::string_view name, std::vector<StatsBucket> buckets,
                              std::string_view help, std::string_view labels) {
  histograms.push_back(
      {clean_name(name), clean_labels(labels), std::move(buckets), clean_help(help)});
}

const StatsSample* StatsSnapshot::find(std::string_view name, std::string_view labels) const {
  for (const auto& s : samples)
    if (s.name == name && s.labels == labels) return &s;
  return nullptr;
}

const StatsHistogram* StatsSnapshot::find_histogram(std::string_view name,
                                                    std::string_view labels) const {
  for (const auto& h : histograms)
    if (h.name == name && h.labels == labels) return &h;
  return nullptr;
}

uint64_t StatsSnapshot::value(std::string_view name, std::string_view labels, uint64_t def) const {
  const StatsSample* s = find(name, labels);
  return s ? s->value : def;
}

std::string format_stats_text(const StatsSnapshot& s) {
  std::string o = "farmem-stats 1\n";
  o += "process " + std::to_string(s.pid) + " " + std::to_string(s.uid) + " " +
       std::to_string(s.time_ms) + " " + std::to_string(s.uptime_ms) + " " +
       (s.comm.empty() ? std::string("?") : clean_labels(s.comm)) + "\n";
  for (const auto& m : s.samples) {
    o += m.kind == StatsSample::Kind::kCounter ? "counter " : "gauge ";
    o += m.name + " " + (m.labels.empty() ? std::string("-") : m.labels) + " " +
         std::to_string(m.value) + " " + m.help + "\n";
  }
  for (const auto& h : s.histograms) {
    o += "histogram " + h.name + " " + (h.labels.empty() ? std::string("-") : h.labels) + " ";
    if (h.buckets.empty()) o += "inf:0";
    for (size_t i = 0; i < h.buckets.size(); ++i) {
      if (i) o += ',';
      o += h.buckets[i].le == StatsBucket::kInf ? std::string("inf")
                                                : std::to_string(h.buckets[i].le);
      o += ':' + std::to_string(h.buckets[i].count);
    }
    o += " " + h.help + "\n";
  }
  o += "end\n";
  return o;
}

Result<StatsSnapshot> parse_stats_text(std::string_view text) {
  StatsSnapshot s;
  int line_no = 0;
  bool have_header = false, have_process = false, have_end = false;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    if (nl == std::string_view::npos)
      return make_error(Errc::kProtocol, "stats line %d is not terminated: the snapshot was cut",
                        line_no + 1);
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    ++line_no;
    if (have_end) return make_error(Errc::kProtocol, "stats line %d follows `end`", line_no);
    std::string_view rest = line;
    std::string_view kind = next_field(&rest);
    auto bad = [&](const char* what) {
      return make_error(Errc::kProtocol, "stats line %d (%.*s): %s", line_no,
                        static_cast<int>(std::min<size_t>(line.size(), 80)), line.data(), what);
    };
    if (line_no == 1) {
      if (kind == "error")
        return make_error(Errc::kPermissionDenied, "%.*s", static_cast<int>(rest.size()),
                          rest.data());
      if (kind != "farmem-stats")
        return bad("not a farmem stats socket (expected `farmem-stats 1`)");
      if (rest != "1") return bad("unsupported stats format version: upgrade farmemctl");
      have_header = true;
      continue;
    }
    if (kind == "process") {
      if (have_process) return bad("a second `process` line");
      std::string_view f[4];
      for (auto& x : f) x = next_field(&rest);
      if (!parse_i64(f[0], &s.pid) || !parse_i64(f[1], &s.uid) || !parse_i64(f[2], &s.time_ms) ||
          !parse_i64(f[3], &s.uptime_ms) || rest.empty())
        return bad("expected `process <pid> <uid> <time_ms> <uptime_ms> <comm>`");
      s.comm = std::string(rest);
      have_process = true;
    } else if (kind == "counter" || kind == "gauge") {
      std::string_view name = next_field(&rest);
      std::string_view labels = next_field(&rest);
      std::string_view value = next_field(&rest);
      StatsSample m;
      m.kind = kind == "counter" ? StatsSample::Kind::kCounter : StatsSample::Kind::kGauge;
      if (!valid_name(name)) return bad("bad metric name");
      if (labels.empty()) return bad("missing labels field (`-` when none)");
      if (!parse_u64(value, &m.value)) return bad("value is not an unsigned integer");
      m.name = std::string(name);
      m.labels = labels == "-" ? std::string() : std::string(labels);
      m.help = std::string(rest);
      s.samples.push_back(std::move(m));
    } else if (kind == "histogram") {
      std::string_view name = next_field(&rest);
      std::string_view labels = next_field(&rest);
      std::string_view buckets = next_field(&rest);
      if (!valid_name(name)) return bad("bad histogram name");
      if (labels.empty()) return bad("missing labels field (`-` when none)");
      StatsHistogram h;
      h.name = std::string(name);
      h.labels = labels == "-" ? std::string() : std::string(labels);
      h.help = std::string(rest);
      if (buckets.empty()) return bad("no buckets");
      while (!buckets.empty()) {
        size_t comma = buckets.find(',');
        std::string_view b = buckets.substr(0, comma);
        buckets = comma == std::string_view::npos ? std::string_view() : buckets.substr(comma + 1);
        size_t colon = b.find(':');
        if (colon == std::string_view::npos) return bad("a bucket is not `le:count`");
        StatsBucket sb;
        std::string_view le = b.substr(0, colon);
        if (le == "inf")
          sb.le = StatsBucket::kInf;
        else if (!parse_u64(le, &sb.le) || sb.le == StatsBucket::kInf)
          return bad("a bucket bound is not an integer or `inf`");
        if (!parse_u64(b.substr(colon + 1), &sb.count))
          return bad("a bucket count is not an integer");
        if (!h.buckets.empty() && sb.le <= h.buckets.back().le)
          return bad("bucket bounds are not ascending");
        h.buckets.push_back(sb);
      }
      s.histograms.push_back(std::move(h));
    } else if (kind == "end") {
      if (!rest.empty()) return bad("junk after `end`");
      have_end = true;
    } else {
      return bad("unknown line kind");
    }
  }
  if (!have_header) return make_error(Errc::kProtocol, "empty reply from the stats socket");
  if (!have_process) return make_error(Errc::kProtocol, "stats snapshot has no `process` line");
  if (!have_end)
    return make_error(Errc::kProtocol, "stats snapshot has no `end` line: it was cut short");
  return s;
}

// ---- paths -----------------------------------------------------------------

std::string stats_socket_dir(uid_t uid) {
  const char* xdg = getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/farmem";
  return "/tmp/farmem-" + std::to_string(uid);
}

std::string stats_socket_path(pid_t pid) {
  return stats_socket_dir(geteuid()) + "/" + std::to_string(pid) + ".sock";
}

std::vector<std::string> stats_socket_candidates(pid_t pid) {
  std::vector<std::string> out;
  struct stat st {};
  std::string proc = "/proc/" + std::to_string(pid);
  if (pid <= 0 || stat(proc.c_str(), &st) != 0) return out;
  const uid_t uid = st.st_uid;  // /proc/PID is owned by the process's effective uid
  // Appended, not "/" + std::to_string(pid): gcc 12 -O3 reports a false
  // -Wrestrict on operator+(const char*, string&&) (GCC PR 105329).
  std::string name = "/";
  name += std::to_string(pid);
  name += ".sock";
  auto add = [&](std::string p) {
    for (const auto& o : out)
      if (o == p) return;
    out.push_back(std::move(p));
  };
  const char* xdg = getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && xdg[0] == '/') add(std::string(xdg) + "/farmem" + name);
  add("/run/user/" + std::to_string(uid) + "/farmem" + name);
  add("/tmp/farmem-" + std::to_string(uid) + name);
  return out;
}

// ---- server ----------------------------------------------------------------

Result<std::unique_ptr<StatsSocket>> StatsSocket::start(StatsProvider provider,
                                                        StatsSocketOptions opts) {
  if (!provider) return make_error(Errc::kInvalidArgument, "StatsSocket needs a provider callback");
  std::unique_ptr<StatsSocket> s(new StatsSocket());
  s->provider_ = std::move(provider);
  s->opts_ = std::move(opts);
  s->path_ = s->opts_.path.empty() ? stats_socket_path(getpid()) : s->opts_.path;
  if (s->opts_.path.empty()) {
    // $XDG_RUNTIME_DIR itself belongs to the session manager; our
    // subdirectory of it, or /tmp/farmem-<uid>, is private.
    const uid_t uid = geteuid();
    FARMEM_RETURN_IF_ERROR(private_dir(stats_socket_dir(uid), uid));
  }
  auto addr = unix_addr(s->path_);
  if (!addr.ok()) return addr.status();

  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return make_error(Errc::kIo, "cannot create a Unix socket: %s", strerror(errno));
  // A socket file left by an earlier process with this pid (pids are
  // reused) would make bind fail; nobody can be serving on it now.
  struct stat st {};
  if (lstat(s->path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return make_error(Errc::kInvalidArgument,
                        "%s exists and is not a socket: remove it or choose another path",
                        s->path_.c_str());
    unlink(s->path_.c_str());
  }
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr) != 0)
    return make_error(Errc::kIo, "cannot bind the stats socket %s: %s", s->path_.c_str(),
                      strerror(errno));
  // The directory is already private; this makes the socket so as well when
  // the caller chose the path.
  if (chmod(s->path_.c_str(), 0600) != 0 || listen(fd.get(), 16) != 0) {
    int e = errno;
    unlink(s->path_.c_str());
    return make_error(Errc::kIo, "cannot set up the stats socket %s: %s", s->path_.c_str(),
                      strerror(e));
  }
  struct stat mine {};
  if (lstat(s->path_.c_str(), &mine) == 0) {
    s->dev_ = mine.st_dev;
    s->ino_ = mine.st_ino;
  }
  s->listen_ = std::move(fd);
  s->wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->wake_.valid()) {
    unlink(s->path_.c_str());
    return make_error(Errc::kIo, "eventfd: %s", strerror(errno));
  }
  s->started_ms_ = steady_ms();
  try {
    s->thread_ = std::thread([p = s.get()] { p->loop(); });
  } catch (const std::system_error& e) {
    unlink(s->path_.c_str());
    return make_error(Errc::kResourceExhausted, "cannot start the stats socket thread: %s",
                      e.what());
  }
  return s;
}

StatsSocket::~StatsSocket() {
  stop();
}

void StatsSocket::stop() {
  if (stopped_.exchange(true)) return;
  uint64_t one = 1;
  if (wake_.valid()) (void)!write(wake_.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  // Only remove the file if it is still ours (a later process may have
  // replaced it after a pid reuse).
  struct stat b {};
  if (listen_.valid() && lstat(path_.c_str(), &b) == 0 && b.st_dev == dev_ && b.st_ino == ino_)
    unlink(path_.c_str());
  listen_.reset();
}

void StatsSocket::loop() {
  if (opts_.thread_init) opts_.thread_init();
  pollfd fds[2] = {{listen_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
  while (true) {
    int r = poll(fds, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (fds[1].revents & POLLIN)) return;
    if (!(fds[0].revents & POLLIN)) continue;
    int c = accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    serve(c);
    close(c);
  }
}

void StatsSocket::serve(int fd) {
  (void)set_socket_timeouts(fd, 0, opts_.send_timeout_ms);
  ucred cred{};
  socklen_t len = sizeof cred;
  const uid_t me = geteuid();
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != me) {
    refused_.fetch_add(1);
    char msg[256];
    int n = snprintf(msg, sizeof msg,
                     "error the farmem stats of pid %d belong to uid %u; uid %u may not read "
                     "them: run farmemctl as uid %u\n",
                     static_cast<int>(getpid()), static_cast<unsigned>(me),
                     static_cast<unsigned>(cred.uid), static_cast<unsigned>(me));
    (void)send_all(fd, msg, static_cast<size_t>(n));
    FARMEM_LOG(kInfo, "stats socket %s: refused uid %u (pid %d)", path_.c_str(),
               static_cast<unsigned>(cred.uid), static_cast<int>(cred.pid));
    return;
  }
  StatsSnapshot s;
  provider_(s);
  s.pid = getpid();
  s.uid = me;
  s.time_ms = unix_ms();
  s.uptime_ms = steady_ms() - started_ms_;
  s.comm = comm_of_self();
  std::string text = format_stats_text(s);
  if (send_all(fd, text.data(), text.size()) == Errc::kOk) served_.fetch_add(1);
}

// ---- client ----------------------------------------------------------------

Result<StatsSnapshot> fetch_stats(const std::string& path, int timeout_ms) {
  auto addr = unix_addr(path);
  if (!addr.ok()) return addr.status();
  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return make_error(Errc::kIo, "cannot create a Unix socket: %s", strerror(errno));
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr) != 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      return make_error(Errc::kNotFound, "no stats socket at %s: %s", path.c_str(), strerror(e));
    if (e == EACCES || e == EPERM)
      return make_error(Errc::kPermissionDenied,
                        "cannot reach %s: %s (the socket and its directory are private to the "
                        "process's user: run farmemctl as that user)",
                        path.c_str(), strerror(e));
    if (e == ECONNREFUSED)
      return make_error(Errc::kUnavailable,
                        "nothing serves %s (connection refused): the process has exited and left "
                        "a stale socket",
                        path.c_str());
    return make_error(Errc::kIo, "cannot connect to %s: %s", path.c_str(), strerror(e));
  }
  FARMEM_RETURN_IF_ERROR(set_socket_timeouts(fd.get(), timeout_ms, timeout_ms));
  std::string text;
  char buf[16384];
  // A snapshot is a few KiB; 16 MiB means something else answers.
  constexpr size_t kMax = 16u << 20;
  while (true) {
    ssize_t n = recv(fd.get(), buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return make_error(Errc::kTimeout, "%s sent no complete snapshot within %d ms", path.c_str(),
                          timeout_ms);
      return make_error(Errc::kIo, "reading %s: %s", path.c_str(), strerror(errno));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMax)
      return make_error(Errc::kProtocol, "%s sent more than %zu bytes: not a farmem stats socket",
                        path.c_str(), kMax);
  }
  auto r = parse_stats_text(text);
  if (!r.ok()) {
    if (r.status().code() == Errc::kPermissionDenied) return r.status();
    return r.status().with_context(path);
  }
  return r;
}

}  // namespace farmem
