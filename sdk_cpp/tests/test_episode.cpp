// Unit tests of record building and validation, groups and value_obs rows.
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "tether/episode.h"
#include "tether/messages.h"
#include "tether/tensors.h"

namespace tether {
namespace {

Space box(std::vector<std::int64_t> shape, double lo, double hi) { return Space::box(std::move(shape), lo, hi).value(); }

EpisodeChunk two_steps() {
  EpisodeChunk c;
  c.obs = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};  // 3 rows of 2
  c.actions = {1, 0};
  c.rewards = {1.0f, 0.5f};
  c.action_logp = {-0.69, -0.7};
  c.action_dist_inputs = {0.1f, -0.1f, 0.2f, -0.2f};
  c.is_truncated = true;
  c.episode_id = "ep-1";
  return c;
}

TEST(Episode, EncodesAndValidatesSingleAgent) {
  const Space obs = box({2}, -1, 1);
  const Space act = Space::discrete(2).value();
  Result<nlohmann::json> record = encode_episode(two_steps(), obs, act);
  ASSERT_TRUE(record.ok()) << record.status().to_string();
  const std::string text = encode_message(record.value());
  EXPECT_NE(text.find("\"obs\":[[0.1,0.2],[0.3,0.4],[0.5,0.6]]"), std::string::npos) << text;
  EXPECT_NE(text.find("\"actions\":[1,0]"), std::string::npos) << text;
  EXPECT_EQ(record.value()["episode_id"], "ep-1");
  EXPECT_EQ(validate_episode(record.value(), 0, obs, act, true).value(), 2u);
  nlohmann::json message = {{"type", "EPISODES"}, {"episodes", {record.value(), record.value()}}};
  EXPECT_EQ(validate_episodes(message, obs, act, true).value(), 4u);
}

TEST(Episode, NestedShapesAndBoxActions) {
  const Space obs = box({2, 2}, -5, 5);
  const Space act = box({1}, -1, 1);
  EpisodeChunk c;
  c.obs = {1, 2, 3, 4, 5, 6, 7, 8};
  c.actions = {1.5};  // a raw sample outside the box is valid (1.3)
  c.rewards = {0};
  nlohmann::json record = encode_episode(c, obs, act).value();
  EXPECT_EQ(record["obs"], nlohmann::json::parse("[[[1.0,2.0],[3.0,4.0]],[[5.0,6.0],[7.0,8.0]]]"));
  EXPECT_EQ(validate_episode(record, 0, obs, act, false).value(), 1u);
  EXPECT_EQ(validate_episode(record, 0, obs, act, true).status().code(), ErrorCode::kMissingActionLogp);
  c.obs.pop_back();
  EXPECT_EQ(encode_episode(c, obs, act).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Episode, ValidationCodes) {
  const Space obs = box({2}, -1, 1);
  const Space act = Space::discrete(2).value();
  nlohmann::json good = encode_episode(two_steps(), obs, act).value();
  auto code = [&](nlohmann::json r) { return validate_episode(r, 0, obs, act, true).status().code(); };
  nlohmann::json r = good;
  r["actions"] = {1, 2};
  EXPECT_EQ(code(r), ErrorCode::kActionOutOfSpace);
  r = good;
  r["obs"][1] = {0.1};
  EXPECT_EQ(code(r), ErrorCode::kObsShapeMismatch);
  r = good;
  r["rewards"] = {1e39, 0};  // overflows float32
  EXPECT_EQ(code(r), ErrorCode::kNonFiniteValue);
  r = good;
  r["is_terminated"] = 0;
  EXPECT_EQ(code(r), ErrorCode::kInvalidField);
  r = good;
  r["action_dist_inputs"] = {{0.1}, {0.2}};
  EXPECT_EQ(code(r), ErrorCode::kEpisodeLengthMismatch);
  r = good;
  r["episode_id"] = {1};
  EXPECT_EQ(code(r), ErrorCode::kInvalidField);
}

TEST(Episode, MultiAgentRecord) {
  std::map<std::string, ModuleSpec> modules;
  modules["m"] = ModuleSpec::from_json("m", nlohmann::json::parse(
      R"({"observation_space":{"type":"Box","shape":[2]},"action_space":{"type":"Discrete","n":2},
          "value_obs_agents":["a","b"]})")).value();
  EXPECT_EQ(modules["m"].value_obs_dim(), 4u);
  MultiAgentRecord record;
  record.episode_id = "e";
  AgentEntry entry;
  entry.module = "m";
  entry.start_step = 3;
  entry.chunk = two_steps();
  entry.value_obs.assign(3 * 4, 0.25f);
  record.agents.emplace_back("a", entry);
  Result<nlohmann::json> json = encode_multi_agent_record(record, modules);
  ASSERT_TRUE(json.ok()) << json.status().to_string();
  EXPECT_EQ(json.value()["agents"]["a"]["start_step"], 3);
  EXPECT_FALSE(json.value()["agents"]["a"].contains("episode_id"));
  EXPECT_EQ(validate_multi_agent_record(json.value(), 0, modules, true).value(), 2u);
  record.agents[0].second.value_obs.pop_back();
  EXPECT_EQ(encode_multi_agent_record(record, modules).status().code(), ErrorCode::kInvalidArgument);
  record.agents[0].second.module = "nope";
  EXPECT_EQ(encode_multi_agent_record(record, modules).status().code(), ErrorCode::kUnknownModule);
}

// weights_seq_no_runs (§10.1): written when set, refused by the encoder
// when it does not cover the steps, and its counts summed without overflow.
TEST(Episode, WeightsSeqNoRuns) {
  const Space obs = box({2}, -1, 1);
  const Space act = Space::discrete(2).value();
  EpisodeChunk c = two_steps();
  EXPECT_FALSE(encode_episode(c, obs, act).value().contains("weights_seq_no_runs"));
  c.weights_seq_no_runs = {{3, 1}, {kMaxRunVersion, 1}};
  nlohmann::json good = encode_episode(c, obs, act).value();
  EXPECT_EQ(good["weights_seq_no_runs"], nlohmann::json::parse("[[3, 1], [2147483647, 1]]"));
  EXPECT_EQ(validate_episode(good, 0, obs, act, true).value(), 2u);
  for (const auto& bad : std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>{
           {{3, 1}}, {{3, 3}}, {{3, 1}, {4, 0}, {5, 1}}, {{-1, 2}}, {{kMaxRunVersion + 1, 2}}}) {
    c.weights_seq_no_runs = bad;
    EXPECT_EQ(encode_episode(c, obs, act).status().code(), ErrorCode::kInvalidArgument);
  }
  c.clear();
  EXPECT_TRUE(c.weights_seq_no_runs.empty());
  auto code = [&](const char* runs) {
    nlohmann::json r = good;
    r["weights_seq_no_runs"] = nlohmann::json::parse(runs);
    Result<std::size_t> steps = validate_episode(r, 0, obs, act, true);
    return steps.ok() ? ErrorCode::kOk : steps.status().code();
  };
  EXPECT_EQ(code("null"), ErrorCode::kOk);
  EXPECT_EQ(code("[[0, 2]]"), ErrorCode::kOk);
  // Counts that wrap around 2^64 (or 2^63) when summed must not add up to T.
  EXPECT_EQ(code("[[0, 18446744073709551615], [1, 3]]"), ErrorCode::kEpisodeLengthMismatch);
  EXPECT_EQ(code("[[0, 9223372036854775807], [1, 9223372036854775807], [2, 4]]"),
            ErrorCode::kEpisodeLengthMismatch);
  EXPECT_EQ(code("[[0, 1], [1, 18446744073709551615]]"), ErrorCode::kEpisodeLengthMismatch);
  EXPECT_EQ(code("[[18446744073709551615, 2]]"), ErrorCode::kInvalidField);
  EXPECT_EQ(code("[[0, -18446744073709551615]]"), ErrorCode::kInvalidField);  // (a float: too big for int64)
  // Every pair is checked (18a) before the counts are summed (18b).
  EXPECT_EQ(code("[[0, 5], [1, true]]"), ErrorCode::kInvalidField);
  // Checked after the existing checks 1-17.
  nlohmann::json r = good;
  r["weights_seq_no_runs"] = "bad";
  r["action_logp"] = {0.1};
  EXPECT_EQ(validate_episode(r, 0, obs, act, true).status().code(), ErrorCode::kEpisodeLengthMismatch);
}

TEST(Episode, GroupsAndValueObs) {
  GroupSpec g = GroupSpec::from_json("g", nlohmann::json::parse(R"({"members":["x","y"],"reward":"mean"})")).value();
  EXPECT_DOUBLE_EQ(g.combine_rewards({1.0, 2.0, 3.0}), 3.0);
  std::vector<std::vector<double>> parts;
  EXPECT_FALSE(g.split_action({1, 2, 3}, parts).ok());
  ASSERT_TRUE(g.split_action({1, 2}, parts).ok());
  EXPECT_EQ(member_action_to_json(parts[0], true), 1);
  EXPECT_TRUE(member_action_to_json(parts[0], false).is_array());
  std::vector<float> joined;
  EXPECT_FALSE(g.join_observations({{"x", {1.0f}}}, joined).ok());
  EXPECT_FALSE(GroupSpec::from_json("g", nlohmann::json::parse(R"({"members":["x","x"]})")).ok());
  EXPECT_FALSE(GroupSpec::from_json("g", nlohmann::json::parse(R"({"members":["x"],"reward":"max"})")).ok());
  float row[4];
  ASSERT_TRUE(value_obs_row({"b", "a"}, {{"a", {1, 2}}}, 2, row).ok());
  EXPECT_EQ(std::vector<float>(row, row + 4), (std::vector<float>{0, 0, 1, 2}));
  EXPECT_FALSE(value_obs_row({"a"}, {{"a", {1}}}, 2, row).ok());
}

// 1.4: a byte box (§8.1) records its observations as JSON integers; the
// validator reads "obs" as a tensor (§10.9) in the attachment or inline, and
// checks 4 and 11b come in the order of §10.6.
Space image_space() {
  return Space::from_json(
             nlohmann::json::parse(R"({"type":"Box","shape":[2,2,1],"dtype":"uint8","low":0,"high":255})"))
      .value();
}

EpisodeChunk image_steps() {
  EpisodeChunk c;
  c.obs = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255};  // 3 images of 2x2x1
  c.actions = {1, 0};
  c.rewards = {1.0f, 0.5f};
  c.action_logp = {-0.69, -0.7};
  return c;
}

TEST(Episode, ByteBoxObservationsAreIntegers) {
  const Space obs = image_space();
  const Space act = Space::discrete(2).value();
  Result<nlohmann::json> record = encode_episode(image_steps(), obs, act);
  ASSERT_TRUE(record.ok()) << record.status().to_string();
  EXPECT_NE(encode_message(record.value()).find("\"obs\":[[[[0],[1]],[[2],[3]]],"), std::string::npos)
      << encode_message(record.value());
  EXPECT_EQ(validate_episode(record.value(), 0, obs, act, true).value(), 2u);
  EpisodeChunk fraction = image_steps();
  fraction.obs[5] = 4.5f;
  Result<nlohmann::json> refused = encode_episode(fraction, obs, act);
  EXPECT_EQ(refused.status().code(), ErrorCode::kObsDtypeMismatch);
  EXPECT_NE(refused.status().message().find("\"obs\"[1]"), std::string::npos) << refused.status().message();
}

// [1.4] A byte box's rows kept as bytes (obs_bytes, as the client keeps
// images) encode as their values given as floats do: as integers, or as the
// same uint8 tensor and attachment bytes to a 1.4 server.
TEST(Episode, ByteRowsEncodeAsTheirFloats) {
  const Space obs = image_space();
  const Space act = Space::discrete(2).value();
  const EpisodeChunk floats = image_steps();
  EpisodeChunk bytes = image_steps();
  bytes.obs_bytes.assign(floats.obs.begin(), floats.obs.end());
  bytes.obs.clear();
  EXPECT_EQ(encode_episode(bytes, obs, act).value(), encode_episode(floats, obs, act).value());
  std::string from_floats = "pad", from_bytes = "pad";
  const nlohmann::json with_floats = encode_episode(floats, obs, act, &from_floats).value();
  const nlohmann::json with_bytes = encode_episode(bytes, obs, act, &from_bytes).value();
  EXPECT_EQ(with_bytes, with_floats);
  EXPECT_EQ(with_bytes["obs"]["dtype"], "uint8");
  EXPECT_EQ(from_bytes, from_floats);
  EXPECT_EQ(from_bytes.substr(3), std::string("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\xff", 12));
  // Under a float box of the same size (a reconnect's new space) they go as
  // the floats they are, as the float rows would.
  const Space float_box = Space::box({2, 2, 1}, 0, 255).value();
  EXPECT_EQ(encode_episode(bytes, float_box, act).value(), encode_episode(floats, float_box, act).value());
  std::string float_tensor = "pad";
  EXPECT_EQ(encode_episode(bytes, float_box, act, &float_tensor).value(), encode_episode(floats, float_box, act).value());
  EXPECT_EQ(float_tensor, "pad");  // (a float box's rows go as numbers)
  // Refused: bytes and floats at once, rows of another size.
  EpisodeChunk both = bytes;
  both.obs = floats.obs;
  EXPECT_EQ(encode_episode(both, obs, act).status().code(), ErrorCode::kInvalidArgument);
  EpisodeChunk short_rows = bytes;
  short_rows.obs_bytes.pop_back();
  Result<nlohmann::json> refused = encode_episode(short_rows, obs, act);
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("\"obs_bytes\" has 11 numbers, expected 12"), std::string::npos)
      << refused.status().message();
  bytes.clear();
  EXPECT_TRUE(bytes.obs_bytes.empty());
}

TEST(Episode, ValidatesObservationTensors) {
  const Space obs = image_space();
  const Space act = Space::discrete(2).value();
  const nlohmann::json numbers = encode_episode(image_steps(), obs, act).value();
  nlohmann::json record = numbers;
  const std::uint8_t bytes[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255};
  std::string attachment = "pad";
  record["obs"] = encode_tensor_at(bytes, 12, {3, 2, 2, 1}, attachment).value();
  nlohmann::json second = numbers;  // (its own bytes, after the first record's)
  second["obs"] = encode_tensor_at(bytes, 12, {3, 2, 2, 1}, attachment).value();
  EXPECT_EQ(second["obs"]["offset"], 15);
  const nlohmann::json message = {{"type", "EPISODES"}, {"episodes", {record, second}}};
  const std::string body = encode_message_with_attachment(message, attachment);
  Result<Message> decoded = decode_message(body);
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  Result<std::size_t> steps = validate_episodes(decoded.value().body, obs, act, true, decoded.value().attachment);
  ASSERT_TRUE(steps.ok()) << steps.status().to_string();
  EXPECT_EQ(steps.value(), 4u);
  // Without the attachment the offset refers to nothing.
  EXPECT_EQ(validate_episodes(message, obs, act, true).status().code(), ErrorCode::kInvalidTensor);

  auto code = [&](const nlohmann::json& r, const Space& space) {
    Result<std::size_t> result = validate_episode(r, 0, space, act, true, std::string_view(attachment));
    return result.ok() ? ErrorCode::kOk : result.status().code();
  };
  nlohmann::json r = record;
  r["obs"] = encode_tensor(bytes, 12, {3, 2, 2, 1}).value();  // inline
  EXPECT_EQ(code(r, obs), ErrorCode::kOk);
  // A float32 space takes float32 tensors, and checks their values' finiteness (check 11).
  const Space floats = Space::box({2, 2, 1}, -1e9, 1e9).value();
  EXPECT_EQ(code(r, floats), ErrorCode::kObsDtypeMismatch);
  std::vector<float> values(bytes, bytes + 12);
  r["obs"] = encode_tensor(values.data(), 12, {3, 2, 2, 1}).value();
  EXPECT_EQ(code(r, floats), ErrorCode::kOk);
  EXPECT_EQ(code(r, obs), ErrorCode::kObsDtypeMismatch);
  values[7] = INFINITY;
  r["obs"] = encode_tensor(values.data(), 12, {3, 2, 2, 1}).value();
  EXPECT_EQ(code(r, floats), ErrorCode::kNonFiniteValue);
  // Check 4 comes before the lengths (check 8): an unreadable tensor of the wrong length.
  r = record;
  r["obs"] = {{"dtype", "uint8"}, {"shape", {2, 2, 2, 1}}, {"offset", 1000}};
  EXPECT_EQ(code(r, obs), ErrorCode::kInvalidTensor);
  r["obs"] = {{"dtype", "uint8"}, {"shape", {2, 2, 2, 1}}, {"offset", 0}};
  EXPECT_EQ(code(r, obs), ErrorCode::kEpisodeLengthMismatch);
  r["obs"] = {{"dtype", "uint8"}, {"shape", {3, 4}}, {"offset", 0}};
  EXPECT_EQ(code(r, obs), ErrorCode::kObsShapeMismatch);
  // Check 11b comes after the rewards' finiteness (check 11), before the actions (12-14).
  r = numbers;
  r["obs"][1][0][1][0] = 0.5;
  EXPECT_EQ(code(r, obs), ErrorCode::kObsDtypeMismatch);
  EXPECT_EQ(code(r, floats), ErrorCode::kOk);  // (only a byte box takes integers only)
  r["actions"] = {1, 7};
  EXPECT_EQ(code(r, obs), ErrorCode::kObsDtypeMismatch);
  r["rewards"] = {1e39, 0};
  EXPECT_EQ(code(r, obs), ErrorCode::kNonFiniteValue);
  r = numbers;
  r["obs"][2][1][1][0] = 7.0;  // 7.0 is 7
  EXPECT_EQ(code(r, obs), ErrorCode::kOk);
  r["obs"][2][1][1][0] = 256;
  Result<std::size_t> refused = validate_episode(r, 3, obs, act, true);
  EXPECT_EQ(refused.status().code(), ErrorCode::kObsDtypeMismatch);
  EXPECT_EQ(refused.status().message().rfind("episodes[3]: \"obs\"[2]", 0), 0u) << refused.status().message();
}

TEST(Episode, MultiAgentEntriesTakeObservationTensors) {
  std::map<std::string, ModuleSpec> modules;
  modules["cam"] = ModuleSpec::from_json("cam", nlohmann::json::parse(
      R"({"observation_space":{"type":"Box","shape":[2,2,1],"dtype":"uint8","low":0,"high":255},
          "action_space":{"type":"Discrete","n":2}})")).value();
  MultiAgentRecord record;
  AgentEntry entry;
  entry.module = "cam";
  entry.chunk = image_steps();
  record.agents.emplace_back("a", entry);
  nlohmann::json json = encode_multi_agent_record(record, modules).value();
  EXPECT_EQ(json["agents"]["a"]["obs"][2][1][1][0], 255);
  EXPECT_TRUE(json["agents"]["a"]["obs"][2][1][1][0].is_number_integer());
  EXPECT_EQ(validate_multi_agent_record(json, 0, modules, true).value(), 2u);
  std::string attachment;
  const std::uint8_t bytes[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255};
  json["agents"]["a"]["obs"] = encode_tensor_at(bytes, 12, {3, 2, 2, 1}, attachment).value();
  EXPECT_EQ(validate_multi_agent_record(json, 0, modules, true, std::string_view(attachment)).value(), 2u);
  Result<std::size_t> refused = validate_multi_agent_record(json, 0, modules, true);
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidTensor);
  EXPECT_EQ(refused.status().message().rfind("episodes[0].agents['a']: \"obs\": ", 0), 0u) << refused.status().message();
  record.agents[0].second.chunk.obs[0] = -1.0f;
  EXPECT_EQ(encode_multi_agent_record(record, modules).status().code(), ErrorCode::kObsDtypeMismatch);
}

TEST(ModuleSpecs, ValueObsAgentsAreAnArrayOfAgentIds) {
  // (§9.1) an array of strings, or absent or null; a string is not split into one-letter ids
  const auto module = [](const char* agents) {
    std::string text = R"({"observation_space":{"type":"Box","shape":[2],"low":0,"high":1},"action_space":{"type":"Discrete","n":2})";
    if (agents != nullptr) text += std::string(R"(,"value_obs_agents":)") + agents;
    return ModuleSpec::from_json("m", nlohmann::json::parse(text + "}"));
  };
  EXPECT_EQ(module(R"(["a_0","a_1"])").value().value_obs_agents, (std::vector<std::string>{"a_0", "a_1"}));
  EXPECT_TRUE(module(nullptr).value().value_obs_agents.empty());
  EXPECT_TRUE(module("null").value().value_obs_agents.empty());
  for (const char* bad : {R"("a_0")", R"({"a_0":1})", "3", R"(["a_0",1])", R"([null])"}) {
    const auto spec = module(bad);
    ASSERT_FALSE(spec.ok()) << bad;
    EXPECT_EQ(spec.status().code(), ErrorCode::kInvalidField) << bad;
    EXPECT_NE(spec.status().message().find("value_obs_agents"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace tether
