// [1.6] A step's reward never goes beyond float32 (§10.5): the rewards logged
// for a step, summed, stay below kFloat32Overflow (2^128 - 2^103). A
// log_returns call that would take its step there is refused
// (NON_FINITE_VALUE, naming the agent and the sum) and adds nothing: not to
// the step, not to the return, not to a demonstration file. The vectors of
// tests/conformance/rewards.json played through a TetherClient; a
// MultiAgentClient's agents and groups (a group's members' shares combined
// into the group's step); a reward before an actor's first action not limited.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "client_test_helpers.h"
#include "tether/client.h"
#include "tether/episode.h"
#include "tether/messages.h"
#include "tether/multi_agent_client.h"

namespace {

using fake::FakeServer;
using fake::json;
using fake::ServerScript;
using tether::ErrorCode;

using fake::records_of;

// The rewards of an episode's records (single-agent), in order.
std::vector<double> rewards_of(FakeServer& server, const std::string& episode) {
  std::vector<double> out;
  for (const json& record : records_of(server)) {
    if (record.value("episode_id", std::string()) != episode) continue;
    for (const json& r : record["rewards"]) out.push_back(r.get<double>());
  }
  return out;
}

// The rewards of an actor's entries in a multi-agent episode's records, in order.
std::vector<double> rewards_of(FakeServer& server, const std::string& episode, const std::string& actor) {
  std::vector<double> out;
  for (const json& record : records_of(server)) {
    if (record.value("episode_id", std::string()) != episode || !record["agents"].contains(actor)) continue;
    for (const json& r : record["agents"][actor]["rewards"]) out.push_back(r.get<double>());
  }
  return out;
}

// `got` (a record's reward as read from its JSON: the shortest decimal of a
// float32) reads as the float32 of `want`, the step's sum in doubles (within
// 1e-9 relative of the vectors' sums is float32 equality here).
void expect_step_reward(double got, double want, const std::string& what) {
  ASSERT_LT(std::fabs(got), tether::kFloat32Overflow) << what;  // (finite as float32)
  EXPECT_EQ(tether::step_reward_float32(got), tether::step_reward_float32(want)) << what << ": " << got << " vs " << want;
}

void expect_refused(const tether::Status& status, const std::string& agent) {
  EXPECT_EQ(status.code(), ErrorCode::kNonFiniteValue) << status.to_string();
  EXPECT_NE(status.message().find("float32"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("'" + agent + "'"), std::string::npos) << status.message();
}

json load_vectors() {
  std::ifstream in(std::string(TETHER_CONFORMANCE_DIR) + "/rewards.json", std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str(), nullptr, false);
}

// rewards.json's "single" cases, each an episode of its own: "act" a
// get_action, a number a log_returns. The refused calls are the vectors',
// the record's step rewards theirs (as float32), and the episode's return
// the sum of every reward not refused (one before the first action included).
TEST(StepRewards, TheClientPlaysTheRewardsVectors) {
  const json file = load_vectors();
  ASSERT_TRUE(file.is_object());
  ServerScript script;
  script.steps_per_sample = 1000;  // (only flush() cuts)
  FakeServer server(script);
  auto client = fake::connect(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  std::size_t cases = 0;
  for (const json& c : file["cases"]) {
    ASSERT_EQ(c["kind"], "single");
    ++cases;
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string episode = client->start_episode(c["name"].get<std::string>()).value();
    std::vector<std::size_t> refused;
    double total = 0.0;
    const json& calls = c["calls"];
    for (std::size_t i = 0; i < calls.size(); ++i) {
      if (calls[i] == "act") {
        double action = -1;
        ASSERT_TRUE(client->get_action(episode, fake::kObs, 4, &action, 1).ok());
        continue;
      }
      const double reward = calls[i].get<double>();
      const tether::Status status = client->log_returns(episode, reward);
      if (status.ok()) {
        total += reward;
      } else {
        expect_refused(status, tether::kDefaultAgentId);
        refused.push_back(i);
      }
    }
    tether::Result<double> ended = client->end_episode(episode, fake::kObs, 4);
    ASSERT_TRUE(ended.ok()) << ended.status().to_string();
    EXPECT_EQ(ended.value(), total);  // the return: every reward not refused
    std::vector<std::size_t> want_refused;
    for (const json& index : c["refused"]) want_refused.push_back(index.get<std::size_t>());
    EXPECT_EQ(refused, want_refused);
    ASSERT_TRUE(client->flush().ok());
    const std::vector<double> rewards = rewards_of(server, episode);
    ASSERT_EQ(rewards.size(), c["step_rewards"].size());
    for (std::size_t t = 0; t < rewards.size(); ++t) {
      expect_step_reward(rewards[t], c["step_rewards"][t].get<double>(), "step " + std::to_string(t));
    }
  }
  EXPECT_GT(cases, 0u);
}

// A refused reward changes nothing: the episode's return, its step's reward
// and the demonstration file's line are as if it had not been logged.
TEST(StepRewards, ARefusedRewardLeavesTheReturnTheStepAndTheDemonstrationFile) {
  const std::string demo = (std::filesystem::temp_directory_path() / "tether_step_rewards.jsonl").string();
  std::remove(demo.c_str());
  ServerScript script;
  script.steps_per_sample = 1000;
  FakeServer server(script);
  tether::ClientOptions options = fake::waiting_options_for(server);
  options.demo_path = demo;
  auto client = fake::connect(options);
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode("e").value();
  double action = -1;
  ASSERT_TRUE(client->get_action(episode, fake::kObs, 4, &action, 1).ok());
  ASSERT_TRUE(client->log_returns(episode, 3e38).ok());
  expect_refused(client->log_returns(episode, 1e38), tether::kDefaultAgentId);  // 4e38
  expect_refused(client->log_returns(episode, 1e300), tether::kDefaultAgentId);
  EXPECT_EQ(client->log_returns(episode, std::nan("")).code(), ErrorCode::kNonFiniteValue);
  ASSERT_TRUE(client->log_returns(episode, -1e38).ok());
  ASSERT_TRUE(client->get_action(episode, fake::kObs, 4, &action, 1).ok());
  ASSERT_TRUE(client->log_returns(episode, 1.0).ok());
  tether::Result<double> total = client->end_episode(episode, fake::kObs, 4);
  ASSERT_TRUE(total.ok()) << total.status().to_string();
  EXPECT_EQ(total.value(), 3e38 - 1e38 + 1.0);
  ASSERT_TRUE(client->flush().ok());
  const std::vector<double> rewards = rewards_of(server, episode);
  ASSERT_EQ(rewards.size(), 2u);
  expect_step_reward(rewards[0], 2e38, "step 0");
  EXPECT_EQ(rewards[1], 1.0);
  client->close();
  std::ifstream in(demo, std::ios::binary);
  std::string header, line;
  ASSERT_TRUE(std::getline(in, header) && std::getline(in, line));
  tether::Result<json> parsed = tether::parse_json(line);
  ASSERT_TRUE(parsed.ok()) << line;
  ASSERT_EQ(parsed.value()["rewards"].size(), 2u);
  expect_step_reward(parsed.value()["rewards"][0].get<double>(), 2e38, "demonstration step 0");
  in.close();
  std::remove(demo.c_str());
}

// -- MultiAgentClient --------------------------------------------------------------------------

const float kObs2[2] = {0.5f, -0.5f};

// A server of pair_config's agents a_0, a_1 and the group "pair" (members
// p_0, p_1), its rewards combined as `reward` ("sum" or "mean").
ServerScript pair_server(const std::string& reward) {
  ServerScript script = fake::answering([](int n) { return fake::pair_state(n); });
  script.full_config = fake::pair_config(1000);
  (*script.full_config)["groups"]["pair"]["reward"] = reward;
  return script;
}

void play_frame(tether::MultiAgentClient& client, const std::string& episode) {
  tether::AgentFrame frame;
  frame.add("a_0", kObs2, 2);
  frame.add("a_1", kObs2, 2);
  frame.add("p_0", kObs2, 2);
  frame.add("p_1", kObs2, 2);
  const tether::Status status = client.get_action(episode, frame);
  ASSERT_TRUE(status.ok()) << status.to_string();
}

// One agent's reward that would take its step beyond float32 is refused and
// adds nothing, to it or to any other actor: every step and return is as if
// the call had not been made. A group's members' rewards combine into the
// group's step first ("sum"), which is what is limited.
TEST(StepRewards, AMultiAgentRefusalAddsNothingToAnyActor) {
  FakeServer server(pair_server("sum"));
  auto client = fake::connect_multi(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode("e").value();
  ASSERT_TRUE(client->log_returns(episode, "a_1", 3e38).ok());  // before its first action: no step, not limited
  ASSERT_TRUE(client->log_returns(episode, "a_1", 3e38).ok());
  play_frame(*client, episode);
  ASSERT_TRUE(client->log_returns(episode, "a_0", 3e38).ok());
  ASSERT_TRUE(client->log_returns(episode, "a_1", 1.0).ok());
  ASSERT_TRUE(client->log_returns(episode, "p_0", 2e38).ok());
  const tether::Status agent = client->log_returns(episode, "a_0", 1e38);
  expect_refused(agent, "a_0");
  EXPECT_NE(agent.message().find("4e+38"), std::string::npos) << agent.message();  // the sum it would make
  const tether::Status member = client->log_returns(episode, "p_1", 2e38);  // the pair's step: 4e38
  expect_refused(member, "p_1");
  EXPECT_NE(member.message().find("group 'pair'"), std::string::npos) << member.message();
  ASSERT_TRUE(client->log_returns(episode, "p_1", 1e38).ok());  // the pair's step: 3e38
  expect_refused(client->log_returns(episode, "p_0", 1e38), "p_0");
  play_frame(*client, episode);  // a new step each: new sums
  ASSERT_TRUE(client->log_returns(episode, "a_0", 3e38).ok());
  ASSERT_TRUE(client->log_returns(episode, "p_0", -3e38).ok());
  tether::Result<std::map<std::string, double>> returns = client->end_episode(episode);
  ASSERT_TRUE(returns.ok()) << returns.status().to_string();
  EXPECT_EQ(returns.value().at("a_0"), 3e38 + 3e38);
  EXPECT_EQ(returns.value().at("a_1"), 3e38 + 3e38 + 1.0);
  EXPECT_EQ(returns.value().at("pair"), 2e38 + 1e38 - 3e38);
  ASSERT_TRUE(client->flush().ok());
  const std::vector<double> a_0 = rewards_of(server, "e", "a_0");
  const std::vector<double> a_1 = rewards_of(server, "e", "a_1");
  const std::vector<double> pair = rewards_of(server, "e", "pair");
  ASSERT_EQ(a_0.size(), 2u);
  ASSERT_EQ(a_1.size(), 2u);
  ASSERT_EQ(pair.size(), 2u);
  expect_step_reward(a_0[0], 3e38, "a_0 step 0");
  expect_step_reward(a_0[1], 3e38, "a_0 step 1");
  EXPECT_EQ(a_1[0], 1.0);
  EXPECT_EQ(a_1[1], 0.0);
  expect_step_reward(pair[0], 3e38, "pair step 0");
  expect_step_reward(pair[1], -3e38, "pair step 1");
}

// rewards.json's cases again, played by one agent (a_0) of a
// MultiAgentClient, each case an episode of its own: "act" a frame of that
// agent alone, a number a log_returns to it. The refused calls and the
// entry's step rewards are the vectors'.
TEST(StepRewards, AMultiAgentClientPlaysTheRewardsVectors) {
  const json file = load_vectors();
  ASSERT_TRUE(file.is_object());
  FakeServer server(pair_server("sum"));
  auto client = fake::connect_multi(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  std::size_t cases = 0;
  for (const json& c : file["cases"]) {
    ++cases;
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string episode = client->start_episode(c["name"].get<std::string>()).value();
    std::vector<std::size_t> refused;
    const json& calls = c["calls"];
    for (std::size_t i = 0; i < calls.size(); ++i) {
      if (calls[i] == "act") {
        tether::AgentFrame frame;
        frame.add("a_0", kObs2, 2);
        ASSERT_TRUE(client->get_action(episode, frame).ok());
        continue;
      }
      const tether::Status status = client->log_returns(episode, "a_0", calls[i].get<double>());
      if (!status.ok()) {
        expect_refused(status, "a_0");
        refused.push_back(i);
      }
    }
    ASSERT_TRUE(client->end_episode(episode).ok());
    std::vector<std::size_t> want_refused;
    for (const json& index : c["refused"]) want_refused.push_back(index.get<std::size_t>());
    EXPECT_EQ(refused, want_refused);
    ASSERT_TRUE(client->flush().ok());
    const std::vector<double> rewards = rewards_of(server, episode, "a_0");
    ASSERT_EQ(rewards.size(), c["step_rewards"].size());
    for (std::size_t t = 0; t < rewards.size(); ++t) {
      expect_step_reward(rewards[t], c["step_rewards"][t].get<double>(), "step " + std::to_string(t));
    }
  }
  EXPECT_GT(cases, 0u);
}

// A "mean" group: each member's share (its reward divided by the member
// count) goes to the group's step, and the combined sum is what is limited.
TEST(StepRewards, AMeanGroupsCombinedSharesAreLimited) {
  FakeServer server(pair_server("mean"));
  auto client = fake::connect_multi(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode("e").value();
  play_frame(*client, episode);
  ASSERT_TRUE(client->log_returns(episode, "p_0", 6e38).ok());  // share 3e38: a reward beyond float32 may be shared
  ASSERT_TRUE(client->log_returns(episode, "p_1", 2e37).ok());  // 3.1e38
  const tether::Status refused = client->log_returns(episode, "p_0", 1e38);  // share 5e37: 3.6e38
  expect_refused(refused, "p_0");
  EXPECT_NE(refused.message().find("3.6"), std::string::npos) << refused.message();
  tether::Result<std::map<std::string, double>> returns = client->end_episode(episode);
  ASSERT_TRUE(returns.ok()) << returns.status().to_string();
  EXPECT_EQ(returns.value().at("pair"), 3e38 + 1e37);
  ASSERT_TRUE(client->flush().ok());
  const std::vector<double> pair = rewards_of(server, "e", "pair");
  ASSERT_EQ(pair.size(), 1u);
  expect_step_reward(pair[0], 3.1e38, "pair step 0");
}

}  // namespace

#endif  // _WIN32
