// Unit tests of glob matching, FNV-1a and the rule list.
#include <gtest/gtest.h>

#include "tether/policy_mapping.h"

namespace tether {
namespace {

TEST(PolicyMapping, GlobLikeFnmatch) {
  EXPECT_TRUE(glob_match("adversary_*", "adversary_12"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("a*b*c", "axxbyyc"));
  EXPECT_FALSE(glob_match("a*b*c", "axxbyy"));
  EXPECT_TRUE(glob_match("good_?", "good_1"));
  EXPECT_FALSE(glob_match("good_?", "good_10"));
  EXPECT_TRUE(glob_match("good_?", "good_\xc3\xa9"));  // ? is one code point
  EXPECT_TRUE(glob_match("car_[0-9]", "car_3"));
  EXPECT_FALSE(glob_match("car_[0-9]", "car_x"));
  EXPECT_TRUE(glob_match("car_[!0-9]", "car_x"));
  EXPECT_TRUE(glob_match("[]]", "]"));
  EXPECT_TRUE(glob_match("a[", "a["));  // unclosed bracket is literal
  EXPECT_TRUE(glob_match("[a-]", "-"));
  EXPECT_FALSE(glob_match("Agent", "agent"));  // case-sensitive
}

TEST(PolicyMapping, Fnv1a) {
  EXPECT_EQ(fnv1a32(""), 2166136261u);
  EXPECT_EQ(fnv1a32("foobar"), 3214735720u);
}

TEST(PolicyMapping, RulesAndRefusals) {
  auto rules = nlohmann::json::parse(
      R"([{"agent_id":"x","module":"m1"},{"pattern":"*","choose_from":["a","b"]}])");
  PolicyMapping mapping = PolicyMapping::from_json(rules).value();
  EXPECT_EQ(mapping.module_for("x").value(), "m1");
  const std::string chosen = mapping.module_for("y", "ep").value();
  EXPECT_TRUE(chosen == "a" || chosen == "b");
  EXPECT_EQ(mapping.module_for("y", "ep").value(), chosen);  // stable
  EXPECT_EQ(mapping.to_json(), rules);
  EXPECT_EQ(mapping.modules(), (std::set<std::string>{"m1", "a", "b"}));
  for (const char* bad : {R"({})", R"([{"agent_id":"a"}])", R"([{"agent_id":"a","pattern":"b","module":"m"}])",
                          R"([{"agent_id":"a","module":"m","extra":1}])", R"([{"agent_id":1,"module":"m"}])",
                          R"([{"pattern":"*","choose_from":[1]}])", R"([3])"}) {
    EXPECT_EQ(PolicyMapping::from_json(nlohmann::json::parse(bad)).status().code(), ErrorCode::kInvalidField) << bad;
  }
  EXPECT_EQ(PolicyMapping().module_for("a").status().code(), ErrorCode::kUnmappedAgent);
}

}  // namespace
}  // namespace tether
