#include "runtime/parse.h"

#include <gtest/gtest.h>

namespace farmem {
namespace {

TEST(Parse, Sizes) {
  EXPECT_EQ(*parse_size("4096", "x"), 4096u);
  EXPECT_EQ(*parse_size("64K", "x"), 64u << 10);
  EXPECT_EQ(*parse_size("64KiB", "x"), 64u << 10);
  EXPECT_EQ(*parse_size("512m", "x"), 512u << 20);
  EXPECT_EQ(*parse_size("2G", "x"), 2ull << 30);
  EXPECT_EQ(*parse_size(" 1T ", "x"), 1ull << 40);
  for (const char* bad : {"", "G", "-1", "12Q", "1.5G", "99999999999999999999", "16777216T"}) {
    auto r = parse_size(bad, "--capacity");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--capacity"), std::string::npos);
  }
}

TEST(Parse, Percent) {
  EXPECT_EQ(*parse_size_or_percent("25%", "x", 1000), 250u);
  EXPECT_EQ(*parse_size_or_percent("1G", "x", 1000), 1u << 30);
  EXPECT_FALSE(parse_size_or_percent("0%", "x", 1000).ok());
  EXPECT_FALSE(parse_size_or_percent("101%", "x", 1000).ok());
}

TEST(Parse, Durations) {
  EXPECT_EQ(*parse_duration_ms("1500", "x"), 1500u);
  EXPECT_EQ(*parse_duration_ms("2s", "x"), 2000u);
  EXPECT_EQ(*parse_duration_ms("1m", "x"), 60000u);
  EXPECT_FALSE(parse_duration_ms("2h", "x").ok());
}

TEST(Parse, Endpoints) {
  auto e = parse_endpoint("127.0.0.1:7400", "x");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 7400);
  e = parse_endpoint("[::1]:80", "x");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->to_string(), "[::1]:80");
  e = parse_endpoint("donor", "x", 7400);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->port, 7400);
  for (const char* bad : {"", ":80", "h:0", "h:65536", "h:x", "a b:1", "[::1", "::1:80"})
    EXPECT_FALSE(parse_endpoint(bad, "x").ok()) << bad;
  auto l = parse_endpoint_list("a:1, b:2,c:3", "FARMEM_SERVERS");
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 3u);
  EXPECT_EQ((*l)[2].host, "c");
  EXPECT_FALSE(parse_endpoint_list(",", "FARMEM_SERVERS").ok());
}

}  // namespace
}  // namespace farmem
