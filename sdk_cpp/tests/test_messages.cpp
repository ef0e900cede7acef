// Unit tests of message decoding, versions, request builders and ERROR.
#include <cmath>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "tether/messages.h"

namespace tether {
namespace {

TEST(Messages, DecodesTypes) {
  Result<Message> m = decode_message("{\"type\":\"SET_STATE\",\"weights_seq_no\":3}");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m.value().type, MessageType::kSetState);
  EXPECT_EQ(m.value().body["weights_seq_no"], 3);
  EXPECT_EQ(decode_message("[]").status().code(), ErrorCode::kNotAnObject);
  EXPECT_EQ(decode_message("{}").status().code(), ErrorCode::kMissingType);
  EXPECT_EQ(decode_message("{\"type\":\"ping\"}").status().code(), ErrorCode::kUnknownType);
  EXPECT_EQ(decode_message("{\"type\":").status().code(), ErrorCode::kInvalidJson);
  EXPECT_EQ(decode_message("{\"type\":\"\xff\"}").status().code(), ErrorCode::kInvalidUtf8);
  EXPECT_EQ(decode_message("{\"type\":\"\xed\xa0\x80\"}").status().code(), ErrorCode::kInvalidUtf8);  // surrogate
}

TEST(Messages, NonFiniteTokensAreNumbers) {
  Result<nlohmann::json> v = parse_json("[NaN, Infinity, -Infinity, 1e400, \"NaN\", 1e-400]");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  const nlohmann::json& a = v.value();
  EXPECT_TRUE(std::isnan(a[0].get<double>()));
  EXPECT_EQ(a[1].get<double>(), INFINITY);
  EXPECT_EQ(a[2].get<double>(), -INFINITY);
  EXPECT_EQ(a[3].get<double>(), INFINITY);
  EXPECT_EQ(a[4], "NaN");  // inside a string it stays text
  EXPECT_EQ(a[5].get<double>(), 0.0);
  EXPECT_FALSE(parse_json("[Nope]").ok());
}

TEST(Messages, Versions) {
  ASSERT_TRUE(parse_version("1.3").ok());
  EXPECT_EQ(parse_version("1.3").value().major, 1);
  EXPECT_EQ(parse_version("1.3").value().minor, 3);
  EXPECT_EQ(parse_version("2").value().minor, 0);
  EXPECT_TRUE(parse_version("1.2.7").ok());
  for (const char* bad : {"", "1.", "a.b", "1.2.3.4", "-1.0", "1..2"}) EXPECT_FALSE(parse_version(bad).ok()) << bad;
}

TEST(Messages, Builders) {
  PingOptions ping;
  ping.client_name = "engine";
  ping.auth_token = "s3cret";
  EXPECT_EQ(make_ping(ping), nlohmann::json::parse(
                                 R"({"type":"PING","protocol_version":"1.9","client_name":"engine","auth_token":"s3cret"})"));
  PingOptions bare;
  bare.protocol_version.clear();
  EXPECT_EQ(make_ping(bare), nlohmann::json::parse(R"({"type":"PING"})"));
  EXPECT_EQ(make_get_config()["type"], "GET_CONFIG");
  EXPECT_EQ(make_get_state(7)["weights_seq_no"], 7);
  EXPECT_FALSE(make_get_state().contains("weights_seq_no"));
  EXPECT_EQ(make_get_state(std::map<std::string, std::int64_t>{{"a", 1}})["weights_seq_nos"]["a"], 1);
  BatchInfo batch;
  batch.client_session = "abc";
  batch.batch_seq = 2;
  batch.env_steps = 5;
  batch.agent_steps = 5;
  Result<nlohmann::json> eps = make_episodes(nlohmann::json::array(), batch, true);
  ASSERT_TRUE(eps.ok());
  EXPECT_EQ(eps.value()["type"], "EPISODES_AND_GET_STATE");
  EXPECT_EQ(eps.value()["batch_seq"], 2);
  EXPECT_EQ(eps.value()["client_session"], "abc");
  BatchInfo half;
  half.batch_seq = 1;
  EXPECT_EQ(make_episodes(nlohmann::json::array(), half, false).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(make_map_agents("ep", {"a", "b"})["agent_ids"].size(), 2u);
}

TEST(Messages, ErrorDecoding) {
  Message m = decode_message(R"({"type":"ERROR","code":"AUTH_FAILED","message":"no","request":"PING"})").value();
  ServerError e = decode_error(m).value();
  EXPECT_EQ(e.code, ErrorCode::kAuthFailed);
  EXPECT_EQ(e.request, std::optional<std::string>("PING"));
  EXPECT_FALSE(e.closes_connection());
  EXPECT_EQ(e.to_status().code(), ErrorCode::kAuthFailed);
  Message future = decode_message(R"({"type":"ERROR","code":"NEW_CODE","message":"m"})").value();
  EXPECT_EQ(decode_error(future).value().code, ErrorCode::kUnknownServerCode);
  EXPECT_EQ(decode_error(future).value().code_name, "NEW_CODE");
  Message closing = decode_message(R"({"type":"ERROR","code":"SERVER_OVERLOADED","message":"m"})").value();
  EXPECT_TRUE(decode_error(closing).value().closes_connection());
  EXPECT_FALSE(decode_error(decode_message(R"({"type":"PONG"})").value()).ok());
}

TEST(Messages, ABodyEndsItsJsonAtTheFirstNul) {
  // 1.4 (§4.3): the bytes after the NUL are the attachment, never UTF-8- or JSON-checked.
  const std::string body = std::string(R"({"type":"EPISODES","episodes":[]})") + std::string("\0\xff\0{", 4);
  Result<Message> m = decode_message(body);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m.value().type, MessageType::kEpisodes);
  ASSERT_TRUE(m.value().attachment.has_value());
  EXPECT_EQ(*m.value().attachment, std::string_view("\xff\0{", 3));
  EXPECT_EQ(m.value().attachment->data(), body.data() + body.size() - 3);  // a view, not a copy
  EXPECT_FALSE(decode_message(R"({"type":"PING"})").value().attachment.has_value());
  EXPECT_EQ(decode_message(std::string("{\"type\":\"PING\"}\0", 16)).value().attachment, std::string_view());
  // The checks of §4.2 see the JSON text only.
  EXPECT_EQ(decode_message(std::string("{\"type\":\"PING\"\0}", 16)).status().code(), ErrorCode::kInvalidJson);
  EXPECT_EQ(decode_message(std::string("\0{\"type\":\"PING\"}", 16)).status().code(), ErrorCode::kInvalidJson);
  EXPECT_EQ(decode_message(std::string("{\"type\":\"\xff\"}\0", 13)).status().code(), ErrorCode::kInvalidUtf8);

  const BodyParts parts = split_body(body);
  EXPECT_EQ(parts.json, R"({"type":"EPISODES","episodes":[]})");
  EXPECT_EQ(parts.attachment, m.value().attachment);
}

TEST(Messages, EncodesABodyWithAnAttachment) {
  // A NUL inside a string is escaped in the JSON, so the first raw NUL is the separator.
  const nlohmann::json message = {{"type", "EPISODES"}, {"episodes", nlohmann::json::array()},
                                  {"note", std::string("a\0b", 3)}};
  const std::string body = encode_message_with_attachment(message, std::string_view("\0\1\2", 3));
  Result<Message> m = decode_message(body);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m.value().body, message);
  EXPECT_EQ(*m.value().attachment, std::string_view("\0\1\2", 3));
  EXPECT_EQ(decode_message(encode_message_with_attachment(message, "")).value().attachment, std::string_view());
}

TEST(Messages, ErrorCodeSpellings) {
  EXPECT_EQ(error_code_from_string("INVALID_TENSOR"), ErrorCode::kInvalidTensor);
  EXPECT_EQ(error_code_from_string("OBS_DTYPE_MISMATCH"), ErrorCode::kObsDtypeMismatch);
  EXPECT_EQ(to_string(ErrorCode::kObsDtypeMismatch), "OBS_DTYPE_MISMATCH");
  EXPECT_EQ(error_code_from_string("INTERNAL"), ErrorCode::kInternal);
  EXPECT_EQ(error_code_from_string("INVALID_FIELD"), ErrorCode::kInvalidField);
  EXPECT_EQ(error_code_from_string("SERVER_OVERLOADED"), ErrorCode::kServerOverloaded);
  EXPECT_EQ(error_code_from_string("CONNECTION_FAILED"), ErrorCode::kUnknownServerCode);  // an SDK code
  EXPECT_EQ(to_string(ErrorCode::kTimeout), "TIMEOUT");
  EXPECT_EQ(Status(ErrorCode::kInternal, "x").to_string(), "INTERNAL: x");
  EXPECT_EQ(to_string(MessageType::kEpisodesAndGetState), "EPISODES_AND_GET_STATE");
  EXPECT_EQ(expected_response(MessageType::kEpisodes), std::nullopt);
  EXPECT_EQ(expected_response(MessageType::kMapAgents), MessageType::kAgentModules);
}

}  // namespace
}  // namespace tether
