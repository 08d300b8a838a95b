// The C++ API (farmem.hpp): RAII runtime, far_allocator with STL
// containers, far_ptr / make_far.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "farmem/farmem.hpp"
#include "pager/uffd.h"

namespace {

fm_config loopback(uint64_t local_mem) {
  fm_config c;
  fm_config_init(&c);
  c.transport = "loopback";
  c.loopback_capacity = 256ull << 20;
  c.local_mem = local_mem;
  c.pager_threads = 2;
  return c;
}

TEST(FarCpp, RuntimeErrorsThrowWithTheReason) {
  fm_config c;
  fm_config_init(&c);
  c.transport = "nope";
  try {
    farmem::Runtime rt(c);
    FAIL() << "constructed";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), EINVAL);
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fm_is_running());
}

TEST(FarCpp, VectorLivesInFarMemory) {
  std::string why = farmem::Uffd::unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "userfaultfd unavailable here: " << why;
  farmem::Runtime rt(loopback(8 << 20));
  {
    std::vector<uint64_t, farmem::far_allocator<uint64_t>> v;
    for (uint64_t i = 0; i < (2u << 20); ++i) v.push_back(i * 0x9e3779b97f4a7c15ull);  // 16 MiB
    EXPECT_TRUE(fm_is_far(v.data()));
    for (uint64_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], i * 0x9e3779b97f4a7c15ull);
    fm_stats_t s = rt.stats();
    EXPECT_GT(s.evictions_dirty, 0u) << "16 MiB through an 8 MiB budget";
    EXPECT_LE(s.resident_peak_bytes, 8u << 20);

    std::map<int, std::string, std::less<>,
             farmem::far_allocator<std::pair<const int, std::string>>>
        m;
    for (int i = 0; i < 1000; ++i) m.emplace(i, std::to_string(i * 3));
    EXPECT_TRUE(fm_is_far(&*m.begin()));
    EXPECT_EQ(m.at(777), "2331");
  }
  EXPECT_EQ(rt.stats().far_allocated, 0u) << "containers gave everything back";
}

struct alignas(256) Node {
  Node(int a, std::string b) : x(a), name(std::move(b)) {}
  int x;
  std::string name;
};

TEST(FarCpp, FarPtrOwnsOneObject) {
  std::string why = farmem::Uffd::unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "userfaultfd unavailable here: " << why;
  farmem::Runtime rt(loopback(8 << 20));
  {
    farmem::far_ptr<Node> n = farmem::make_far<Node>(42, "answer");
    EXPECT_TRUE(fm_is_far(n.get()));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(n.get()) % 256, 0u);
    EXPECT_EQ(n->x, 42);
    EXPECT_EQ(n->name, "answer");
    EXPECT_GT(rt.stats().far_allocated, 0u);
  }
  EXPECT_EQ(rt.stats().far_allocated, 0u);
}

}  // namespace
