// FARMEM_TRANSPORT on the client: the names it takes, and FarRuntime's
// choice on a host without RDMA: auto runs over tcp and says so in one info
// line; verbs is a start-up error naming the reason and FARMEM_TRANSPORT=tcp.
// (tests/softroce/pager_verbs_test.cc checks that auto picks verbs where an
// RDMA device reaches the donor.)
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <string>

#include "allocator/far_runtime.h"
#include "allocator/options.h"
#include "pager/uffd.h"
#include "runtime/donor_server.h"
#include "runtime/log.h"
#if defined(FARMEM_HAVE_VERBS)
#include "runtime/verbs_transport.h"
#endif

namespace farmem {
namespace {

// Sets FARMEM_TRANSPORT for one scope; restores "unset" after.
class ScopedTransportEnv {
 public:
  explicit ScopedTransportEnv(const char* v) {
    if (v) {
      setenv("FARMEM_TRANSPORT", v, 1);
    } else {
      unsetenv("FARMEM_TRANSPORT");
    }
  }
  ~ScopedTransportEnv() { unsetenv("FARMEM_TRANSPORT"); }
};

TEST(FarTransportTest, EnvNames) {
  struct {
    const char* env;
    FarTransport want;
  } cases[] = {{nullptr, FarTransport::kAuto},
               {"auto", FarTransport::kAuto},
               {"tcp", FarTransport::kTcp},
               {"verbs", FarTransport::kVerbs},
               {"loopback", FarTransport::kLoopback}};
  for (const auto& c : cases) {
    ScopedTransportEnv env(c.env);
    auto o = options_from_env();
    ASSERT_TRUE(o.ok()) << (c.env ? c.env : "(unset)") << ": " << o.status().to_string();
    EXPECT_EQ(o->transport, c.want) << (c.env ? c.env : "(unset)");
  }
  ScopedTransportEnv env("rdma");
  auto o = options_from_env();
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(o.status().message().find("auto, tcp, verbs or loopback"), std::string::npos)
      << o.status().to_string();
}

TEST(FarTransportTest, EnvTableDocumentsAuto) {
  bool found = false;
  for (const EnvVar& v : env_table()) {
    if (strcmp(v.name, "FARMEM_TRANSPORT") != 0) continue;
    found = true;
    EXPECT_STREQ(v.def, "auto");
    EXPECT_NE(strstr(v.doc, "verbs"), nullptr) << v.doc;
  }
  EXPECT_TRUE(found);
}

TEST(FarTransportTest, VerbsForcedWithoutRdmaIsAStartupError) {
  FarOptions o;
  o.transport = FarTransport::kVerbs;
  o.servers = {{"127.0.0.1", 7400}};
  o.stats_socket = false;
#if defined(FARMEM_HAVE_VERBS)
  std::string why;
  if (verbs::reachable("127.0.0.1", &why))
    GTEST_SKIP() << "an RDMA device reaches 127.0.0.1 here (" << why << ")";
  const char* reason = "no RDMA device reaches donor 127.0.0.1:7400";
#else
  const char* reason = "built without rdma-core";
#endif
  auto rt = FarRuntime::start(o);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), Errc::kUnavailable);
  const std::string msg = rt.status().message();
  EXPECT_NE(msg.find("FARMEM_TRANSPORT=verbs"), std::string::npos) << msg;
  EXPECT_NE(msg.find(reason), std::string::npos) << msg;
  EXPECT_NE(msg.find("set FARMEM_TRANSPORT=tcp"), std::string::npos) << msg;
}

TEST(FarTransportTest, AutoPicksTcpAndLogsIt) {
  std::string why = Uffd::unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "userfaultfd unavailable here: " << why;
#if defined(FARMEM_HAVE_VERBS)
  if (verbs::reachable("127.0.0.1", &why))
    GTEST_SKIP() << "an RDMA device reaches 127.0.0.1 here (" << why << ")";
#endif
  DonorOptions d;
  d.listen = {"127.0.0.1", 0};
  d.capacity = 16ull << 20;
  d.slab_size = 1ull << 20;
  d.insecure = true;
  d.try_hugepages = false;
  d.transport = DonorTransportMode::kTcp;
  auto srv = DonorServer::start(d);
  ASSERT_TRUE(srv.ok()) << srv.status().to_string();

  FarOptions o;  // transport: auto by default
  ASSERT_EQ(o.transport, FarTransport::kAuto);
  o.servers = {{"127.0.0.1", (*srv)->port()}};
  o.pager.local_budget = 2ull << 20;
  o.pager.handler_threads = 1;
  o.stats_socket = false;
  const LogLevel level = log_level();
  set_log_level(LogLevel::kInfo);
  ::testing::internal::CaptureStderr();
  auto rt = FarRuntime::start(o);
  const std::string log = ::testing::internal::GetCapturedStderr();
  set_log_level(level);
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  EXPECT_EQ((*rt)->describe().rfind("tcp: ", 0), 0u) << (*rt)->describe();
  EXPECT_NE(log.find("transport auto: tcp"), std::string::npos) << log;
  // Exactly one line about the choice.
  size_t lines = 0;
  for (size_t p = log.find("transport auto:"); p != std::string::npos;
       p = log.find("transport auto:", p + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << log;

  // The heap works over the chosen path: bytes written come back.
  auto* p = static_cast<uint8_t*>((*rt)->heap().alloc(1 << 20));
  ASSERT_NE(p, nullptr);
  for (size_t i = 0; i < (1 << 20); ++i) p[i] = static_cast<uint8_t>(i * 7);
  size_t bad = 0;
  for (size_t i = 0; i < (1 << 20); ++i) bad += p[i] != static_cast<uint8_t>(i * 7);
  EXPECT_EQ(bad, 0u);
  (*rt)->heap().free(p);
  rt->reset();
  (*srv)->stop();
}

}  // namespace
}  // namespace farmem
