// [1.7] Environment parameters (§19) through both clients, against the fake
// server: every GET_STATE and EPISODES_AND_GET_STATE to a 1.7 server carries
// env_params_seq (none to a 1.6 one); a SET_STATE's env_params is swapped in
// on the engine's thread by its next call (the callback runs then, once per
// call, after all of the call's events, with the set held then), a malformed
// one is ignored and counted, a 1.6 server's is never read, and a new
// connection's answer without a set drops the set held; episodes started
// afterwards draw their values from the set, and every record carries them
// (the measure only on the record that ends the episode). The pure parts (parsing, drawing) are the
// conformance vectors' (env_params.json, test_conformance.cpp).
#include <gtest/gtest.h>

#ifndef _WIN32

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "client_test_helpers.h"
#include "tether/env_params.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

// The sets the server's answers carry, as the test's phase says: none; a
// valid set (seq 5: speed fixed, gravity uniform in [9, 11]); a malformed one
// (seq 0); another valid set (seq 6).
enum Phase { kNoSet = 0, kSet5 = 1, kMalformed = 2, kSet6 = 3 };
using SharedPhase = std::shared_ptr<std::atomic<int>>;

json env_set(int phase) {
  switch (phase) {
    case kSet5:
      return {{"seq", 5},
              {"lesson", 1},
              {"values", {{"speed", 2}, {"gravity", {{"sampler", "uniform"}, {"low", 9}, {"high", 11}}}}}};
    case kMalformed:
      return {{"seq", 0}, {"lesson", 0}, {"values", {{"speed", 3}}}};
    case kSet6:
      return {{"seq", 6}, {"lesson", 2}, {"values", {{"speed", {{"sampler", "gaussian"}, {"mean", 1}, {"std", 0.5}}}}}};
    default:
      return nullptr;
  }
}

// `state` answering `request` as a server does (§19.2): with the phase's set
// when the request's env_params_seq is an integer other than its seq.
json with_set(json state, int phase, const tether::Message& request) {
  if (phase == kNoSet) return state;
  const json set = env_set(phase);
  const auto held = request.body.find("env_params_seq");
  if (held != request.body.end() && held->is_number_integer() && *held != set["seq"]) state["env_params"] = set;
  return state;
}

// A server whose every SET_STATE (`answer`) carries the phase's set, as with_set says.
ServerScript phase_script(SharedPhase phase, json answer, std::int64_t steps_per_sample = 4) {
  ServerScript script;
  script.steps_per_sample = steps_per_sample;
  script.on_get_state = [phase, answer](Conn& conn, const tether::Message& message, int) {
    conn.send(with_set(answer, phase->load(), message));
    return true;
  };
  script.on_batch = [phase, answer](Conn& conn, const tether::Message& message, int) {
    if (message.type == tether::MessageType::kEpisodesAndGetState) {
      conn.send(with_set(answer, phase->load(), message));
    }
    return true;
  };
  return script;
}


// The state requests the server received (GET_STATE, EPISODES_AND_GET_STATE), in order.
std::vector<json> state_requests(FakeServer& server) {
  std::vector<json> out;
  for (const json& message : server.messages()) {
    const std::string type = message.value("type", std::string());
    if (type == "GET_STATE" || type == "EPISODES_AND_GET_STATE") out.push_back(message);
  }
  return out;
}

// The records of `episode_id`, in sending order.
std::vector<json> records_named(FakeServer& server, const std::string& episode_id) {
  std::vector<json> out;
  for (const json& record : records_of(server)) {
    if (record.value("episode_id", std::string()) == episode_id) out.push_back(record);
  }
  return out;
}

TEST(EnvParams, SingleAgentSetsDrawsAndRecords) {
  auto phase = std::make_shared<std::atomic<int>>(kNoSet);
  FakeServer server(phase_script(phase, state(0, 0)));
  auto client = connect(waiting_options_for(server));
  ASSERT_TRUE(client);
  int calls = 0;
  std::int64_t last_seq = 0;
  client->on_env_params_changed([&](const tether::EnvParams* params) {
    ++calls;
    last_seq = params != nullptr ? params->seq : -1;
  });
  EXPECT_EQ(calls, 0);  // (no set held yet: not called)
  EXPECT_EQ(client->env_params(), nullptr);

  // The handshake's GET_STATE: this connection was sent no set yet.
  std::vector<json> requests = state_requests(server);
  ASSERT_EQ(requests.size(), 1u);
  ASSERT_TRUE(requests[0].contains("env_params_seq")) << requests[0].dump();
  EXPECT_EQ(requests[0]["env_params_seq"], 0);

  // An episode started before any set has no values; a measure reported for it goes nowhere.
  const std::string before = client->start_episode().value();
  ASSERT_TRUE(client->episode_params(before).ok());
  EXPECT_TRUE(client->episode_params(before).value().empty());
  EXPECT_TRUE(client->report_measure(before, 1.0).ok());
  phase->store(kSet5);
  ASSERT_NO_FATAL_FAILURE(act(*client, before, 5, 1.0));
  ASSERT_NO_FATAL_FAILURE(end(*client, before));
  // flush: the batch goes, its answer brings set 5, swapped in by the call's sync: the callback runs then.
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(last_seq, 5);
  ASSERT_NE(client->env_params(), nullptr);
  EXPECT_EQ(client->env_params()->seq, 5);
  EXPECT_EQ(client->env_params()->lesson, 1);
  ASSERT_EQ(client->env_params()->values.size(), 2u);
  EXPECT_EQ(client->env_params()->values.at("gravity").kind, tether::EnvParamValue::Kind::kUniform);

  // Episodes started now draw from it, each its own value, within the sampler.
  const std::string during = client->start_episode().value();
  tether::Result<tether::EnvValues> drawn = client->episode_params(during);
  ASSERT_TRUE(drawn.ok()) << drawn.status().to_string();
  ASSERT_EQ(drawn.value().size(), 2u);
  EXPECT_EQ(drawn.value().at("speed"), 2.0);
  const double gravity = drawn.value().at("gravity");
  EXPECT_GE(gravity, 9.0);
  EXPECT_LE(gravity, 11.0);
  std::set<double> gravities = {gravity};
  for (int i = 0; i < 5; ++i) {
    const std::string other = client->start_episode("other_" + std::to_string(i), /*training_enabled=*/false).value();
    const double g = client->episode_params(other).value().at("gravity");
    EXPECT_GE(g, 9.0);
    EXPECT_LE(g, 11.0);
    gravities.insert(g);
    ASSERT_TRUE(client->end_episode(other, kObs, 4).ok());
  }
  EXPECT_GT(gravities.size(), 3u);  // (drawn per episode)

  // report_measure: refused values change nothing; the last valid report goes.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(client->report_measure(during, nan).code(), tether::ErrorCode::kNonFiniteValue);
  EXPECT_EQ(client->report_measure(during, std::numeric_limits<double>::infinity()).code(),
            tether::ErrorCode::kNonFiniteValue);
  EXPECT_EQ(client->report_measure(during, -1e301).code(), tether::ErrorCode::kNonFiniteValue);
  EXPECT_EQ(client->report_measure("no_such_episode", 1.0).code(), tether::ErrorCode::kInvalidArgument);
  EXPECT_EQ(client->episode_params("no_such_episode").status().code(), tether::ErrorCode::kInvalidArgument);
  EXPECT_TRUE(client->report_measure(during, 0.5).ok());
  EXPECT_TRUE(client->report_measure(during, 0.75).ok());  // (replaces the earlier one)

  // A malformed set is ignored: the client keeps set 5 (and says so in its requests).
  phase->store(kMalformed);
  ASSERT_NO_FATAL_FAILURE(act(*client, during, 11, 1.0));
  ASSERT_NO_FATAL_FAILURE(end(*client, during));
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(client->env_params()->seq, 5);
  EXPECT_GE(client->env_params_ignored(), 1u);  // (counted, once per answer that carried it)
  EXPECT_TRUE(client->take_error().ok());  // (no error either)

  // Every record of the episode carries its seq and values; the measure only on the one that ends it.
  const std::vector<json> records = records_named(server, during);
  ASSERT_GE(records.size(), 2u);
  for (std::size_t i = 0; i < records.size(); ++i) {
    SCOPED_TRACE("record " + std::to_string(i));
    ASSERT_TRUE(records[i].contains("env_params")) << records[i].dump();
    const json& member = records[i]["env_params"];
    EXPECT_EQ(member["seq"], 5);
    EXPECT_EQ(member["values"]["speed"].get<double>(), 2.0);
    EXPECT_EQ(member["values"]["gravity"].get<double>(), gravity);  // (the double, exactly)
    EXPECT_TRUE(member["values"]["gravity"].is_number_float());
    const bool last = i + 1 == records.size();
    EXPECT_EQ(records[i]["is_terminated"].get<bool>(), last);
    if (last) {
      EXPECT_EQ(member.size(), 3u);
      EXPECT_EQ(member["measure"].get<double>(), 0.75);
    } else {
      EXPECT_EQ(member.size(), 2u);
      EXPECT_FALSE(member.contains("measure"));
    }
  }
  for (const json& record : records_named(server, before)) EXPECT_FALSE(record.contains("env_params"));

  // Every state request said which set this connection held: 0, then 5 once the set came.
  requests = state_requests(server);
  ASSERT_GE(requests.size(), 3u);
  bool seen_five = false;
  for (const json& request : requests) {
    ASSERT_TRUE(request.contains("env_params_seq")) << request.dump();
    const std::int64_t seq = request["env_params_seq"].get<std::int64_t>();
    if (seen_five) EXPECT_EQ(seq, 5);  // (the malformed set changed nothing)
    EXPECT_TRUE(seq == 0 || seq == 5) << seq;
    seen_five = seen_five || seq == 5;
  }
  EXPECT_TRUE(seen_five);

  // A new set replaces it; a callback set while a set is held is called at once.
  phase->store(kSet6);
  const std::string third = client->start_episode().value();
  ASSERT_NO_FATAL_FAILURE(act(*client, third, 5, 1.0));
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(last_seq, 6);
  std::int64_t at_once = 0;
  client->on_env_params_changed([&](const tether::EnvParams* params) { at_once = params != nullptr ? params->seq : -1; });
  EXPECT_EQ(at_once, 6);
  // The episode that started under set 5 keeps its values.
  EXPECT_TRUE(client->episode_params(third).value().count("gravity"));
  ASSERT_NO_FATAL_FAILURE(end(*client, third));
  EXPECT_TRUE(client->take_error().ok());
}

TEST(EnvParams, NoSeqToAServerOlderThan17) {
  auto phase = std::make_shared<std::atomic<int>>(kNoSet);
  ServerScript script = phase_script(phase, state(0, 0));
  script.on_ping = [](Conn& conn, const tether::Message&) {
    conn.send(pong("1.6"));
    return true;
  };
  FakeServer server(script);
  auto client = connect(waiting_options_for(server));
  ASSERT_TRUE(client);
  const std::string episode = client->start_episode().value();
  ASSERT_NO_FATAL_FAILURE(act(*client, episode, 5, 1.0));
  ASSERT_NO_FATAL_FAILURE(end(*client, episode));
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> requests = state_requests(server);
  ASSERT_GE(requests.size(), 2u);
  for (const json& request : requests) EXPECT_FALSE(request.contains("env_params_seq")) << request.dump();
  for (const json& record : records_of(server)) EXPECT_FALSE(record.contains("env_params"));
  EXPECT_EQ(client->env_params(), nullptr);
}

TEST(EnvParams, ANewConnectionStartsFromSeqZero) {
  auto phase = std::make_shared<std::atomic<int>>(kSet5);
  ServerScript script = phase_script(phase, state(0, 0));
  // The first connection's first batch is lost (the server closes): the client reconnects.
  script.on_batch = [phase](Conn& conn, const tether::Message& message, int n) {
    if (n == 1) return false;
    if (message.type == tether::MessageType::kEpisodesAndGetState) {
      conn.send(with_set(state(0, 0), phase->load(), message));
    }
    return true;
  };
  FakeServer server(script);
  auto client = connect(waiting_options_for(server));
  ASSERT_TRUE(client);
  const std::string episode = client->start_episode().value();
  // (the handshake's answer brought set 5: taken in by start_episode's sync)
  EXPECT_EQ(client->env_params() != nullptr ? client->env_params()->seq : 0, 5);
  ASSERT_NO_FATAL_FAILURE(act(*client, episode, 5, 1.0));
  ASSERT_NO_FATAL_FAILURE(end(*client, episode));
  ASSERT_TRUE(client->flush().ok());
  EXPECT_GE(server.connections(), 2);
  std::vector<std::int64_t> seqs;
  for (const json& request : state_requests(server)) seqs.push_back(request.value("env_params_seq", std::int64_t{-1}));
  // Connection 1: GET_STATE 0, EPISODES_AND_GET_STATE 5 (lost); connection 2: GET_STATE 0, then the resend 5.
  ASSERT_GE(seqs.size(), 4u);
  EXPECT_EQ(seqs[0], 0);
  EXPECT_EQ(seqs[1], 5);
  EXPECT_EQ(seqs[2], 0);
  EXPECT_EQ(seqs[3], 5);
  for (const json& record : records_named(server, episode)) {
    ASSERT_TRUE(record.contains("env_params"));
    EXPECT_EQ(record["env_params"]["seq"], 5);
  }
}

// A 1.6 server's env_params are ignored (§19.2: taken only from a server whose
// PONG announced 1.7 or later), even when it sends them unasked.
TEST(EnvParams, IgnoredFromAServerOlderThan17) {
  ServerScript script;
  script.steps_per_sample = 4;
  script.on_ping = [](Conn& conn, const tether::Message&) {
    conn.send(pong("1.6"));
    return true;
  };
  const json with_set5 = [] {
    json answer = state(0, 0);
    answer["env_params"] = env_set(kSet5);
    return answer;
  }();
  script.on_get_state = [with_set5](Conn& conn, const tether::Message&, int) {
    conn.send(with_set5);
    return true;
  };
  script.on_batch = [with_set5](Conn& conn, const tether::Message& message, int) {
    if (message.type == tether::MessageType::kEpisodesAndGetState) conn.send(with_set5);
    return true;
  };
  FakeServer server(script);
  auto client = connect(waiting_options_for(server));
  ASSERT_TRUE(client);
  int calls = 0;
  client->on_env_params_changed([&](const tether::EnvParams*) { ++calls; });
  const std::string episode = client->start_episode().value();
  EXPECT_TRUE(client->episode_params(episode).value().empty());
  ASSERT_NO_FATAL_FAILURE(act(*client, episode, 5, 1.0));
  ASSERT_NO_FATAL_FAILURE(end(*client, episode));
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(client->env_params(), nullptr);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(client->env_params_ignored(), 0u);  // (not read at all: not a set that breaks the rules)
  ASSERT_GE(records_of(server).size(), 1u);
  for (const json& record : records_of(server)) EXPECT_FALSE(record.contains("env_params"));
  EXPECT_TRUE(client->take_error().ok());
}

// A server that answers the state request of a new connection (env_params_seq
// 0) without a set has no parameters (§19.2): the client drops the set it held
// (the callback hears of it with null), episodes started from then on have no
// values and their records no env_params; an episode started before keeps its
// values.
TEST(EnvParams, ANewConnectionWithoutASetDropsTheSetHeld) {
  ServerScript script;
  script.steps_per_sample = 4;
  // Connection 1 has set 5; its first batch is lost (the server closes); connection 2 has no parameters.
  script.on_get_state = [](Conn& conn, const tether::Message& message, int connection) {
    conn.send(with_set(state(0, 0), connection == 1 ? kSet5 : kNoSet, message));
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message& message, int n) {
    if (n == 1) return false;
    if (message.type == tether::MessageType::kEpisodesAndGetState) conn.send(with_set(state(0, 0), kNoSet, message));
    return true;
  };
  FakeServer server(script);
  auto client = connect(waiting_options_for(server));
  ASSERT_TRUE(client);
  ASSERT_NE(client->env_params(), nullptr);
  EXPECT_EQ(client->env_params()->seq, 5);
  std::vector<std::int64_t> seen;  // (-1: null)
  client->on_env_params_changed(
      [&](const tether::EnvParams* params) { seen.push_back(params != nullptr ? params->seq : -1); });
  EXPECT_EQ(seen, std::vector<std::int64_t>({5}));  // at once: a set is held

  const std::string before = client->start_episode().value();
  ASSERT_EQ(client->episode_params(before).value().size(), 2u);
  ASSERT_NO_FATAL_FAILURE(act(*client, before, 5, 1.0));
  ASSERT_NO_FATAL_FAILURE(end(*client, before));
  ASSERT_TRUE(client->flush().ok());
  EXPECT_GE(server.connections(), 2);
  EXPECT_EQ(client->env_params(), nullptr);
  EXPECT_EQ(seen, std::vector<std::int64_t>({5, -1}));  // once, with null

  const std::string after = client->start_episode().value();
  EXPECT_TRUE(client->episode_params(after).value().empty());
  ASSERT_NO_FATAL_FAILURE(act(*client, after, 5, 1.0));
  ASSERT_NO_FATAL_FAILURE(end(*client, after));
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(seen, std::vector<std::int64_t>({5, -1}));  // (later answers without a set: no set to drop)

  const std::vector<json> before_records = records_named(server, before);
  ASSERT_GE(before_records.size(), 2u);
  for (const json& record : before_records) {
    ASSERT_TRUE(record.contains("env_params")) << record.dump();
    EXPECT_EQ(record["env_params"]["seq"], 5);
  }
  const std::vector<json> after_records = records_named(server, after);
  ASSERT_GE(after_records.size(), 1u);
  for (const json& record : after_records) EXPECT_FALSE(record.contains("env_params")) << record.dump();
  EXPECT_EQ(client->env_params_ignored(), 0u);
  EXPECT_TRUE(client->take_error().ok());
}

// Two sets that arrive before the engine's next call make one callback call,
// with the newer, after every event of that call is applied (§19.2 "Change
// callback"); a drop with no set held calls nothing.
TEST(EnvParams, TwoSetsBeforeACallMakeOneCallback) {
  // Connection 1: no parameters; connection 2 (once the test lets it in): set
  // 5; connection 3: set 6; each closed after its state's answer. Connection 4 and on: set 6.
  auto open_gate = std::make_shared<std::atomic<bool>>(false);
  auto pings = std::make_shared<std::atomic<int>>(0);
  ServerScript script;
  script.steps_per_sample = 4;
  script.on_ping = [open_gate, pings](Conn& conn, const tether::Message&) {
    if (pings->fetch_add(1) + 1 == 2) {
      while (!open_gate->load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    conn.send(pong("1.7"));
    return true;
  };
  script.on_get_state = [](Conn& conn, const tether::Message& message, int connection) {
    const int phase = connection == 1 ? kNoSet : connection == 2 ? kSet5 : kSet6;
    conn.send(with_set(state(0, 0), phase, message));
    return connection >= 4;  // (the first three close after answering)
  };
  FakeServer server(script);
  auto client = connect(waiting_options_for(server));
  ASSERT_TRUE(client);
  EXPECT_EQ(client->env_params(), nullptr);
  std::vector<std::int64_t> seen;
  client->on_env_params_changed([&](const tether::EnvParams* params) {
    seen.push_back(params != nullptr ? params->seq : -1);
    // (called after the call's events are applied: what the client holds is the set given)
    EXPECT_EQ(client->env_params(), params);
  });
  EXPECT_TRUE(seen.empty());  // (no set held)
  open_gate->store(true);
  // Connections 2 and 3 were handshaken (their sets posted) once the third is lost.
  ASSERT_TRUE(wait_for([&] { return client->reconnects() >= 3; }, 10.0));
  EXPECT_TRUE(seen.empty());  // (nothing is applied between two calls)
  const std::string episode = client->start_episode().value();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], 6);
  ASSERT_NE(client->env_params(), nullptr);
  EXPECT_EQ(client->env_params()->seq, 6);
  EXPECT_EQ(client->episode_params(episode).value().size(), 1u);  // (drawn from set 6: speed)
  EXPECT_EQ(client->env_params_ignored(), 0u);
}

// Parameter sets that break §19.1 are ignored (the client keeps its set and its
// env_params_seq) and counted, once per answer that carries one.
TEST(EnvParams, IgnoredSetsAreCounted) {
  auto malformed_sent = std::make_shared<std::atomic<int>>(0);
  ServerScript script;
  script.steps_per_sample = 4;
  script.on_get_state = [](Conn& conn, const tether::Message& message, int) {
    conn.send(with_set(state(0, 0), kSet5, message));
    return true;
  };
  script.on_batch = [malformed_sent](Conn& conn, const tether::Message& message, int) {
    if (message.type != tether::MessageType::kEpisodesAndGetState) return true;
    json answer = state(0, 0);
    answer["env_params"] = {{"seq", 7}, {"lesson", 0}, {"values", {{"speed", "fast"}}}};  // (not a number)
    malformed_sent->fetch_add(1);
    conn.send(answer);
    return true;
  };
  FakeServer server(script);
  auto client = connect(waiting_options_for(server));
  ASSERT_TRUE(client);
  int calls = 0;
  client->on_env_params_changed([&](const tether::EnvParams*) { ++calls; });
  EXPECT_EQ(calls, 1);  // (set 5, at once)
  EXPECT_EQ(client->env_params_ignored(), 0u);
  for (int i = 0; i < 3; ++i) {
    const std::string episode = client->start_episode().value();
    ASSERT_NO_FATAL_FAILURE(act(*client, episode, 5, 1.0));
    ASSERT_NO_FATAL_FAILURE(end(*client, episode));
  }
  ASSERT_TRUE(client->flush().ok());
  ASSERT_GE(malformed_sent->load(), 2);
  EXPECT_EQ(client->env_params_ignored(), static_cast<std::uint64_t>(malformed_sent->load()));
  ASSERT_NE(client->env_params(), nullptr);
  EXPECT_EQ(client->env_params()->seq, 5);
  EXPECT_EQ(calls, 1);
  for (const json& request : state_requests(server)) {
    if (request["type"] == "EPISODES_AND_GET_STATE") EXPECT_EQ(request["env_params_seq"], 5);
  }
  EXPECT_TRUE(client->take_error().ok());
}

#ifndef TETHER_NO_EXCEPTIONS
// A callback that throws: the exception comes out of the call that took the
// news in; what was taken in stays applied and nothing is applied (nor called
// for) again by the next calls (§19.2 "Change callback").
TEST(EnvParams, ACallbackThatThrowsAppliesNothingTwice) {
  auto phase = std::make_shared<std::atomic<int>>(kNoSet);
  ServerScript script;
  script.steps_per_sample = 1000;  // (no batch before flush)
  script.on_get_state = [phase](Conn& conn, const tether::Message& message, int) {
    conn.send(with_set(state(0, 0), phase->load(), message));
    return true;
  };
  script.on_batch = [phase](Conn& conn, const tether::Message& message, int n) {
    if (message.type == tether::MessageType::kEpisodesAndGetState) {
      conn.send(with_set(state(n, static_cast<std::uint8_t>(n % 2)), phase->load(), message));  // (a new model)
    }
    return true;
  };
  FakeServer server(script);
  auto client = connect(waiting_options_for(server));
  ASSERT_TRUE(client);
  int calls = 0;
  client->on_env_params_changed([&](const tether::EnvParams* params) {
    ++calls;
    if (params != nullptr && params->seq == 5) throw std::runtime_error("the game refuses set 5");
  });
  EXPECT_EQ(calls, 0);
  const std::int64_t models_before = client->models_loaded();
  const std::string episode = client->start_episode().value();
  ASSERT_NO_FATAL_FAILURE(act(*client, episode, 6, 1.0));
  ASSERT_NO_FATAL_FAILURE(end(*client, episode));
  phase->store(kSet5);
  EXPECT_THROW((void)client->flush(), std::runtime_error);  // (the answer: model 1, set 5 and the batch)
  EXPECT_EQ(calls, 1);
  ASSERT_NE(client->env_params(), nullptr);
  EXPECT_EQ(client->env_params()->seq, 5);
  const std::int64_t models = client->models_loaded();
  const std::int64_t sent = client->env_steps_sent();
  EXPECT_EQ(models, models_before + 1);
  EXPECT_EQ(sent, 6);
  // The next calls take nothing in again.
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(client->flush().ok());
    EXPECT_TRUE(client->take_error().ok());
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(client->models_loaded(), models);
  EXPECT_EQ(client->env_steps_sent(), sent);
  EXPECT_EQ(client->env_params()->seq, 5);
  // The client goes on: an episode draws from set 5.
  const std::string next = client->start_episode().value();
  EXPECT_EQ(client->episode_params(next).value().size(), 2u);
  EXPECT_EQ(calls, 1);
}
#endif  // TETHER_NO_EXCEPTIONS

// -- the multi-agent client ------------------------------------------------------------------

TEST(EnvParams, MultiAgentRecordsCarryTheEpisodesValues) {
  auto phase = std::make_shared<std::atomic<int>>(kSet5);
  ServerScript script = phase_script(phase, pair_state(0));
  script.full_config = pair_config(6);  // (3 actors a frame: a batch every 2 frames)
  FakeServer server(script);
  auto client = connect_multi(waiting_options_for(server, 3));
  ASSERT_TRUE(client);
  std::int64_t seen = 0;
  const std::string episode = client->start_episode().value();  // (its sync takes in set 5)
  client->on_env_params_changed([&](const tether::EnvParams* params) { seen = params != nullptr ? params->seq : -1; });
  EXPECT_EQ(seen, 5);  // called at once: a set is held
  const tether::EnvValues drawn = client->episode_params(episode).value();
  ASSERT_EQ(drawn.size(), 2u);
  EXPECT_GE(drawn.at("gravity"), 9.0);
  EXPECT_LE(drawn.at("gravity"), 11.0);
  const float obs[2] = {0.5f, -0.5f};
  for (int f = 0; f < 5; ++f) {
    tether::AgentFrame frame;
    for (const char* id : {"a_0", "a_1", "p_0", "p_1"}) frame.add(id, obs, 2);
    tether::Status status = client->get_action(episode, frame);
    ASSERT_TRUE(status.ok()) << status.to_string();
    ASSERT_TRUE(client->log_returns(episode, "a_0", 1.0).ok());
  }
  EXPECT_EQ(client->report_measure(episode, std::nan("")).code(), tether::ErrorCode::kNonFiniteValue);
  ASSERT_TRUE(client->report_measure(episode, -2.5).ok());
  ASSERT_TRUE(client->end_episode(episode).ok());
  EXPECT_EQ(client->report_measure(episode, 1.0).code(), tether::ErrorCode::kInvalidArgument);  // (ended)
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> records = records_named(server, episode);
  ASSERT_GE(records.size(), 2u);
  for (std::size_t i = 0; i < records.size(); ++i) {
    SCOPED_TRACE("record " + std::to_string(i));
    ASSERT_TRUE(records[i].contains("env_params")) << records[i].dump().substr(0, 300);
    const json& member = records[i]["env_params"];
    EXPECT_EQ(member["seq"], 5);
    EXPECT_EQ(member["values"]["gravity"].get<double>(), drawn.at("gravity"));
    EXPECT_EQ(member["values"]["speed"].get<double>(), 2.0);
    const bool last = i + 1 == records.size();
    EXPECT_EQ(records[i]["is_terminated"].get<bool>(), last);
    EXPECT_EQ(member.contains("measure"), last);
    if (last) EXPECT_EQ(member["measure"].get<double>(), -2.5);
    for (const auto& entry : records[i]["agents"].items()) EXPECT_FALSE(entry.value().contains("env_params"));
  }
  for (const json& request : state_requests(server)) {
    ASSERT_TRUE(request.contains("env_params_seq")) << request.dump().substr(0, 200);
  }
  EXPECT_EQ(state_requests(server).front()["env_params_seq"], 0);
  EXPECT_EQ(state_requests(server).back()["env_params_seq"], 5);
  EXPECT_TRUE(client->take_error().ok());
}

}  // namespace

#endif  // _WIN32
