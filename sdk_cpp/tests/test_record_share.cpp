// Holding clients back (protocol 1.3, §13.2): every SET_STATE's record_share
// (§7.6) sets the share of new training episodes a client records; the
// others are played as usual, counted (episodes_held_back) and never sent,
// and a batch still goes every steps_per_batch steps played (SET_STATE
// steps_per_batch, at most env_steps_per_sample; env_steps_per_sample when
// absent), with "episodes": [] when every one of them was held back. Both
// clients, against the fake server.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

// record_share values of the answers: one so small that every episode is
// held back, and none (no member: every episode is recorded).
const json kTiny = 1e-9;
const json kNone;

// The record_share the server's answers carry; the test may change it between batches.
using Share = std::shared_ptr<std::atomic<const json*>>;
Share share_of(const json& value) { return std::make_shared<std::atomic<const json*>>(&value); }

// `state` with `share` as its record_share, or none when `share` is null.
json with_share(json state, const json& share) {
  if (!share.is_null()) state["record_share"] = share;
  return state;
}

// A SET_STATE at version 0 (the model in use: nothing to load again), with
// `share` as its record_share, or none when `share` is null.
json state_with_share(const json& share) { return with_share(state(0, 0), share); }

// A single-agent server whose every SET_STATE carries `*share` (null: none);
// the test may change it between batches.
ServerScript share_script(std::int64_t steps_per_sample, Share share,
                          bool force_on_policy = true) {
  ServerScript script;
  script.steps_per_sample = steps_per_sample;
  script.force_on_policy = force_on_policy;
  script.on_get_state = [share](Conn& conn, const tether::Message&, int) {
    conn.send(state_with_share(*share->load()));
    return true;
  };
  script.on_batch = [share](Conn& conn, const tether::Message& message, int) {
    if (message.type == tether::MessageType::kEpisodesAndGetState) conn.send(state_with_share(*share->load()));
    return true;  // (off-policy: the GET_STATE behind the EPISODES answers)
  };
  return script;
}

// `steps` steps of `episode`, each rewarded 1 (returns are counted, recorded or held back).
void play(tether::TetherClient& client, const std::string& episode, int steps) { act(client, episode, steps, 1.0); }

// What a run's batches recorded: its episodes, their steps (as the test
// counts a record's), and the batches without any record.
struct Recorded {
  std::set<std::string> episodes;
  std::size_t steps = 0;
  std::size_t empty_batches = 0;
};

template <class StepsOf>
Recorded recorded_in(const std::vector<json>& batches, StepsOf steps_of) {
  Recorded recorded;
  for (const json& batch : batches) {
    if (batch["episodes"].empty()) ++recorded.empty_batches;
    for (const json& record : batch["episodes"]) {
      recorded.episodes.insert(record["episode_id"].get<std::string>());
      recorded.steps += steps_of(record);
    }
  }
  return recorded;
}

// There are `count` batches, the last holding one record: episode `id`'s,
// whose `field` has `size` entries.
void expect_last_batch_holds(const std::vector<json>& batches, std::size_t count, const std::string& id,
                             const char* field, std::size_t size) {
  ASSERT_EQ(batches.size(), count);
  const json& last = batches.back();
  ASSERT_EQ(last["episodes"].size(), 1u);
  EXPECT_EQ(last["episodes"][0]["episode_id"], id);
  EXPECT_EQ(last["episodes"][0][field].size(), size);
}

// Every batch is a message of this client's session, numbered 1, 2, ...
void expect_numbered(const std::vector<json>& batches, const std::string& session) {
  for (std::size_t i = 0; i < batches.size(); ++i) {
    EXPECT_EQ(batches[i]["client_session"], session);
    EXPECT_EQ(batches[i]["batch_seq"], static_cast<std::int64_t>(i + 1));
  }
}

TEST(RecordShare, AQuarterOfTheEpisodesIsRecordedAndTheRestHeldBack) {
  const json quarter = 0.25;
  auto share = share_of(quarter);
  FakeServer server(share_script(20, share));
  auto client = connect(waiting_options_for(server, 3));
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->record_share(), 0.25);
  constexpr int kEpisodes = 400, kLength = 3;
  for (int e = 0; e < kEpisodes; ++e) {
    const std::string episode = client->start_episode().value();
    ASSERT_NO_FATAL_FAILURE(play(*client, episode, kLength));
    ASSERT_NO_FATAL_FAILURE(end(*client, episode, kLength));
  }
  ASSERT_TRUE(client->flush().ok());
  std::vector<json> batches = server.batches();
  const Recorded got = recorded_in(batches, [](const json& record) { return record["rewards"].size(); });
  const std::set<std::string>& recorded = got.episodes;
  const std::size_t recorded_steps = got.steps;
  EXPECT_GE(recorded.size(), 60u);
  EXPECT_LE(recorded.size(), 140u);
  EXPECT_EQ(client->episodes_held_back(), kEpisodes - recorded.size());
  EXPECT_EQ(recorded_steps + kLength * client->episodes_held_back(), std::size_t{kEpisodes * kLength});
  EXPECT_EQ(recorded_steps, kLength * recorded.size());  // a recorded episode is sent whole
  EXPECT_EQ(client->env_steps_sent(), static_cast<std::int64_t>(recorded_steps));
  // A batch every 20 steps played (1200), not every 20 recorded (about 300).
  EXPECT_GE(batches.size(), 55u);
  EXPECT_LE(batches.size(), 61u);
  EXPECT_GT(got.empty_batches, 0u);  // some batches had only held-back steps behind them
  expect_numbered(batches, client->client_session());
  EXPECT_TRUE(client->take_error().ok());
}

// Each round's answers carry one value; the share after the round.
struct Round {
  std::optional<json> value;  // none: the answers have no record_share
  double share_after;
};

TEST(RecordShare, InvalidValuesAreIgnoredAndAnAbsentOneMeansRecordEveryEpisode) {
  const std::vector<Round> rounds = {
      {json(0.5), 0.5},  {json("0.5"), 0.5}, {json(true), 0.5},  {json(0), 0.5},   {json(1.5), 0.5},
      {json(-0.25), 0.5}, {json(nullptr), 0.5}, {std::nullopt, 1.0}, {json(0.75), 0.75}, {json(1), 1.0},
  };
  // (null in the SET_STATE is sent as a member "record_share": null; nullopt leaves the member out)
  auto round = std::make_shared<std::atomic<std::size_t>>(0);
  ServerScript script = answering([&rounds, round](int n) {
    json answer = state_with_share(json());
    const Round& now = rounds[round->load()];
    if (n > 0 && now.value) answer["record_share"] = *now.value;  // (n 0: the handshake's GET_STATE)
    return answer;
  });
  script.steps_per_sample = 1;  // a batch at every training episode's second step
  FakeServer server(script);
  auto client = connect(waiting_options_for(server, 3));
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->record_share(), 1.0);
  for (std::size_t r = 0; r < rounds.size(); ++r) {
    round->store(r);
    const std::size_t before = server.batches().size();
    const std::string episode = client->start_episode().value();
    ASSERT_NO_FATAL_FAILURE(play(*client, episode, 2));  // recorded or held back, a batch goes
    ASSERT_NO_FATAL_FAILURE(end(*client, episode, 2.0));
    ASSERT_TRUE(client->flush().ok());
    EXPECT_GT(server.batches().size(), before) << "round " << r;
    EXPECT_EQ(client->record_share(), rounds[r].share_after) << "round " << r;
  }
  EXPECT_TRUE(client->take_error().ok());  // invalid values are no errors
}

TEST(RecordShare, EverythingHeldBackStillSendsABatchEveryEnvStepsPerSampleStepsPlayed) {
  auto share = share_of(kTiny);
  FakeServer server(share_script(10, share));
  auto client = connect(waiting_options_for(server, 3));
  ASSERT_NE(client, nullptr);
  ASSERT_EQ(client->weights_seq_no(), 0);
  for (int e = 0; e < 10; ++e) {  // 70 steps played: a batch at the 11th, 21st, ... 61st
    const std::string episode = client->start_episode().value();
    ASSERT_NO_FATAL_FAILURE(play(*client, episode, 7));
    ASSERT_NO_FATAL_FAILURE(end(*client, episode, 7.0));
  }
  ASSERT_TRUE(client->flush().ok());  // nothing recorded: flush sends nothing more
  EXPECT_EQ(client->episodes_held_back(), 10u);
  std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 6u);
  for (const json& batch : batches) {
    EXPECT_EQ(batch["type"], "EPISODES_AND_GET_STATE");
    EXPECT_TRUE(batch["episodes"].is_array() && batch["episodes"].empty()) << batch.dump();
    EXPECT_EQ(batch["env_steps"], 0);
    EXPECT_EQ(batch["agent_steps"], 0);
    EXPECT_EQ(batch["weights_seq_no"], 0);  // the version held: the usual claim
  }
  expect_numbered(batches, client->client_session());
  // An answer without record_share: episodes are recorded again.
  share->store(&kNone);
  const std::string last_held = client->start_episode().value();
  ASSERT_NO_FATAL_FAILURE(play(*client, last_held, 11));  // the 11th step sends a batch, answered without it
  ASSERT_NO_FATAL_FAILURE(end(*client, last_held, 11.0));
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(client->record_share(), 1.0);
  EXPECT_EQ(client->episodes_held_back(), 11u);
  ASSERT_EQ(server.batches().size(), 7u);
  const std::string recorded = client->start_episode().value();
  ASSERT_NO_FATAL_FAILURE(play(*client, recorded, 3));
  ASSERT_NO_FATAL_FAILURE(end(*client, recorded, 3.0));
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(client->episodes_held_back(), 11u);
  ASSERT_NO_FATAL_FAILURE(expect_last_batch_holds(server.batches(), 8, recorded, "rewards", 3));
  EXPECT_TRUE(client->take_error().ok());
}

TEST(RecordShare, OffPolicyAnEmptyBatchIsAnEpisodesMessageFollowedByGetState) {
  auto share = share_of(kTiny);
  FakeServer server(share_script(10, share, /*force_on_policy=*/false));
  auto client = connect(waiting_options_for(server, 3));
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode().value();
  ASSERT_NO_FATAL_FAILURE(play(*client, episode, 21));  // batches at the 11th and 21st steps
  ASSERT_NO_FATAL_FAILURE(end(*client, episode, 21.0));
  ASSERT_TRUE(client->flush().ok());
  std::vector<json> messages = server.messages();
  std::vector<std::string> after_handshake;
  for (std::size_t i = 3; i < messages.size(); ++i) after_handshake.push_back(messages[i]["type"]);
  EXPECT_EQ(after_handshake, (std::vector<std::string>{"EPISODES", "GET_STATE", "EPISODES", "GET_STATE"}));
  for (const json& batch : server.batches()) {
    EXPECT_TRUE(batch["episodes"].empty());
    EXPECT_EQ(batch["client_session"], client->client_session());
  }
  EXPECT_EQ(client->episodes_held_back(), 1u);
}

// With share 1 (sent or not) no number is drawn: a client's draws (here its
// random episode ids) are those of a client that never heard of record_share.
TEST(RecordShare, AtOneNoRandomNumberIsDrawn) {
  auto ids_with = [](const json& value) {
    auto share = share_of(value);
    FakeServer server(share_script(1000, share));
    auto connected = tether::TetherClient::connect(waiting_options_for(server, 11));
    EXPECT_TRUE(connected.ok());
    std::vector<std::string> ids;
    if (!connected.ok()) return ids;
    for (int e = 0; e < 3; ++e) ids.push_back(connected.value()->start_episode().value());
    return ids;
  };
  const std::vector<std::string> absent = ids_with(json());
  EXPECT_EQ(ids_with(json(1.0)), absent);
  const std::vector<std::string> below = ids_with(json(0.999999));
  EXPECT_EQ(below[0], absent[0]);  // (each draw comes after its episode's id)
  EXPECT_NE(below[1], absent[1]);
}

// The handshake's SET_STATE (n = 0) and the answer to the n-th batch carry
// values[n] as steps_per_batch (nullopt, or n past the end: no member), with
// record_share 1e-9: every episode is held back.
ServerScript steps_per_batch_script(std::int64_t steps_per_sample, std::vector<std::optional<json>> values,
                                    json (*state_of)(const json&, const std::optional<json>&)) {
  auto value_of = [values](int n) -> std::optional<json> {
    return n < static_cast<int>(values.size()) ? values[n] : std::nullopt;
  };
  ServerScript script = answering([value_of, state_of](int n) { return state_of(json(1e-9), value_of(n)); });
  script.steps_per_sample = steps_per_sample;
  return script;
}

json single_state_with_steps(const json& share, const std::optional<json>& every) {
  json state = state_with_share(share);
  if (every) state["steps_per_batch"] = *every;
  return state;
}

// Strict on-policy: each batch's answer applies before the next cut.
tether::ClientOptions strict_options_for(const FakeServer& server) {
  tether::ClientOptions options = waiting_options_for(server, 3);
  options.wait_for_weights = true;
  return options;
}

// Gaps between the steps (or frames) at which batches went, the first from 0.
std::vector<int> gaps_of(const std::vector<int>& sends_at) {
  std::vector<int> gaps;
  int last = 0;
  for (int at : sends_at) {
    gaps.push_back(at - last);
    last = at;
  }
  return gaps;
}

// Everything held back, strict on-policy (each answer applies before the next
// cut): the handshake asks for 4 steps per batch, so a batch goes every 4
// steps played; answers with invalid values (a boolean, 0, 2.5, a string, -1,
// null) keep 4; the largest JSON integer and 50 (above env_steps_per_sample,
// 10) count as 10; a valid 5 applies; an answer without the member means
// env_steps_per_sample again. (The Python SDK's
// test_steps_per_batch_sets_the_cadence_until_an_answer_without_it.)
TEST(RecordShare, StepsPerBatchSetsTheCadenceUntilAnAnswerWithoutIt) {
  const std::vector<std::optional<json>> values = {
      json(4),  json(true), json(0), json(2.5), json("3"), json(-1), json(nullptr),
      json(std::numeric_limits<std::uint64_t>::max()), json(5), json(50), std::nullopt};
  // steps_per_batch() once values[n] applied
  const std::vector<std::int64_t> expected = {4, 4, 4, 4, 4, 4, 4, 10, 5, 10, 10};
  FakeServer server(steps_per_batch_script(10, values, single_state_with_steps));
  auto client = connect(strict_options_for(server));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->waits_for_weights());
  EXPECT_EQ(client->env_steps_per_sample(), 10);
  EXPECT_EQ(client->steps_per_batch(), 4);
  const std::string episode = client->start_episode().value();
  const float obs[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  double action[1];
  std::vector<int> sends_at;
  for (int t = 0; t < 100; ++t) {
    const std::size_t before = server.batches().size();
    ASSERT_TRUE(client->get_action(episode, obs, 4, action, 1).ok());
    if (server.batches().size() > before) {
      // the cut comes before step t is acted: steps 0 .. t-1 were played
      sends_at.push_back(t);
      const std::size_t n = server.batches().size();
      EXPECT_EQ(client->steps_per_batch(), n < expected.size() ? expected[n] : 10) << "after batch " << n;
    }
  }
  const std::vector<int> gaps = gaps_of(sends_at);
  ASSERT_EQ(gaps.size(), 14u) << ::testing::PrintToString(gaps);
  // Seven batches of 4 (the handshake's 4, then six answers with invalid
  // values), 10 (the largest integer), 5, then 10 (50, clamped; then none).
  EXPECT_EQ(gaps, (std::vector<int>{4, 4, 4, 4, 4, 4, 4, 10, 5, 10, 10, 10, 10, 10}));
  EXPECT_EQ(client->steps_per_batch(), 10);
  EXPECT_EQ(client->episodes_held_back(), 1u);
  for (const json& batch : server.batches()) EXPECT_TRUE(batch["episodes"].empty());
  expect_numbered(server.batches(), client->client_session());
  EXPECT_TRUE(client->take_error().ok());  // invalid values are no errors
}

// §13.2 as the Python SDK has it: held-back steps make a batch due only once
// some were played since the last cut. Recorded steps enough for a batch wait
// in an ended episode; a held-back episode's first step does not send them,
// its second does (held-back steps played and recorded ones add up).
TEST(RecordShare, AHeldBackEpisodeMakesABatchDueOnlyOnceItPlayedAStep) {
  auto share = share_of(kNone);
  FakeServer server(share_script(4, share));
  auto client = connect(strict_options_for(server));
  ASSERT_NE(client, nullptr);
  ASSERT_EQ(client->steps_per_batch(), 4);
  const std::string recorded = client->start_episode().value();  // share 1: recorded
  const std::string first = client->start_episode().value();
  ASSERT_NO_FATAL_FAILURE(play(*client, first, 1));
  ASSERT_NO_FATAL_FAILURE(end(*client, first, 1.0));
  share->store(&kTiny);
  ASSERT_TRUE(client->flush().ok());  // its answer holds every new episode back
  ASSERT_EQ(server.batches().size(), 1u);
  EXPECT_EQ(client->record_share(), 1e-9);
  ASSERT_NO_FATAL_FAILURE(play(*client, recorded, 4));  // 4 recorded steps ...
  ASSERT_NO_FATAL_FAILURE(end(*client, recorded, 4.0));  // ... complete, not cut yet
  EXPECT_EQ(server.batches().size(), 1u);
  const std::string held = client->start_episode().value();
  EXPECT_EQ(client->episodes_held_back(), 1u);
  ASSERT_NO_FATAL_FAILURE(play(*client, held, 1));
  EXPECT_EQ(server.batches().size(), 1u) << "no held-back step played yet: no batch due";
  ASSERT_NO_FATAL_FAILURE(play(*client, held, 1));
  ASSERT_NO_FATAL_FAILURE(expect_last_batch_holds(server.batches(), 2, recorded, "rewards", 4));
  EXPECT_TRUE(client->take_error().ok());
}

// -- the multi-agent client ------------------------------------------------------------------

// Modules m (agents a_*) and pm (the group "pair": members p_0, p_1) at version 0.
json multi_state_with_share(const json& share) { return with_share(pair_state(0), share); }

ServerScript multi_share_script(std::int64_t steps_per_sample, Share share) {
  ServerScript script = answering([share](int) { return multi_state_with_share(*share->load()); });
  script.full_config = pair_config(steps_per_sample);
  return script;
}

// One frame of a_0, a_1 and the group's members: three actors, three agent steps.
void multi_frame(tether::MultiAgentClient& client, const std::string& episode) {
  tether::AgentFrame frame;
  const float obs[2] = {0.5f, -0.5f};
  for (const char* id : {"a_0", "a_1", "p_0", "p_1"}) frame.add(id, obs, 2);
  tether::Status status = client.get_action(episode, frame);
  ASSERT_TRUE(status.ok()) << status.to_string();
  ASSERT_EQ(frame.action_size(0), 1u);  // the policy acts for every actor
  ASSERT_EQ(frame.action_size(3), 1u);
  ASSERT_TRUE(client.log_returns(episode, "a_0", 1.0).ok());
}

std::unique_ptr<tether::MultiAgentClient> multi_client(const FakeServer& server, bool strict = false) {
  return connect_multi(strict ? strict_options_for(server) : waiting_options_for(server, 3));
}

TEST(RecordShare, MultiAgentOneDrawPerEpisodeForAllItsAgents) {
  const json quarter = 0.25;
  auto share = share_of(quarter);
  FakeServer server(multi_share_script(30, share));
  auto client = multi_client(server);
  ASSERT_TRUE(client);
  constexpr int kEpisodes = 400, kFrames = 2, kActors = 3;
  for (int e = 0; e < kEpisodes; ++e) {
    const std::string episode = client->start_episode().value();
    for (int f = 0; f < kFrames; ++f) ASSERT_NO_FATAL_FAILURE(multi_frame(*client, episode));
    auto returns = client->end_episode(episode);
    ASSERT_TRUE(returns.ok()) << returns.status().to_string();
    EXPECT_EQ(returns.value()["a_0"], 2.0);
  }
  ASSERT_TRUE(client->flush().ok());
  std::vector<json> batches = server.batches();
  const Recorded got = recorded_in(batches, [](const json& record) {
    EXPECT_EQ(record["agents"].size(), 3u) << record.dump().substr(0, 300);  // all its actors, or none
    std::size_t steps = 0;
    for (const auto& entry : record["agents"].items()) steps += entry.value()["rewards"].size();
    return steps;
  });
  const std::set<std::string>& recorded = got.episodes;
  const std::size_t recorded_steps = got.steps;
  EXPECT_GE(recorded.size(), 60u);
  EXPECT_LE(recorded.size(), 140u);
  EXPECT_EQ(client->episodes_held_back(), kEpisodes - recorded.size());
  EXPECT_EQ(recorded_steps, std::size_t{kFrames * kActors} * recorded.size());
  EXPECT_EQ(recorded_steps + kFrames * kActors * client->episodes_held_back(),
            std::size_t{kEpisodes * kFrames * kActors});
  EXPECT_EQ(client->agent_steps_sent(), static_cast<std::int64_t>(recorded_steps));
  EXPECT_EQ(client->env_steps_sent(), static_cast<std::int64_t>(kFrames * recorded.size()));
  // A batch every 30 agent steps played (2400), not every 30 recorded (about 600).
  EXPECT_GE(batches.size(), 70u);  // (a cut waits for steps to complete: some batches carry a few more)
  EXPECT_LE(batches.size(), 81u);
  EXPECT_GT(got.empty_batches, 0u);
  expect_numbered(batches, client->client_session());
  EXPECT_TRUE(client->take_error().ok());
}

TEST(RecordShare, MultiAgentEverythingHeldBackStillSendsBatchesThenRecordsAgain) {
  auto share = share_of(kTiny);
  FakeServer server(multi_share_script(6, share));  // a batch every two frames played
  auto client = multi_client(server);
  ASSERT_TRUE(client);
  const std::string episode = client->start_episode().value();
  for (int f = 0; f < 7; ++f) ASSERT_NO_FATAL_FAILURE(multi_frame(*client, episode));  // batches at frames 3, 5, 7
  ASSERT_TRUE(client->end_episode(episode).ok());
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(client->episodes_held_back(), 1u);
  std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 3u);
  for (const json& batch : batches) {
    EXPECT_TRUE(batch["episodes"].is_array() && batch["episodes"].empty()) << batch.dump();
    EXPECT_EQ(batch["agent_steps"], 0);
    EXPECT_EQ(batch["weights_seq_nos"], json::parse(R"({"m": 0, "pm": 0})"));  // the versions held
  }
  expect_numbered(batches, client->client_session());
  share->store(&kNone);
  const std::string held = client->start_episode().value();
  for (int f = 0; f < 3; ++f) ASSERT_NO_FATAL_FAILURE(multi_frame(*client, held));  // a batch, answered without it
  ASSERT_TRUE(client->end_episode(held).ok());
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(client->record_share(), 1.0);
  ASSERT_EQ(server.batches().size(), 4u);
  const std::string recorded = client->start_episode().value();
  for (int f = 0; f < 2; ++f) ASSERT_NO_FATAL_FAILURE(multi_frame(*client, recorded));
  ASSERT_TRUE(client->end_episode(recorded).ok());
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(client->episodes_held_back(), 2u);
  ASSERT_NO_FATAL_FAILURE(expect_last_batch_holds(server.batches(), 5, recorded, "agents", 3));
  EXPECT_TRUE(client->take_error().ok());
}

// Spec 13.3's worked example (docs/parity.md, the frame a cut happens in): the cut comes before a frame's
// observations are taken, so the actors about to act keep their latest step. Two agents, 10 agent steps per
// batch, every episode recorded: the call of frame 5 finds 10 steps played but 8 complete and cuts nothing;
// the call of frame 6 cuts frames 0-4 of both agents, each entry ending with its frame-5 observation.
TEST(RecordShare, MultiAgentCutsBeforeTakingTheFramesObservations) {
  auto share = share_of(kNone);
  FakeServer server(multi_share_script(10, share));
  auto client = multi_client(server, /*strict=*/true);
  ASSERT_TRUE(client);
  const std::string episode = client->start_episode().value();
  std::vector<int> sends_at;
  for (int f = 0; f < 8; ++f) {
    const std::size_t before = server.batches().size();
    tether::AgentFrame frame;
    const float mine[2] = {static_cast<float>(f), static_cast<float>(f)};
    const float theirs[2] = {static_cast<float>(-f), static_cast<float>(-f)};
    frame.add("a_0", mine, 2);
    frame.add("a_1", theirs, 2);
    tether::Status status = client->get_action(episode, frame);
    ASSERT_TRUE(status.ok()) << status.to_string();
    if (server.batches().size() > before) sends_at.push_back(f);
  }
  ASSERT_FALSE(sends_at.empty());
  EXPECT_EQ(sends_at[0], 6);
  const std::vector<json> batches = server.batches();
  const json& entries = batches[0]["episodes"][0]["agents"];
  EXPECT_EQ(entries["a_0"]["actions"].size(), 5u);
  EXPECT_EQ(entries["a_1"]["actions"].size(), 5u);
  EXPECT_EQ(entries["a_0"]["obs"].back(), json::parse("[5.0, 5.0]")) << "frame 6's observation is not in the cut";
  EXPECT_TRUE(client->take_error().ok());
}

json multi_state_with_steps(const json& share, const std::optional<json>& every) {
  json state = multi_state_with_share(share);
  if (every) state["steps_per_batch"] = *every;
  return state;
}

// Three actors (three agent steps a frame), everything held back: 6 agent
// steps per batch (a batch every 2 frames), kept through an invalid false;
// 3 (every frame), kept through an invalid -3; none (env_steps_per_sample,
// 12: every 4 frames); 50 (counts as 12).
TEST(RecordShare, MultiAgentBatchesFollowStepsPerBatchInAgentStepsPlayed) {
  const std::vector<std::optional<json>> values = {json(6), json(false), json(3), json(-3), std::nullopt, json(50)};
  const std::vector<std::int64_t> expected = {6, 6, 3, 3, 12, 12};
  ServerScript script = steps_per_batch_script(12, values, multi_state_with_steps);
  script.full_config = pair_config(12);
  FakeServer server(script);
  auto client = multi_client(server, /*strict=*/true);
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->waits_for_weights());
  EXPECT_EQ(client->env_steps_per_sample(), 12);
  EXPECT_EQ(client->steps_per_batch(), 6);
  const std::string episode = client->start_episode().value();
  std::vector<int> sends_at;
  for (int f = 0; f < 20; ++f) {
    const std::size_t before = server.batches().size();
    ASSERT_NO_FATAL_FAILURE(multi_frame(*client, episode));
    if (server.batches().size() > before) {
      sends_at.push_back(f);  // the cut comes before frame f is acted
      const std::size_t n = server.batches().size();
      EXPECT_EQ(client->steps_per_batch(), n < expected.size() ? expected[n] : 12) << "after batch " << n;
    }
  }
  EXPECT_EQ(gaps_of(sends_at), (std::vector<int>{2, 2, 1, 1, 4, 4, 4}));
  EXPECT_EQ(client->steps_per_batch(), 12);
  EXPECT_EQ(client->episodes_held_back(), 1u);
  expect_numbered(server.batches(), client->client_session());
  EXPECT_TRUE(client->take_error().ok());
}

// As for the single-agent client: recorded agent steps enough for a batch
// wait in an ended episode; a held-back episode's first frame does not send
// them (no held-back step played since the cut), its second does.
TEST(RecordShare, MultiAgentHeldBackEpisodeMakesABatchDueOnlyOnceItPlayedAStep) {
  auto share = share_of(kNone);
  FakeServer server(multi_share_script(6, share));  // two frames of three actors
  auto client = multi_client(server, /*strict=*/true);
  ASSERT_TRUE(client);
  const std::string recorded = client->start_episode().value();
  const std::string first = client->start_episode().value();
  ASSERT_NO_FATAL_FAILURE(multi_frame(*client, first));
  ASSERT_TRUE(client->end_episode(first).ok());
  share->store(&kTiny);
  ASSERT_TRUE(client->flush().ok());
  ASSERT_EQ(server.batches().size(), 1u);
  EXPECT_EQ(client->record_share(), 1e-9);
  for (int f = 0; f < 2; ++f) ASSERT_NO_FATAL_FAILURE(multi_frame(*client, recorded));
  ASSERT_TRUE(client->end_episode(recorded).ok());  // 6 agent steps, complete
  EXPECT_EQ(server.batches().size(), 1u);
  const std::string held = client->start_episode().value();
  EXPECT_EQ(client->episodes_held_back(), 1u);
  ASSERT_NO_FATAL_FAILURE(multi_frame(*client, held));
  EXPECT_EQ(server.batches().size(), 1u) << "no held-back step played yet: no batch due";
  ASSERT_NO_FATAL_FAILURE(multi_frame(*client, held));
  std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 2u);
  ASSERT_EQ(batches[1]["episodes"].size(), 1u);
  EXPECT_EQ(batches[1]["episodes"][0]["episode_id"], recorded);
  EXPECT_EQ(batches[1]["agent_steps"], 6);
  EXPECT_TRUE(client->take_error().ok());
}

}  // namespace

#endif  // _WIN32
