// A byte box (protocol 1.4, §8.1, §12.1) with the ONNX Runtime backend and a
// real policy model whose input is uint8 (batch, 2, 3, 1) (tests/data/
// make_byte_policy_model.py): its outputs match onnxruntime's in Python, and
// TetherClient acts with it, records the images as JSON integers and refuses
// an observation that is not one of bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ort_test_helpers.h"
#include "test_data.h"
#include "tether/onnxruntime_backend.h"

#ifndef _WIN32
#include "client_test_helpers.h"
#include "tether/client.h"
#include "tether/episode.h"
#include "tether/tensors.h"
#endif

namespace {

using nlohmann::json;

// The model (integer observations 0-255, flat rows) and the shape of its uint8 input.
struct ByteModel : test_data::PolicyRecord {
  std::vector<std::int64_t> input_shape;
};

ByteModel byte_model() {
  ByteModel m{test_data::read_policy_record("policy_bytes_2x3x1.json"), {}};
  if (!m.record.empty()) m.input_shape = m.record["input_shape"].get<std::vector<std::int64_t>>();
  return m;
}

TEST(OrtByteBox, ReadsTheInputsTypeAndShapeAndMatchesPython) {
  const ByteModel m = byte_model();
  tether::OnnxRuntimeBackend backend;
  EXPECT_EQ(backend.input_type(), tether::ModelInputType::kFloat32);  // nothing loaded
  EXPECT_TRUE(backend.input_shape().empty());
  tether::Status loaded = backend.load(m.model.data(), m.model.size(), m.input_name, m.output_name);
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
  EXPECT_EQ(backend.input_type(), tether::ModelInputType::kUint8);
  EXPECT_EQ(backend.input_shape(), m.input_shape);
  EXPECT_EQ(backend.obs_dim(), m.obs_dim);
  EXPECT_EQ(backend.out_dim(), m.out_dim);
  // Batch 1 row by row, then every row at once, then batch 1 again (its binding is kept).
  for (int round = 0; round < 2; ++round) {
    for (std::size_t r = 0; r < m.rows; ++r) {
      float out[2] = {-1000.0f, -1000.0f};
      ASSERT_TRUE(backend.run(&m.obs[r * m.obs_dim], 1, m.obs_dim, out, m.out_dim).ok());
      for (std::size_t j = 0; j < m.out_dim; ++j) EXPECT_NEAR(out[j], m.expected[r * m.out_dim + j], 1e-5) << r;
    }
    std::vector<float> out(m.rows * m.out_dim, -1000.0f);
    ASSERT_TRUE(backend.run(m.obs.data(), m.rows, m.obs_dim, out.data(), m.out_dim).ok());
    for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], m.expected[i], 1e-5) << i;
  }
  float out[2];
  EXPECT_EQ(backend.run(m.obs.data(), 1, m.obs_dim - 1, out, m.out_dim).code(), tether::ErrorCode::kInvalidArgument);

  // A float32 model says so.
  tether::OnnxRuntimeBackend floats;
  const std::vector<std::uint8_t> float_model = test_data::read_bytes(test_data::kDir + "policy_4x64x64x2.onnx");
  ASSERT_TRUE(floats.load(float_model.data(), float_model.size(), "onnx::Gemm_0", "action_dist_inputs").ok());
  EXPECT_EQ(floats.input_type(), tether::ModelInputType::kFloat32);
  EXPECT_EQ(floats.input_shape(), (std::vector<std::int64_t>{4}));
}

// Counts the runs the default run_bytes makes, and the rows it was given.
class FloatOnlyBackend final : public tether::InferenceBackend {
 public:
  tether::Status load(const std::uint8_t*, std::size_t, const std::string&, const std::string&) override {
    return tether::Status::Ok();
  }
  tether::Status run(const float* obs, std::size_t batch, std::size_t obs_dim, float* out,
                     std::size_t out_dim) override {
    seen.assign(obs, obs + batch * obs_dim);
    for (std::size_t i = 0; i < batch * out_dim; ++i) out[i] = static_cast<float>(i);
    return tether::Status::Ok();
  }
  bool loaded() const noexcept override { return true; }
  std::size_t obs_dim() const noexcept override { return 0; }
  std::size_t out_dim() const noexcept override { return 0; }
  std::vector<float> seen;
};

// [1.4] run_bytes: a uint8 input takes the bytes as they are, a float32 one
// their values widened, and a backend that has only run() gets them widened
// by the default; every output equals run()'s on the same values as floats.
TEST(OrtByteBox, RunBytesGivesWhatRunGivesOnTheSameValues) {
  const ByteModel m = byte_model();
  tether::OnnxRuntimeBackend backend;
  ASSERT_TRUE(backend.load(m.model.data(), m.model.size(), m.input_name, m.output_name).ok());
  const std::vector<std::uint8_t> bytes(m.obs.begin(), m.obs.end());  // (integers 0-255)
  for (std::size_t batch : {std::size_t{1}, m.rows}) {
    std::vector<float> out(batch * m.out_dim, -1000.0f);
    ASSERT_TRUE(backend.run_bytes(bytes.data(), batch, m.obs_dim, out.data(), m.out_dim).ok());
    for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], m.expected[i], 1e-5) << batch << " " << i;
  }
  float out[2];
  EXPECT_EQ(backend.run_bytes(bytes.data(), 1, m.obs_dim - 1, out, m.out_dim).code(),
            tether::ErrorCode::kInvalidArgument);
  EXPECT_EQ(backend.run_bytes_recurrent(bytes.data(), 1, m.obs_dim, out, out, 4, out, m.out_dim).code(),
            tether::ErrorCode::kInvalidArgument);  // (no memory to feed)

  tether::OnnxRuntimeBackend floats;
  const std::vector<std::uint8_t> float_model = test_data::read_bytes(test_data::kDir + "policy_4x64x64x2.onnx");
  ASSERT_TRUE(floats.load(float_model.data(), float_model.size(), "onnx::Gemm_0", "action_dist_inputs").ok());
  const std::uint8_t row[8] = {0, 1, 2, 255, 7, 0, 128, 3};
  const std::vector<float> widened(row, row + 8);
  float from_bytes[4], from_floats[4];
  ASSERT_TRUE(floats.run_bytes(row, 2, 4, from_bytes, 2).ok());
  ASSERT_TRUE(floats.run(widened.data(), 2, 4, from_floats, 2).ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(from_bytes[i], from_floats[i]) << i;

  FloatOnlyBackend only_floats;
  ASSERT_TRUE(only_floats.run_bytes(row, 2, 4, from_bytes, 2).ok());
  EXPECT_EQ(only_floats.seen, widened);
  EXPECT_EQ(from_bytes[3], 3.0f);
}

#ifndef _WIN32

fake::ServerScript byte_box_script(const ByteModel& m) {
  fake::ServerScript script;
  script.steps_per_sample = 8;
  script.config_overrides = {
      {"observation_space", {{"type", "Box"}, {"shape", m.input_shape}, {"dtype", "uint8"}, {"low", 0}, {"high", 255}}},
      {"onnx_input_names", {m.input_name}},
      {"onnx_output_names", {m.output_name}}};
  const std::vector<std::uint8_t> bytes = m.model;
  script.model_file = [bytes](std::uint8_t) { return fake::onnx_file_of(bytes); };
  return script;
}

TEST(OrtByteBox, TheClientActsOnImagesAndSendsThemAsByteTensors) {
  const ByteModel m = byte_model();
  ASSERT_FALSE(m.model.empty());
  fake::FakeServer server(byte_box_script(m));
  auto client = fake::connect(fake::ort_options_for(server, 5));
  ASSERT_NE(client, nullptr);
  double action[1];
  int acted = 0;
  for (int e = 0; e < 4; ++e) {
    tether::Result<std::string> episode = client->start_episode();
    ASSERT_TRUE(episode.ok()) << episode.status().to_string();
    for (std::size_t t = 0; t < 6; ++t, ++acted) {
      const float* image = &m.obs[((e + t) % m.rows) * m.obs_dim];
      tether::Status status = client->get_action(episode.value(), image, m.obs_dim, action, 1);
      ASSERT_TRUE(status.ok()) << status.to_string();
      client->log_returns(episode.value(), 1.0);
    }
    ASSERT_TRUE(client->end_episode(episode.value(), &m.obs[0], m.obs_dim).ok());
  }
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(client->env_steps_sent(), acted);
  // The client speaks 1.4, as the server: the images go as uint8 tensors in each body's attachment (§10.9).
  EXPECT_EQ(server.messages().front()["protocol_version"], "1.9");

  const tether::Space obs_space = tether::Space::from_json(server.config()["observation_space"]).value();
  const tether::Space act_space = tether::Space::discrete(2).value();
  std::size_t checked = 0;
  const std::vector<json> batches = server.batches();
  const std::vector<std::string> attachments = server.attachments();
  ASSERT_EQ(batches.size(), attachments.size());
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const json& batch = batches[b];
    const std::optional<std::string_view> attachment = std::string_view(attachments[b]);
    tether::Result<std::size_t> steps = tether::validate_episodes(batch, obs_space, act_space, true, attachment);
    ASSERT_TRUE(steps.ok()) << steps.status().to_string();
    for (const json& record : batch["episodes"]) {
      tether::Result<tether::Tensor> obs = tether::decode_tensor(record["obs"], attachment);
      ASSERT_TRUE(obs.ok()) << obs.status().to_string();
      ASSERT_EQ(obs.value().dtype(), tether::TensorDtype::kUint8);
      ASSERT_TRUE(obs.value().in_attachment());
      std::vector<double> values;
      obs.value().values(values);
      for (std::size_t t = 0; t < record["actions"].size(); ++t) {
        // The image's bytes; the dist inputs are the model's for it.
        std::vector<float> image(values.begin() + static_cast<std::ptrdiff_t>(t * m.obs_dim),
                                 values.begin() + static_cast<std::ptrdiff_t>((t + 1) * m.obs_dim));
        std::size_t r = 0;
        while (r < m.rows && !std::equal(image.begin(), image.end(), &m.obs[r * m.obs_dim])) ++r;
        ASSERT_LT(r, m.rows) << "an image the engine did not show";
        for (std::size_t j = 0; j < m.out_dim; ++j) {
          EXPECT_NEAR(record["action_dist_inputs"][t][j].get<double>(), m.expected[r * m.out_dim + j], 1e-5);
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, static_cast<std::size_t>(acted));
}

// [1.4] The byte overloads play, record and send exactly what the float ones
// do on the same values: two clients of one seed, one given floats and one
// bytes (get_action, log_action, end_episode), send the same steps and write
// the same demonstration file, and compute_action on bytes is compute_action
// on their floats. Wrong sizes and null pointers are refused alike.
TEST(OrtByteBox, TheByteOverloadsActRecordAndSendAsTheFloatOnes) {
  const ByteModel m = byte_model();
  ASSERT_FALSE(m.model.empty());
  const std::vector<std::uint8_t> bytes(m.obs.begin(), m.obs.end());
  std::vector<json> sent[2];
  std::vector<std::string> images[2];  // (the bodies' attachments: the images as uint8 tensors)
  std::string demos[2];
  for (int as_bytes = 0; as_bytes < 2; ++as_bytes) {
    fake::FakeServer server(byte_box_script(m));
    tether::ClientOptions options = fake::ort_options_for(server, 5);
    const std::string demo_path = ::testing::TempDir() + "byte_overloads_" + std::to_string(as_bytes) + ".jsonl";
    options.demo_path = demo_path;
    auto client = fake::connect(options);
    ASSERT_NE(client, nullptr);
    double action[1];
    const std::size_t wrong = m.obs_dim + 1;
    EXPECT_EQ(client->get_action("none", bytes.data(), m.obs_dim, action, 1).code(), tether::ErrorCode::kInvalidArgument);
    for (int e = 0; e < 3; ++e) {
      const std::string episode = client->start_episode("ep" + std::to_string(e)).value();
      EXPECT_EQ(client->get_action(episode, bytes.data(), wrong, action, 1).code(), tether::ErrorCode::kInvalidArgument);
      EXPECT_EQ(client->get_action(episode, static_cast<const std::uint8_t*>(nullptr), m.obs_dim, action, 1).code(),
                tether::ErrorCode::kInvalidArgument);
      EXPECT_EQ(client->end_episode(episode, bytes.data(), wrong).status().code(), tether::ErrorCode::kInvalidArgument);
      EXPECT_EQ(client->compute_action(static_cast<const std::uint8_t*>(nullptr), m.obs_dim, action, 1).code(),
                tether::ErrorCode::kInvalidArgument);
      for (std::size_t t = 0; t < 5; ++t) {
        const std::size_t at = ((e + t) % m.rows) * m.obs_dim;
        tether::Status status;
        if (t % 3 == 2) {
          const double taken = static_cast<double>(t % 2);
          status = as_bytes ? client->log_action(episode, &bytes[at], m.obs_dim, &taken, 1)
                            : client->log_action(episode, &m.obs[at], m.obs_dim, &taken, 1);
        } else {
          status = as_bytes ? client->get_action(episode, &bytes[at], m.obs_dim, action, 1)
                            : client->get_action(episode, &m.obs[at], m.obs_dim, action, 1);
        }
        ASSERT_TRUE(status.ok()) << status.to_string();
        client->log_returns(episode, 0.5);
      }
      tether::Result<double> ended = as_bytes ? client->end_episode(episode, &bytes[m.obs_dim], m.obs_dim, e == 1)
                                              : client->end_episode(episode, &m.obs[m.obs_dim], m.obs_dim, e == 1);
      ASSERT_TRUE(ended.ok()) << ended.status().to_string();
    }
    double greedy_bytes[1] = {-1}, greedy_floats[1] = {-2};
    ASSERT_TRUE(client->compute_action(&bytes[m.obs_dim], m.obs_dim, greedy_bytes, 1).ok());
    ASSERT_TRUE(client->compute_action(&m.obs[m.obs_dim], m.obs_dim, greedy_floats, 1).ok());
    EXPECT_EQ(greedy_bytes[0], greedy_floats[0]);
    ASSERT_TRUE(client->flush().ok());
    EXPECT_EQ(client->env_steps_sent(), 15);
    for (json batch : server.batches()) {
      for (json& record : batch["episodes"]) record.erase("episode_id");  // (ids are drawn apart)
      sent[as_bytes].push_back(batch["episodes"]);
    }
    images[as_bytes] = server.attachments();
    client->close();
    std::ifstream in(demo_path, std::ios::binary);
    demos[as_bytes].assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_FALSE(sent[0].empty());
  EXPECT_EQ(sent[0], sent[1]);
  ASSERT_FALSE(images[0].empty());
  EXPECT_FALSE(images[0].front().empty());
  EXPECT_EQ(images[0], images[1]);
  EXPECT_NE(demos[0].find("\"ep2\""), std::string::npos) << demos[0].substr(0, 300);
  EXPECT_EQ(demos[0], demos[1]);
}

TEST(OrtByteBox, AValueThatIsNoByteIsRefusedAndNothingRecorded) {
  const ByteModel m = byte_model();
  fake::FakeServer server(byte_box_script(m));
  auto client = fake::connect(fake::ort_options_for(server, 5));
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode().value();
  double action[1];
  ASSERT_TRUE(client->get_action(episode, m.obs.data(), m.obs_dim, action, 1).ok());
  for (float bad : {0.5f, -1.0f, 256.0f, 254.9f}) {
    std::vector<float> image(m.obs.begin(), m.obs.begin() + static_cast<std::ptrdiff_t>(m.obs_dim));
    image[4] = bad;
    tether::Status refused = client->get_action(episode, image.data(), m.obs_dim, action, 1);
    EXPECT_EQ(refused.code(), tether::ErrorCode::kObsDtypeMismatch) << bad;
    EXPECT_NE(refused.message().find("observation[4]"), std::string::npos) << refused.message();
    // The final observation too, before the episode ends: it goes on.
    EXPECT_EQ(client->end_episode(episode, image.data(), m.obs_dim).status().code(),
              tether::ErrorCode::kObsDtypeMismatch);
  }
  std::vector<float> whole(m.obs.begin(), m.obs.begin() + static_cast<std::ptrdiff_t>(m.obs_dim));
  whole[4] = 17.0f;  // 17.0 is 17
  ASSERT_TRUE(client->get_action(episode, whole.data(), m.obs_dim, action, 1).ok());
  ASSERT_TRUE(client->end_episode(episode, whole.data(), m.obs_dim).ok());
  ASSERT_TRUE(client->flush().ok());
  EXPECT_TRUE(client->take_error().ok());
  EXPECT_EQ(client->env_steps_sent(), 2);
  const std::vector<json> batches = server.batches();
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0]["episodes"].size(), 1u);
  EXPECT_EQ(batches[0]["episodes"][0]["obs"].size(), 3u);
}

#endif  // _WIN32

}  // namespace
