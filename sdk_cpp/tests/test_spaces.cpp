// Unit tests of space parsing, writing and membership.
#include <cmath>

#include <gtest/gtest.h>

#include "tether/spaces.h"

namespace tether {
namespace {

TEST(Spaces, BoxBoundsAndInfinity) {
  Result<Space> s = Space::from_json(nlohmann::json::parse(
      R"({"type":"Box","shape":[2],"low":[-1,"-inf"],"high":["inf",2.5]})"));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s.value().kind(), SpaceKind::kBox);
  EXPECT_TRUE(std::isinf(s.value().low()[1]));
  EXPECT_EQ(s.value().dist_inputs_size(), 4u);
  nlohmann::json back = s.value().to_json();
  EXPECT_EQ(back["low"], nlohmann::json::parse(R"([-1,"-inf"])"));
  EXPECT_EQ(back["high"], nlohmann::json::parse(R"(["inf",2.5])"));
  EXPECT_EQ(Space::from_json(back).value(), s.value());
  double inside[2] = {1e30, -1e30};
  double outside[2] = {-1.5, 0.0};
  EXPECT_TRUE(s.value().contains(inside, 2));
  EXPECT_FALSE(s.value().contains(outside, 2));
  EXPECT_FALSE(s.value().contains(inside, 1));
}

TEST(Spaces, BoxFloat32Comparison) {
  Space s = Space::box({1}, -0.1, 0.1).value();
  double v = static_cast<double>(0.1f);  // 0.100000001
  EXPECT_TRUE(s.contains(&v, 1));
}

TEST(Spaces, DiscreteAndMultiDiscrete) {
  Space d = Space::from_json(nlohmann::json::parse(R"({"type":"Discrete","n":3,"start":-1})")).value();
  EXPECT_TRUE(d.shape().empty());
  EXPECT_EQ(d.flat_dim(), 1u);
  double ok = 1, bad = 2, frac = 0.5;
  EXPECT_TRUE(d.contains(&ok, 1));
  EXPECT_FALSE(d.contains(&bad, 1));
  EXPECT_FALSE(d.contains(&frac, 1));
  Space m = Space::from_json(nlohmann::json::parse(R"({"type":"MultiDiscrete","nvec":[3,2]})")).value();
  EXPECT_EQ(m.dist_inputs_size(), 5u);
  double a[2] = {2, 1}, b[2] = {2, 2};
  EXPECT_TRUE(m.contains(a, 2));
  EXPECT_FALSE(m.contains(b, 2));
  EXPECT_EQ(m.to_json(), nlohmann::json::parse(R"({"type":"MultiDiscrete","nvec":[3,2]})"));
}

TEST(Spaces, Refusals) {
  for (const char* text : {R"({"type":"Discrete","n":true})", R"({"type":"Box","shape":[-1]})",
                           R"({"type":"Box","shape":"x"})", R"({"type":"MultiDiscrete","nvec":[0]})",
                           R"({"type":"MultiDiscrete"})", R"({"n":2})", R"(null)"}) {
    EXPECT_EQ(Space::from_json(nlohmann::json::parse(text)).status().code(), ErrorCode::kInvalidField) << text;
  }
  EXPECT_FALSE(Space::discrete(0).ok());
  EXPECT_FALSE(Space::box({2}, {0.0}, {1.0, 1.0}).ok());
}

}  // namespace
}  // namespace tether
