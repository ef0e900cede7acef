// A reconnect does not stop a multi-agent engine: every module keeps acting
// with the model it has until the new connection sends another (as
// TetherClient does), unless the new SET_CONFIG changed that module's spaces:
// that model cannot serve them, so that module alone waits for a new one.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

// Modules m (agents a_*) and n (agents b_*); n observes `n_width` values.
json config(int n_width) {
  return multi_agent_config(
      10, {{"m", module_json(2)}, {"n", module_json(n_width)}},
      json::array({{{"pattern", "a_*"}, {"module", "m"}}, {{"pattern", "b_*"}, {"module", "n"}}}));
}

json models(bool any) {
  json out = json::object();
  if (any) {
    for (const char* id : {"m", "n"}) out[id] = {{"weights_seq_no", 0}, {"onnx_file", fake::onnx_file(1)}};
  }
  return {{"type", "SET_STATE"}, {"models", out}};
}

// The first batch is lost with its connection; the next connection (with
// `second_config`) sends no model, in its handshake or in its answers.
ServerScript reconnecting_server(json second_config) {
  ServerScript script;
  script.config_of_connection = [second_config](int connection) {
    return connection == 1 ? config(2) : second_config;
  };
  script.on_get_state = [](Conn& conn, const tether::Message&, int connection) {
    conn.send(models(connection == 1));
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    if (n == 1) return false;
    conn.send(models(false));
    return true;
  };
  return script;
}

std::unique_ptr<tether::MultiAgentClient> connect_to(const FakeServer& server) {
  tether::ClientOptions options = options_for(server, 5);
  options.wait_for_weights = true;  // the reconnect happens while get_action waits in its cut
  return connect_multi(options);
}

// Plays frames of a_0 until the client has reconnected (and a few after).
void play_through_a_reconnect(tether::MultiAgentClient& client, const std::string& episode) {
  tether::AgentFrame frame;
  for (int t = 0; t < 25; ++t) {
    const float obs[2] = {static_cast<float>(t), 0.0f};
    frame.clear();
    frame.add("a_0", obs, 2);
    tether::Status status = client.get_action(episode, frame);
    ASSERT_TRUE(status.ok()) << "frame " << t << ": " << status.to_string();
    EXPECT_EQ(frame.discrete_action(0), 1);
  }
  EXPECT_GE(client.reconnects(), 1);
}

// Frame `t` of `first` (observing [t, 0]) and `second` (observing [t, 1]); it must succeed.
void act_two(tether::MultiAgentClient& client, const std::string& episode, tether::AgentFrame& frame, int t,
             const char* first, const char* second) {
  const float first_obs[2] = {static_cast<float>(t), 0.0f};
  const float second_obs[2] = {static_cast<float>(t), 1.0f};
  frame.clear();
  frame.add(first, first_obs, 2);
  frame.add(second, second_obs, 2);
  tether::Status status = client.get_action(episode, frame);
  ASSERT_TRUE(status.ok()) << "frame " << t << ": " << status.to_string();
}

// What play_until_n_fails played.
struct Played {
  int a_steps = 0;                         // the frames that succeeded
  std::vector<tether::Status> failed;      // those that failed
  std::int64_t reconnects_at_failure = 0;  // reconnects() when the first one failed
  std::string last_failure() const { return failed.empty() ? "no frame failed" : failed.back().to_string(); }
};

// Frames 0 .. frames-1 of a_0 (observing [t, 0]) and, until a frame fails, of
// b_0 (and b_1 with `group`; both observe [t, 1]): once the reconnect changed
// or dropped module n, the frame with b_0 fails (nothing of it is recorded)
// and b_0 acts no more.
Played play_until_n_fails(tether::MultiAgentClient& client, const std::string& episode, int frames,
                          bool group = false) {
  Played played;
  tether::AgentFrame frame;
  for (int t = 0; t < frames; ++t) {
    const float a_obs[2] = {static_cast<float>(t), 0.0f};
    const float b_obs[2] = {static_cast<float>(t), 1.0f};
    frame.clear();
    frame.add("a_0", a_obs, 2);
    if (played.failed.empty()) {
      frame.add("b_0", b_obs, 2);
      if (group) frame.add("b_1", b_obs, 2);
    }
    tether::Status status = client.get_action(episode, frame);
    if (status.ok()) {
      ++played.a_steps;
      continue;
    }
    if (played.failed.empty()) played.reconnects_at_failure = client.reconnects();
    played.failed.push_back(status);
  }
  return played;
}

// a_0's steps in `batches` (a resent batch counted once). Every record of a
// batch after the first holds no b_0 when `no_b0`, and fits `specs` when given.
std::size_t a0_steps_sent(const std::vector<json>& batches, bool no_b0,
                          const std::map<std::string, tether::ModuleSpec>* specs) {
  std::size_t a_sent = 0;
  std::set<std::int64_t> seqs;
  for (const json& batch : batches) {
    if (!seqs.insert(batch["batch_seq"].get<std::int64_t>()).second) continue;  // a resend
    for (std::size_t i = 0; i < batch["episodes"].size(); ++i) {
      const json& record = batch["episodes"][i];
      if (record["agents"].contains("a_0")) a_sent += record["agents"]["a_0"]["actions"].size();
      if (batch["batch_seq"] == 1) continue;
      if (no_b0) EXPECT_FALSE(record["agents"].contains("b_0")) << record.dump();
      if (specs == nullptr) continue;
      tether::Result<std::size_t> steps = tether::validate_multi_agent_record(record, i, *specs, true);
      EXPECT_TRUE(steps.ok()) << steps.status().to_string() << "\n" << record.dump();
    }
  }
  return a_sent;
}

}  // namespace

TEST(MultiAgentReconnect, ModulesKeepTheirModelsUntilTheNewConnectionSendsOthers) {
  FakeServer server(reconnecting_server(config(2)));
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  std::string episode = client->start_episode().value();
  ASSERT_NO_FATAL_FAILURE(play_through_a_reconnect(*client, episode));
  EXPECT_EQ(client->models_loaded(), 2);  // the first connection's only
  EXPECT_EQ(client->weights_seq_no("m"), 0);
  const float obs[2] = {1.0f, 2.0f};
  tether::AgentFrame frame;
  frame.add("b_0", obs, 2);
  EXPECT_TRUE(client->get_action(episode, frame).ok());  // n too
}

TEST(MultiAgentReconnect, AModuleWhoseSpacesChangedWaitsForANewModel) {
  FakeServer server(reconnecting_server(config(3)));  // n now observes 3 values
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  std::string episode = client->start_episode().value();
  ASSERT_NO_FATAL_FAILURE(play_through_a_reconnect(*client, episode));  // m is unchanged: it acts on
  EXPECT_EQ(client->weights_seq_no("m"), 0);
  EXPECT_FALSE(client->weights_seq_no("n").has_value());
  const float obs[3] = {1.0f, 2.0f, 3.0f};
  tether::AgentFrame frame;
  frame.add("b_0", obs, 3);
  EXPECT_EQ(client->get_action(episode, frame).code(), tether::ErrorCode::kNotReady);
}

// Steps recorded with a module's old spaces are not sent to a server that
// now describes other ones: every record after the reconnect fits the new
// spaces, and the agents of the unchanged module lose nothing.
TEST(MultiAgentReconnect, StepsOfAModuleWhoseSpacesChangedAreDropped) {
  FakeServer server(reconnecting_server(config(3)));
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  std::string episode = client->start_episode("changed").value();
  const Played played = play_until_n_fails(*client, episode, 40);
  // Once: b_0's observations no longer fit module n (nothing of the frame is recorded).
  ASSERT_EQ(played.failed.size(), 1u) << played.last_failure();
  EXPECT_EQ(played.failed[0].code(), tether::ErrorCode::kInvalidArgument) << played.failed[0].to_string();
  EXPECT_GE(played.reconnects_at_failure, 1);
  tether::AgentFrame frame;
  const float final_obs[2] = {-1.0f, 0.0f};
  const float b_final[3] = {-1.0f, 1.0f, 1.0f};  // (its latest observation has the old size)
  frame.add("a_0", final_obs, 2);
  frame.add("b_0", b_final, 3);
  tether::Result<std::map<std::string, double>> ended = client->end_episode(episode, &frame);
  ASSERT_TRUE(ended.ok()) << ended.status().to_string();
  ASSERT_TRUE(client->flush().ok());
  EXPECT_TRUE(client->take_error().ok()) << client->last_error().to_string();
  // Batch 1 went with the first connection (and again, the same, after it);
  // what was cut later must fit the second connection's spaces.
  std::vector<json> batches = server.batches();
  ASSERT_GE(batches.size(), 3u);
  const auto specs = module_specs(config(3));
  EXPECT_EQ(a0_steps_sent(batches, /*no_b0=*/false, &specs), static_cast<std::size_t>(played.a_steps));
}

// An agent of module n leaves just after a cut; the reconnect that changes
// n's spaces comes while its steps wait for the next cut (finished, not cut).
TEST(MultiAgentReconnect, AFinishedAgentOfAModuleWhoseSpacesChangedIsDropped) {
  FakeServer server(reconnecting_server(config(3)));
  tether::ClientOptions options = waiting_options_for(server, 5);
  options.wait_for_weights = false;
  auto connected = tether::MultiAgentClient::connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  auto& client = *connected.value();
  std::string episode = client.start_episode("fin").value();
  tether::AgentFrame frame;
  for (int t = 0; t < 7; ++t) ASSERT_NO_FATAL_FAILURE(act_two(client, episode, frame, t, "a_0", "b_0"));
  const float b_final[2] = {7.0f, 1.0f};
  ASSERT_TRUE(client.retire_agent(episode, "b_0", b_final, 2).ok());  // finished, 2 steps not cut
  for (int i = 0; i < 500 && client.reconnects() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE(client.reconnects(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int t = 7; t < 30; ++t) {
    const float a_obs[2] = {static_cast<float>(t), 0.0f};
    frame.clear();
    frame.add("a_0", a_obs, 2);
    ASSERT_TRUE(client.get_action(episode, frame).ok()) << t;
  }
  ASSERT_TRUE(client.end_episode(episode).ok());
  ASSERT_TRUE(client.flush().ok());
  EXPECT_TRUE(client.take_error().ok()) << client.last_error().to_string();
  const auto specs = module_specs(config(3));
  EXPECT_EQ(a0_steps_sent(server.batches(), /*no_b0=*/true, &specs), 30u) << "dropped " << client.batches_dropped();
}

// The new connection's server no longer describes module n: steps b_0
// recorded with it must not be sent to that server (it would refuse the batch
// and, with it, every other episode's steps in it).
TEST(MultiAgentReconnect, StepsOfAModuleTheServerNoLongerDescribesAreNotSent) {
  json second = config(2);
  second["modules"].erase("n");
  second["policy_mapping"] = json::array({{{"pattern", "a_*"}, {"module", "m"}}});
  FakeServer server(reconnecting_server(second));
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  std::string episode = client->start_episode("gone").value();
  // Once: module n has no model any more (nothing of the frame is recorded).
  const Played played = play_until_n_fails(*client, episode, 30);
  ASSERT_EQ(played.failed.size(), 1u) << played.last_failure();
  tether::AgentFrame frame;
  const float a_final[2] = {-1.0f, 0.0f};
  frame.add("a_0", a_final, 2);
  ASSERT_TRUE(client->end_episode(episode, &frame).ok());
  ASSERT_TRUE(client->flush().ok());
  tether::Status error = client->take_error();
  EXPECT_TRUE(error.ok()) << error.to_string();
  // a_0's steps, its last chunk included
  EXPECT_EQ(a0_steps_sent(server.batches(), /*no_b0=*/true, nullptr), static_cast<std::size_t>(played.a_steps));
}

// After a reconnect changed module n's spaces, b_0 (which stopped acting)
// has only an observation of the old size: end_episode without final
// observations must still end the episode (b_0 has nothing left to send).
TEST(MultiAgentReconnect, AnEpisodeEndsAfterAModulesSpacesChanged) {
  FakeServer server(reconnecting_server(config(3)));
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  std::string episode = client->start_episode("ends").value();
  ASSERT_FALSE(play_until_n_fails(*client, episode, 30).failed.empty());
  tether::Result<std::map<std::string, double>> ended = client->end_episode(episode);
  EXPECT_TRUE(ended.ok()) << ended.status().to_string();
}


namespace {

// a_0 and a_1 (module m) act through a reconnect whose SET_CONFIG changes
// m's critic agents from `first` to {"a_1"}: every critic row sent after it
// must be a_1's observation of that frame, [t, 1].
void check_critic_rows_after_a_reconnect(std::vector<std::string> first) {
  auto critic_config = [](std::vector<std::string> critic) {
    json c = config(2);
    c["modules"]["m"]["value_obs_agents"] = critic;
    return c;
  };
  ServerScript script = reconnecting_server(critic_config({"a_1"}));
  script.config_of_connection = [critic_config, first](int connection) {
    return connection == 1 ? critic_config(first) : critic_config({"a_1"});
  };
  FakeServer server(script);
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  std::string episode = client->start_episode("critic").value();
  tether::AgentFrame frame;
  for (int t = 0; t < 30; ++t) ASSERT_NO_FATAL_FAILURE(act_two(*client, episode, frame, t, "a_0", "a_1"));
  ASSERT_GE(client->reconnects(), 1);
  ASSERT_TRUE(client->end_episode(episode).ok());
  ASSERT_TRUE(client->flush().ok());
  std::set<std::int64_t> seqs;
  std::size_t checked = 0;
  for (const json& batch : server.batches()) {
    if (!seqs.insert(batch["batch_seq"].get<std::int64_t>()).second || batch["batch_seq"] == 1) continue;
    for (const json& record : batch["episodes"]) {
      for (const char* agent : {"a_0", "a_1"}) {
        if (!record["agents"].contains(agent)) continue;
        const json& entry = record["agents"][agent];
        ASSERT_EQ(entry["value_obs"].size(), entry["obs"].size());
        for (std::size_t k = 0; k < entry["obs"].size(); ++k) {
          ++checked;
          EXPECT_EQ(entry["value_obs"][k], json({entry["obs"][k][0], 1.0}))
              << "batch " << batch["batch_seq"] << " " << agent << " row " << k;
        }
      }
    }
  }
  EXPECT_GT(checked, 0u);
}

}  // namespace

// The critic's agents change on reconnect (the spaces do not): value_obs rows
// recorded for the old list must not be sent laid out for the new one.
TEST(MultiAgentReconnect, ValueObsRowsRecordedBeforeACriticChangeKeepTheirLayout) {
  check_critic_rows_after_a_reconnect({"a_0", "a_1"});
}

// A reconnect makes a_1, acting since before it, the critic's agent
// (it was not before). Its critic rows recorded after the reconnect must hold
// its observations, not zeros (which agents a critic sees is looked at again).
TEST(MultiAgentReconnect, AnAgentThatBecomesACriticAgentIsSeenByTheCritic) {
  check_critic_rows_after_a_reconnect({"a_0"});
}

// As AnEpisodeEndsAfterAModulesSpacesChanged, for a group: its
// members' latest observations have the old size; end_episode without final
// observations must still end the episode (the group has nothing to send).
TEST(MultiAgentReconnect, AnEpisodeWithAGroupEndsAfterItsModulesSpacesChanged) {
  auto group_config = [](int member_width) {
    json c = config(2);
    c["modules"]["n"]["observation_space"]["shape"] = {2 * member_width};
    c["modules"]["n"]["action_space"] = {{"type", "MultiDiscrete"}, {"nvec", {2, 2}}};
    c["groups"] = {{"g", {{"members", {"b_0", "b_1"}}, {"reward", "sum"}}}};
    c["policy_mapping"] = json::array({{{"pattern", "a_*"}, {"module", "m"}}, {{"agent_id", "g"}, {"module", "n"}}});
    return c;
  };
  ServerScript script = reconnecting_server(group_config(3));
  script.config_of_connection = [group_config](int connection) { return group_config(connection == 1 ? 2 : 3); };
  FakeServer server(script);
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  std::string episode = client->start_episode("ends").value();
  const Played played = play_until_n_fails(*client, episode, 30, /*group=*/true);
  ASSERT_EQ(played.failed.size(), 1u) << played.last_failure();
  tether::Result<std::map<std::string, double>> ended = client->end_episode(episode);
  EXPECT_TRUE(ended.ok()) << ended.status().to_string();
}

#endif  // _WIN32
