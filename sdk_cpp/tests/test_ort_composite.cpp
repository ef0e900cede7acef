// The ONNX Runtime backend runs a model of a Dict observation with an action
// mask (protocol 1.4, §12.1, §11.6), the server's own export
// (tests/data/make_dict_policy_model.py): one input per leaf, fed by name from
// flat rows ("cam" as uint8 in its shape, the others float32), with outputs
// equal to onnxruntime's in Python and masked logits of exactly -1e9.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ort_test_helpers.h"
#include "test_data.h"
#include "tether/action_mask.h"
#include "tether/onnxruntime_backend.h"
#include "tether/spaces.h"

namespace {

using nlohmann::json;

struct DictModel {
  std::vector<std::uint8_t> bytes;
  tether::Space space;
  std::vector<float> rows;      // flat rows, leaf order
  std::vector<float> expected;  // rows x 3
  std::size_t count = 0;
};

DictModel dict_model() {
  DictModel m;
  const json record = test_data::read_record("policy_dict_mask.json");
  if (record.empty()) return m;
  m.bytes = test_data::read_bytes(test_data::kDir + record["model"].get<std::string>());
  m.space = tether::Space::from_json(record["observation_space"]).value();
  m.rows = test_data::flat_rows(record["rows"]);
  m.expected = test_data::flat_rows(record["expected"]);
  m.count = record["rows"].size();
  EXPECT_FALSE(m.bytes.empty());
  return m;
}

std::vector<tether::ModelLeafInput> inputs_of(const tether::Space& space) {
  std::vector<tether::ModelLeafInput> inputs;
  for (const tether::SpaceLeaf& leaf : space.leaves()) inputs.push_back({leaf.path, leaf.offset, leaf.size});
  return inputs;
}

TEST(OrtComposite, FeedsEachLeafByNameAndMatchesPython) {
  const DictModel m = dict_model();
  ASSERT_EQ(m.space.flat_dim(), 9u);
  std::vector<tether::ModelLeafInput> inputs = inputs_of(m.space);
  // By name: the order the inputs are given in does not matter.
  std::reverse(inputs.begin(), inputs.end());
  tether::OnnxRuntimeBackend backend;
  tether::Status loaded = backend.load_leaves(m.bytes.data(), m.bytes.size(), inputs, "action_dist_inputs");
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
  EXPECT_EQ(backend.input_count(), 3u);
  EXPECT_EQ(backend.obs_dim(), 9u);
  EXPECT_EQ(backend.out_dim(), 3u);
  const tether::ActionMask mask =
      tether::ActionMask::resolve(m.space, tether::Space::discrete(3).value(), "action_mask").value();
  std::vector<float> out(3 * m.count);
  for (int pass = 0; pass < 2; ++pass) {  // (the second pass reuses the bound buffers)
    for (std::size_t r = 0; r < m.count; ++r) {
      ASSERT_TRUE(backend.run(&m.rows[r * 9], 1, 9, &out[r * 3], 3).ok());
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      EXPECT_NEAR(out[i], m.expected[i], 1e-5 * std::max(1.0f, std::abs(m.expected[i]))) << i;
      const float allowed = m.rows[(i / 3) * 9 + mask.offset + i % 3];
      if (allowed == 0.0f) EXPECT_EQ(out[i], tether::kMaskedLogit) << i;
    }
  }
  // A batch of all rows at once gives the same.
  std::vector<float> batch(out.size());
  ASSERT_TRUE(backend.run(m.rows.data(), m.count, 9, batch.data(), 3).ok());
  for (std::size_t i = 0; i < batch.size(); ++i) EXPECT_NEAR(batch[i], out[i], 1e-6f) << i;
  EXPECT_FALSE(backend.run(m.rows.data(), 1, 8, out.data(), 3).ok());
}

TEST(OrtComposite, ALeafWithoutItsInputOrOfAnotherSizeIsRefused) {
  const DictModel m = dict_model();
  std::vector<tether::ModelLeafInput> inputs = inputs_of(m.space);
  inputs[1].name = "boards";
  tether::OnnxRuntimeBackend backend;
  tether::Status loaded = backend.load_leaves(m.bytes.data(), m.bytes.size(), inputs, "action_dist_inputs");
  EXPECT_EQ(loaded.code(), tether::ErrorCode::kInferenceFailed);
  EXPECT_NE(loaded.message().find("boards"), std::string::npos) << loaded.message();
  inputs = inputs_of(m.space);
  inputs[2].size = 3;  // cam is uint8 (batch, 2, 1): 2 values
  EXPECT_EQ(backend.load_leaves(m.bytes.data(), m.bytes.size(), inputs, "action_dist_inputs").code(),
            tether::ErrorCode::kInferenceFailed);
  EXPECT_FALSE(backend.loaded());
  // A model of one input per leaf is not one a single float input can run.
  EXPECT_FALSE(backend.load(m.bytes.data(), m.bytes.size(), "obs", "action_dist_inputs").ok());
}

}  // namespace
