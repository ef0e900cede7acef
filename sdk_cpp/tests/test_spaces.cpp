// Unit tests of space parsing, writing and membership.
#include <cmath>
#include <vector>

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

TEST(Spaces, ByteBoxes) {
  // 1.4 (§8.1, §8.4): dtype "uint8" makes a byte box, bounds within [0, 255].
  Result<Space> image = Space::from_json(
      nlohmann::json::parse(R"({"type":"Box","shape":[84,84,4],"dtype":"uint8","low":0,"high":255})"));
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  EXPECT_TRUE(image.value().is_bytes());
  EXPECT_EQ(image.value().to_json()["dtype"], "uint8");
  EXPECT_TRUE(Space::from_json(image.value().to_json()).value().is_bytes());
  EXPECT_FALSE(Space::box({2}, 0, 255).value().is_bytes());  // float32
  EXPECT_FALSE(Space::discrete(256).value().is_bytes());
  auto code = [](const char* text) { return Space::from_json(nlohmann::json::parse(text)).status().code(); };
  EXPECT_EQ(code(R"({"type":"Box","shape":[2],"dtype":"uint8"})"), ErrorCode::kInvalidField);  // -inf..inf
  EXPECT_EQ(code(R"({"type":"Box","shape":[2],"dtype":"uint8","low":[0,-0.5],"high":255})"), ErrorCode::kInvalidField);
  EXPECT_EQ(code(R"({"type":"Box","shape":[2],"dtype":"uint8","low":0,"high":[255,"inf"]})"), ErrorCode::kInvalidField);
  EXPECT_EQ(code(R"({"type":"Box","shape":[2],"dtype":null})"), ErrorCode::kInvalidField);
  EXPECT_EQ(code(R"({"type":"Box","shape":[2],"dtype":["uint8"]})"), ErrorCode::kInvalidField);
  // Another dtype is informational: handled as float32, bounds unchecked.
  EXPECT_TRUE(Space::from_json(nlohmann::json::parse(R"({"type":"Box","shape":[2],"dtype":"int16"})")).ok());
  EXPECT_EQ(Space::box({2}, {0, 0}, {255, 256}, "uint8").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Space::box({2}, {0, 10}, {255, 20}, "uint8").value().is_bytes());
  // A byte box is another space than a float box of the same bounds (rows kept across a reconnect
  // are dropped when one becomes the other); other dtypes are float32 alike.
  EXPECT_FALSE(Space::box({2}, {0, 0}, {255, 255}, "uint8").value() == Space::box({2}, 0, 255).value());
  EXPECT_TRUE(Space::box({2}, {0, 0}, {255, 255}, "uint8").value() == Space::box({2}, {0, 0}, {255, 255}, "uint8").value());
  EXPECT_TRUE(Space::box({2}, {0, 0}, {255, 255}, "int16").value() == Space::box({2}, 0, 255).value());
}

TEST(Spaces, FirstNonByte) {
  const float good[4] = {0.0f, 7.0f, 128.0f, 255.0f};
  EXPECT_EQ(first_non_byte(good, 4), 4u);
  EXPECT_EQ(first_non_byte(nullptr, 0), 0u);
  for (float bad : {-1.0f, 256.0f, 0.5f, 254.999f, -0.0001f, std::nanf(""), INFINITY}) {
    const float values[3] = {1.0f, bad, 2.5f};
    EXPECT_EQ(first_non_byte(values, 3), 1u) << bad;
  }
}

TEST(Spaces, FirstNonByteOfALongRowAtEveryPosition) {
  // Rows longer than 16 values are checked 16 at a time: each position must still be found.
  std::vector<float> row(53);
  for (std::size_t i = 0; i < row.size(); ++i) row[i] = static_cast<float>((i * 37) % 256);
  row[0] = -0.0f;  // (accepted, as the scalar check does)
  EXPECT_EQ(first_non_byte(row.data(), row.size()), row.size());
  for (float bad : {-1.0f, 256.0f, 0.5f, 254.999f, 8388609.0f, std::nanf(""), INFINITY, -INFINITY}) {
    for (std::size_t at = 0; at < row.size(); ++at) {
      std::vector<float> values = row;
      values[at] = bad;
      values[row.size() - 1] = 3.5f;  // a later bad value is not the first
      if (at == row.size() - 1) values[at] = bad;
      EXPECT_EQ(first_non_byte(values.data(), values.size()), at) << bad << " at " << at;
    }
  }
}

}  // namespace
}  // namespace tether
