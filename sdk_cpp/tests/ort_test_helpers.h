// What the ONNX Runtime tests share: the record files that describe a test
// policy model (sdk_cpp/tests/data, written by its make_*_model.py scripts)
// with what onnxruntime in Python computed for it, and, on POSIX, client
// options for models run by the ONNX Runtime backend.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_data.h"
#include "tether/onnxruntime_backend.h"

#ifndef _WIN32
#include "client_test_helpers.h"
#endif

namespace test_data {

/// The JSON object in the file `name` of kDir; a test failure, and an empty
/// object, when it cannot be read as one.
inline nlohmann::json read_record(const std::string& name) {
  const std::vector<std::uint8_t> text = read_bytes(kDir + name);
  nlohmann::json record = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (!record.is_object()) {
    ADD_FAILURE() << "cannot parse " << name;
    return nlohmann::json::object();
  }
  return record;
}

/// The numbers of a JSON array of rows (each an array of numbers), row after row.
inline std::vector<float> flat_rows(const nlohmann::json& rows) {
  std::vector<float> values;
  for (const nlohmann::json& row : rows) {
    for (const nlohmann::json& x : row) values.push_back(x.get<float>());
  }
  return values;
}

/// A policy model with flat observation rows and what onnxruntime computed for them.
struct PolicyRecord {
  nlohmann::json record;  ///< the whole record file (fields only some models have)
  std::vector<std::uint8_t> model;
  std::string input_name;
  std::string output_name;
  std::size_t obs_dim = 0;
  std::size_t out_dim = 0;
  std::size_t rows = 0;
  std::vector<float> obs;       ///< rows x obs_dim
  std::vector<float> expected;  ///< rows x out_dim
};

/// The policy record file `name` (its "model", names, dims, "observations"
/// and "outputs"), checked for sizes; test failures (not throws) if anything is off.
inline PolicyRecord read_policy_record(const std::string& name) {
  PolicyRecord p;
  p.record = read_record(name);
  if (p.record.empty()) return p;
  const nlohmann::json& record = p.record;
  p.model = read_bytes(kDir + record["model"].get<std::string>());
  p.input_name = record["input_name"].get<std::string>();
  p.output_name = record["output_name"].get<std::string>();
  p.obs_dim = record["obs_dim"].get<std::size_t>();
  p.out_dim = record["out_dim"].get<std::size_t>();
  p.obs = flat_rows(record["observations"]);
  p.expected = flat_rows(record["outputs"]);
  p.rows = record["observations"].size();
  EXPECT_FALSE(p.model.empty());
  EXPECT_EQ(p.obs.size(), p.rows * p.obs_dim);
  EXPECT_EQ(p.expected.size(), p.rows * p.out_dim);
  return p;
}

}  // namespace test_data

#ifndef _WIN32
namespace fake {

/// Options for a client of `server` whose models run in ONNX Runtime: seed
/// `seed`, every batch delivered (kWait), the SDK's default limits but a 5 s reconnect.
inline tether::ClientOptions ort_options_for(const FakeServer& server, std::uint64_t seed) {
  tether::ClientOptions options;
  options.port = server.port();
  options.seed = seed;
  options.reconnect_timeout_s = 5.0;
  options.when_queue_full = tether::QueueFullPolicy::kWait;
  options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
  return options;
}

}  // namespace fake
#endif  // _WIN32
