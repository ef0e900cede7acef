// A reconnect whose SET_CONFIG describes other spaces (§6.5): TetherClient
// drops the steps recorded under the old config and not cut yet (an open
// episode's, and all of an episode that ended meanwhile), lets the old model
// go (NOT_READY until the new connection's arrives, usually in its
// handshake), refuses an observation of the old size (INVALID_ARGUMENT), and
// goes on with the open episode: its next chunk starts from its next
// observation. The scenario of the Python SDK's
// tests/sdk/test_reconnect_new_spaces.py (the single-agent case) and of the
// C# SDK's ReconnectNewSpacesTests.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

json single_agent_config(int obs_width) {
  return {{"type", "SET_CONFIG"},
          {"observation_space", {{"type", "Box"}, {"shape", {obs_width}}, {"low", -10.0}, {"high", 10.0}}},
          {"action_space", discrete(2)},
          {"onnx_input_names", {"obs"}},
          {"onnx_output_names", {"action_dist_inputs"}},
          {"env_steps_per_sample", 10},
          {"force_on_policy", true},
          {"heartbeat_interval_s", 0},
          {"protocol_version", "1.3"}};
}

// The first connection observes 3 values and loses the first batch (once
// `release` is set); the next ones observe 4, and send a model in their
// handshake when `model_in_handshake`.
ServerScript reconnecting_server(std::shared_ptr<std::atomic<bool>> release, bool model_in_handshake) {
  ServerScript script;
  script.config_of_connection = [](int connection) { return single_agent_config(connection == 1 ? 3 : 4); };
  script.on_get_state = [model_in_handshake](Conn& conn, const tether::Message&, int connection) {
    if (connection == 1) {
      conn.send(fake::state(0, 1));
    } else if (model_in_handshake) {
      conn.send(fake::state(1, 1));
    } else {
      conn.send(json{{"type", "SET_STATE"}, {"weights_seq_no", 0}});
    }
    return true;
  };
  script.on_batch = [release](Conn& conn, const tether::Message&, int n) {
    if (n == 1) {  // the connection is lost once b has ended
      (void)wait_for([&release] { return release->load(); }, 10.0);
      return false;
    }
    conn.send(json{{"type", "SET_STATE"}, {"weights_seq_no", 1}});
    return true;
  };
  return script;
}

std::vector<float> row(int width, float value) { return std::vector<float>(static_cast<std::size_t>(width), value); }

// Plays a (12 steps of 3 values: the 11th cuts batch 1, lost with the
// connection) and b (3 steps, ended, not cut), then lets the connection go
// and waits for the reconnect.
void play_until_the_reconnect(tether::TetherClient& client, const std::shared_ptr<std::atomic<bool>>& release) {
  std::vector<double> action;
  ASSERT_TRUE(client.start_episode("a").ok());
  for (int t = 0; t < 12; ++t) {
    tether::Status status = client.get_action("a", row(3, static_cast<float>(t)), action);
    ASSERT_TRUE(status.ok()) << "step " << t << ": " << status.to_string();
    ASSERT_TRUE(client.log_returns("a", 1.0).ok());
  }
  ASSERT_TRUE(client.start_episode("b").ok());
  for (int t = 0; t < 3; ++t) ASSERT_TRUE(client.get_action("b", row(3, static_cast<float>(t)), action).ok());
  ASSERT_TRUE(client.end_episode("b", row(3, 0.0f)).ok());  // ended, its 3 steps not cut
  release->store(true);
  ASSERT_TRUE(wait_for([&] { return client.reconnects() >= 1; }, 5.0));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

// A client of `server` (waiting_options_for's, seed 5) that does not wait for weights.
std::unique_ptr<tether::TetherClient> connect_not_waiting_for_weights(const FakeServer& server) {
  tether::ClientOptions options = waiting_options_for(server, 5);
  options.wait_for_weights = false;
  return connect(options);
}

TEST(ReconnectNewSpaces, StepsRecordedWithOtherSpacesAreDroppedAndTheEpisodeGoesOn) {
  auto release = std::make_shared<std::atomic<bool>>(false);
  FakeServer server(reconnecting_server(release, /*model_in_handshake=*/true));
  auto client = connect_not_waiting_for_weights(server);
  ASSERT_TRUE(client);
  ASSERT_EQ(client->observation_space().flat_dim(), 3u);
  play_until_the_reconnect(*client, release);
  if (HasFatalFailure()) return;

  std::vector<double> action;
  tether::Status old_size = client->get_action("a", row(3, 12.0f), action);
  EXPECT_EQ(old_size.code(), tether::ErrorCode::kInvalidArgument) << old_size.to_string();
  EXPECT_NE(old_size.message().find("has 3 values"), std::string::npos) << old_size.to_string();
  EXPECT_EQ(client->observation_space().flat_dim(), 4u);
  EXPECT_EQ(client->models_loaded(), 2);  // the new connection's, from its handshake
  EXPECT_EQ(client->weights_seq_no(), std::optional<std::int64_t>(1));
  for (int t = 12; t < 30; ++t) {
    tether::Status status = client->get_action("a", row(4, static_cast<float>(t)), action);
    ASSERT_TRUE(status.ok()) << "step " << t << ": " << status.to_string();
    ASSERT_TRUE(client->log_returns("a", 1.0).ok());
  }
  tether::Result<double> total = client->end_episode("a", row(4, -1.0f));
  ASSERT_TRUE(total.ok()) << total.status().to_string();
  EXPECT_EQ(total.value(), 30.0);
  tether::Status flushed = client->flush();
  EXPECT_TRUE(flushed.ok()) << flushed.to_string();
  client->close();

  std::vector<json> batches = unique_batches(server.batches());
  ASSERT_GE(batches.size(), 2u);
  ASSERT_EQ(batches[0]["episodes"].size(), 1u);
  EXPECT_EQ(batches[0]["episodes"][0]["episode_id"], "a");
  EXPECT_EQ(batches[0]["episodes"][0]["actions"].size(), 10u);
  std::vector<json> later;
  for (std::size_t i = 1; i < batches.size(); ++i) {
    for (const json& record : batches[i]["episodes"]) later.push_back(record);
  }
  ASSERT_FALSE(later.empty());
  std::size_t steps = 0;
  for (const json& record : later) {
    EXPECT_EQ(record["episode_id"], "a") << "b's steps were dropped";
    for (const json& obs : record["obs"]) EXPECT_EQ(obs.size(), 4u) << record.dump();
    EXPECT_EQ(record["obs"].size(), record["actions"].size() + 1);
    steps += record["actions"].size();
  }
  EXPECT_EQ(steps, 18u);  // steps 12-29; 10 and 11 (3 values) were dropped
  EXPECT_EQ(later.front()["obs"][0][0].get<double>(), 12.0);
  EXPECT_TRUE(later.back().value("is_terminated", false));
}

TEST(ReconnectNewSpaces, TheOldModelIsLetGoUntilTheNewConnectionSendsOne) {
  auto release = std::make_shared<std::atomic<bool>>(false);
  FakeServer server(reconnecting_server(release, /*model_in_handshake=*/false));
  auto client = connect_not_waiting_for_weights(server);
  ASSERT_TRUE(client);
  play_until_the_reconnect(*client, release);
  if (HasFatalFailure()) return;

  std::vector<double> action;
  tether::Status not_ready = client->get_action("a", row(4, 12.0f), action);
  EXPECT_EQ(not_ready.code(), tether::ErrorCode::kNotReady) << not_ready.to_string();
  EXPECT_EQ(client->models_loaded(), 1);
  tether::Status old_size = client->get_action("a", row(3, 12.0f), action);
  EXPECT_EQ(old_size.code(), tether::ErrorCode::kInvalidArgument) << old_size.to_string();
  client->close();
  // Nothing recorded after the reconnect was sent: b's and a's uncut steps were dropped.
  for (const json& batch : unique_batches(server.batches())) EXPECT_EQ(batch["batch_seq"], 1);
}

}  // namespace

#endif  // _WIN32
