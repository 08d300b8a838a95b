// farmemd's operator surfaces: the Prometheus endpoint (parsed with a strict
// parser of the text exposition format 0.0.4, written here) and the CLIENTS
// request behind `farmemctl status`.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/donor_admin.h"
#include "runtime/donor_server.h"
#include "tests/runtime/raw_client.h"

namespace farmem {
namespace {

constexpr char kToken[] = "ops-metrics-token";
constexpr uint64_t kSlab = 1 << 20;

// ---- A strict parser of the Prometheus text format 0.0.4 ---------------------

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
struct PromFamily {
  std::string type;
  std::string help;
  std::vector<PromSample> samples;
};
struct PromPage {
  std::map<std::string, PromFamily> families;
  // The one sample of `family` whose labels include every pair given.
  const PromSample* find(const std::string& family,
                         const std::map<std::string, std::string>& want = {}) const {
    auto it = families.find(family);
    if (it == families.end()) return nullptr;
    const PromSample* hit = nullptr;
    for (const auto& s : it->second.samples) {
      bool match = true;
      for (const auto& [k, v] : want) {
        auto l = s.labels.find(k);
        if (l == s.labels.end() || l->second != v) match = false;
      }
      if (match) {
        if (hit != nullptr) return nullptr;  // ambiguous
        hit = &s;
      }
    }
    return hit;
  }
  double value(const std::string& family,
               const std::map<std::string, std::string>& want = {}) const {
    const PromSample* s = find(family, want);
    return s ? s->value : std::nan("");
  }
};

bool metric_name_ok(const std::string& n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool label_name_ok(const std::string& n) {
  return metric_name_ok(n) && n.find(':') == std::string::npos && !n.starts_with("__");
}

// Which family a sample name belongs to, given the declared types.
std::string family_of(const std::string& sample, const std::map<std::string, PromFamily>& fams) {
  if (fams.count(sample)) return sample;
  for (const char* suf : {"_bucket", "_sum", "_count"}) {
    std::string s = suf;
    if (sample.size() > s.size() && sample.ends_with(s)) {
      std::string base = sample.substr(0, sample.size() - s.size());
      auto it = fams.find(base);
      if (it != fams.end() && (it->second.type == "histogram" || it->second.type == "summary"))
        return base;
    }
  }
  return "";
}

// Every line is a HELP, a TYPE, a blank or a sample of a declared family;
// a family's lines are contiguous, TYPE precedes its samples, names, label
// syntax, escapes and values are valid. Returns "" or what is wrong.
std::string parse_prometheus(const std::string& text, PromPage* page) {
  if (text.empty() || text.back() != '\n') return "the page does not end with a newline";
  std::set<std::string> closed;  // families whose block has ended
  std::string current;
  size_t pos = 0;
  int ln = 0;
  auto enter = [&](const std::string& fam) -> std::string {
    if (fam == current) return "";
    if (closed.count(fam)) return "family " + fam + " is not contiguous";
    if (!current.empty()) closed.insert(current);
    current = fam;
    return "";
  };
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++ln;
    std::string where = "line " + std::to_string(ln) + " '" + line + "': ";
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::istringstream is(line);
      std::string hash, kw, name;
      is >> hash >> kw >> name;
      if (hash != "#") return where + "comment must start with '# '";
      if (kw != "HELP" && kw != "TYPE") continue;  // other comments are allowed
      if (!metric_name_ok(name)) return where + "bad metric name";
      if (std::string e = enter(name); !e.empty()) return where + e;
      PromFamily& f = page->families[name];
      std::string rest;
      std::getline(is, rest);
      if (!rest.empty() && rest[0] == ' ') rest.erase(0, 1);
      if (kw == "HELP") {
        if (!f.help.empty()) return where + "second HELP";
        if (rest.empty()) return where + "empty HELP";
        f.help = rest;
      } else {
        if (!f.type.empty()) return where + "second TYPE";
        if (!f.samples.empty()) return where + "TYPE after samples";
        if (rest != "counter" && rest != "gauge" && rest != "histogram" && rest != "summary" &&
            rest != "untyped")
          return where + "unknown type";
        f.type = rest;
      }
      continue;
    }
    PromSample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    if (!metric_name_ok(s.name)) return where + "bad sample name";
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (true) {
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        size_t eq = line.find('=', i);
        if (eq == std::string::npos) return where + "label without '='";
        std::string ln_ = line.substr(i, eq - i);
        if (!label_name_ok(ln_)) return where + "bad label name '" + ln_ + "'";
        i = eq + 1;
        if (i >= line.size() || line[i] != '"') return where + "label value not quoted";
        ++i;
        std::string v;
        while (true) {
          if (i >= line.size()) return where + "unterminated label value";
          char c = line[i++];
          if (c == '"') break;
          if (c == '\\') {
            if (i >= line.size()) return where + "dangling escape";
            char e = line[i++];
            if (e == 'n')
              v += '\n';
            else if (e == '\\' || e == '"')
              v += e;
            else
              return where + "bad escape";
          } else {
            v += c;
          }
        }
        if (s.labels.count(ln_)) return where + "repeated label";
        s.labels[ln_] = v;
        if (i < line.size() && line[i] == ',')
          ++i;
        else if (i >= line.size() || line[i] != '}')
          return where + "expected ',' or '}'";
      }
    }
    if (i >= line.size() || line[i] != ' ') return where + "no value";
    std::string rest = line.substr(i + 1);
    std::string val = rest.substr(0, rest.find(' '));
    if (val == "+Inf" || val == "-Inf" || val == "NaN") {
      const double inf = std::numeric_limits<double>::infinity();
      s.value = val == "NaN" ? std::nan("") : (val[0] == '-' ? -inf : inf);
    } else {
      char* end = nullptr;
      s.value = strtod(val.c_str(), &end);
      if (val.empty() || *end != '\0') return where + "value does not parse";
    }
    if (rest.find(' ') != std::string::npos) {
      std::string ts = rest.substr(rest.find(' ') + 1);
      char* end = nullptr;
      (void)strtoll(ts.c_str(), &end, 10);
      if (ts.empty() || *end != '\0') return where + "timestamp does not parse";
    }
    std::string fam = family_of(s.name, page->families);
    if (fam.empty()) return where + "sample of an undeclared family";
    if (page->families[fam].type.empty()) return where + "sample before its TYPE";
    if (std::string e = enter(fam); !e.empty()) return where + e;
    page->families[fam].samples.push_back(std::move(s));
  }
  return "";
}

TEST(PromParser, RejectsWhatPrometheusWould) {
  PromPage p;
  EXPECT_EQ(parse_prometheus("# TYPE a counter\na 1\n", &p), "");
  auto bad = [](const std::string& t) {
    PromPage q;
    return !parse_prometheus(t, &q).empty();
  };
  EXPECT_TRUE(bad("a 1\n")) << "undeclared";
  EXPECT_TRUE(bad("# TYPE a counter\na 1"));
  EXPECT_TRUE(bad("# TYPE a counting\na 1\n"));
  EXPECT_TRUE(bad("# TYPE a counter\na x\n"));
  EXPECT_TRUE(bad("# TYPE a counter\na{b=\"1} 1\n"));
  EXPECT_TRUE(bad("# TYPE a counter\na{b=1} 1\n"));
  EXPECT_TRUE(bad("# TYPE a counter\na{b=\"\\x\"} 1\n"));
  EXPECT_TRUE(bad("# TYPE a gauge\n# TYPE b gauge\nb 1\na 1\n")) << "not contiguous";
  EXPECT_TRUE(bad("# TYPE a gauge\na 1\n# TYPE a gauge\n"));
  EXPECT_TRUE(bad("# TYPE 1a gauge\n1a 1\n"));
  EXPECT_FALSE(bad("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 2\nh_count 1\n"));
}

// ---- Fixture: an in-process farmemd with metrics on ---------------------------

class DonorOps : public ::testing::Test {
 protected:
  void SetUp() override {
    DonorOptions o;
    o.listen = {"127.0.0.1", 0};
    o.capacity = 64 * kSlab;
    o.slab_size = kSlab;
    o.token = kToken;
    o.try_hugepages = false;
    o.metrics_listen = Endpoint{"", 0};  // empty host: loopback
    auto s = DonorServer::start(o);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    srv_ = std::move(*s);
    ASSERT_NE(srv_->metrics_port(), 0);
  }

  // One HTTP/1.0 exchange with the metrics endpoint: status line and body.
  std::pair<std::string, std::string> http(const std::string& request) {
    auto fd = tcp_connect({"127.0.0.1", srv_->metrics_port()}, 2000);
    EXPECT_TRUE(fd.ok());
    if (!fd.ok()) return {};
    (void)set_socket_timeouts(fd->get(), 5000, 5000);
    EXPECT_EQ(send_all(fd->get(), request.data(), request.size()), Errc::kOk);
    std::string resp;
    char buf[8192];
    ssize_t n;
    while ((n = recv(fd->get(), buf, sizeof buf, 0)) > 0) resp.append(buf, static_cast<size_t>(n));
    size_t split = resp.find("\r\n\r\n");
    EXPECT_NE(split, std::string::npos) << resp;
    if (split == std::string::npos) return {};
    std::string head = resp.substr(0, split), body = resp.substr(split + 4);
    size_t cl = head.find("Content-Length: ");
    EXPECT_NE(cl, std::string::npos);
    if (cl != std::string::npos && !request.starts_with("HEAD")) {
      EXPECT_EQ(std::stoul(head.substr(cl + 16)), body.size());
    }
    return {head, body};
  }

  PromPage scrape() {
    auto [head, body] = http("GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
    EXPECT_TRUE(head.starts_with("HTTP/1.0 200 OK\r\n")) << head;
    EXPECT_NE(head.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << head;
    PromPage p;
    std::string err = parse_prometheus(body, &p);
    EXPECT_EQ(err, "") << body;
    return p;
  }

  std::unique_ptr<DonorServer> srv_;
};

std::string hex(uint64_t v) {
  char b[17];
  snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

TEST_F(DonorOps, MetricsFollowPrometheusConventions) {
  PromPage p = scrape();
  ASSERT_GE(p.families.size(), 14u);
  for (const auto& [name, f] : p.families) {
    EXPECT_TRUE(name.starts_with("farmem_donor_")) << name;
    EXPECT_FALSE(f.help.empty()) << name;
    EXPECT_TRUE(f.type == "counter" || f.type == "gauge") << name << " " << f.type;
    EXPECT_EQ(f.type == "counter", name.ends_with("_total")) << name;
  }
  EXPECT_EQ(p.families.at("farmem_donor_capacity_bytes").type, "gauge");
  EXPECT_EQ(p.families.at("farmem_donor_read_bytes_total").type, "counter");
  EXPECT_EQ(p.value("farmem_donor_capacity_bytes"), 64.0 * kSlab);
  EXPECT_EQ(p.value("farmem_donor_leased_bytes"), 0.0);
  EXPECT_EQ(p.value("farmem_donor_free_bytes"), 64.0 * kSlab);
  EXPECT_EQ(p.value("farmem_donor_slab_size_bytes"), 1.0 * kSlab);
  EXPECT_EQ(p.value("farmem_donor_clients"), 0.0);
  EXPECT_EQ(
      p.value("farmem_donor_info", {{"instance", hex(srv_->instance_id())}, {"transport", "tcp"}}),
      1.0);
  EXPECT_TRUE(p.families.at("farmem_donor_client_leased_bytes").samples.empty());
}

TEST_F(DonorOps, MetricsCountersMoveWithTraffic) {
  PromPage before = scrape();
  test::RawClient ctl;
  ASSERT_TRUE(ctl.connect(srv_->port()).ok());
  auto w = ctl.handshake_control(kToken, 0xABCD);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto slabs = ctl.lease(3 * kSlab);
  ASSERT_TRUE(slabs.ok());
  test::RawClient data;
  ASSERT_TRUE(data.connect(srv_->port()).ok());
  ASSERT_TRUE(data.attach(w->session_id, w->secret).ok());
  std::vector<uint8_t> bytes(8192);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE(data.write((*slabs)[1].slab, 4096, bytes).ok());
  ASSERT_TRUE(data.write((*slabs)[2].slab, 0, {bytes.data(), 100}).ok());
  auto back = data.read((*slabs)[1].slab, 4096, 4096);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(0, memcmp(back->data(), bytes.data(), 4096));
  // A refused READ (beyond the slab) is an error, not traffic.
  EXPECT_EQ(data.read((*slabs)[0].slab, kSlab - 10, 4096).status().code(), Errc::kOutOfRange);

  PromPage after = scrape();
  auto delta = [&](const char* n) { return after.value(n) - before.value(n); };
  EXPECT_EQ(delta("farmem_donor_written_bytes_total"), 8192.0 + 100.0);
  EXPECT_EQ(delta("farmem_donor_writes_total"), 2.0);
  EXPECT_EQ(delta("farmem_donor_read_bytes_total"), 4096.0);
  EXPECT_EQ(delta("farmem_donor_reads_total"), 1.0);
  EXPECT_EQ(delta("farmem_donor_errors_total"), 1.0);
  EXPECT_EQ(after.value("farmem_donor_leased_bytes"), 3.0 * kSlab);
  EXPECT_EQ(after.value("farmem_donor_free_bytes"), 61.0 * kSlab);
  EXPECT_EQ(after.value("farmem_donor_clients"), 1.0);
  EXPECT_EQ(after.value("farmem_donor_connections"), 2.0);
  const std::map<std::string, std::string> me = {{"session", hex(w->session_id)},
                                                 {"client", hex(0xABCD)}};
  EXPECT_EQ(after.value("farmem_donor_client_leased_bytes", me), 3.0 * kSlab);
  EXPECT_EQ(after.value("farmem_donor_client_written_bytes_total", me), 8292.0);
  EXPECT_EQ(after.value("farmem_donor_client_read_bytes_total", me), 4096.0);
  const PromSample* s = after.find("farmem_donor_client_leased_bytes", me);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->labels.at("peer").starts_with("127.0.0.1:")) << s->labels.at("peer");

  // The session ends: its leases and its per-client series go away.
  data.close();
  ctl.close();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  PromPage end;
  do {
    end = scrape();
    if (end.value("farmem_donor_clients") == 0.0 && end.value("farmem_donor_leased_bytes") == 0.0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(end.value("farmem_donor_leased_bytes"), 0.0);
  EXPECT_TRUE(end.families.at("farmem_donor_client_leased_bytes").samples.empty());
  EXPECT_EQ(end.value("farmem_donor_written_bytes_total"),
            after.value("farmem_donor_written_bytes_total"))
      << "counters never go back";
}

TEST_F(DonorOps, MetricsEndpointAnswersOnlyGetMetrics) {
  auto [h404, b404] = http("GET / HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(h404.starts_with("HTTP/1.0 404 ")) << h404;
  EXPECT_NE(b404.find("/metrics"), std::string::npos);
  auto [h405, b405] = http("POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
  EXPECT_TRUE(h405.starts_with("HTTP/1.0 405 ")) << h405;
  auto [h400, b400] = http("hello\r\n\r\n");
  EXPECT_TRUE(h400.starts_with("HTTP/1.0 400 ")) << h400;
  auto [hh, bh] = http("HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(hh.starts_with("HTTP/1.0 200 OK")) << hh;
  EXPECT_TRUE(bh.empty());
  auto [hq, bq] = http("GET /metrics?x=1 HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(hq.starts_with("HTTP/1.0 200 OK")) << hq;
  // A silent client is dropped and does not block the next scrape.
  auto idle = tcp_connect({"127.0.0.1", srv_->metrics_port()}, 2000);
  ASSERT_TRUE(idle.ok());
  PromPage p = scrape();
  EXPECT_EQ(p.value("farmem_donor_capacity_bytes"), 64.0 * kSlab);
}

TEST(DonorMetricsOff, NoPortWhenNotAsked) {
  DonorOptions o;
  o.listen = {"127.0.0.1", 0};
  o.capacity = 4 * kSlab;
  o.slab_size = kSlab;
  o.insecure = true;
  o.try_hugepages = false;
  auto s = DonorServer::start(o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->metrics_port(), 0);
}

// ---- CLIENTS -------------------------------------------------------------------

TEST_F(DonorOps, ClientsListsEverySessionWithItsLeasesAndTraffic) {
  // 34 sessions: more than one CLIENTS page (30).
  constexpr int kSessions = 34;
  std::vector<std::unique_ptr<test::RawClient>> ctl;
  std::map<uint64_t, uint64_t> leased;  // session -> bytes
  uint64_t traffic_session = 0;
  wire::Welcome tw;
  for (int i = 0; i < kSessions; ++i) {
    auto c = std::make_unique<test::RawClient>();
    ASSERT_TRUE(c->connect(srv_->port()).ok());
    auto w = c->handshake_control(kToken, 1000 + static_cast<uint64_t>(i));
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    uint64_t bytes = (i % 3) * kSlab;
    if (bytes) {
      ASSERT_TRUE(c->lease(bytes).ok());
    }
    leased[w->session_id] = bytes;
    if (i == 4) {
      traffic_session = w->session_id;
      tw = *w;
    }
    ctl.push_back(std::move(c));
  }
  // Traffic on session #4 (leased 1 slab).
  test::RawClient data;
  ASSERT_TRUE(data.connect(srv_->port()).ok());
  ASSERT_TRUE(data.attach(tw.session_id, tw.secret).ok());
  auto slabs = ctl[4]->lease(kSlab);
  ASSERT_TRUE(slabs.ok());
  leased[traffic_session] += kSlab;
  std::vector<uint8_t> bytes(5000, 0x5A);
  ASSERT_TRUE(data.write((*slabs)[0].slab, 0, bytes).ok());
  ASSERT_TRUE(data.read((*slabs)[0].slab, 0, 3000).ok());

  DonorAdminOptions ao;
  ao.server = {"127.0.0.1", srv_->port()};
  ao.token = kToken;
  auto admin = DonorAdmin::connect(ao);
  ASSERT_TRUE(admin.ok()) << admin.status().to_string();
  auto list = (*admin)->clients();
  ASSERT_TRUE(list.ok()) << list.status().to_string();
  ASSERT_EQ(list->size(), static_cast<size_t>(kSessions)) << "every session, the admin excluded";
  uint64_t prev = 0;
  for (const auto& c : *list) {
    EXPECT_GT(c.session_id, prev) << "ascending";
    prev = c.session_id;
    ASSERT_TRUE(leased.count(c.session_id));
    EXPECT_EQ(c.leased, leased[c.session_id]);
    EXPECT_GE(c.client_id, 1000u);
    EXPECT_LT(c.client_id, 1000u + kSessions);
    EXPECT_TRUE(c.peer.starts_with("127.0.0.1:")) << c.peer;
    if (c.session_id == traffic_session) {
      EXPECT_EQ(c.client_id, 1004u);
      EXPECT_EQ(c.bytes_written, 5000u);
      EXPECT_EQ(c.bytes_read, 3000u);
      EXPECT_EQ(c.writes, 1u);
      EXPECT_EQ(c.reads, 1u);
      EXPECT_EQ(c.data_conns, 1u);
    } else {
      EXPECT_EQ(c.bytes_written + c.bytes_read + c.data_conns, 0u);
    }
  }
  // The same figures through the in-process API.
  auto direct = srv_->clients();
  EXPECT_EQ(direct.size(), static_cast<size_t>(kSessions) + 1);
  auto st = (*admin)->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->clients, static_cast<uint64_t>(kSessions) + 1);
}

TEST_F(DonorOps, ClientsOnlyForTokenHoldersOnAControlConnection) {
  DonorAdminOptions ao;
  ao.server = {"127.0.0.1", srv_->port()};
  ao.token = "wrong";
  auto admin = DonorAdmin::connect(ao);
  ASSERT_FALSE(admin.ok());
  EXPECT_EQ(admin.status().code(), Errc::kUnauthenticated);
  EXPECT_NE(admin.status().message().find("refused the token"), std::string::npos);

  // A data connection (authenticated by a session secret, not the token)
  // may not ask: protocol error, connection closed.
  test::RawClient ctl;
  ASSERT_TRUE(ctl.connect(srv_->port()).ok());
  auto w = ctl.handshake_control(kToken);
  ASSERT_TRUE(w.ok());
  test::RawClient data;
  ASSERT_TRUE(data.connect(srv_->port()).ok());
  ASSERT_TRUE(data.attach(w->session_id, w->secret).ok());
  std::vector<uint8_t> f;
  wire::encode_clients(f, 9, wire::ClientsReq{0});
  ASSERT_TRUE(data.send_raw(f).ok());
  Status e = data.expect_error();
  EXPECT_EQ(e.code(), Errc::kProtocol) << e.to_string();
  EXPECT_NE(e.message().find("CLIENTS is not allowed on a data connection"), std::string::npos)
      << e.message();
  EXPECT_TRUE(data.wait_closed());

  // Nor before the handshake.
  test::RawClient fresh;
  ASSERT_TRUE(fresh.connect(srv_->port()).ok());
  f.clear();
  wire::encode_clients(f, 1, wire::ClientsReq{0});
  ASSERT_TRUE(fresh.send_raw(f).ok());
  EXPECT_EQ(fresh.expect_error().code(), Errc::kProtocol);
}

// ---- The farmemd binary: --metrics-listen -----------------------------------

struct Daemon {
  pid_t pid = -1;
  int out = -1;
  ~Daemon() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
    if (out >= 0) close(out);
  }
};

// Starts farmemd with `args`; returns the first `want` lines of its stdout.
std::vector<std::string> start_farmemd(Daemon* d, const std::vector<std::string>& args, int want) {
  int p[2];
  if (pipe(p) != 0) return {};
  d->pid = fork();
  if (d->pid == 0) {
    dup2(p[1], 1);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    close(p[0]);
    std::vector<char*> argv{const_cast<char*>(FARMEMD_PATH)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(FARMEMD_PATH, argv.data());
    _exit(127);
  }
  close(p[1]);
  d->out = p[0];
  std::vector<std::string> lines;
  std::string cur;
  char c;
  while (static_cast<int>(lines.size()) < want && read(d->out, &c, 1) == 1) {
    if (c == '\n') {
      lines.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return lines;
}

TEST(FarmemdMetricsFlag, ServesMetricsOnLoopbackByDefault) {
  Daemon d;
  auto lines = start_farmemd(&d,
                             {"--insecure", "--listen", "127.0.0.1:0", "--capacity", "8M",
                              "--slab-size", "1M", "--metrics-listen", "0", "--log-level", "error"},
                             2);
  ASSERT_EQ(lines.size(), 2u);
  const std::string prefix = "farmemd metrics at http://127.0.0.1:";
  ASSERT_TRUE(lines[1].starts_with(prefix)) << lines[1];
  uint16_t port = static_cast<uint16_t>(std::stoul(lines[1].substr(prefix.size())));
  auto fd = tcp_connect({"127.0.0.1", port}, 2000);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  (void)set_socket_timeouts(fd->get(), 5000, 5000);
  const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
  ASSERT_EQ(send_all(fd->get(), req.data(), req.size()), Errc::kOk);
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd->get(), buf, sizeof buf, 0)) > 0) resp.append(buf, static_cast<size_t>(n));
  ASSERT_TRUE(resp.starts_with("HTTP/1.0 200 OK")) << resp;
  PromPage page;
  ASSERT_EQ(parse_prometheus(resp.substr(resp.find("\r\n\r\n") + 4), &page), "");
  EXPECT_EQ(page.value("farmem_donor_capacity_bytes"), 8.0 * kSlab);
}

TEST(FarmemdMetricsFlag, BadAddressIsAUsageError) {
  Daemon d;
  start_farmemd(&d, {"--insecure", "--listen", "127.0.0.1:0", "--metrics-listen", "host:notaport"},
                0);
  int status = 0;
  ASSERT_EQ(waitpid(d.pid, &status, 0), d.pid);
  d.pid = -1;
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
}

}  // namespace
}  // namespace farmem
