// RegistrationTable (runtime/registration_table.h), the buffer table of
// every Transport backend: what it refuses, what find() covers at the
// edges, erase by start only, and the extra datum handed back.
#include "runtime/registration_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace farmem {
namespace {

class RegistrationTableTest : public ::testing::Test {
 protected:
  // One arena: the table never dereferences, but addresses must be real
  // enough not to wrap.
  std::vector<char> arena_ = std::vector<char>(1 << 16);
  char* at(size_t off) { return arena_.data() + off; }
};

TEST_F(RegistrationTableTest, RefusesNullZeroWrapAndOverlap) {
  RegistrationTable<> t;
  EXPECT_EQ(t.insert(nullptr, 10).code(), Errc::kInvalidArgument);
  EXPECT_EQ(t.insert(at(0), 0).code(), Errc::kInvalidArgument);
  EXPECT_EQ(t.insert(reinterpret_cast<void*>(~uintptr_t{0} - 10), 100).code(),
            Errc::kInvalidArgument);
  ASSERT_TRUE(t.insert(at(4096), 4096).ok());
  // The same range, inside it, straddling either end, covering it.
  EXPECT_EQ(t.insert(at(4096), 4096).code(), Errc::kInvalidArgument);
  EXPECT_EQ(t.insert(at(5000), 10).code(), Errc::kInvalidArgument);
  EXPECT_EQ(t.insert(at(4095), 2).code(), Errc::kInvalidArgument);
  EXPECT_EQ(t.insert(at(8191), 2).code(), Errc::kInvalidArgument);
  EXPECT_EQ(t.insert(at(0), 3 * 4096).code(), Errc::kInvalidArgument);
  Status st = t.insert(at(100), 4000);
  EXPECT_EQ(st.code(), Errc::kInvalidArgument);
  EXPECT_NE(st.message().find("overlaps the registered buffer"), std::string::npos)
      << st.to_string();
  EXPECT_EQ(t.size(), 1u);
  // Touching ranges on both sides are fine.
  EXPECT_TRUE(t.insert(at(0), 4096).ok());
  EXPECT_TRUE(t.insert(at(8192), 4096).ok());
  EXPECT_EQ(t.size(), 3u);
  // check_insert refuses the same things and changes nothing.
  EXPECT_EQ(t.check_insert(at(4096), 1).code(), Errc::kInvalidArgument);
  EXPECT_TRUE(t.check_insert(at(3 * 4096), 1).ok());
  EXPECT_EQ(t.size(), 3u);
}

TEST_F(RegistrationTableTest, FindCoversWholeRangesOnly) {
  RegistrationTable<int> t;
  ASSERT_TRUE(t.insert(at(4096), 4096, 7).ok());
  ASSERT_TRUE(t.insert(at(3 * 4096), 100, 9).ok());
  const auto* e = t.find(at(4096), 4096);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->extra, 7);
  EXPECT_EQ(e->begin, reinterpret_cast<uintptr_t>(at(4096)));
  ASSERT_NE(t.find(at(8191), 1), nullptr);
  EXPECT_EQ(t.find(at(8191), 2), nullptr);  // runs past the end
  EXPECT_EQ(t.find(at(4095), 1), nullptr);  // before the start
  EXPECT_EQ(t.find(at(8192), 1), nullptr);  // the gap
  EXPECT_EQ(t.find(at(4096), 0), nullptr);  // empty
  EXPECT_EQ(t.find(at(4096), ~size_t{0}), nullptr);
  e = t.find(at(3 * 4096 + 99), 1);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->extra, 9);
  EXPECT_EQ(t.find(at(3 * 4096 + 100), 1), nullptr);
}

TEST_F(RegistrationTableTest, EraseTakesTheStartAndHandsBackTheExtra) {
  RegistrationTable<int> t;
  ASSERT_TRUE(t.insert(at(4096), 4096, 7).ok());
  ASSERT_TRUE(t.insert(at(0), 4096, 5).ok());
  int got = 0;
  EXPECT_EQ(t.erase(at(4097), &got).code(), Errc::kNotFound);
  EXPECT_EQ(t.erase(at(8192)).code(), Errc::kNotFound);
  EXPECT_EQ(got, 0);
  ASSERT_TRUE(t.erase(at(4096), &got).ok());
  EXPECT_EQ(got, 7);
  EXPECT_EQ(t.find(at(4096), 1), nullptr);
  EXPECT_EQ(t.erase(at(4096)).code(), Errc::kNotFound);
  ASSERT_NE(t.find(at(0), 4096), nullptr);
  // The freed range can be registered again, with a new datum.
  ASSERT_TRUE(t.insert(at(4096), 8192, 8).ok());
  ASSERT_EQ(t.entries().size(), 2u);
  EXPECT_EQ(t.entries()[0].extra, 5);  // sorted by start
  EXPECT_EQ(t.entries()[1].extra, 8);
  // A copy is independent (tcp and verbs publish copies).
  RegistrationTable<int> copy = t;
  ASSERT_TRUE(copy.erase(at(0)).ok());
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(copy.size(), 1u);
}

}  // namespace
}  // namespace farmem
