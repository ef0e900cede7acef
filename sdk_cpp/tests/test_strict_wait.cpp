// Strict on-policy: hand_over(..., wait_for_answer) waits for ITS batch's
// answer. An error event about something else (here an ERROR the server sent
// before, which the engine has not taken yet) must not end the wait: the
// engine would then act on with the old weights.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <chrono>
#include <deque>
#include <memory>
#include <thread>

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

}  // namespace

TEST(StrictWait, AnUnrelatedErrorDoesNotEndTheWaitForTheAnswer) {
  ServerScript script;
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send(state(0, 0));
    conn.send({{"type", "ERROR"}, {"code", "INTERNAL"}, {"message", "about something else"}});
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // training
    conn.send(state(n, 1));
    return true;
  };
  FakeServer server(script);
  tether::ServerLink link(link_options_for(server));
  ASSERT_TRUE(link.start().ok());
  // The connection and the error wait for the engine, untaken.
  const auto until = fake::Clock::now() + std::chrono::seconds(5);
  while (link.events_waiting() < 2 && fake::Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(link.events_waiting(), 2u);

  std::shared_ptr<tether::Batch> batch = one_step("e");
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
