// Logged steps (protocol 1.6, §10.1, §15): TetherClient::log_action and a
// MultiAgentClient frame's logged actions against the fake server: the
// records carry the given actions, 0 as their logp, the model's dist inputs
// and logged_runs by their own step indices (the "record" vectors of
// tests/conformance/logged.json played through a client); refusals leave
// nothing recorded; a server older than 1.6 is never sent a logged step.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <atomic>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "client_test_helpers.h"
#include "tether/client.h"
#include "tether/multi_agent_client.h"
#include "tether/observation_leaves.h"

namespace {

using fake::Conn;
using fake::FakeServer;
using fake::json;
using fake::pong;
using fake::ServerScript;
using tether::ErrorCode;

constexpr float kObs[4] = {0.1f, 0.2f, 0.3f, 0.4f};


// A server whose PONG announces `version`.
ServerScript speaking(const std::string& version, ServerScript script = ServerScript()) {
  script.on_ping = [version](Conn& conn, const tether::Message&) {
    conn.send(pong(version));
    return true;
  };
  return script;
}

using fake::records_of;

// The records of one episode, in order.
std::vector<json> records_of(FakeServer& server, const std::string& episode) {
  std::vector<json> out;
  for (const json& record : records_of(server)) {
    if (record.value("episode_id", std::string()) == episode) out.push_back(record);
  }
  return out;
}

json logged_runs_of(const json& record) { return record.contains("logged_runs") ? record["logged_runs"] : json(); }

std::unique_ptr<tether::TetherClient> connect(FakeServer& server) {
  return fake::connect(fake::waiting_options_for(server));
}

// -- TetherClient::log_action ------------------------------------------------------------------

TEST(LoggedActions, LogActionRecordsTheGivenActionWithTheModelsDistInputs) {
  ServerScript script;
  script.steps_per_sample = 100;
  FakeServer server(script);
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode().value();
  double sampled = -1;
  ASSERT_TRUE(client->get_action(episode, kObs, 4, &sampled, 1).ok());
  const double taken = 1;  // (the fake model prefers 0)
  ASSERT_TRUE(client->log_action(episode, kObs, 4, &taken, 1).ok());
  ASSERT_TRUE(client->log_returns(episode, 2.0).ok());  // goes to the logged step
  ASSERT_TRUE(client->log_action(episode, std::vector<float>(kObs, kObs + 4), std::vector<double>{1}).ok());
  ASSERT_TRUE(client->get_action(episode, kObs, 4, &sampled, 1).ok());
  ASSERT_TRUE(client->end_episode(episode, kObs, 4).ok());
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> records = records_of(server, episode);
  ASSERT_EQ(records.size(), 1u);
  const json& record = records[0];
  EXPECT_EQ(record["actions"], json({0, 1, 1, 0}));
  EXPECT_EQ(record["rewards"], json({0.0, 2.0, 0.0, 0.0}));
  EXPECT_EQ(record["action_logp"][1], 0.0);
  EXPECT_EQ(record["action_logp"][2], 0.0);
  // The model was evaluated at every step: its dist inputs (30 for its preferred action) are recorded.
  ASSERT_EQ(record["action_dist_inputs"].size(), 4u);
  for (const json& row : record["action_dist_inputs"]) EXPECT_EQ(row, json({30.0, 0.0}));
  EXPECT_EQ(logged_runs_of(record), json({{1, 2}}));
  // What the server validates (§10.6 check 20).
  tether::Result<std::size_t> steps =
      tether::validate_episode(record, 0, client->observation_space(), client->action_space(), true);
  EXPECT_TRUE(steps.ok()) << steps.status().to_string();
}

// logged.json's "record" vectors, played by a TetherClient: each case's calls
// in an episode of its own, cut by flush() after each count of `cuts` steps.
TEST(LoggedActions, TheClientCutsRecordsWithTheVectorsLoggedRuns) {
  std::ifstream in(std::string(TETHER_CONFORMANCE_DIR) + "/logged.json", std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const json file = json::parse(text.str(), nullptr, false);
  ASSERT_TRUE(file.is_object());
  ServerScript script;
  script.steps_per_sample = 1000;  // (only flush() cuts)
  FakeServer server(script);
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  std::size_t cases = 0;
  for (const json& c : file["cases"]) {
    if (c["kind"] != "record") continue;
    ++cases;
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string episode = client->start_episode(c["name"].get<std::string>()).value();
    std::set<std::size_t> flush_after;  // a record of the first B steps is cut once step B's observation is known
    std::size_t bound = 0;
    for (const json& cut : c["cuts"]) flush_after.insert((bound += cut.get<std::size_t>()) + 1);
    const json& calls = c["calls"];
    for (std::size_t i = 0; i < calls.size(); ++i) {
      double action = 1;
      const tether::Status status = calls[i] == "log" ? client->log_action(episode, kObs, 4, &action, 1)
                                                      : client->get_action(episode, kObs, 4, &action, 1);
      ASSERT_TRUE(status.ok()) << status.to_string();
      if (flush_after.count(i + 1) != 0) ASSERT_TRUE(client->flush().ok());
    }
    ASSERT_TRUE(client->end_episode(episode, kObs, 4).ok());
    ASSERT_TRUE(client->flush().ok());
    const std::vector<json> records = records_of(server, episode);
    ASSERT_EQ(records.size(), c["records_logged_runs"].size());
    for (std::size_t r = 0; r < records.size(); ++r) {
      EXPECT_EQ(logged_runs_of(records[r]), c["records_logged_runs"][r]) << "record " << r;
    }
  }
  EXPECT_GT(cases, 0u);
}

TEST(LoggedActions, AnActionTheSpaceRefusesIsRefusedAndNothingIsRecorded) {
  ServerScript script;
  script.steps_per_sample = 100;
  FakeServer server(script);
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode().value();
  const double two = 2, half = 0.5, negative = -1, nan = std::nan(""), pair[2] = {0, 1};
  EXPECT_EQ(client->log_action(episode, kObs, 4, &two, 1).code(), ErrorCode::kActionOutOfSpace);
  EXPECT_EQ(client->log_action(episode, kObs, 4, &half, 1).code(), ErrorCode::kActionOutOfSpace);
  EXPECT_EQ(client->log_action(episode, kObs, 4, &negative, 1).code(), ErrorCode::kActionOutOfSpace);
  EXPECT_EQ(client->log_action(episode, kObs, 4, &nan, 1).code(), ErrorCode::kNonFiniteValue);
  const tether::Status wrong_size = client->log_action(episode, kObs, 4, pair, 2);
  EXPECT_EQ(wrong_size.code(), ErrorCode::kActionOutOfSpace);
  EXPECT_NE(wrong_size.message().find("log_action"), std::string::npos) << wrong_size.message();
  EXPECT_EQ(client->log_action(episode, kObs, 4, nullptr, 0).code(), ErrorCode::kActionOutOfSpace);
  const float bad_obs[4] = {0, std::nanf(""), 0, 0};
  const double one = 1;
  EXPECT_EQ(client->log_action(episode, bad_obs, 4, &one, 1).code(), ErrorCode::kNonFiniteValue);
  EXPECT_EQ(client->log_action(episode, kObs, 3, &one, 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(client->log_action("no-such-episode", kObs, 4, &one, 1).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(client->log_action(episode, kObs, 4, &one, 1).ok());
  ASSERT_TRUE(client->end_episode(episode, kObs, 4).ok());
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> records = records_of(server, episode);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["actions"], json({1}));  // only the step that was taken
}

TEST(LoggedActions, ABoxActionIsRecordedAsGivenNeverClipped) {
  ServerScript script;
  script.steps_per_sample = 100;
  script.config_overrides = {{"action_space", {{"type", "Box"}, {"shape", {2}}, {"low", -1.0}, {"high", 1.0}}}};
  FakeServer server(script);
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode().value();
  const double outside[2] = {5.0, -3.0};
  ASSERT_TRUE(client->log_action(episode, kObs, 4, outside, 2).ok());
  const double infinite[2] = {0.0, std::numeric_limits<double>::infinity()};
  EXPECT_EQ(client->log_action(episode, kObs, 4, infinite, 2).code(), ErrorCode::kNonFiniteValue);
  const double beyond_float32[2] = {0.0, 1e39};  // finite as a double, not as the float32 a record holds
  EXPECT_EQ(client->log_action(episode, kObs, 4, beyond_float32, 2).code(), ErrorCode::kNonFiniteValue);
  ASSERT_TRUE(client->end_episode(episode, kObs, 4).ok());
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> records = records_of(server, episode);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["actions"], json({{5.0, -3.0}}));
  EXPECT_EQ(records[0]["action_dist_inputs"][0].size(), 4u);  // the Gaussian's mean and log-std
  EXPECT_EQ(logged_runs_of(records[0]), json({{0, 1}}));
}

// Dict(action_mask: Box[3], board: Box[2]) acting in Discrete(3), masked by its action_mask leaf.
TEST(LoggedActions, AnActionTheMaskForbidsIsRefused) {
  ServerScript script;
  script.steps_per_sample = 100;
  script.config_overrides = {
      {"observation_space",
       {{"type", "Dict"},
        {"spaces",
         {{"board", {{"type", "Box"}, {"shape", {2}}, {"low", 0}, {"high", 1}}},
          {"action_mask", {{"type", "Box"}, {"shape", {3}}, {"low", 0}, {"high", 1}}}}}}},
      {"action_space", fake::discrete(3)},
      {"action_mask", "action_mask"},
      {"onnx_input_names", {"action_mask", "board"}}};
  FakeServer server(script);
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  tether::ObservationLeaves obs(client->observation_space());
  const float board[2] = {0, 1}, mask[3] = {1, 0, 1};
  ASSERT_TRUE(obs.set("board", board, 2).ok());
  ASSERT_TRUE(obs.set("action_mask", mask, 3).ok());
  const std::string episode = client->start_episode().value();
  const double forbidden = 1, allowed = 2;
  const tether::Status masked = client->log_action(episode, obs, &forbidden, 1);
  EXPECT_EQ(masked.code(), ErrorCode::kActionMasked) << masked.to_string();
  EXPECT_NE(masked.message().find("action_mask"), std::string::npos) << masked.message();
  ASSERT_TRUE(client->log_action(episode, obs, &allowed, 1).ok());
  ASSERT_TRUE(client->end_episode(episode, obs).ok());
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> records = records_of(server, episode);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["actions"], json({2}));
}

TEST(LoggedActions, AServerOlderThan1_6IsNeverSentALoggedStep) {
  ServerScript script = speaking("1.5");
  script.steps_per_sample = 100;
  FakeServer server(script);
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode().value();
  const double one = 1;
  const tether::Status refused = client->log_action(episode, kObs, 4, &one, 1);
  EXPECT_EQ(refused.code(), ErrorCode::kNotReady);
  EXPECT_NE(refused.message().find("1.5"), std::string::npos) << refused.message();
  double action = -1;
  ASSERT_TRUE(client->get_action(episode, kObs, 4, &action, 1).ok());
  ASSERT_TRUE(client->end_episode(episode, kObs, 4).ok());
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> records = records_of(server, episode);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["actions"].size(), 1u);
  EXPECT_FALSE(records[0].contains("logged_runs"));
}

TEST(LoggedActions, WithoutAModelLogActionIsRefusedAsGetActionIs) {
  ServerScript script;
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send({{"type", "SET_STATE"}, {"weights_seq_no", 0}});  // (no onnx_file: no model yet)
    return true;
  };
  FakeServer server(script);
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode().value();
  const double one = 1;
  EXPECT_EQ(client->log_action(episode, kObs, 4, &one, 1).code(), ErrorCode::kNotReady);
  double action = -1;
  EXPECT_EQ(client->get_action(episode, kObs, 4, &action, 1).code(), ErrorCode::kNotReady);
}

// A batch with logged steps, cut for a 1.6 server and lost with its
// connection, goes to the 1.5 server the client reconnects to without them:
// the record holding them is let go (counted), the others are sent (§15).
TEST(LoggedActions, AResendToAnOlderServerLeavesOutTheRecordsWithLoggedSteps) {
  auto pings = std::make_shared<std::atomic<int>>(0);
  ServerScript script;
  script.steps_per_sample = 100;
  script.on_ping = [pings](Conn& conn, const tether::Message&) {
    conn.send(pong(pings->fetch_add(1) == 0 ? "1.6" : "1.5"));
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    if (n == 1) return false;  // the first connection is lost with the first batch
    conn.send(fake::state(n, 0));
    return true;
  };
  FakeServer server(script);
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  const std::string logged = client->start_episode("logged").value();
  const std::string sampled = client->start_episode("sampled").value();
  double action = -1;
  const double one = 1;
  ASSERT_TRUE(client->get_action(logged, kObs, 4, &action, 1).ok());
  ASSERT_TRUE(client->log_action(logged, kObs, 4, &one, 1).ok());
  ASSERT_TRUE(client->end_episode(logged, kObs, 4).ok());
  for (int t = 0; t < 3; ++t) ASSERT_TRUE(client->get_action(sampled, kObs, 4, &action, 1).ok());
  ASSERT_TRUE(client->end_episode(sampled, kObs, 4).ok());
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 2u);  // the batch, then the same batch resent
  EXPECT_EQ(batches[0]["episodes"].size(), 2u);
  EXPECT_EQ(batches[1]["batch_seq"], batches[0]["batch_seq"]);
  ASSERT_EQ(batches[1]["episodes"].size(), 1u);
  EXPECT_EQ(batches[1]["episodes"][0]["episode_id"], "sampled");
  EXPECT_EQ(batches[1]["env_steps"], 3);
  EXPECT_EQ(batches[1]["agent_steps"], 3);
  EXPECT_EQ(client->logged_steps_dropped(), 2u);
  EXPECT_EQ(client->env_steps_sent(), 3);
  // The server it now talks to is older: logging is refused.
  const std::string next = client->start_episode().value();
  EXPECT_EQ(client->log_action(next, kObs, 4, &one, 1).code(), ErrorCode::kNotReady);
}

// A -> B -> A: a client that went from a 1.6 server to a 1.5 one (logging
// refused there, the resent batch without its logged record) and on to a 1.6
// server again logs once more, and its logged steps go, marked.
TEST(LoggedActions, BackOnA1_6ServerLoggingResumes) {
  auto pings = std::make_shared<std::atomic<int>>(0);
  ServerScript script;
  script.steps_per_sample = 100;
  script.on_ping = [pings](Conn& conn, const tether::Message&) {
    conn.send(pong(pings->fetch_add(1) == 1 ? "1.5" : "1.6"));  // connections 1 and 3: 1.6; 2: 1.5
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    if (n == 1 || n == 3) return false;  // lost with its connection: 1 on the first, 3 on the 1.5 one
    conn.send(fake::state(n, 0));
    return true;
  };
  FakeServer server(script);
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  double action = -1;
  const double one = 1;
  const std::string first = client->start_episode("first").value();
  ASSERT_TRUE(client->log_action(first, kObs, 4, &one, 1).ok());
  ASSERT_TRUE(client->end_episode(first, kObs, 4).ok());
  ASSERT_TRUE(client->flush().ok());  // lost on A, resent to B without its logged record
  const std::string on_b = client->start_episode("on_b").value();
  EXPECT_EQ(client->log_action(on_b, kObs, 4, &one, 1).code(), ErrorCode::kNotReady);
  for (int t = 0; t < 2; ++t) ASSERT_TRUE(client->get_action(on_b, kObs, 4, &action, 1).ok());
  ASSERT_TRUE(client->end_episode(on_b, kObs, 4).ok());
  ASSERT_TRUE(client->flush().ok());  // lost on B, resent to A again
  const std::string back = client->start_episode("back").value();
  ASSERT_TRUE(client->get_action(back, kObs, 4, &action, 1).ok());
  ASSERT_TRUE(client->log_action(back, kObs, 4, &one, 1).ok());  // A speaks 1.6: logging resumes
  ASSERT_TRUE(client->end_episode(back, kObs, 4).ok());
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 5u);  // 1 (lost), 1 resent, 2 (lost), 2 resent, 3
  EXPECT_EQ(batches[1]["episodes"].size(), 0u);  // (its one record held the logged step)
  ASSERT_EQ(batches[3]["episodes"].size(), 1u);
  EXPECT_EQ(batches[3]["episodes"][0]["episode_id"], "on_b");
  ASSERT_EQ(batches[4]["episodes"].size(), 1u);
  EXPECT_EQ(batches[4]["episodes"][0]["episode_id"], "back");
  EXPECT_EQ(batches[4]["episodes"][0]["logged_runs"], json({{1, 1}}));
  EXPECT_EQ(client->logged_steps_dropped(), 1u);
}

// -- MultiAgentClient: logged actions in a frame -----------------------------------------------

ServerScript pair_server(std::int64_t steps_per_sample) {
  ServerScript script = fake::answering([](int n) { return fake::pair_state(n); });
  script.full_config = fake::pair_config(steps_per_sample);
  return script;
}

const float kObs2[2] = {0.5f, -0.5f};

// Agents a_0 (logged), a_1 (by the policy) and the group "pair" (members p_0, p_1).
void fill(tether::AgentFrame& frame) {
  frame.clear();
  frame.add("a_0", kObs2, 2);
  frame.add("a_1", kObs2, 2);
  frame.add("p_0", kObs2, 2);
  frame.add("p_1", kObs2, 2);
}

TEST(LoggedActions, AFrameActsForThePolicyAgentsAndRecordsTheLoggedOnes) {
  FakeServer server(pair_server(1000));
  auto client = fake::connect_multi(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode().value();
  tether::AgentFrame frame;
  const double zero = 0, joint[2] = {0, 1};  // (the fake model prefers 1)
  // Frame 1: a_0 logged; frame 2: a_0 and the pair logged; frame 3: nobody.
  for (int t = 0; t < 3; ++t) {
    fill(frame);
    if (t < 2) frame.log_action("a_0", &zero, 1);
    if (t == 1) frame.log_action("pair", joint, 2);
    const tether::Status status = client->get_action(episode, frame);
    ASSERT_TRUE(status.ok()) << status.to_string();
    EXPECT_EQ(frame.discrete_action(0), t < 2 ? 0 : 1);  // a logged agent gets its action back
    EXPECT_EQ(frame.discrete_action(1), 1);
    EXPECT_EQ(frame.discrete_action(2), t == 1 ? 0 : 1);  // the members their parts of the joint action
    EXPECT_EQ(frame.discrete_action(3), 1);
  }
  ASSERT_TRUE(client->end_episode(episode).ok());
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> records = records_of(server);
  ASSERT_EQ(records.size(), 1u);
  const json& agents = records[0]["agents"];
  EXPECT_EQ(logged_runs_of(agents["a_0"]), json({{0, 2}}));
  EXPECT_EQ(agents["a_0"]["actions"], json({0, 0, 1}));
  EXPECT_EQ(agents["a_0"]["action_logp"][0], 0.0);
  EXPECT_EQ(agents["a_0"]["action_dist_inputs"][0], json({0.0, 30.0}));  // the model's, though not followed
  EXPECT_FALSE(agents["a_1"].contains("logged_runs"));
  EXPECT_EQ(logged_runs_of(agents["pair"]), json({{1, 1}}));
  EXPECT_EQ(agents["pair"]["actions"][1], json({0, 1}));
  const std::map<std::string, tether::ModuleSpec> modules = fake::module_specs(fake::pair_config(1000));
  tether::Result<std::size_t> steps = tether::validate_multi_agent_record(records[0], 0, modules, true);
  EXPECT_TRUE(steps.ok()) << steps.status().to_string();
}

TEST(LoggedActions, AFrameWithALoggedActionItCannotTakeIsRefusedWhole) {
  FakeServer server(pair_server(1000));
  auto client = fake::connect_multi(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode().value();
  tether::AgentFrame frame;
  const double one = 1, two = 2, joint[2] = {1, 1};
  auto refused = [&](const std::string& actor, const double* action, std::size_t size) {
    fill(frame);
    frame.log_action(actor, action, size);
    return client->get_action(episode, frame);
  };
  const tether::Status member = refused("p_0", &one, 1);
  EXPECT_EQ(member.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(member.message().find("group 'pair'"), std::string::npos) << member.message();
  EXPECT_EQ(refused("nobody", &one, 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(refused("a_0", &two, 1).code(), ErrorCode::kActionOutOfSpace);
  EXPECT_EQ(refused("pair", &one, 1).code(), ErrorCode::kActionOutOfSpace);  // (the joint action has 2 values)
  fill(frame);
  frame.log_action("a_0", &one, 1);
  frame.log_action("a_0", &one, 1);
  EXPECT_EQ(client->get_action(episode, frame).code(), ErrorCode::kInvalidArgument);
  fill(frame);
  frame.log_action("pair", joint, 2);
  EXPECT_EQ(client->compute_actions(frame).code(), ErrorCode::kInvalidArgument);
  // Nothing of the refused frames was recorded.
  fill(frame);
  ASSERT_TRUE(client->get_action(episode, frame).ok());
  ASSERT_TRUE(client->end_episode(episode).ok());
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> records = records_of(server);
  ASSERT_EQ(records.size(), 1u);
  for (const auto& [actor, entry] : records[0]["agents"].items()) {
    EXPECT_EQ(entry["actions"].size(), 1u) << actor;
    EXPECT_FALSE(entry.contains("logged_runs")) << actor;
  }
}

TEST(LoggedActions, AMultiAgentResendToAnOlderServerLeavesOutTheLoggedEntries) {
  auto pings = std::make_shared<std::atomic<int>>(0);
  ServerScript script = pair_server(1000);
  script.on_ping = [pings](Conn& conn, const tether::Message&) {
    conn.send(pong(pings->fetch_add(1) == 0 ? "1.6" : "1.5"));
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    if (n == 1) return false;
    conn.send(fake::pair_state(n));
    return true;
  };
  FakeServer server(script);
  auto client = fake::connect_multi(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode().value();
  tether::AgentFrame frame;
  const double one = 1;
  for (int t = 0; t < 2; ++t) {
    fill(frame);
    if (t == 0) frame.log_action("a_0", &one, 1);
    ASSERT_TRUE(client->get_action(episode, frame).ok());
  }
  ASSERT_TRUE(client->end_episode(episode).ok());
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_TRUE(batches[0]["episodes"][0]["agents"].contains("a_0"));
  const json& resent = batches[1]["episodes"][0]["agents"];
  EXPECT_FALSE(resent.contains("a_0"));
  EXPECT_TRUE(resent.contains("a_1"));
  EXPECT_TRUE(resent.contains("pair"));
  EXPECT_EQ(batches[1]["agent_steps"], 4);  // a_1's and the pair's 2 steps each
  EXPECT_EQ(client->logged_steps_dropped(), 2u);
  // The server it now talks to is older: a frame with a logged action is refused.
  fill(frame);
  frame.log_action("a_1", &one, 1);
  const std::string next = client->start_episode().value();
  EXPECT_EQ(client->get_action(next, frame).code(), ErrorCode::kNotReady);
}

}  // namespace

#endif  // _WIN32
