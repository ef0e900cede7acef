// The end of training on the wire (protocol 1.3, docs/protocol.md §6.6 "End
// of training"): a server whose run is done writes the unsolicited ERROR
// TRAINING_DONE with the run's summary and closes. The clients report it as
// the normal end (training_done(), training_summary()), not as an error or a
// lost connection; they never reconnect nor resend; the batches not answered
// are discarded and counted; every call goes on acting with the last model,
// recording and sending nothing; flush() returns at once; a request waiting
// (MAP_AGENTS) fails with TRAINING_DONE.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tether/messages.h"
#include "tether/session.h"
#include "tether/status.h"

namespace {

using nlohmann::json;

json summary_json() {
  return {{"reason", "max_env_steps"}, {"env_steps", 1234},   {"agent_steps", 1300},
          {"agent_steps_trained", 1200}, {"updates", 3},      {"episodes", 42},
          {"weights_seq_no", 3},         {"return_mean", 87.5}, {"wall_s", 12.5}};
}

json training_done(const json& summary = summary_json()) {
  return {{"type", "ERROR"},
          {"code", "TRAINING_DONE"},
          {"message", "training is done (max_env_steps): 3 updates; do not reconnect"},
          {"summary", summary}};
}

// The summary fields summary_json() sent.
void expect_summary(const std::optional<tether::TrainingSummary>& summary) {
  ASSERT_TRUE(summary.has_value());
  EXPECT_EQ(summary->reason, "max_env_steps");
  EXPECT_EQ(summary->env_steps, 1234);
  EXPECT_EQ(summary->agent_steps, 1300);
  EXPECT_EQ(summary->agent_steps_trained, 1200);
  EXPECT_EQ(summary->updates, 3);
  EXPECT_EQ(summary->episodes, 42);
  EXPECT_EQ(summary->weights_seq_no, 3);
  ASSERT_TRUE(summary->return_mean.has_value());
  EXPECT_DOUBLE_EQ(*summary->return_mean, 87.5);
  EXPECT_EQ(summary->json.value("wall_s", 0.0), 12.5);  // members the SDK does not name are kept
}

}  // namespace

TEST(TrainingDone, IsAConnectionClosingCodeThatPairsWithNoRequest) {
  EXPECT_EQ(tether::error_code_from_string("TRAINING_DONE"), tether::ErrorCode::kTrainingDone);
  EXPECT_EQ(tether::to_string(tether::ErrorCode::kTrainingDone), "TRAINING_DONE");
  EXPECT_TRUE(tether::closes_connection(tether::ErrorCode::kTrainingDone));
  tether::ClientConnection conn;
  std::string sent;
  ASSERT_TRUE(conn.send({{"type", "EPISODES_AND_GET_STATE"}, {"episodes", json::array()}}, sent).ok());
  std::string data;
  ASSERT_TRUE(tether::append_message_frame(training_done(), data).ok());
  std::vector<tether::Response> responses;
  tether::Status status = conn.receive_data(data, responses);
  EXPECT_EQ(status.code(), tether::ErrorCode::kTrainingDone);
  EXPECT_TRUE(conn.closed());
  ASSERT_EQ(responses.size(), 1u);
  EXPECT_FALSE(responses[0].request.has_value());  // it answers nothing (§5.3 step 1)
  EXPECT_TRUE(tether::is_training_done(responses[0].message));
  tether::Message with_request{tether::MessageType::kError, training_done()};
  with_request.body["request"] = "GET_STATE";
  EXPECT_FALSE(tether::is_training_done(with_request));  // a refusal of that request, not the goodbye
}

TEST(TrainingDone, SummaryReadsWhatWasSentAndDefaultsTheRest) {
  expect_summary(tether::TrainingSummary::from_json(summary_json()));
  const tether::TrainingSummary odd = tether::TrainingSummary::from_json(
      {{"reason", 7}, {"env_steps", "many"}, {"agent_steps", -5}, {"updates", 2.5},
       {"episodes", std::numeric_limits<std::uint64_t>::max()}, {"return_mean", nullptr}});
  EXPECT_EQ(odd.reason, "");
  EXPECT_EQ(odd.env_steps, 0);
  EXPECT_EQ(odd.agent_steps, 0);
  EXPECT_EQ(odd.updates, 0);
  EXPECT_EQ(odd.episodes, std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(odd.agent_steps_trained, 0);
  EXPECT_FALSE(odd.return_mean.has_value());
  const tether::TrainingSummary none = tether::TrainingSummary::from_json(json());  // an ERROR without one
  EXPECT_TRUE(none.json.is_object() && none.json.empty());
  EXPECT_FALSE(none.return_mean.has_value());
}

#ifndef _WIN32

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

// Batches 1..answered get the model preferring action 1; the next one is
// answered with TRAINING_DONE, and the connection is closed.
ServerScript ending_after(int answered) {
  ServerScript script;
  script.steps_per_sample = 10;
  script.on_batch = [answered](Conn& conn, const tether::Message&, int n) {
    if (n <= answered) {
      conn.send(state(n, 1));
      return true;
    }
    conn.send(training_done());
    return false;
  };
  return script;
}

// Plays `steps` steps of 10-step episodes; every call must succeed; returns the actions.
std::vector<int> play(tether::TetherClient& client, int steps) {
  std::vector<int> actions;
  float obs[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  double action[1];
  for (int done = 0; done < steps;) {
    tether::Result<std::string> episode = client.start_episode();
    EXPECT_TRUE(episode.ok()) << episode.status().to_string();
    if (!episode.ok()) return actions;
    for (int t = 0; t < 10; ++t, ++done) {
      tether::Status acted = client.get_action(episode.value(), obs, 4, action, 1);
      EXPECT_TRUE(acted.ok()) << acted.to_string();
      if (!acted.ok()) return actions;
      actions.push_back(static_cast<int>(action[0]));
      EXPECT_TRUE(client.log_returns(episode.value(), 1.0).ok());
      obs[0] = static_cast<float>(t) / 10.0f;
    }
    tether::Result<double> ended = client.end_episode(episode.value(), obs, 4, false);
    EXPECT_TRUE(ended.ok()) << ended.status().to_string();
    EXPECT_DOUBLE_EQ(ended.ok() ? ended.value() : 0.0, 10.0);
  }
  return actions;
}

// Plays until the client says training is done (at most `seconds`).
bool play_until_done(tether::TetherClient& client, double seconds) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  while (!client.training_done() && Clock::now() < deadline) {
    play(client, 10);
    if (::testing::Test::HasFailure()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return client.training_done();
}

}  // namespace

TEST(TrainingDone, ANormalEndTheClientActsOnWithTheLastModelAndSendsNothing) {
  FakeServer server(ending_after(2));
  auto connected = tether::TetherClient::connect(options_for(server));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  EXPECT_FALSE(client.training_done());
  EXPECT_FALSE(client.training_summary().has_value());
  EXPECT_EQ(client.batches_unsent_at_end(), 0);
  ASSERT_TRUE(play_until_done(client, 10.0));
  expect_summary(client.training_summary());
  // The normal end: no fatal status, no error queued, no reconnect.
  EXPECT_TRUE(client.fatal_error().ok()) << client.fatal_error().to_string();
  EXPECT_EQ(client.take_error().code(), tether::ErrorCode::kOk);
  EXPECT_EQ(client.reconnects(), 0);
  // Every call goes on, with the last model (it prefers action 1).
  std::vector<int> actions = play(client, 30);
  ASSERT_EQ(actions.size(), 30u);
  for (int a : actions) EXPECT_EQ(a, 1);
  const std::int64_t unsent = client.batches_unsent_at_end();
  EXPECT_GE(unsent, 1);  // batch 3, in flight when the server said goodbye
  const std::int64_t sent_steps = client.env_steps_sent();
  EXPECT_EQ(sent_steps, 20);  // batches 1 and 2 (batch 3 was not answered)
  const auto flush_started = Clock::now();
  EXPECT_TRUE(client.flush().ok());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - flush_started).count(), 1.0);  // it does not wait
  play(client, 50);
  EXPECT_TRUE(client.flush().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a reconnect would come now
  EXPECT_EQ(server.connections(), 1);
  EXPECT_EQ(client.reconnects(), 0);
  EXPECT_EQ(server.batches().size(), 3u);  // nothing was sent after the goodbye
  EXPECT_EQ(client.batches_unsent_at_end(), unsent);  // episodes played since are not recorded at all
  EXPECT_EQ(client.env_steps_sent(), sent_steps);
  EXPECT_EQ(client.pending_errors(), 0u);
  EXPECT_TRUE(client.fatal_error().ok());
  expect_summary(client.training_summary());
}

TEST(TrainingDone, AStrictOnPolicyWaitForTheAnswerEndsAndTheBatchIsCounted) {
  FakeServer server(ending_after(1));
  tether::ClientOptions options = options_for(server);
  options.wait_for_weights = true;  // get_action waits for each batch's answer
  auto connected = tether::TetherClient::connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  // The cut of batch 2 waits for its answer; TRAINING_DONE ends the wait, no call fails.
  play(client, 30);
  ASSERT_TRUE(client.training_done());
  EXPECT_TRUE(client.fatal_error().ok());
  EXPECT_EQ(client.pending_errors(), 0u);
  // Batch 2 was in flight; every step played since then was unrecorded, so none else is counted.
  EXPECT_EQ(client.batches_unsent_at_end(), 1);
  EXPECT_EQ(client.env_steps_sent(), 10);
  play(client, 40);
  EXPECT_TRUE(client.flush().ok());
  EXPECT_EQ(client.batches_unsent_at_end(), 1);
  EXPECT_EQ(server.batches().size(), 2u);
  EXPECT_EQ(server.connections(), 1);
}

TEST(TrainingDone, AnIdleClientHearsItToo) {
  ServerScript script;
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send(state(0, 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the client is idle by now
    conn.send(training_done());
    return false;
  };
  FakeServer server(script);
  auto connected = tether::TetherClient::connect(options_for(server));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!client.training_done() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(client.training_done());
  expect_summary(client.training_summary());
  std::vector<int> actions = play(client, 20);
  ASSERT_EQ(actions.size(), 20u);
  EXPECT_EQ(actions.back(), 1);
  EXPECT_TRUE(client.flush().ok());
  EXPECT_EQ(client.batches_unsent_at_end(), 0);  // nothing was recorded or queued
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(server.connections(), 1);
  EXPECT_TRUE(server.batches().empty());
  EXPECT_EQ(client.pending_errors(), 0u);
}

TEST(TrainingDone, DuringTheHandshakeConnectFailsWithItAndNeverRetries) {
  ServerScript script;
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send(training_done());
    return false;
  };
  FakeServer server(script);
  auto connected = tether::TetherClient::connect(options_for(server));
  ASSERT_FALSE(connected.ok());
  EXPECT_EQ(connected.status().code(), tether::ErrorCode::kTrainingDone) << connected.status().to_string();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(server.connections(), 1);
}

// -- the multi-agent client ------------------------------------------------------------------

namespace {

// Modules m (agents a_*) and n (b_*) by rules, or mapped by the server (MAP_AGENTS).
json multi_config(bool rules) {
  return multi_agent_config(
      10, {{"m", module_json(2)}, {"n", module_json(2)}},
      rules ? json::array({{{"pattern", "a_*"}, {"module", "m"}}, {{"pattern", "b_*"}, {"module", "n"}}}) : json());
}

json models(std::int64_t seq, std::uint8_t model) {
  return {{"type", "SET_STATE"},
          {"models",
           {{"m", {{"weights_seq_no", seq}, {"onnx_file", fake::onnx_file(model)}}},
            {"n", {{"weights_seq_no", seq}, {"onnx_file", fake::onnx_file(model)}}}}}};
}

// One 5-frame episode of a_0 and b_0; every call must succeed; returns the actions taken.
std::vector<std::int64_t> play_multi(tether::MultiAgentClient& client) {
  std::vector<std::int64_t> actions;
  tether::Result<std::string> episode = client.start_episode();
  EXPECT_TRUE(episode.ok()) << episode.status().to_string();
  if (!episode.ok()) return actions;
  tether::AgentFrame frame;
  for (int t = 0; t < 5; ++t) {
    const float obs[2] = {static_cast<float>(t), 0.5f};
    frame.clear();
    frame.add("a_0", obs, 2);
    frame.add("b_0", obs, 2);
    tether::Status status = client.get_action(episode.value(), frame);
    EXPECT_TRUE(status.ok()) << status.to_string();
    if (!status.ok()) return actions;
    actions.push_back(frame.discrete_action(0));
    actions.push_back(frame.discrete_action(1));
    EXPECT_TRUE(client.log_returns(episode.value(), "a_0", 1.0).ok());
  }
  auto ended = client.end_episode(episode.value());
  EXPECT_TRUE(ended.ok()) << ended.status().to_string();
  return actions;
}

}  // namespace

TEST(TrainingDone, AMultiAgentClientEndsNormallyToo) {
  ServerScript script;
  script.full_config = multi_config(true);
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send(models(0, 0));
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    if (n <= 2) {
      conn.send(models(n, 1));
      return true;
    }
    conn.send(training_done());
    return false;
  };
  FakeServer server(script);
  auto client = connect_multi(options_for(server));
  ASSERT_TRUE(client);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!client->training_done() && Clock::now() < deadline && !::testing::Test::HasFailure()) {
    play_multi(*client);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(client->training_done());
  expect_summary(client->training_summary());
  EXPECT_TRUE(client->fatal_error().ok()) << client->fatal_error().to_string();
  EXPECT_EQ(client->take_error().code(), tether::ErrorCode::kOk);
  std::vector<std::int64_t> actions = play_multi(*client);
  ASSERT_EQ(actions.size(), 10u);
  for (std::int64_t a : actions) EXPECT_EQ(a, 1);  // the last models
  const std::int64_t unsent = client->batches_unsent_at_end();
  EXPECT_GE(unsent, 1);
  const auto flush_started = Clock::now();
  EXPECT_TRUE(client->flush().ok());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - flush_started).count(), 1.0);
  for (int i = 0; i < 10; ++i) play_multi(*client);
  EXPECT_TRUE(client->flush().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(server.connections(), 1);
  EXPECT_EQ(client->reconnects(), 0);
  EXPECT_EQ(server.batches().size(), 3u);
  EXPECT_EQ(client->batches_unsent_at_end(), unsent);
  EXPECT_EQ(client->agent_steps_sent(), 20);  // batches 1 and 2
  EXPECT_EQ(client->pending_errors(), 0u);
}

TEST(TrainingDone, AMapAgentsWaitingFailsWithItAndNothingIsAskedAgain) {
  ServerScript script;
  script.full_config = multi_config(false);  // the server maps (MAP_AGENTS)
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send(models(0, 1));
    return true;
  };
  script.on_map_agents = [](Conn& conn, const tether::Message&) {
    conn.send(training_done());
    return false;
  };
  FakeServer server(script);
  auto client = connect_multi(options_for(server));
  ASSERT_TRUE(client);
  std::string episode = client->start_episode().value();
  tether::AgentFrame frame;
  const float obs[2] = {0.0f, 1.0f};
  frame.add("a_0", obs, 2);
  tether::Status status = client->get_action(episode, frame);
  EXPECT_EQ(status.code(), tether::ErrorCode::kTrainingDone) << status.to_string();
  EXPECT_TRUE(client->training_done());
  expect_summary(client->training_summary());
  EXPECT_TRUE(client->fatal_error().ok());
  // Nobody answers MAP_AGENTS any more: a new actor cannot be mapped, at once, without a reconnect.
  const auto asked = Clock::now();
  EXPECT_EQ(client->get_action(episode, frame).code(), tether::ErrorCode::kTrainingDone);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - asked).count(), 1.0);
  EXPECT_TRUE(client->end_episode(episode).ok());
  EXPECT_TRUE(client->flush().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(server.connections(), 1);
  EXPECT_EQ(client->reconnects(), 0);
}

#endif  // _WIN32
