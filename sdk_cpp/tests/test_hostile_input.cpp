// What a hostile or broken server can send never crashes, aborts (the SDK
// also builds with -fno-exceptions, where nlohmann/json errors abort) or takes
// unbounded memory or time: each gets a clear status naming what was wrong.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tether/messages.h"
#include "tether/onnx_codec.h"
#include "tether/session.h"
#include "tether/spaces.h"

namespace {

using nlohmann::json;

std::string nested(std::size_t depth) {
  return "{\"type\": \"PONG\", \"x\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
}

}  // namespace

TEST(HostileInput, DeepNestingIsRefusedBeforeParsing) {
  // Deep enough to overflow the stack of a recursive walk (describe, dump, destruction).
  tether::Result<tether::Message> deep = tether::decode_message(nested(1000000));
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), tether::ErrorCode::kInvalidJson);
  EXPECT_NE(deep.status().message().find("deep"), std::string::npos) << deep.status().message();
  EXPECT_TRUE(tether::decode_message(nested(tether::kMaxJsonDepth - 1)).ok());
  // Brackets inside strings are not nesting.
  const std::string quoted = "{\"type\": \"PONG\", \"s\": \"" + std::string(100000, '[') + "\\\"[\"}";
  EXPECT_TRUE(tether::decode_message(quoted).ok());
}

TEST(HostileInput, InvalidUtf8IsLocatedInOnePass) {
  // 8 MiB of ASCII then one bad byte: a quadratic search would not finish.
  std::string body = "{\"type\": \"PONG\", \"s\": \"" + std::string(8u << 20, 'a');
  const std::size_t bad_at = body.size();
  body += "\xff\"}";
  tether::Result<tether::Message> message = tether::decode_message(body);
  ASSERT_FALSE(message.ok());
  EXPECT_EQ(message.status().code(), tether::ErrorCode::kInvalidUtf8);
  EXPECT_NE(message.status().message().find("at byte " + std::to_string(bad_at)), std::string::npos)
      << message.status().message();
  EXPECT_EQ(tether::first_invalid_utf8("ab\xc3"), 2u);  // a truncated sequence
  EXPECT_EQ(tether::first_invalid_utf8("\xc3\xa9t\xed\xa0\x80"), 3u);  // a surrogate
  EXPECT_EQ(tether::first_invalid_utf8("\xc3\xa9t"), std::string_view::npos);
}

TEST(HostileInput, HugeSpacesAreRefusedBeforeAllocating) {
  struct Case {
    const char* name;
    json space;
  };
  const std::vector<Case> cases = {
      {"overflowing Box shape", {{"type", "Box"}, {"shape", {4294967296LL, 4294967296LL, 16}}, {"low", 0}, {"high", 1}}},
      {"huge Box", {{"type", "Box"}, {"shape", {100000, 100000}}, {"low", "-inf"}, {"high", "inf"}}},
      {"huge Discrete", {{"type", "Discrete"}, {"n", 1099511627776LL}}},
      {"unsigned Discrete", {{"type", "Discrete"}, {"n", 18446744073709551615ULL}}},
      {"MultiDiscrete sum overflow", {{"type", "MultiDiscrete"}, {"nvec", {9223372036854775807LL, 9223372036854775807LL}}}},
  };
  for (const Case& c : cases) {
    tether::Result<tether::Space> space = tether::Space::from_json(c.space);
    ASSERT_FALSE(space.ok()) << c.name;
    EXPECT_EQ(space.status().code(), tether::ErrorCode::kInvalidField) << c.name;
    EXPECT_NE(space.status().message().find("exceeds"), std::string::npos) << c.name << ": " << space.status().message();
  }
  EXPECT_FALSE(tether::Space::discrete(tether::kMaxSpaceElements + 1).ok());
  EXPECT_FALSE(tether::Space::box({1 << 20, 1 << 20}, 0.0, 1.0).ok());
  EXPECT_TRUE(tether::Space::from_json({{"type", "Box"}, {"shape", {84, 84, 4}}, {"low", 0}, {"high", 255}}).ok());
  EXPECT_TRUE(tether::Space::discrete(tether::kMaxSpaceElements).ok());
}

TEST(HostileInput, AModelLargerThanTheLimitIsRefusedWhileDecoding) {
  // base64(gzip.compress(b"abc" * 4, mtime=0)): 12 bytes once decoded.
  const std::string twelve_bytes = "H4sIAAAAAAACA0tMSk6EIQA0Km5aDAAAAA==";
  EXPECT_TRUE(tether::decode_onnx_file(twelve_bytes, 12).ok());
  tether::Result<std::vector<std::uint8_t>> refused = tether::decode_onnx_file(twelve_bytes, 11);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), tether::ErrorCode::kInvalidField);
  EXPECT_NE(refused.status().message().find("limit of 11 bytes"), std::string::npos) << refused.status().message();
}

TEST(HostileInput, MutatedServerFramesNeverCrashTheSession) {
  // Valid server messages, then seeded mutations of their bytes, through the client's session decoder.
  const std::vector<std::string> bodies = {
      R"({"type": "PONG", "protocol_version": "1.3", "server_name": "t"})",
      R"({"type": "SET_CONFIG", "env_steps_per_sample": 20, "force_on_policy": true,
          "observation_space": {"type": "Box", "shape": [4], "low": "-inf", "high": "inf"},
          "action_space": {"type": "Discrete", "n": 2}, "onnx_input_names": ["obs"],
          "onnx_output_names": ["action_dist_inputs"], "heartbeat_interval_s": 5})",
      R"({"type": "SET_STATE", "weights_seq_no": 3, "onnx_file": "H4sIAAAAAAACA0tMSk6EIQA0Km5aDAAAAA=="})",
      R"({"type": "ERROR", "code": "INVALID_FIELD", "message": "episodes[0].obs: bad"})",
  };
  const std::vector<const char*> requests = {"PING", "GET_CONFIG", "GET_STATE", "GET_STATE"};
  std::mt19937 rng(1234);
  int decoded = 0, refused = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::size_t which = static_cast<std::size_t>(i) % bodies.size();
    std::string body = bodies[which];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !body.empty(); ++e) {
      const std::size_t at = rng() % body.size();
      switch (rng() % 4) {
        case 0: body[at] = static_cast<char>(rng() % 256); break;
        case 1: body.erase(at, 1 + rng() % 8); break;
        case 2: body.insert(at, std::string(1 + rng() % 8, "[{\"9-e.,:}]"[rng() % 11])); break;
        default: body.insert(at, body.substr(rng() % body.size(), 1 + rng() % 16)); break;
      }
    }
    tether::ClientConnection connection;
    std::string out;
    json request = {{"type", requests[which]}};
    if (which == 0) request["protocol_version"] = "1.3";
    ASSERT_TRUE(connection.send(request, out).ok());
    std::string frame;
    ASSERT_TRUE(tether::append_frame(body, frame).ok());
    std::vector<tether::Response> responses;
    tether::Status status = connection.receive_data(frame, responses);
    if (!status.ok()) EXPECT_FALSE(status.message().empty());
    (status.ok() && !responses.empty() ? decoded : refused) += 1;
    for (const tether::Response& r : responses) {  // what a client reads next from each answer
      const json& m = r.message.body;
      for (const char* field : {"observation_space", "action_space"}) {
        if (m.is_object() && m.contains(field)) (void)tether::Space::from_json(m[field]);
      }
      if (m.is_object() && m.contains("onnx_file") && m["onnx_file"].is_string()) {
        (void)tether::decode_onnx_file(m["onnx_file"].get<std::string>());
      }
    }
  }
  EXPECT_GT(decoded, 0);
  EXPECT_GT(refused, 0);
}
