// The ONNX Runtime backend against the test policy (tests/data/make_policy_model.py):
// outputs match onnxruntime's in Python, batch 1 and 256, bad models and names refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "ort_test_helpers.h"
#include "test_data.h"
#include "tether/onnxruntime_backend.h"

namespace {

using Fixture = test_data::PolicyRecord;

// Loads the model and its expected outputs; fails the test (not throws) if anything is off.
Fixture load_fixture() { return test_data::read_policy_record("policy_4x64x64x2.json"); }

class OrtInference : public ::testing::Test {
 protected:
  void SetUp() override {
    f_ = load_fixture();
    tether::Status status = backend_.load(f_.model.data(), f_.model.size(), f_.input_name, f_.output_name);
    ASSERT_TRUE(status.ok()) << status.message();
  }

  // Runs `batch` rows cycling through the recorded observations and checks every row.
  void run_and_check(std::size_t batch) {
    std::vector<float> obs(batch * f_.obs_dim);
    for (std::size_t i = 0; i < batch; ++i) {
      std::copy_n(&f_.obs[(i % f_.rows) * f_.obs_dim], f_.obs_dim, &obs[i * f_.obs_dim]);
    }
    std::vector<float> out(batch * f_.out_dim, -1000.0f);
    tether::Status status = backend_.run(obs.data(), batch, f_.obs_dim, out.data(), f_.out_dim);
    ASSERT_TRUE(status.ok()) << status.message();
    for (std::size_t i = 0; i < batch; ++i) {
      for (std::size_t j = 0; j < f_.out_dim; ++j) {
        EXPECT_NEAR(out[i * f_.out_dim + j], f_.expected[(i % f_.rows) * f_.out_dim + j], 1e-5)
            << "batch " << batch << " row " << i << " output " << j;
      }
    }
  }

  Fixture f_;
  tether::OnnxRuntimeBackend backend_;
};

TEST_F(OrtInference, ReportsTheModelsWidths) {
  EXPECT_TRUE(backend_.loaded());
  EXPECT_EQ(backend_.obs_dim(), 4u);
  EXPECT_EQ(backend_.out_dim(), 2u);
}

TEST_F(OrtInference, MatchesPythonOnnxRuntimeOneObservationAtATime) {
  for (std::size_t i = 0; i < f_.rows; ++i) {
    float out[2] = {0.0f, 0.0f};
    ASSERT_TRUE(backend_.run(&f_.obs[i * f_.obs_dim], 1, f_.obs_dim, out, f_.out_dim).ok());
    EXPECT_NEAR(out[0], f_.expected[i * 2], 1e-5) << "row " << i;
    EXPECT_NEAR(out[1], f_.expected[i * 2 + 1], 1e-5) << "row " << i;
  }
}

TEST_F(OrtInference, MatchesPythonOnnxRuntimeBatch1AllRecordedAnd256) {
  run_and_check(1);
  run_and_check(f_.rows);
  run_and_check(256);
}

TEST_F(OrtInference, ManyBatchSizesInTurnStayCorrect) {
  // More sizes than the backend keeps bound: bindings are evicted and remade.
  for (int round = 0; round < 3; ++round) {
    for (std::size_t batch : {1u, 256u, 3u, 7u, 64u, 1u, 2u}) {
      run_and_check(batch);
    }
  }
}

TEST_F(OrtInference, TimesSingleObservationAndBatch256) {
  using Clock = std::chrono::steady_clock;
  auto median_us = [&](std::size_t batch, int iterations) {
    std::vector<float> obs(batch * f_.obs_dim, 0.25f);
    std::vector<float> out(batch * f_.out_dim);
    for (int i = 0; i < 20; ++i) {
      EXPECT_TRUE(backend_.run(obs.data(), batch, f_.obs_dim, out.data(), f_.out_dim).ok());
    }
    std::vector<double> times;
    for (int i = 0; i < iterations; ++i) {
      auto start = Clock::now();
      tether::Status status = backend_.run(obs.data(), batch, f_.obs_dim, out.data(), f_.out_dim);
      times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
      EXPECT_TRUE(status.ok());
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  };
  double single = median_us(1, 2000);
  double batch256 = median_us(256, 500);
  std::cout << "[ timing ] ONNX Runtime backend median: single observation " << single << " us, batch 256 "
            << batch256 << " us\n";
  RecordProperty("single_us", std::to_string(single));
  RecordProperty("batch256_us", std::to_string(batch256));
}

TEST_F(OrtInference, RefusesWrongSizes) {
  std::vector<float> obs(8, 0.0f);
  std::vector<float> out(4, 0.0f);
  tether::Status status = backend_.run(obs.data(), 2, 3, out.data(), 2);
  EXPECT_EQ(status.code(), tether::ErrorCode::kInvalidArgument);
  EXPECT_NE(status.message().find("observation width 3"), std::string::npos) << status.message();
  status = backend_.run(obs.data(), 2, 4, out.data(), 1);
  EXPECT_EQ(status.code(), tether::ErrorCode::kInvalidArgument);
  EXPECT_NE(status.message().find("output width 1"), std::string::npos) << status.message();
  status = backend_.run(obs.data(), 0, 4, out.data(), 2);
  EXPECT_EQ(status.code(), tether::ErrorCode::kInvalidArgument);
}

TEST_F(OrtInference, AFailedLoadKeepsThePreviousModel) {
  const std::string junk = "definitely not an ONNX model";
  tether::Status status =
      backend_.load(reinterpret_cast<const std::uint8_t*>(junk.data()), junk.size(), f_.input_name, f_.output_name);
  EXPECT_EQ(status.code(), tether::ErrorCode::kInferenceFailed);
  EXPECT_TRUE(backend_.loaded());
  run_and_check(3);
}

TEST(OrtInferenceErrors, RunBeforeLoadIsNotReady) {
  tether::OnnxRuntimeBackend backend;
  float obs[4] = {0, 0, 0, 0};
  float out[2];
  tether::Status status = backend.run(obs, 1, 4, out, 2);
  EXPECT_EQ(status.code(), tether::ErrorCode::kNotReady);
  EXPECT_FALSE(backend.loaded());
}

TEST(OrtInferenceErrors, RefusesABadModel) {
  tether::OnnxRuntimeBackend backend;
  const std::string junk = "definitely not an ONNX model";
  tether::Status status =
      backend.load(reinterpret_cast<const std::uint8_t*>(junk.data()), junk.size(), "obs", "action_dist_inputs");
  EXPECT_EQ(status.code(), tether::ErrorCode::kInferenceFailed);
  EXPECT_NE(status.message().find("could not load the model"), std::string::npos) << status.message();
  EXPECT_FALSE(backend.loaded());
  status = backend.load(nullptr, 0, "obs", "action_dist_inputs");
  EXPECT_EQ(status.code(), tether::ErrorCode::kInferenceFailed);
  EXPECT_NE(status.message().find("empty"), std::string::npos) << status.message();
}

TEST(OrtInferenceErrors, RefusesAWrongInputName) {
  Fixture f = load_fixture();
  tether::OnnxRuntimeBackend backend;
  tether::Status status = backend.load(f.model.data(), f.model.size(), "obs", f.output_name);
  EXPECT_EQ(status.code(), tether::ErrorCode::kInferenceFailed);
  EXPECT_NE(status.message().find("no input named 'obs'"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find(f.input_name), std::string::npos) << status.message();
  EXPECT_FALSE(backend.loaded());
}

TEST(OrtInferenceErrors, RefusesAWrongOutputName) {
  Fixture f = load_fixture();
  tether::OnnxRuntimeBackend backend;
  tether::Status status = backend.load(f.model.data(), f.model.size(), f.input_name, "logits");
  EXPECT_EQ(status.code(), tether::ErrorCode::kInferenceFailed);
  EXPECT_NE(status.message().find("no output named 'logits'"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find(f.output_name), std::string::npos) << status.message();
}

}  // namespace
