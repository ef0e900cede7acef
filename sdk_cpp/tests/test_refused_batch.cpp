// An error of the server (here a refused batch: ERROR DATA_REFUSED answering
// it, §13.2) comes back from the next call, once, as the Python and C# SDKs
// raise it: that call does nothing else (no episode begun or ended, no action
// computed, nothing recorded, nothing sent), and the engine calls again.
// log_returns never returns one; take_error() returns only the errors no call
// returned. Both clients, against the fake server.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

using tether::ErrorCode;

// Refuses batch 1 (DATA_REFUSED, after 100 ms: the call that cut it has
// returned by then) and answers the others; batches of 4 steps.
ServerScript refusing_batch_1(std::int64_t steps_per_sample = 4) {
  ServerScript script;
  script.steps_per_sample = steps_per_sample;
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    if (n == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    conn.send(n == 1 ? refusal("DATA_REFUSED", "batch 1: no") : state(n, 1));
    return true;
  };
  return script;
}

// A TetherClient whose batch 1 (episode "r": 4 steps) the server refused: the
// refusal has arrived, and no call was made since. Episode "e" began before,
// without steps (it is in no batch).
class RefusedBatch : public ::testing::Test {
 protected:
  void SetUp() override {
    client = connect(options_for(server));
    ASSERT_TRUE(client);
    ASSERT_TRUE(client->start_episode("r").ok());
    ASSERT_TRUE(client->start_episode("e").ok());
    ASSERT_NO_FATAL_FAILURE(act(*client, "r", 5));  // the 5th cuts batch 1
    ASSERT_TRUE(wait_for([&] { return !client->sending(); }, 5.0));  // answered
    ASSERT_EQ(server.batches().size(), 1u);
    ASSERT_EQ(client->pending_errors(), 0u);  // (not taken in yet: no call was made)
  }

  // The refusal was returned by a call: it is gone, the newest error is kept.
  void expect_returned_once() {
    EXPECT_EQ(client->last_error().code(), ErrorCode::kDataRefused);
    EXPECT_EQ(client->pending_errors(), 0u);
    EXPECT_TRUE(client->take_error().ok());
  }

  FakeServer server{refusing_batch_1()};
  std::unique_ptr<tether::TetherClient> client;
};

TEST_F(RefusedBatch, GetActionReturnsItOnceAndActsAndRecordsNothing) {
  EXPECT_TRUE(client->log_returns("e", 1.0).ok());  // never returns it
  double action[1] = {-1.0};
  const tether::Status refused = client->get_action("e", kObs, 4, action, 1);
  EXPECT_EQ(refused.code(), ErrorCode::kDataRefused) << refused.to_string();
  EXPECT_NE(refused.message().find("DATA_REFUSED: batch 1: no"), std::string::npos) << refused.to_string();
  EXPECT_EQ(action[0], -1.0);  // no action computed
  expect_returned_once();
  // The engine calls again: it works; the failed call recorded no step.
  ASSERT_NO_FATAL_FAILURE(act(*client, "e", 2));
  ASSERT_NO_FATAL_FAILURE(end(*client, "e"));
  ASSERT_TRUE(client->flush().ok());
  std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 2u);
  const json e = record_of(batches[1], "e");
  ASSERT_TRUE(e.is_object()) << batches[1].dump().substr(0, 600);
  EXPECT_EQ(e["actions"].size(), 2u);
  EXPECT_TRUE(record_of(batches[1], "r").is_null());  // the rest of a refused batch's episode is not sent
  EXPECT_TRUE(client->take_error().ok());
}

TEST_F(RefusedBatch, StartEpisodeReturnsItOnceAndBeginsNothing) {
  const tether::Result<std::string> started = client->start_episode("x");
  EXPECT_EQ(started.status().code(), ErrorCode::kDataRefused) << started.status().to_string();
  expect_returned_once();
  EXPECT_TRUE(client->start_episode("x").ok());  // "x" was not begun
}

TEST_F(RefusedBatch, EndEpisodeReturnsItOnceAndEndsNothing) {
  const tether::Result<double> ended = client->end_episode("e", kObs, 4);
  EXPECT_EQ(ended.status().code(), ErrorCode::kDataRefused) << ended.status().to_string();
  expect_returned_once();
  // "e" goes on: it acts, and ends now.
  ASSERT_NO_FATAL_FAILURE(act(*client, "e", 1, 2.0));
  ASSERT_NO_FATAL_FAILURE(end(*client, "e", 2.0));
}

TEST_F(RefusedBatch, FlushReturnsItOnceAndThenFlushes) {
  EXPECT_EQ(client->flush().code(), ErrorCode::kDataRefused);
  expect_returned_once();
  EXPECT_TRUE(client->flush().ok());
  EXPECT_EQ(server.batches().size(), 1u);  // nothing to send: "r" went with the refused batch
}

// With wait_for_weights the call that cuts a batch waits for its answer: a
// refusal is that call's (the batch went; the step is not acted).
TEST(RefusedBatchStrict, TheCallThatCutTheBatchReturnsItsRefusal) {
  FakeServer server(refusing_batch_1());
  tether::ClientOptions options = options_for(server);
  options.wait_for_weights = true;
  auto client = connect(options);
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->start_episode("r").ok());
  ASSERT_NO_FATAL_FAILURE(act(*client, "r", 4));
  double action[1] = {-1.0};
  const tether::Status refused = client->get_action("r", kObs, 4, action, 1);  // cuts batch 1, waits
  EXPECT_EQ(refused.code(), ErrorCode::kDataRefused) << refused.to_string();
  EXPECT_EQ(action[0], -1.0);
  EXPECT_EQ(server.batches().size(), 1u);
  EXPECT_TRUE(client->take_error().ok());
  ASSERT_NO_FATAL_FAILURE(act(*client, "r", 1));  // called again: it acts
  ASSERT_NO_FATAL_FAILURE(end(*client, "r"));
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(server.batches().size(), 1u);  // "r" went with the refused batch: none of it is sent again
}

// Errors come one per call, oldest first (two unsolicited ERRORs here).
TEST(RefusedBatchOrder, SeveralErrorsComeOnePerCallOldestFirst) {
  ServerScript script;
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send(state(0, 0));
    conn.send({{"type", "ERROR"}, {"code", "INTERNAL"}, {"message", "one"}});
    conn.send({{"type", "ERROR"}, {"code", "INTERNAL"}, {"message", "two"}});
    return true;
  };
  FakeServer server(script);
  auto client = connect(options_for(server));
  ASSERT_TRUE(client);
  std::vector<std::string> returned;  // the messages of the calls that failed
  for (int i = 0; i < 500 && returned.size() < 2; ++i) {
    tether::Result<std::string> started = client->start_episode();
    if (started.ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // (not arrived yet)
      continue;
    }
    EXPECT_EQ(started.status().code(), ErrorCode::kInternal) << started.status().to_string();
    returned.push_back(started.status().message());
  }
  ASSERT_EQ(returned.size(), 2u);
  EXPECT_NE(returned[0].find("INTERNAL: one"), std::string::npos) << returned[0];
  EXPECT_NE(returned[1].find("INTERNAL: two"), std::string::npos) << returned[1];
  EXPECT_TRUE(client->start_episode().ok());
  EXPECT_TRUE(client->take_error().ok());
  EXPECT_NE(client->last_error().message().find("two"), std::string::npos);
}

// -- the multi-agent client ------------------------------------------------------------------

// One frame of a_0 in `episode`.
tether::Status frame_of_a0(tether::MultiAgentClient& client, const std::string& episode, tether::AgentFrame& frame) {
  const float obs[2] = {0.5f, -0.5f};
  frame.clear();
  frame.add("a_0", obs, 2);
  return client.get_action(episode, frame);
}

TEST(RefusedBatchMultiAgent, EachCallReturnsItOnceAndDoesNothingElse) {
  ServerScript script;
  script.full_config = pair_config(4);  // a batch every 4 agent steps
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send(pair_state(0));
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    if (n == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    conn.send(n == 1 ? refusal("DATA_REFUSED", "batch 1: no") : pair_state(n));
    return true;
  };
  FakeServer server(script);
  auto client = connect_multi(options_for(server));
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->start_episode("r").ok());
  ASSERT_TRUE(client->start_episode("e").ok());
  tether::AgentFrame frame;
  // The 6th frame cuts batch 1: a_0's 4 complete steps (its 5th waits for its next observation).
  for (int t = 0; t < 6; ++t) ASSERT_TRUE(frame_of_a0(*client, "r", frame).ok());
  ASSERT_TRUE(wait_for([&] { return server.batches().size() == 1; }, 5.0));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the refusal arrives (after 100 ms)
  EXPECT_TRUE(client->log_returns("e", "a_0", 1.0).ok());  // never returns it
  // get_action: nothing of the frame is acted or recorded.
  const tether::Status refused = frame_of_a0(*client, "e", frame);
  EXPECT_EQ(refused.code(), ErrorCode::kDataRefused) << refused.to_string();
  EXPECT_EQ(frame.action_size(0), 0u);
  EXPECT_FALSE(client->module_of("e", "a_0").ok());
  EXPECT_TRUE(client->take_error().ok());
  EXPECT_EQ(client->last_error().code(), ErrorCode::kDataRefused);
  ASSERT_TRUE(frame_of_a0(*client, "e", frame).ok());  // called again: it acts
  EXPECT_EQ(client->module_of("e", "a_0").value(), "m");
  ASSERT_TRUE(client->end_episode("e").ok());
  ASSERT_TRUE(client->flush().ok());
  EXPECT_TRUE(client->take_error().ok());
}

}  // namespace

#endif  // _WIN32
