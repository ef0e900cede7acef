// Unit tests of the generator, sampling, log-probabilities and clipping.
#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "tether/distributions.h"

namespace tether {
namespace {

TEST(Rng, DeterministicAndUniform) {
  Rng a(42), b(42), c(43);
  EXPECT_EQ(a.next_u64(), b.next_u64());
  EXPECT_NE(a.next_u64(), c.next_u64());
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = a.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const double z = b.normal();
    sum += z;
    sum_sq += z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.02);
}

TEST(Distributions, TwoActionsSampleAsTheGeneralFormulaBitForBit) {
  // Two actions take a path with one exp instead of two: the same choices and
  // the same logp, to the bit, as exp of both logits would give.
  Space s = Space::discrete(2).value();
  Rng rng(11), reference(11), logit_source(5);
  int ones = 0;
  for (int i = 0; i < 20000; ++i) {
    float logits[2] = {static_cast<float>(logit_source.normal() * 3.0), static_cast<float>(logit_source.normal() * 3.0)};
    if (i % 97 == 0) logits[1] = logits[0];  // ties
    double action = 0, logp = 0;
    ASSERT_TRUE(sample(s, logits, 2, rng, &action, 1, &logp).ok());
    const double a = logits[0], b = logits[1];
    const double top = std::max(a, b);
    const double k0 = std::exp(a - top), k1 = std::exp(b - top);
    const double total = (0.0 + k0) + k1;
    const double threshold = reference.uniform() * total;
    const int choice = k0 <= threshold ? 1 : 0;
    const double expected_logp = (choice == 0 ? a : b) - top - std::log(total);
    ASSERT_EQ(action, choice) << i;
    ASSERT_EQ(logp, expected_logp) << i;  // exactly
    ones += choice;
  }
  EXPECT_GT(ones, 5000);
  EXPECT_LT(ones, 15000);
}

TEST(Distributions, DiscreteSamplingMatchesSoftmax) {
  Space s = Space::discrete(3, 5).value();
  const float logits[3] = {0.0f, 1.0f, 2.0f};
  Rng rng(7);
  int counts[3] = {0, 0, 0};
  const int n = 60000;
  for (int i = 0; i < n; ++i) {
    double action = 0, logp = 0;
    ASSERT_TRUE(sample(s, logits, 3, rng, &action, 1, &logp).ok());
    ASSERT_GE(action, 5);
    ASSERT_LE(action, 7);
    counts[static_cast<int>(action) - 5]++;
    EXPECT_NEAR(logp, log_prob(s, logits, 3, &action, 1).value(), 1e-12);
  }
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  EXPECT_NEAR(counts[2] / static_cast<double>(n), std::exp(2.0) / z, 0.01);
  double mode = 0;
  ASSERT_TRUE(deterministic(s, logits, 3, &mode, 1).ok());
  EXPECT_EQ(mode, 7);
}

TEST(Distributions, MultiDiscreteSumsDimensions) {
  Space s = Space::multi_discrete({2, 3}).value();
  const double inputs[5] = {0.5, -0.5, 1.0, 2.0, -2.0};
  const double action[2] = {1, 2};
  const double expected = log_prob(Space::discrete(2).value(), inputs, 2, &action[0], 1).value() +
                          log_prob(Space::discrete(3).value(), inputs + 2, 3, &action[1], 1).value();
  EXPECT_NEAR(log_prob(s, inputs, 5, action, 2).value(), expected, 1e-12);
  const double outside[2] = {2, 0};
  EXPECT_EQ(log_prob(s, inputs, 5, outside, 2).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(log_prob(s, inputs, 4, action, 2).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Distributions, BoxRecordsRawSampleAndClipsForEngine) {
  Space s = Space::box({2}, -1.0, 1.0).value();
  const float inputs[4] = {0.9f, -0.9f, 0.0f, 0.0f};  // std 1: often outside the box
  Rng rng(3);
  bool saw_outside = false;
  for (int i = 0; i < 1000; ++i) {
    double record[2], env[2], logp = 0;
    ASSERT_TRUE(sample_for_record(s, inputs, 4, rng, true, record, env, 2, &logp).ok());
    EXPECT_NEAR(logp, log_prob(s, inputs, 4, record, 2).value(), 1e-9);
    for (int j = 0; j < 2; ++j) {
      EXPECT_EQ(static_cast<double>(static_cast<float>(record[j])), record[j]);  // float32 values
      EXPECT_GE(env[j], -1.0);
      EXPECT_LE(env[j], 1.0);
      saw_outside = saw_outside || std::fabs(record[j]) > 1.0;
    }
    double clipped_record[2], env2[2], logp2 = 0;
    ASSERT_TRUE(sample_for_record(s, inputs, 4, rng, false, clipped_record, env2, 2, &logp2).ok());
    EXPECT_EQ(clipped_record[0], env2[0]);
    EXPECT_EQ(clipped_record[1], env2[1]);
    EXPECT_NEAR(logp2, log_prob(s, inputs, 4, clipped_record, 2).value(), 1e-9);
  }
  EXPECT_TRUE(saw_outside);
  double mode[2];
  ASSERT_TRUE(deterministic(s, inputs, 4, mode, 2).ok());
  EXPECT_NEAR(mode[0], 0.9, 1e-6);
}

// A frame's rows drawn at once equal the same rows drawn one by one through
// sample() and to_env_action() (the 1.2 rule for a Box: the clipped action and
// its density), draw for draw from the same seed.
TEST(Distributions, RowsDrawnAtOnceEqualRowByRowDraws) {
  const std::vector<Space> spaces = {Space::discrete(3, 2).value(), Space::discrete(70).value(),
                                     Space::multi_discrete({2, 5}).value(), Space::box({2}, -1.0, 1.0).value()};
  for (const Space& space : spaces) {
    for (bool raw : {true, false}) {
      const std::size_t rows = 9, n_in = space.dist_inputs_size(), k = space.flat_dim();
      std::vector<float> inputs(rows * n_in);
      Rng fill(11);
      for (float& x : inputs) x = static_cast<float>(fill.normal());
      std::vector<double> record(rows * k), env(rows * k), logp(rows);
      Rng at_once(5), one_by_one(5);
      ASSERT_TRUE(sample_rows_for_record(space, inputs.data(), rows, at_once, raw, record.data(), env.data(),
                                         logp.data()).ok());
      for (std::size_t r = 0; r < rows; ++r) {
        std::vector<double> want(k), want_env(k);
        double want_logp = 0;
        ASSERT_TRUE(sample(space, &inputs[r * n_in], n_in, one_by_one, want.data(), k, &want_logp).ok());
        ASSERT_TRUE(to_env_action(space, want.data(), want_env.data(), k).ok());
        if (space.kind() == SpaceKind::kBox && !raw) {
          want = want_env;
          want_logp = log_prob(space, &inputs[r * n_in], n_in, want.data(), k).value();
        }
        for (std::size_t j = 0; j < k; ++j) {
          EXPECT_EQ(record[r * k + j], want[j]) << r;
          EXPECT_EQ(env[r * k + j], want_env[j]) << r;
        }
        EXPECT_DOUBLE_EQ(logp[r], want_logp) << r;
      }
    }
  }
}

TEST(Distributions, RawSamplesByServerVersion) {
  EXPECT_TRUE(server_takes_raw_box_samples(""));
  EXPECT_TRUE(server_takes_raw_box_samples("1.3"));
  EXPECT_TRUE(server_takes_raw_box_samples("2.0"));
  EXPECT_FALSE(server_takes_raw_box_samples("1.2"));
  EXPECT_FALSE(server_takes_raw_box_samples("1.1"));
}

}  // namespace
}  // namespace tether
