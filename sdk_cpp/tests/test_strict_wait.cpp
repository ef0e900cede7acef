// Strict on-policy: hand_over(..., wait_for_answer) waits for ITS batch's
// answer. An error event about something else (here an ERROR the server sent
// before, which the engine has not taken yet) must not end the wait: the
// engine would then act on with the old weights.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include "fake_backend.h"
#include "fake_server.h"
#include "tether/server_link.h"

namespace {

using fake::Conn;
using fake::FakeServer;
using fake::ServerScript;
using nlohmann::json;

json set_state(std::int64_t seq, std::uint8_t model) {
  return {{"type", "SET_STATE"}, {"weights_seq_no", seq}, {"onnx_file", fake::onnx_file(model)}};
}

}  // namespace

TEST(StrictWait, AnUnrelatedErrorDoesNotEndTheWaitForTheAnswer) {
  ServerScript script;
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send(set_state(0, 0));
    conn.send({{"type", "ERROR"}, {"code", "INTERNAL"}, {"message", "about something else"}});
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // training
    conn.send(set_state(n, 1));
    return true;
  };
  FakeServer server(script);
  tether::LinkOptions options;
  options.port = server.port();
  options.reconnect_timeout_s = 5.0;
  options.response_timeout_s = 5.0;
  options.update_timeout_s = 5.0;
  options.backend_factory = [] { return std::make_unique<fake::Backend>(); };
  tether::ServerLink link(options);
  ASSERT_TRUE(link.start().ok());
  // The connection and the error wait for the engine, untaken.
  const auto until = fake::Clock::now() + std::chrono::seconds(5);
  while (link.events_waiting() < 2 && fake::Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(link.events_waiting(), 2u);

  auto batch = std::make_shared<tether::Batch>();
  tether::EpisodeChunk chunk;
  chunk.episode_id = "e";
  chunk.obs = {0, 0, 0, 0, 1, 1, 1, 1};
  chunk.actions = {1};
  chunk.rewards = {1};
  chunk.action_logp = {-0.5};
  batch->chunks.push_back(chunk);
  batch->env_steps = 1;
  const auto start = fake::Clock::now();
  link.hand_over(batch, 1, /*wait_for_room=*/false, /*wait_for_answer=*/true);
  EXPECT_GE(std::chrono::duration<double>(fake::Clock::now() - start).count(), 0.25);
  EXPECT_TRUE(link.idle());  // answered: nothing queued or in flight
  std::deque<tether::LinkEvent> events;
  link.take_events(events);
  ASSERT_FALSE(events.empty());
  ASSERT_EQ(events.back().kind, tether::LinkEvent::Kind::kBatch);
  EXPECT_TRUE(events.back().batch->error.ok());
}

#endif  // _WIN32
