// TetherClient against a fake server built from the SDK's own framing and
// message code (a listening socket and a thread in the test), with a fake
// inference backend: batches, hot model swaps, ERROR replies, garbage, an
// oversized header, a server that stops answering or goes away. Every case
// must end with a clear status, no crash and no hang.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client_test_helpers.h"
#include "tether/framing.h"
#include "tether/onnx_codec.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

// A server that refuses batch 1 (INVALID_FIELD) and answers the others.
ServerScript refusing_batch_1() {
  ServerScript script;
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    conn.send(n == 1 ? refusal("INVALID_FIELD") : state(n, 1));
    return true;
  };
  return script;
}

// Plays `steps` steps of 10-step episodes; returns the actions; stops at the first failing call.
struct Played {
  std::vector<int> actions;
  tether::Status status;
};

Played play(tether::TetherClient& client, int steps) {
  Played played;
  float obs[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  double action[1];
  int done_steps = 0;
  while (done_steps < steps) {
    tether::Result<std::string> episode = client.start_episode();
    if (!episode.ok()) {
      played.status = episode.status();
      return played;
    }
    for (int t = 0; t < 10; ++t) {
      played.status = client.get_action(episode.value(), obs, 4, action, 1);
      if (!played.status.ok()) return played;
      played.actions.push_back(static_cast<int>(action[0]));
      client.log_returns(episode.value(), 1.0);
      obs[0] = static_cast<float>(t) / 10.0f;
      ++done_steps;
    }
    played.status = client.end_episode(episode.value(), obs, 4, false).status();
    if (!played.status.ok()) return played;
  }
  return played;
}

tether::Space obs_space() { return tether::Space::box({4}, -10.0, 10.0).value(); }
tether::Space action_space() { return tether::Space::discrete(2).value(); }

}  // namespace

TEST(OnnxCodec, DecodesStoredAndRejectsCorruptData) {
  tether::Result<std::vector<std::uint8_t>> model = tether::decode_onnx_file(onnx_file(7));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ(model.value(), (std::vector<std::uint8_t>{7, 1, 2, 3}));
  EXPECT_EQ(tether::decode_onnx_file("not base64!").status().code(), tether::ErrorCode::kInvalidField);
  EXPECT_EQ(tether::decode_onnx_file("AAAA").status().code(), tether::ErrorCode::kInvalidField);
  std::string corrupt = onnx_file(7);
  corrupt[corrupt.size() - 6] = corrupt[corrupt.size() - 6] == 'A' ? 'B' : 'A';  // the CRC
  EXPECT_EQ(tether::decode_onnx_file(corrupt).status().code(), tether::ErrorCode::kInvalidField);
}

TEST(OnnxCodec, DecodesPythonGzipWithFixedAndDynamicHuffmanBlocks) {
  // base64(gzip.compress(..., mtime=0)) made by Python: b"abc" * 4 (a fixed-Huffman
  // block) and "tether {i*i % 97} " for i in 0..399 (a dynamic-Huffman block).
  tether::Result<std::vector<std::uint8_t>> fixed = tether::decode_onnx_file("H4sIAAAAAAACA0tMSk6EIQA0Km5aDAAAAA==");
  ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();
  EXPECT_EQ(std::string(fixed.value().begin(), fixed.value().end()), "abcabcabcabc");
  tether::Result<std::vector<std::uint8_t>> dynamic = tether::decode_onnx_file(
      "H4sIAAAAAAACA+2Tyw0DIQwFW0kJAXb5FLRSztH2rxwiZiJBATn4ZmH8eNie+7pf1/vxfNzfIM3gmMEgVWeUzxkVzg7uVUo7aoVSkkebUctk"
      "uU9l5Wz4KnJN49w7yQ7d+R1/6D2yJ3odAzybcdzJnpRmDHRbYQNQSZx17FWNolzQS3rBMd47wo1nm2dlE20qVFG5ru/rSZ969z9p8297YX/s"
      "mX20t/bbGfR1Uk7vZ6JpM/m6bohb4ya5XW5c3WxmXvfXnXbPy0qDhEhN2dAlcWPBErFAN9ANdAPdQDfQDXQD3UA30A10/wTdD4CF+hdfDwAA");
  ASSERT_TRUE(dynamic.ok()) << dynamic.status().to_string();
  std::string expected;
  for (int i = 0; i < 400; ++i) expected += "tether " + std::to_string(i * i % 97) + " ";
  EXPECT_EQ(std::string(dynamic.value().begin(), dynamic.value().end()), expected);
}

TEST(TetherClient, PlaysSendsNumberedBatchesAndSwapsModels) {
  FakeServer server(ServerScript{});
  auto connected = tether::TetherClient::connect(waiting_options_for(server));  // every batch reaches the server
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  EXPECT_EQ(client.env_steps_per_sample(), 20);
  EXPECT_EQ(client.action_space(), action_space());
  Played played = play(client, 200);
  ASSERT_TRUE(played.status.ok()) << played.status.to_string();
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> batches = server.batches();
  ASSERT_GE(batches.size(), 8u);
  for (std::size_t i = 0; i < batches.size(); ++i) {
    EXPECT_EQ(batches[i]["batch_seq"], static_cast<std::int64_t>(i + 1));
    EXPECT_EQ(batches[i]["client_session"], client.client_session());
    EXPECT_EQ(batches[i]["type"], "EPISODES_AND_GET_STATE");
    tether::Result<std::size_t> steps = tether::validate_episodes(batches[i], obs_space(), action_space(), true);
    ASSERT_TRUE(steps.ok()) << steps.status().to_string();
    EXPECT_EQ(static_cast<std::int64_t>(steps.value()), batches[i]["env_steps"].get<std::int64_t>());
  }
  // Batch n is answered by model n % 2: the actions change once it is in use.
  bool saw0 = false, saw1 = false;
  for (int a : played.actions) (a == 0 ? saw0 : saw1) = true;
  EXPECT_TRUE(saw0 && saw1);
  EXPECT_GT(client.models_loaded(), 2);
  EXPECT_EQ(client.env_steps_sent(), 200);
  EXPECT_TRUE(client.take_error().ok());
}

// A batch is cut inside the get_action that completes its last step: the
// chunk of the calling episode ends with that call's observation (the next
// chunk starts from it again), while every other open episode keeps its last
// action, still waiting for its next observation, for the next chunk. Three
// episodes played in turn, every observation numbered: each episode's chunks,
// joined at their shared rows, are exactly the observations it was given, in order.
TEST(TetherClient, ACutTakesTheCuttingCallsObservationAsItsEpisodesLastStepsNext) {
  FakeServer server(ServerScript{});
  auto connected = tether::TetherClient::connect(waiting_options_for(server));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  const std::vector<std::string> ids = {"a", "b", "c"};
  std::map<std::string, std::vector<float>> given;
  for (const std::string& id : ids) ASSERT_TRUE(client.start_episode(id).ok());
  double action[1];
  for (int round = 0; round < 45; ++round) {
    for (std::size_t e = 0; e < ids.size(); ++e) {
      const float number = static_cast<float>(round * 3 + static_cast<int>(e)) * 0.01f;
      const float obs[4] = {number, static_cast<float>(e), 0.0f, 0.0f};
      ASSERT_TRUE(client.get_action(ids[e], obs, 4, action, 1).ok());
      ASSERT_TRUE(client.log_returns(ids[e], 1.0).ok());
      given[ids[e]].push_back(number);
    }
  }
  for (std::size_t e = 0; e < ids.size(); ++e) {
    const float final_obs[4] = {-1.0f - static_cast<float>(e), static_cast<float>(e), 0.0f, 0.0f};
    ASSERT_TRUE(client.end_episode(ids[e], final_obs, 4).ok());
    given[ids[e]].push_back(-1.0f - static_cast<float>(e));
  }
  ASSERT_TRUE(client.flush().ok());
  std::map<std::string, std::vector<float>> sent;
  std::size_t chunks = 0;
  for (const json& batch : server.batches()) {
    for (const json& record : batch["episodes"]) {
      std::vector<float>& rows = sent[record["episode_id"].get<std::string>()];
      const json& obs = record["obs"];
      ASSERT_EQ(obs.size(), record["actions"].size() + 1);
      if (!rows.empty()) EXPECT_EQ(obs[0][0].get<float>(), rows.back()) << "a chunk starts where the last ended";
      for (std::size_t i = rows.empty() ? 0 : 1; i < obs.size(); ++i) rows.push_back(obs[i][0].get<float>());
      ++chunks;
    }
  }
  EXPECT_GT(chunks, 6u);  // (cuts every 20 steps, inside get_action, of every episode)
  EXPECT_EQ(sent, given);
}

TEST(TetherClient, ErrorReplyIsAStatusAndTheBatchIsNotResent) {
  FakeServer server(refusing_batch_1());
  auto connected = tether::TetherClient::connect(options_for(server));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  // The refusal of batch 1 comes back from the call after it arrived (a get_action,
  // start_episode or end_episode; or flush, which waits for it), once.
  Played played = play(client, 100);
  const tether::Status error = played.status.ok() ? client.flush() : played.status;
  EXPECT_EQ(error.code(), tether::ErrorCode::kInvalidField) << error.to_string();
  EXPECT_EQ(client.last_error().code(), tether::ErrorCode::kInvalidField);
  // That call did nothing else; the engine plays on.
  played = play(client, 100);
  ASSERT_TRUE(played.status.ok()) << played.status.to_string();
  ASSERT_TRUE(client.flush().ok());
  EXPECT_TRUE(client.take_error().ok());  // (returned by that call: not again)
  EXPECT_EQ(client.last_error().code(), tether::ErrorCode::kInvalidField);
  std::vector<json> batches = server.batches();
  ASSERT_GE(batches.size(), 2u);
  EXPECT_EQ(batches[1]["batch_seq"], 2);
  EXPECT_EQ(server.connections(), 1);
}

// The server answers batch 1 with `reply` on the first connection; the client must
// drop the connection, reconnect, and resend batch 1 with the same seq.
void expect_resend_after(const std::string& reply, std::size_t max_frame_bytes = tether::kDefaultMaxFrameBytes) {
  ServerScript script;
  script.on_batch = [reply](Conn& conn, const tether::Message&, int n) {
    if (n == 1) {
      conn.send_raw(reply);
      return true;  // keep the connection: the client must close it
    }
    conn.send(state(n, 1));
    return true;
  };
  FakeServer server(script);
  tether::ClientOptions options = options_for(server);
  options.max_frame_bytes = max_frame_bytes;
  auto connected = tether::TetherClient::connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  Played played = play(client, 60);
  ASSERT_TRUE(played.status.ok()) << played.status.to_string();
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> batches = server.batches();
  ASSERT_GE(batches.size(), 3u);
  EXPECT_EQ(batches[0]["batch_seq"], 1);
  EXPECT_EQ(batches[1]["batch_seq"], 1);  // resent
  EXPECT_EQ(batches[1]["episodes"], batches[0]["episodes"]);
  EXPECT_EQ(batches[2]["batch_seq"], 2);
  // A batch queued while the client is still connecting abandons that TCP connect and
  // starts another (under load this happens): one reconnect, maybe one abandoned connect.
  EXPECT_GE(server.connections(), 2);
  EXPECT_LE(server.connections(), 3);
  EXPECT_GE(client.reconnects(), 1);
}

TEST(TetherClient, GarbageFromTheServerMeansReconnectAndResend) { expect_resend_after("NOT-A-FRAME-HEADER"); }

TEST(TetherClient, OversizedHeaderMeansReconnectAndResend) { expect_resend_after("99999999{", 1 << 20); }

TEST(TetherClient, UnsolicitedResponseMeansReconnectAndResend) {
  expect_resend_after(tether::encode_frame("{\"type\":\"PONG\"}").value() +
                      tether::encode_frame("{\"type\":\"PONG\"}").value());
}

TEST(TetherClient, ServerThatStopsAnsweringTimesOutAndTheBatchIsResent) {
  ServerScript script;
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    if (n > 1) conn.send(state(n, 1));
    return true;  // batch 1: silence
  };
  FakeServer server(script);
  tether::ClientOptions options = options_for(server);
  options.update_timeout_s = 0.5;
  auto connected = tether::TetherClient::connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  const auto start = Clock::now();
  Played played = play(client, 40);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 0.5);  // get_action never waited
  ASSERT_TRUE(played.status.ok());
  // The timeout comes back from the next call, here flush (which waited for it), once.
  const tether::Status timed_out = client.flush();
  EXPECT_EQ(timed_out.code(), tether::ErrorCode::kTimeout) << timed_out.to_string();
  ASSERT_TRUE(client.flush().ok());
  EXPECT_TRUE(client.take_error().ok());
  std::vector<json> batches = server.batches();
  ASSERT_GE(batches.size(), 2u);
  EXPECT_EQ(batches[1]["batch_seq"], 1);
}

TEST(TetherClient, ServerGoneEndsWithConnectionFailedNotAHang) {
  auto server = std::make_unique<FakeServer>(ServerScript{});
  tether::ClientOptions options = options_for(*server);
  options.reconnect_timeout_s = 0.5;
  auto connected = tether::TetherClient::connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  server->stop();
  const auto start = Clock::now();
  Played played;
  ASSERT_TRUE(wait_for([&] {
    played = play(client, 30);
    return !played.status.ok();
  }, 10.0));
  EXPECT_EQ(played.status.code(), tether::ErrorCode::kConnectionFailed) << played.status.to_string();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 8.0);
  EXPECT_EQ(client.fatal_error().code(), tether::ErrorCode::kConnectionFailed);
}

TEST(TetherClient, ConnectFailsClearly) {
  std::uint16_t port = 0;
  {
    FakeServer server(ServerScript{});
    port = server.port();
  }
  tether::ClientOptions options;
  options.port = port;
  options.reconnect_timeout_s = 0.3;
  options.backend_factory = [] { return std::make_unique<fake::Backend>(); };
  auto connected = tether::TetherClient::connect(options);
  EXPECT_EQ(connected.status().code(), tether::ErrorCode::kConnectionFailed) << connected.status().to_string();
  options.backend_factory = nullptr;
  EXPECT_EQ(tether::TetherClient::connect(options).status().code(), tether::ErrorCode::kInvalidArgument);
}

TEST(TetherClient, AuthFailedAtConnect) {
  ServerScript script;
  script.on_ping = [](Conn& conn, const tether::Message&) {
    conn.send({{"type", "ERROR"}, {"code", "AUTH_FAILED"}, {"message", "wrong token"}, {"request", "PING"}});
    return false;
  };
  FakeServer server(script);
  auto connected = tether::TetherClient::connect(options_for(server));
  EXPECT_EQ(connected.status().code(), tether::ErrorCode::kAuthFailed) << connected.status().to_string();
}

TEST(TetherClient, HeartbeatsWhileIdle) {
  ServerScript script;
  script.heartbeat_interval_s = 0.1;
  FakeServer server(script);
  auto connected = tether::TetherClient::connect(options_for(server));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  EXPECT_TRUE(wait_for([&] { return server.pings() >= 4; }, 3.0));
  EXPECT_GE(connected.value()->heartbeats_sent(), 3);
}

TEST(TetherClient, BadCallsAreStatuses) {
  FakeServer server(ServerScript{});
  auto connected = tether::TetherClient::connect(options_for(server));
  ASSERT_TRUE(connected.ok());
  tether::TetherClient& client = *connected.value();
  float obs[4] = {0, 0, 0, 0};
  double action[1];
  EXPECT_EQ(client.get_action("nope", obs, 4, action, 1).code(), tether::ErrorCode::kInvalidArgument);
  std::string id = client.start_episode("e1").value();
  EXPECT_EQ(client.start_episode("e1").status().code(), tether::ErrorCode::kInvalidArgument);
  EXPECT_EQ(client.get_action(id, obs, 3, action, 1).code(), tether::ErrorCode::kInvalidArgument);
  EXPECT_EQ(client.get_action(id, obs, 4, action, 2).code(), tether::ErrorCode::kInvalidArgument);
  obs[2] = std::nanf("");
  EXPECT_EQ(client.get_action(id, obs, 4, action, 1).code(), tether::ErrorCode::kNonFiniteValue);
  obs[2] = 0;
  EXPECT_TRUE(client.get_action(id, obs, 4, action, 1).ok());
  EXPECT_EQ(client.log_returns(id, std::nan("")).code(), tether::ErrorCode::kNonFiniteValue);
  EXPECT_TRUE(client.end_episode(id, obs, 4).ok());
  EXPECT_EQ(client.end_episode(id, obs, 4).status().code(), tether::ErrorCode::kInvalidArgument);
}

TEST(TetherClient, ActsWhileBatchesAndModelsMoveWithObserverThreads) {
  ServerScript script;
  script.steps_per_sample = 5;
  script.force_on_policy = false;  // EPISODES + GET_STATE
  FakeServer server(script);
  auto connected = tether::TetherClient::connect(waiting_options_for(server));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  std::atomic<bool> done{false};
  std::thread observer([&] {
    while (!done.load()) {
      (void)client.reconnects();
      (void)client.batches_dropped();
      (void)client.heartbeats_sent();
      std::this_thread::yield();
    }
  });
  Played played = play(client, 2000);
  done.store(true);
  observer.join();
  ASSERT_TRUE(played.status.ok()) << played.status.to_string();
  ASSERT_TRUE(client.flush().ok());
  EXPECT_EQ(client.env_steps_sent(), 2000);
  for (const json& batch : server.batches()) {
    EXPECT_EQ(batch["type"], "EPISODES");
    ASSERT_TRUE(tether::validate_episodes(batch, obs_space(), action_space(), true).ok());
  }
}

TEST(ServerLink, BatchLostOnEveryConnectionIsGivenUpWithBackoff) {
  ServerScript script;
  script.on_batch = [](Conn&, const tether::Message&, int) { return false; };  // drop the connection, every time
  FakeServer server(script);
  auto connected = tether::TetherClient::connect(options_for(server));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  const auto start = Clock::now();
  Played played = play(client, 30);  // one batch of 20 steps is cut
  ASSERT_TRUE(played.status.ok()) << played.status.to_string();
  tether::Status error;
  ASSERT_TRUE(wait_for([&] {
    error = client.take_error();
    return error.code() == tether::ErrorCode::kConnectionFailed;
  }, 20.0)) << "the batch was never given up: " << server.batches().size() << " sends";
  EXPECT_NE(error.message().find("max_batch_attempts"), std::string::npos) << error.to_string();
  std::vector<json> batches = server.batches();
  ASSERT_GE(batches.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(batches[static_cast<std::size_t>(i)]["batch_seq"], 1);
  // Backoff kept between the fruitless connections: 0.05 + 0.1 + 0.2 + 0.4 s at least.
  EXPECT_GE(std::chrono::duration<double>(Clock::now() - start).count(), 0.7);
  EXPECT_TRUE(client.fatal_error().ok());  // the link goes on
}

TEST(ServerLink, AnIdOfARefusedEpisodeIsSentAgainWhenReused) {
  FakeServer server(refusing_batch_1());
  auto connected = tether::TetherClient::connect(options_for(server));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  double action[1];
  int refused = 0;  // calls that returned the refusal of batch 1 (and did nothing else)
  auto ok = [&](auto call) { return again_after(tether::ErrorCode::kInvalidField, refused, call).ok(); };
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(ok([&] { return client.start_episode("e1"); }));
    for (int t = 0; t < 25; ++t) ASSERT_TRUE(ok([&] { return client.get_action("e1", kObs, 4, action, 1); }));
    ASSERT_TRUE(ok([&] { return client.end_episode("e1", kObs, 4); }));
    ASSERT_TRUE(ok([&] { return client.flush(); }));
  }
  EXPECT_EQ(refused, 1);
  EXPECT_TRUE(client.take_error().ok());
  std::vector<json> batches = server.batches();
  ASSERT_GE(batches.size(), 2u);
  std::size_t steps_after_refusal = 0;
  for (std::size_t i = 1; i < batches.size(); ++i) {
    for (const json& record : batches[i]["episodes"]) {
      EXPECT_EQ(record["episode_id"], "e1");
      steps_after_refusal += record["actions"].size();
    }
  }
  EXPECT_EQ(steps_after_refusal, 25u);  // the second "e1", whole
}

// Batch 1 is lost on connection 1 and resent on connection 2, where the server
// announces `second_version` (connection 1 announced 5).
std::vector<json> claims_across_reconnect(std::int64_t second_version, std::optional<std::int64_t>& current) {
  ServerScript script;
  script.on_get_state = [second_version](Conn& conn, const tether::Message&, int connection) {
    conn.send(state(connection == 1 ? 5 : second_version, 0));
    return true;
  };
  script.on_batch = [second_version](Conn& conn, const tether::Message&, int n) {
    if (n == 1) return false;  // lost before the answer: resent on the next connection
    conn.send(state(second_version + n, 1));
    return true;
  };
  FakeServer server(script);
  auto connected = tether::TetherClient::connect(options_for(server));
  EXPECT_TRUE(connected.ok()) << connected.status().to_string();
  if (!connected.ok()) return {};
  tether::TetherClient& client = *connected.value();
  EXPECT_EQ(client.weights_seq_no(), 5);
  EXPECT_TRUE(play(client, 30).status.ok());
  EXPECT_TRUE(client.flush().ok());
  current = client.weights_seq_no();
  EXPECT_TRUE(play(client, 10).status.ok());  // fewer than a batch: all acted with `current`
  EXPECT_TRUE(client.flush().ok());
  return server.batches();
}

// A resent batch goes unchanged (§6.5), claim included, whether the server
// it reaches restarted without resuming (its versions went back) or not; the
// server judges the claim (with the behaviour-logp check, a version it never
// served is not trained).
TEST(ServerLink, AResentBatchKeepsItsClaimOnAnyServerRun) {
  std::optional<std::int64_t> current;
  // The server restarted without resuming (its versions went back).
  std::vector<json> batches = claims_across_reconnect(2, current);
  ASSERT_GE(batches.size(), 3u);
  EXPECT_EQ(batches[0]["weights_seq_no"], 5);
  EXPECT_EQ(batches[1]["batch_seq"], 1);
  EXPECT_EQ(batches[1]["weights_seq_no"], 5);
  ASSERT_TRUE(current.has_value());
  EXPECT_EQ(batches.back()["weights_seq_no"], *current);
  // The same run (versions went on).
  batches = claims_across_reconnect(7, current);
  ASSERT_GE(batches.size(), 3u);
  EXPECT_EQ(batches[1]["batch_seq"], 1);
  EXPECT_EQ(batches[1]["weights_seq_no"], 5);
  EXPECT_EQ(batches.back()["weights_seq_no"], *current);
}

TEST(ServerLink, StepsOfUnknownVersionClaimNone) {
  ServerScript script;
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send({{"type", "SET_STATE"}, {"onnx_file", onnx_file(0)}});  // no weights_seq_no
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    conn.send(state(n, 1));
    return true;
  };
  FakeServer server(script);
  auto connected = tether::TetherClient::connect(waiting_options_for(server));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  float obs[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  double action[1];
  ASSERT_TRUE(client.start_episode("a").ok());
  for (int t = 0; t < 5; ++t) ASSERT_TRUE(client.get_action("a", obs, 4, action, 1).ok());
  ASSERT_TRUE(client.flush().ok());  // 4 steps; the answer brings version 1; the 5th step waits for its next obs
  EXPECT_EQ(client.weights_seq_no(), 1);
  ASSERT_TRUE(client.end_episode("a", obs, 4).ok());
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_FALSE(batches[0].contains("weights_seq_no"));
  // Batch 2's step was acted before version 1 was known: it must not claim 1.
  EXPECT_FALSE(batches[1].contains("weights_seq_no")) << batches[1].dump().substr(0, 300);
}

TEST(ServerLink, AnsweredBatchIsFreedOnTheIoThread) {
  FakeServer server(ServerScript{});
  tether::ServerLink link(link_options_for(server));
  ASSERT_TRUE(link.start().ok());
  std::shared_ptr<tether::Batch> batch = one_step("e");
  link.submit(batch);
  tether::Batch* sent = batch.get();
  link.wait_until([sent] { return sent->done; });
  ASSERT_TRUE(sent->done);
  // Before the engine takes the event, the heavy parts are gone already.
  EXPECT_TRUE(sent->chunks.empty());
  EXPECT_TRUE(sent->episodes.is_null() || sent->episodes.empty());
  EXPECT_EQ(sent->episode_ids, std::vector<std::string>{"e"});
  ASSERT_EQ(server.batches().size(), 1u);
  EXPECT_EQ(server.batches()[0]["episodes"][0]["episode_id"], "e");
}

TEST(ServerLink, EventsOfAnEngineThatNeverReadsAreBounded) {
  ServerScript script;
  script.on_get_state = [](Conn& conn, const tether::Message&, int connection) {
    conn.send(state(0, 0));
    if (connection == 1) {
      std::string errors;
      for (int i = 0; i < 3000; ++i) {
        tether::append_message_frame({{"type", "ERROR"}, {"code", "INTERNAL"}, {"message", std::to_string(i)}}, errors);
      }
      conn.send_raw(errors);
      return false;  // then goes away: the client reconnects once it has read them all
    }
    return true;
  };
  FakeServer server(script);
  tether::LinkOptions options = link_options_for(server);
  options.max_queued_events = 100;
  tether::ServerLink link(options);
  ASSERT_TRUE(link.start().ok());
  // The loss is noticed once every ERROR before it was read.
  ASSERT_TRUE(wait_for([&] { return link.reconnects() >= 1; }, 10.0));
  EXPECT_LE(link.events_waiting(), 100u);
  std::deque<tether::LinkEvent> events;
  link.take_events(events);
  int errors = 0;
  for (const tether::LinkEvent& event : events) errors += event.kind == tether::LinkEvent::Kind::kError;
  EXPECT_GT(errors, 50);  // the newest errors are kept
  EXPECT_EQ(events.front().kind, tether::LinkEvent::Kind::kConnected);  // never dropped
  // The second connection is reported too.
  EXPECT_TRUE(wait_for([&] {
    link.take_events(events);
    int connected = 0;
    for (const tether::LinkEvent& event : events) connected += event.kind == tether::LinkEvent::Kind::kConnected;
    return connected == 2;
  }, 10.0));
}

TEST(TetherClient, CallsAfterCloseReturnClosed) {
  FakeServer server(ServerScript{});
  auto connected = tether::TetherClient::connect(options_for(server));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  std::string id = client.start_episode().value();
  float obs[4] = {0, 0, 0, 0};
  double action[1];
  ASSERT_TRUE(client.get_action(id, obs, 4, action, 1).ok());
  client.close();
  EXPECT_EQ(client.flush().code(), tether::ErrorCode::kClosed);
  EXPECT_EQ(client.get_action(id, obs, 4, action, 1).code(), tether::ErrorCode::kClosed);
  EXPECT_EQ(client.start_episode().status().code(), tether::ErrorCode::kClosed);
}

#endif  // _WIN32
