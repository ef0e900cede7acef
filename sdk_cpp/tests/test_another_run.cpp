// [1.8] A reconnect that reaches another server run (PONG run_id, §6.5,
// §7.2): a server restarted without resuming counts weights versions from 0
// again, so steps acted with the old run's weights claim versions that name
// other weights there, and no model of the new run explains their
// action_logp. Both clients therefore drop them: the batch cut before the
// reconnect and not answered is not sent again (the link counts it), the
// steps not cut yet go when the engine takes in the new connection, both are
// counted (other_run_steps_dropped()), and the episodes go on. The same run
// (a resumed server), or a server that names no run, keeps the rules of 1.7:
// the batch is sent again, nothing is dropped. The scenarios of the Python
// SDK's tests/sdk/test_another_run.py (and of the C# SDK's AnotherRunTests).
#include <gtest/gtest.h>

#ifndef _WIN32

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

// A PONG of protocol 1.8 naming `run_id` (none: naming no run, as an older server).
json pong_of(const std::optional<std::string>& run_id) {
  json pong = {{"type", "PONG"}, {"protocol_version", "1.8"}, {"server", "fake"}};
  if (run_id) pong["run_id"] = *run_id;
  return pong;
}

// Run "run-a" (the first connection: `first_state` in its handshake) loses
// the first batch with its connection, unanswered, once `release` is set;
// the next connections reach `second_run` (`second_state` in their
// handshake) and answer every batch with `answer`. Every connection is
// configured with `config`.
ServerScript restarting_server(std::optional<std::string> second_run, json config, json first_state,
                               json second_state, json answer, std::shared_ptr<std::atomic<bool>> release) {
  ServerScript script;
  auto pings = std::make_shared<std::atomic<int>>(0);
  script.on_ping = [pings, second_run](Conn& conn, const tether::Message&) {
    conn.send(pong_of(pings->fetch_add(1) == 0 ? std::optional<std::string>("run-a") : second_run));
    return true;
  };
  script.config_of_connection = [config](int) { return config; };
  script.on_get_state = [first_state, second_state](Conn& conn, const tether::Message&, int connection) {
    conn.send(connection == 1 ? first_state : second_state);
    return true;
  };
  script.on_batch = [release, answer](Conn& conn, const tether::Message&, int n) {
    if (n == 1) {  // lost with the connection, unanswered
      (void)wait_for([&release] { return release->load(); }, 10.0);
      return false;
    }
    conn.send(answer);
    return true;
  };
  return script;
}

// The batches the server received on its second connection (after the second PING).
std::vector<json> batches_on_second(FakeServer& server) {
  std::vector<json> out;
  int pings = 0;
  for (const json& message : server.messages()) {
    if (message["type"] == "PING") ++pings;
    if (pings == 2 && message["type"] == "EPISODES_AND_GET_STATE") out.push_back(message);
  }
  return out;
}

// Waits until the engine has taken in the second connection: its model(s)
// are loaded (`models` in all). Every error taken meanwhile fails the test.
void wait_for_the_second_connection(tether::ClientBase& client, std::int64_t models) {
  ASSERT_TRUE(wait_for(
      [&] {
        tether::Status error = client.take_error();  // (takes in the I/O thread's news)
        EXPECT_TRUE(error.ok()) << error.to_string();
        return client.models_loaded() >= models;
      },
      5.0));
}

// -- the link alone -----------------------------------------------------------------------------

// A one-step batch of episode `id`, cut on connection `connection`.
std::shared_ptr<tether::Batch> one_step_on(const std::string& id, std::int64_t connection) {
  std::shared_ptr<tether::Batch> batch = one_step(id);
  batch->connection = connection;
  return batch;
}

json single_agent_config(int obs_width) {
  return {{"type", "SET_CONFIG"},
          {"observation_space", {{"type", "Box"}, {"shape", {obs_width}}, {"low", -10.0}, {"high", 10.0}}},
          {"action_space", discrete(2)},
          {"onnx_input_names", {"obs"}},
          {"onnx_output_names", {"action_dist_inputs"}},
          {"env_steps_per_sample", 10},
          {"force_on_policy", true},
          {"heartbeat_interval_s", 0},
          {"protocol_version", "1.8"}};
}

// Batch "lost" (cut on connection 1) goes with run-a's connection; once the
// link reached `second_run`, "queued" (cut on connection 1 too) and "fresh"
// (cut on connection 2) are handed over.
struct LinkRun {
  std::uint64_t dropped = 0;                  // other_run_steps_dropped()
  std::shared_ptr<tether::Batch> lost, queued, fresh;
  std::vector<tether::LinkEvent> events;      // all of them, taken at the end
  std::vector<json> batches;                  // the server's
};

LinkRun run_link(std::optional<std::string> second_run) {
  LinkRun run;
  auto release = std::make_shared<std::atomic<bool>>(false);
  FakeServer server(restarting_server(second_run, single_agent_config(4), state(3, 1), state(0, 1),
                                      json{{"type", "SET_STATE"}, {"weights_seq_no", 0}}, release));
  tether::ServerLink link(link_options_for(server));
  EXPECT_TRUE(link.start().ok());
  run.lost = one_step_on("lost", 1);
  link.submit(run.lost);
  EXPECT_TRUE(wait_for([&] { return server.batches().size() == 1; }, 5.0));
  release->store(true);
  EXPECT_TRUE(wait_for([&] { return link.reconnects() >= 1 && server.connections() >= 2 && link.idle(); }, 5.0));
  run.queued = one_step_on("queued", 1);
  run.fresh = one_step_on("fresh", 2);
  link.submit(run.queued);
  link.submit(run.fresh);
  link.wait_for_idle();
  run.dropped = link.other_run_steps_dropped();
  link.take_events(run.events);
  link.close();
  run.batches = server.batches();
  return run;
}

TEST(AnotherRun, TheLinkDropsBatchesCutUnderAnotherRun) {
  const LinkRun run = run_link(std::string("run-b"));
  EXPECT_EQ(run.dropped, 2u);  // "lost" and "queued", a step each
  for (const auto* batch : {&run.lost, &run.queued}) {
    EXPECT_TRUE((*batch)->done);
    EXPECT_TRUE((*batch)->other_run);
    EXPECT_TRUE((*batch)->error.ok()) << (*batch)->error.to_string();
    EXPECT_TRUE((*batch)->chunks.empty());  // (freed on the I/O thread)
  }
  EXPECT_TRUE(run.fresh->done);
  EXPECT_FALSE(run.fresh->other_run);
  int other_run_events = 0;
  for (const tether::LinkEvent& event : run.events) {
    EXPECT_NE(event.kind, tether::LinkEvent::Kind::kError) << event.status.to_string();
    if (event.kind == tether::LinkEvent::Kind::kBatch && event.batch->other_run) ++other_run_events;
  }
  EXPECT_EQ(other_run_events, 2);  // the engine hears of both: not sent, no error
  // The server got "lost" once (on run-a's connection) and "fresh" alone then.
  ASSERT_EQ(run.batches.size(), 2u);
  EXPECT_EQ(run.batches[0]["episodes"][0]["episode_id"], "lost");
  EXPECT_EQ(run.batches[1]["episodes"][0]["episode_id"], "fresh");
  EXPECT_EQ(run.batches[1]["batch_seq"], 2);
}

TEST(AnotherRun, TheLinkSendsAgainToTheSameRunOrOneThatNamesNone) {
  for (const std::optional<std::string>& second : {std::optional<std::string>("run-a"), std::optional<std::string>()}) {
    SCOPED_TRACE(second.value_or("(no run_id)"));
    const LinkRun run = run_link(second);
    EXPECT_EQ(run.dropped, 0u);
    for (const auto* batch : {&run.lost, &run.queued, &run.fresh}) {
      EXPECT_TRUE((*batch)->done);
      EXPECT_FALSE((*batch)->other_run);
    }
    ASSERT_EQ(run.batches.size(), 4u);  // "lost" twice (the same batch_seq), then the two others
    EXPECT_EQ(run.batches[1]["episodes"][0]["episode_id"], "lost");
    EXPECT_EQ(run.batches[1]["batch_seq"], 1);
  }
}

// -- TetherClient -------------------------------------------------------------------------------

std::vector<float> row(int width, float value) { return std::vector<float>(static_cast<std::size_t>(width), value); }

struct SingleAgentRun {
  std::uint64_t dropped = 0;  // other_run_steps_dropped()
  std::vector<json> batches;  // unique_batches
  std::vector<json> on_second;
};

// Batch 1 (steps 0-9) is lost with run-a's connection; steps 10 and 11 are
// recorded, not cut, when the client reconnects to `second_run`; then steps
// 12-29 and the end.
SingleAgentRun play_single_agent(std::optional<std::string> second_run) {
  SingleAgentRun run;
  auto release = std::make_shared<std::atomic<bool>>(false);
  FakeServer server(restarting_server(second_run, single_agent_config(3), state(3, 1), state(0, 1),
                                      json{{"type", "SET_STATE"}, {"weights_seq_no", 0}}, release));
  tether::ClientOptions options = waiting_options_for(server, 5);
  options.wait_for_weights = false;
  auto client = connect(options);
  if (!client) return run;
  std::vector<double> action;
  EXPECT_TRUE(client->start_episode("a").ok());
  for (int t = 0; t < 12; ++t) {  // the 11th cuts batch 1 (steps 0-9), lost with the connection
    tether::Status status = client->get_action("a", row(3, static_cast<float>(t)), action);
    EXPECT_TRUE(status.ok()) << "step " << t << ": " << status.to_string();
    EXPECT_TRUE(client->log_returns("a", 1.0).ok());
  }
  release->store(true);
  wait_for_the_second_connection(*client, 2);
  for (int t = 12; t < 30; ++t) {
    tether::Status status = client->get_action("a", row(3, static_cast<float>(t)), action);
    EXPECT_TRUE(status.ok()) << "step " << t << ": " << status.to_string();
    EXPECT_TRUE(client->log_returns("a", 1.0).ok());
  }
  tether::Result<double> total = client->end_episode("a", row(3, -1.0f));
  EXPECT_TRUE(total.ok()) << total.status().to_string();
  if (total.ok()) EXPECT_EQ(total.value(), 30.0);
  tether::Status flushed = client->flush();  // no error: nothing was refused
  EXPECT_TRUE(flushed.ok()) << flushed.to_string();
  run.dropped = client->other_run_steps_dropped();
  client->close();
  EXPECT_EQ(client->other_run_steps_dropped(), run.dropped);  // (still readable once closed)
  run.batches = unique_batches(server.batches());
  run.on_second = batches_on_second(server);
  return run;
}

TEST(AnotherRun, SingleAgentStepsOfAnotherRunAreDroppedAndTheEpisodeGoesOn) {
  const SingleAgentRun run = play_single_agent(std::string("run-b"));
  // 12 in all: batch 1's 10 (not sent again, by the link) and steps 10 and 11 (not cut yet).
  EXPECT_EQ(run.dropped, 12u);
  ASSERT_GE(run.batches.size(), 2u);
  EXPECT_EQ(run.batches[0]["batch_seq"], 1);
  EXPECT_EQ(run.batches[0]["episodes"][0]["actions"].size(), 10u);  // the link's 10
  for (const json& batch : run.on_second) EXPECT_NE(batch["batch_seq"], 1) << "batch 1 was sent to run-b";
  std::vector<json> later;
  for (std::size_t i = 1; i < run.batches.size(); ++i) {
    for (const json& record : run.batches[i]["episodes"]) later.push_back(record);
    // run-b's version is claimed, not run-a's 3 (steps 10 and 11 used it)
    EXPECT_EQ(run.batches[i]["weights_seq_no"], 0) << run.batches[i].dump().substr(0, 200);
  }
  ASSERT_FALSE(later.empty());
  EXPECT_EQ(later.front()["obs"][0][0].get<double>(), 12.0) << "steps 10 and 11 were dropped";
  std::size_t steps = 0;
  for (const json& record : later) steps += record["actions"].size();
  EXPECT_EQ(steps, 18u);  // steps 12-29
  EXPECT_TRUE(later.back().value("is_terminated", false));
}

TEST(AnotherRun, SingleAgentStepsGoAgainToTheSameRunOrOneThatNamesNone) {
  for (const std::optional<std::string>& second : {std::optional<std::string>("run-a"), std::optional<std::string>()}) {
    SCOPED_TRACE(second.value_or("(no run_id)"));
    const SingleAgentRun run = play_single_agent(second);
    EXPECT_EQ(run.dropped, 0u);
    ASSERT_FALSE(run.on_second.empty());
    EXPECT_EQ(run.on_second[0]["batch_seq"], 1) << "batch 1 goes again to the same run";
    std::size_t steps = 0;
    for (const json& batch : run.batches) {
      for (const json& record : batch["episodes"]) steps += record["actions"].size();
    }
    EXPECT_EQ(steps, 30u);
    ASSERT_GE(run.batches.size(), 2u);
    EXPECT_EQ(run.batches[1]["episodes"][0]["obs"][0][0].get<double>(), 10.0);
  }
}

// The batch cut at step 10 waits for its answer (wait_for_weights): its
// connection goes unanswered and the link reaches run-b within that same
// call, so the engine takes in run-b's connection (dropping the steps not
// cut yet) while the step that cut the batch is still being acted. The
// step is acted and recorded whole, and the episode goes on (an earlier
// client lent the step's observation to the cut and took it back after the
// drop had taken it already: a length_error that ended the game).
TEST(AnotherRun, ADropWhileTheCuttingStepWaitsLeavesThatStepWhole) {
  auto release = std::make_shared<std::atomic<bool>>(true);  // batch 1's connection goes at once
  FakeServer server(restarting_server(std::string("run-b"), single_agent_config(3), state(3, 1), state(0, 1),
                                      json{{"type", "SET_STATE"}, {"weights_seq_no", 0}}, release));
  tether::ClientOptions options = waiting_options_for(server, 5);
  options.wait_for_weights = true;
  auto client = connect(options);
  ASSERT_TRUE(client);
  std::vector<double> action;
  ASSERT_TRUE(client->start_episode("a").ok());
  for (int t = 0; t < 30; ++t) {  // the 11th cuts batch 1 and waits through the reconnect to run-b
    tether::Status status = client->get_action("a", row(3, static_cast<float>(t)), action);
    ASSERT_TRUE(status.ok()) << "step " << t << ": " << status.to_string();
    ASSERT_TRUE(client->log_returns("a", 1.0).ok());
  }
  tether::Result<double> total = client->end_episode("a", row(3, -1.0f));
  ASSERT_TRUE(total.ok()) << total.status().to_string();
  EXPECT_EQ(total.value(), 30.0);
  EXPECT_TRUE(client->flush().ok());
  const std::uint64_t dropped = client->other_run_steps_dropped();
  client->close();
  EXPECT_EQ(dropped, 10u);  // batch 1 (the link's); nothing was recorded but not cut then
  std::vector<json> later = batches_on_second(server);
  ASSERT_FALSE(later.empty());
  std::size_t steps = 0;
  float next = 10.0f;  // every step from 10 on goes to run-b once, in order
  for (const json& batch : later) {
    for (const json& record : batch["episodes"]) {
      for (std::size_t i = 0; i < record["actions"].size(); ++i) {
        EXPECT_EQ(record["obs"][i][0].get<double>(), next) << batch.dump().substr(0, 300);
        next += 1.0f;
      }
      steps += record["actions"].size();
    }
  }
  EXPECT_EQ(steps, 20u);  // steps 10-29
}

// -- MultiAgentClient ---------------------------------------------------------------------------

// Modules m (agents a_*) and n (agents b_*), both observing 2 values.
json multi_agent_run_config() {
  return multi_agent_config(
      10, {{"m", module_json(2)}, {"n", module_json(2)}},
      json::array({{{"pattern", "a_*"}, {"module", "m"}}, {{"pattern", "b_*"}, {"module", "n"}}}));
}

json models_at(std::int64_t seq) {
  json models = json::object();
  for (const char* id : {"m", "n"}) models[id] = {{"weights_seq_no", seq}, {"onnx_file", onnx_file(1)}};
  return {{"type", "SET_STATE"}, {"models", models}};
}

// Frame `t` of a_0 (observing [t, 0]) and b_0 ([t, 1]), each rewarded 1; it must succeed.
void frame_of_two(tether::MultiAgentClient& client, const std::string& episode, tether::AgentFrame& frame, int t) {
  const float a_obs[2] = {static_cast<float>(t), 0.0f};
  const float b_obs[2] = {static_cast<float>(t), 1.0f};
  frame.clear();
  frame.add("a_0", a_obs, 2);
  frame.add("b_0", b_obs, 2);
  tether::Status status = client.get_action(episode, frame);
  ASSERT_TRUE(status.ok()) << "frame " << t << ": " << status.to_string();
  ASSERT_TRUE(client.log_returns(episode, "a_0", 1.0).ok());
  ASSERT_TRUE(client.log_returns(episode, "b_0", 1.0).ok());
}

// Both modules' steps not cut yet go at the reconnect to run-b (a_0's and
// b_0's), and the batch lost with run-a's connection is not sent; the
// episode goes on, each agent from its next frame.
TEST(AnotherRun, MultiAgentStepsOfAnotherRunAreDroppedInEveryModule) {
  auto release = std::make_shared<std::atomic<bool>>(false);
  FakeServer server(restarting_server(std::string("run-b"), multi_agent_run_config(), models_at(4), models_at(0),
                                      json{{"type", "SET_STATE"}, {"models", json::object()}}, release));
  tether::ClientOptions options = waiting_options_for(server, 5);
  options.wait_for_weights = false;
  auto client = connect_multi(options);
  ASSERT_TRUE(client);
  const std::string episode = client->start_episode("e").value();
  tether::AgentFrame frame;
  // 5 steps of each agent are sendable at the 6th frame: batch 1, lost.
  for (int t = 0; t < 7; ++t) ASSERT_NO_FATAL_FAILURE(frame_of_two(*client, episode, frame, t));
  release->store(true);
  ASSERT_NO_FATAL_FAILURE(wait_for_the_second_connection(*client, 4));
  for (int t = 7; t < 30; ++t) ASSERT_NO_FATAL_FAILURE(frame_of_two(*client, episode, frame, t));
  ASSERT_TRUE(client->end_episode(episode).ok());
  tether::Status flushed = client->flush();
  EXPECT_TRUE(flushed.ok()) << flushed.to_string();
  const std::uint64_t dropped = client->other_run_steps_dropped();
  client->close();

  const std::vector<json> batches = unique_batches(server.batches());
  ASSERT_GE(batches.size(), 2u);
  EXPECT_EQ(batches[0]["batch_seq"], 1);
  std::size_t sent_first = 0;
  for (const json& record : batches[0]["episodes"]) {
    for (const auto& entry : record["agents"].items()) sent_first += entry.value()["actions"].size();
  }
  EXPECT_EQ(sent_first, 10u);  // 5 steps of each agent: the link's part of what was dropped
  for (const json& batch : batches_on_second(server)) EXPECT_NE(batch["batch_seq"], 1) << "batch 1 was sent to run-b";
  // Batch 1's, and every step after it recorded before the engine took in run-b.
  EXPECT_EQ(dropped, 2u * 7u);
  std::size_t later_steps = 0;
  for (std::size_t i = 1; i < batches.size(); ++i) {
    EXPECT_EQ(batches[i]["weights_seq_nos"], json({{"m", 0}, {"n", 0}})) << "run-b's versions are claimed";
    for (const json& record : batches[i]["episodes"]) {
      for (const auto& entry : record["agents"].items()) {
        for (const json& obs : entry.value()["obs"]) {
          EXPECT_GE(obs[0].get<double>(), 7.0) << entry.key() << ": a step acted with run-a's models went";
        }
        later_steps += entry.value()["actions"].size();
      }
    }
  }
  EXPECT_EQ(later_steps, 2u * 23u);
}

}  // namespace

#endif  // _WIN32
