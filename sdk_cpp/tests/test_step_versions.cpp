// Versions per step (protocol 1.3): a record (or agent entry) whose steps
// were acted with more than one weights version names each step's in
// weights_seq_no_runs (§10.1), and only when every version is known and was
// learned on the connection the batch goes on, to a server that announced a
// protocol_version. And the steps the server refused as too stale
// (SET_STATE steps_refused_stale, §7.6) add up in a counter. Both clients,
// against the fake server.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

// Batches are cut by flush() only (a sample far larger than the steps played).
// Version 0 first; batch n brings version n (the model preferring 1).
ServerScript single_agent_script() {
  ServerScript script = answering([](int n) { return state(n, n == 0 ? 0 : 1); });
  script.steps_per_sample = 1000;
  return script;
}

// Connection 1 announces version 5, the later ones `second`; batch 2 is lost
// before its answer (resent on the next connection); batch n's answer brings
// version version_after(n). state_of(seq, answer): the SET_STATE of version
// seq (answer: one answering a batch).
ServerScript losing_batch_2(std::int64_t second, std::int64_t (*version_after)(int),
                            json (*state_of)(std::int64_t, bool)) {
  ServerScript script;
  script.steps_per_sample = 1000;
  script.on_get_state = [second, state_of](Conn& conn, const tether::Message&, int connection) {
    conn.send(state_of(connection == 1 ? 5 : second, false));
    return true;
  };
  script.on_batch = [version_after, state_of](Conn& conn, const tether::Message&, int n) {
    if (n == 2) return false;  // lost before its answer: resent on the next connection
    conn.send(state_of(version_after(n), true));
    return true;
  };
  return script;
}

// The single-agent SET_STATE of version `seq`: the model preferring 0, 1 in answers to batches.
json single_state(std::int64_t seq, bool answer) { return state(seq, answer ? 1 : 0); }

void expect_valid(const json& batch) {
  const tether::Space obs = tether::Space::box({4}, -10.0, 10.0).value();
  const tether::Space act = tether::Space::discrete(2).value();
  tether::Result<std::size_t> steps = tether::validate_episodes(batch, obs, act, true);
  EXPECT_TRUE(steps.ok()) << steps.status().to_string() << "\n" << batch.dump().substr(0, 600);
}

// Episode "a" acts 5 steps with version 0, is flushed (4 steps: its 5th waits
// for its next observation; the answer brings version 1), acts 3 more with
// version 1 and ends; "b" acts only with version 1. Returns the batches.
std::vector<json> play_across_a_swap(ServerScript script) {
  FakeServer server(std::move(script));
  std::unique_ptr<tether::TetherClient> connected = connect(options_for(server, 3));
  if (!connected) return {};
  tether::TetherClient& client = *connected;
  EXPECT_TRUE(client.start_episode("a").ok());
  act(client, "a", 5);
  EXPECT_TRUE(client.flush().ok());
  EXPECT_EQ(client.weights_seq_no(), 1);
  EXPECT_TRUE(client.start_episode("b").ok());
  act(client, "a", 3);
  act(client, "b", 2);
  end(client, "a");
  end(client, "b");
  EXPECT_TRUE(client.flush().ok());
  return server.batches();
}

TEST(StepVersions, ARecordThatStraddlesAModelSwapNamesEachStepsVersion) {
  std::vector<json> batches = play_across_a_swap(single_agent_script());
  ASSERT_EQ(batches.size(), 2u);
  // One version only: the record is as before, without runs.
  EXPECT_FALSE(record_of(batches[0], "a").contains("weights_seq_no_runs")) << batches[0].dump().substr(0, 600);
  EXPECT_EQ(batches[0]["weights_seq_no"], 0);
  const json a = record_of(batches[1], "a");
  ASSERT_TRUE(a.is_object());
  EXPECT_EQ(a["rewards"].size(), 4u);
  EXPECT_EQ(a["weights_seq_no_runs"], json::parse("[[0, 1], [1, 3]]")) << a.dump().substr(0, 600);
  EXPECT_FALSE(record_of(batches[1], "b").contains("weights_seq_no_runs"));
  EXPECT_EQ(batches[1]["weights_seq_no"], 0);  // the claim is still the oldest version
  expect_valid(batches[1]);
}

TEST(StepVersions, APlainV1ServerIsSentNoRuns) {
  ServerScript script = single_agent_script();
  script.on_ping = [](Conn& conn, const tether::Message&) {
    conn.send({{"type", "PONG"}});  // no protocol_version: RLlib's own server
    return true;
  };
  std::vector<json> batches = play_across_a_swap(std::move(script));
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_FALSE(record_of(batches[1], "a").contains("weights_seq_no_runs")) << batches[1].dump().substr(0, 600);
  EXPECT_EQ(batches[1]["weights_seq_no"], 0);
}

TEST(StepVersions, AStepOfUnknownVersionMeansNoRuns) {
  ServerScript script = single_agent_script();
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send({{"type", "SET_STATE"}, {"onnx_file", fake::onnx_file(0)}});  // no weights_seq_no
    return true;
  };
  std::vector<json> batches = play_across_a_swap(std::move(script));
  ASSERT_EQ(batches.size(), 2u);
  const json a = record_of(batches[1], "a");
  ASSERT_TRUE(a.is_object());
  EXPECT_EQ(a["rewards"].size(), 4u);
  EXPECT_FALSE(a.contains("weights_seq_no_runs")) << a.dump().substr(0, 600);
}

// Batch 2 straddles versions 5 and 6 of connection 1 and is lost with it;
// connection 2 announces version 2: a server restarted without resuming, on
// which those versions mean nothing. Resent there, it carries no runs.
TEST(StepVersions, RunsOfAnEarlierServerRunAreLeftOutOfAResend) {
  FakeServer server(losing_batch_2(2, [](int n) -> std::int64_t { return n == 1 ? 6 : 3; }, single_state));
  auto client = connect(options_for(server, 3));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->start_episode("a").ok());
  act(*client, "a", 5);
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(client->weights_seq_no(), 6);
  act(*client, "a", 3);
  end(*client, "a");
  ASSERT_TRUE(client->flush().ok());
  std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[1]["batch_seq"], 2);
  EXPECT_EQ(record_of(batches[1], "a")["weights_seq_no_runs"], json::parse("[[5, 1], [6, 3]]"));
  EXPECT_EQ(batches[2]["batch_seq"], 2);
  EXPECT_EQ(batches[2]["weights_seq_no"], batches[1]["weights_seq_no"]);  // the claim, unchanged
  EXPECT_EQ(batches[2]["weights_seq_no"], 5);
  EXPECT_FALSE(record_of(batches[2], "a").contains("weights_seq_no_runs")) << batches[2].dump().substr(0, 600);
  EXPECT_GE(client->reconnects(), 1);
}

// Connection 1 announces version 5, connection 2 version 6: the same server
// run (versions only grew). Batch 2 straddles versions 5 and 6 of connection
// 1 and is lost with it: resent on connection 2 it carries no runs (the
// claim is resent unchanged). Episode "a" then goes on with a step of
// connection 1 held back and steps of connection 2: no runs either. Episode
// "b", all of connection 2, sent on connection 2, keeps its runs.
// Batch 1 brings 6, the resend (3) 8, then 9, 10, ...
std::int64_t same_run_versions(int n) { return n == 1 ? 6 : 5 + n; }

TEST(StepVersions, RunsGoOnlyOnTheConnectionTheirVersionsWereLearnedOn) {
  FakeServer server(losing_batch_2(6, same_run_versions, single_state));
  auto client = connect(options_for(server, 3));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->start_episode("a").ok());
  act(*client, "a", 2);
  ASSERT_TRUE(client->flush().ok());  // batch 1: a's first step (5)
  EXPECT_EQ(client->weights_seq_no(), 6);
  act(*client, "a", 2);
  ASSERT_TRUE(client->flush().ok());  // batch 2: steps of 5 and 6, lost; resent as batch 3
  EXPECT_EQ(client->weights_seq_no(), 8);
  EXPECT_GE(client->reconnects(), 1);
  act(*client, "a", 2);
  end(*client, "a");
  ASSERT_TRUE(client->flush().ok());  // batch 4: a's step of connection 1, two of connection 2
  ASSERT_TRUE(client->start_episode("b").ok());
  act(*client, "b", 2);
  ASSERT_TRUE(client->flush().ok());  // batch 5: b's first step
  act(*client, "b", 2);
  end(*client, "b");
  ASSERT_TRUE(client->flush().ok());  // batch 6: b's steps of two versions, all of connection 2
  std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 6u);
  EXPECT_EQ(record_of(batches[1], "a")["weights_seq_no_runs"], json::parse("[[5, 1], [6, 1]]"));
  EXPECT_EQ(batches[2]["batch_seq"], batches[1]["batch_seq"]);
  EXPECT_EQ(batches[2]["weights_seq_no"], 5);  // the claim, unchanged: the same server run
  EXPECT_FALSE(record_of(batches[2], "a").contains("weights_seq_no_runs")) << batches[2].dump().substr(0, 600);
  const json a = record_of(batches[3], "a");
  ASSERT_TRUE(a.is_object());
  EXPECT_EQ(a["rewards"].size(), 3u);
  EXPECT_EQ(batches[3]["weights_seq_no"], 6);  // its oldest step's version, learned on connection 1
  EXPECT_FALSE(a.contains("weights_seq_no_runs")) << a.dump().substr(0, 600);
  const json b = record_of(batches[5], "b");
  ASSERT_TRUE(b.is_object());
  EXPECT_EQ(b["weights_seq_no_runs"], json::parse("[[9, 1], [10, 2]]")) << b.dump().substr(0, 600);
  for (const json& batch : batches) expect_valid(batch);
}

// Answers carrying 7 and then 5 refused steps make 12; values that are not a
// JSON integer >= 1 are ignored, never an error.
const json kRefusedValues = json::parse(R"([7, 5, "3", true, 2.5, 0, -4, null])");

TEST(StepsRefusedStale, TetherClientAddsUpTheServersCounts) {
  ServerScript script = single_agent_script();
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    json answer = state(n, 0);
    answer["steps_refused_stale"] = kRefusedValues[static_cast<std::size_t>(n - 1)];
    conn.send(answer);
    return true;
  };
  FakeServer server(script);
  auto client = connect(options_for(server, 3));
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->steps_refused_stale(), 0u);
  for (std::size_t n = 1; n <= kRefusedValues.size(); ++n) {
    const std::string episode = client->start_episode().value();
    act(*client, episode, 1);
    end(*client, episode);
    ASSERT_TRUE(client->flush().ok());
    EXPECT_EQ(client->steps_refused_stale(), n == 1 ? 7u : 12u) << "after answer " << n;
  }
  EXPECT_EQ(server.batches().size(), kRefusedValues.size());
  EXPECT_TRUE(client->take_error().ok());
}

// -- the multi-agent client ------------------------------------------------------------------

// Modules m (agents a_*) and pm (the group "pair"); batches are cut by flush() only.
json multi_config() { return pair_config(1000); }

// multi_config at version 0; batch n brings version n.
ServerScript multi_script() {
  ServerScript script = answering(pair_state);
  script.full_config = multi_config();
  return script;
}

void frame_of(tether::MultiAgentClient& client, const std::string& episode, const std::vector<std::string>& agents) {
  tether::AgentFrame frame;
  const float obs[2] = {0.5f, -0.5f};
  for (const std::string& id : agents) frame.add(id, obs, 2);
  tether::Status status = client.get_action(episode, frame);
  ASSERT_TRUE(status.ok()) << status.to_string();
}

// An entry's (agent's or group's) steps across a swap name their versions;
// an entry of one version does not.
TEST(StepVersions, MultiAgentEntriesThatStraddleAModelSwapNameEachStepsVersion) {
  FakeServer server(multi_script());
  auto client = connect_multi(options_for(server, 3));
  ASSERT_TRUE(client);
  const std::string episode = client->start_episode("e").value();
  for (int t = 0; t < 3; ++t) ASSERT_NO_FATAL_FAILURE(frame_of(*client, episode, {"a_0", "a_1", "p_0", "p_1"}));
  ASSERT_TRUE(client->flush().ok());  // two steps each; every latest one waits for its next observation
  EXPECT_EQ(client->weights_seq_no("m"), 1);
  for (int t = 0; t < 2; ++t) ASSERT_NO_FATAL_FAILURE(frame_of(*client, episode, {"a_0", "p_0", "p_1"}));
  ASSERT_TRUE(client->end_episode(episode).ok());
  ASSERT_TRUE(client->flush().ok());
  std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 2u);
  const json& first = batches[0]["episodes"][0]["agents"];
  for (const char* actor : {"a_0", "a_1", "pair"}) {
    ASSERT_TRUE(first.contains(actor)) << first.dump().substr(0, 600);
    EXPECT_EQ(first[actor]["rewards"].size(), 2u) << actor;
    EXPECT_FALSE(first[actor].contains("weights_seq_no_runs")) << actor;
  }
  const json& second = batches[1]["episodes"][0]["agents"];
  for (const char* actor : {"a_0", "pair"}) {
    ASSERT_TRUE(second.contains(actor)) << second.dump().substr(0, 600);
    EXPECT_EQ(second[actor]["weights_seq_no_runs"], json::parse("[[0, 1], [1, 2]]")) << actor;
  }
  ASSERT_TRUE(second.contains("a_1"));
  EXPECT_EQ(second["a_1"]["rewards"].size(), 1u);  // its held-back step only: one version
  EXPECT_FALSE(second["a_1"].contains("weights_seq_no_runs"));
  EXPECT_EQ(batches[1]["weights_seq_nos"], json::parse(R"({"m": 0, "pm": 0})"));  // the claims as before
  tether::Result<std::size_t> steps =
      tether::validate_multi_agent_record(batches[1]["episodes"][0], 0, module_specs(multi_config()), true);
  EXPECT_TRUE(steps.ok()) << steps.status().to_string();
}

// As RunsGoOnlyOnTheConnectionTheirVersionsWereLearnedOn, for an agent
// entry: connection 2 is the same server run (its versions only grew).
TEST(StepVersions, MultiAgentRunsGoOnlyOnTheConnectionTheirVersionsWereLearnedOn) {
  ServerScript script = losing_batch_2(6, same_run_versions, [](std::int64_t seq, bool) { return pair_state(seq); });
  script.full_config = multi_config();
  FakeServer server(script);
  auto client = connect_multi(options_for(server, 3));
  ASSERT_TRUE(client);
  const std::string e = client->start_episode("e").value();
  for (int t = 0; t < 2; ++t) ASSERT_NO_FATAL_FAILURE(frame_of(*client, e, {"a_0"}));
  ASSERT_TRUE(client->flush().ok());  // batch 1: a_0's first step (5)
  for (int t = 0; t < 2; ++t) ASSERT_NO_FATAL_FAILURE(frame_of(*client, e, {"a_0"}));
  ASSERT_TRUE(client->flush().ok());  // batch 2: steps of 5 and 6, lost; resent as batch 3
  EXPECT_EQ(client->weights_seq_no("m"), 8);
  EXPECT_GE(client->reconnects(), 1);
  for (int t = 0; t < 2; ++t) ASSERT_NO_FATAL_FAILURE(frame_of(*client, e, {"a_0"}));
  ASSERT_TRUE(client->end_episode(e).ok());
  ASSERT_TRUE(client->flush().ok());  // batch 4: a step of connection 1, two of connection 2
  const std::string f = client->start_episode("f").value();
  for (int t = 0; t < 2; ++t) ASSERT_NO_FATAL_FAILURE(frame_of(*client, f, {"a_0"}));
  ASSERT_TRUE(client->flush().ok());  // batch 5
  for (int t = 0; t < 2; ++t) ASSERT_NO_FATAL_FAILURE(frame_of(*client, f, {"a_0"}));
  ASSERT_TRUE(client->end_episode(f).ok());
  ASSERT_TRUE(client->flush().ok());  // batch 6: two versions, all of connection 2
  std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 6u);
  auto entry = [&](std::size_t b) { return batches[b]["episodes"][0]["agents"]["a_0"]; };
  EXPECT_EQ(entry(1)["weights_seq_no_runs"], json::parse("[[5, 1], [6, 1]]"));
  EXPECT_EQ(batches[2]["batch_seq"], batches[1]["batch_seq"]);
  EXPECT_EQ(batches[2]["weights_seq_nos"]["m"], 5);  // the claim, unchanged: the same server run
  EXPECT_FALSE(entry(2).contains("weights_seq_no_runs")) << batches[2].dump().substr(0, 600);
  EXPECT_EQ(entry(3)["rewards"].size(), 3u);
  EXPECT_EQ(batches[3]["weights_seq_nos"]["m"], 6);
  EXPECT_FALSE(entry(3).contains("weights_seq_no_runs")) << batches[3].dump().substr(0, 600);
  EXPECT_EQ(entry(5)["weights_seq_no_runs"], json::parse("[[9, 1], [10, 2]]")) << batches[5].dump().substr(0, 600);
}

TEST(StepsRefusedStale, MultiAgentClientAddsUpTheServersCounts) {
  ServerScript script = multi_script();
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    json answer = {{"type", "SET_STATE"}, {"models", json::object()}};
    answer["steps_refused_stale"] = kRefusedValues[static_cast<std::size_t>(n - 1)];
    conn.send(answer);
    return true;
  };
  FakeServer server(script);
  auto client = connect_multi(options_for(server, 3));
  ASSERT_TRUE(client);
  EXPECT_EQ(client->steps_refused_stale(), 0u);
  for (std::size_t n = 1; n <= kRefusedValues.size(); ++n) {
    const std::string episode = client->start_episode().value();
    ASSERT_NO_FATAL_FAILURE(frame_of(*client, episode, {"a_0"}));
    ASSERT_TRUE(client->end_episode(episode).ok());
    ASSERT_TRUE(client->flush().ok());
    EXPECT_EQ(client->steps_refused_stale(), n == 1 ? 7u : 12u) << "after answer " << n;
  }
  EXPECT_EQ(server.batches().size(), kRefusedValues.size());
  EXPECT_TRUE(client->take_error().ok());
}

}  // namespace

#endif  // _WIN32
