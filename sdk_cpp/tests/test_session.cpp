// Unit tests of the client connection's pairing and the server handshake.
#include <gtest/gtest.h>

#include "tether/session.h"

namespace tether {
namespace {

std::string frames(std::initializer_list<const char*> bodies) {
  std::string out;
  for (const char* b : bodies) EXPECT_TRUE(append_frame(b, out).ok());
  return out;
}

TEST(Session, PairsInOrderAcrossPieces) {
  ClientConnection conn;
  std::string out;
  ASSERT_TRUE(conn.send(make_ping(), out).ok());
  ASSERT_TRUE(conn.send(make_get_config(), out).ok());
  ASSERT_TRUE(conn.send(make_episodes(nlohmann::json::array(), BatchInfo(), false).value(), out).ok());
  EXPECT_EQ(conn.outstanding().size(), 2u);  // EPISODES expects nothing
  const std::string data = frames({R"({"type":"PONG"})", R"({"type":"SET_CONFIG"})"});
  std::vector<Response> responses;
  for (char c : data) ASSERT_TRUE(conn.receive_data(std::string_view(&c, 1), responses).ok());
  ASSERT_EQ(responses.size(), 2u);
  EXPECT_EQ(responses[0].request, MessageType::kPing);
  EXPECT_EQ(responses[1].request, MessageType::kGetConfig);
  EXPECT_FALSE(conn.awaiting_response());
}

TEST(Session, RefusesToSendResponses) {
  ClientConnection conn;
  std::string out;
  EXPECT_EQ(conn.send({{"type", "PONG"}}, out).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(conn.send({{"type", "NOPE"}}, out).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(conn.send(nlohmann::json::array(), out).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());
}

TEST(Session, ConnectionLevelErrorCloses) {
  ClientConnection conn;
  std::string out;
  ASSERT_TRUE(conn.send(make_get_state(), out).ok());
  std::vector<Response> responses;
  Status status = conn.receive_data(frames({R"({"type":"ERROR","code":"CLIENT_TIMEOUT","message":"m"})"}), responses);
  EXPECT_EQ(status.code(), ErrorCode::kClientTimeout);
  ASSERT_EQ(responses.size(), 1u);
  EXPECT_EQ(responses[0].request, std::nullopt);
  EXPECT_TRUE(conn.closed());
  EXPECT_EQ(conn.send(make_ping(), out).code(), ErrorCode::kClosed);
  conn.reset();
  EXPECT_FALSE(conn.closed());
  EXPECT_FALSE(conn.awaiting_response());
  EXPECT_TRUE(conn.send(make_ping(), out).ok());
}

TEST(Session, ViolationsAreSticky) {
  ClientConnection conn;
  std::vector<Response> responses;
  EXPECT_EQ(conn.receive_data(frames({R"({"type":"PONG"})"}), responses).code(), ErrorCode::kNotARequest);
  EXPECT_EQ(conn.receive_data(frames({R"({"type":"PONG"})"}), responses).code(), ErrorCode::kNotARequest);
  ClientConnection bad_frame;
  EXPECT_EQ(bad_frame.receive_data("xxxxxxxx", responses).code(), ErrorCode::kBadHeader);
  ClientConnection bad_body;
  std::string out;
  ASSERT_TRUE(bad_body.send(make_ping(), out).ok());
  EXPECT_EQ(bad_body.receive_data(frames({"[1]"}), responses).code(), ErrorCode::kNotAnObject);
}

TEST(Session, ServerHandshake) {
  ServerConnection server("tok");
  EXPECT_EQ(server.handle_body(R"({"type":"GET_CONFIG"})").refusal.code(), ErrorCode::kAuthFailed);
  ServerEvent wrong = server.handle_body(R"({"type":"PING","auth_token":"x"})");
  EXPECT_EQ(wrong.refusal.code(), ErrorCode::kAuthFailed);
  EXPECT_TRUE(wrong.closes_connection);
  EXPECT_EQ(wrong.error_message()["request"], "PING");
  EXPECT_TRUE(server.handle_body(R"({"type":"PING","auth_token":"tok","protocol_version":"1.0"})").accepted());
  EXPECT_TRUE(server.ready());
  EXPECT_TRUE(server.handle_body(R"({"type":"GET_CONFIG"})").accepted());
  ServerEvent bad = server.handle_body("{");
  EXPECT_EQ(bad.refusal.code(), ErrorCode::kInvalidJson);
  EXPECT_FALSE(bad.error_message().contains("request"));
  EXPECT_EQ(ServerConnection::pong()["protocol_version"], "1.9");
  EXPECT_FALSE(ServerConnection::pong().contains("run_id"));
  EXPECT_EQ(ServerConnection::pong("tether", "run-a")["run_id"], "run-a");
}

// [1.8] The run a PONG names (§7.2), and when steps are another run's (§6.5;
// run_ids.json pins the comparison too).
TEST(Session, RunIds) {
  EXPECT_EQ(run_id_of(nlohmann::json{{"type", "PONG"}, {"run_id", "run-a"}}), std::optional<std::string>("run-a"));
  EXPECT_EQ(run_id_of(nlohmann::json{{"type", "PONG"}}), std::nullopt);
  EXPECT_EQ(run_id_of(nlohmann::json{{"run_id", ""}}), std::nullopt);
  EXPECT_EQ(run_id_of(nlohmann::json{{"run_id", 7}}), std::nullopt);
  EXPECT_EQ(run_id_of(nlohmann::json{{"run_id", nullptr}}), std::nullopt);
  EXPECT_EQ(run_id_of(nlohmann::json::array()), std::nullopt);
  EXPECT_TRUE(from_another_run(std::string("run-a"), std::string("run-b")));
  EXPECT_TRUE(from_another_run(std::string("run-A"), std::string("run-a")));
  EXPECT_FALSE(from_another_run(std::string("run-a"), std::string("run-a")));
  EXPECT_FALSE(from_another_run(std::string("run-a"), std::nullopt));
  EXPECT_FALSE(from_another_run(std::nullopt, std::string("run-b")));
  EXPECT_FALSE(from_another_run(std::nullopt, std::nullopt));
}

}  // namespace
}  // namespace tether
