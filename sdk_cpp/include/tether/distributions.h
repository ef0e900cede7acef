// Action sampling (docs/protocol.md §11): how action_dist_inputs define a
// distribution per action space, its log-probabilities, sampling with a
// caller-owned generator, and the Box clipping rule of §11.4.
//
// Values are flat row-major arrays of doubles (a Discrete action is one
// number, start included). The functions do not allocate: callers pass the
// output buffers, sized Space::flat_dim().
#pragma once

#include <cstddef>
#include <cstdint>

#include "tether/spaces.h"
#include "tether/status.h"

namespace tether {

/// A small fast generator (xoshiro256**, seeded through splitmix64) with
/// uniform and standard normal draws. Not thread-safe: one per thread.
class Rng {
 public:
  /// A generator whose sequence is fixed by `seed`.
  explicit Rng(std::uint64_t seed = 0x9E3779B97F4A7C15ull) noexcept { reseed(seed); }
  /// Restarts the sequence from `seed`.
  void reseed(std::uint64_t seed) noexcept;
  /// 64 uniformly random bits.
  std::uint64_t next_u64() noexcept;
  /// A uniform double in [0, 1) with 53 random bits.
  double uniform() noexcept;
  /// A standard normal draw (Box-Muller; the second value of a pair is kept for the next call).
  double normal() noexcept;

 private:
  std::uint64_t s_[4] = {0, 0, 0, 0};
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/// log-probability (log-density for a Box) of `action` under one step's
/// dist inputs (§11.1-11.3). INVALID_ARGUMENT for wrong sizes or a discrete
/// action outside the space.
Result<double> log_prob(const Space& space, const double* dist_inputs, std::size_t n_inputs, const double* action,
                        std::size_t action_size);
/// log_prob for float32 dist inputs (a model's output).
Result<double> log_prob(const Space& space, const float* dist_inputs, std::size_t n_inputs, const double* action,
                        std::size_t action_size);

/// Draws one action: writes the action a 1.3 record carries into `action`
/// (a Box action is the raw Gaussian sample, rounded to float32, which may lie
/// outside the box) and its log-probability into `*logp`.
Status sample(const Space& space, const float* dist_inputs, std::size_t n_inputs, Rng& rng, double* action,
              std::size_t action_size, double* logp);
/// sample() for double dist inputs.
Status sample(const Space& space, const double* dist_inputs, std::size_t n_inputs, Rng& rng, double* action,
              std::size_t action_size, double* logp);

/// Draws one action for a record (§11.4): `record_action` and `*logp` are
/// what the record carries, `env_action` what the engine executes (a Box
/// sample clipped into the box). With `raw_box_samples` false (a server
/// announcing a version below 1.3) the record carries the clipped Box action
/// and the density at the clipped value.
Status sample_for_record(const Space& space, const float* dist_inputs, std::size_t n_inputs, Rng& rng,
                         bool raw_box_samples, double* record_action, double* env_action, std::size_t action_size,
                         double* logp);

/// sample_for_record for `rows` consecutive rows of a batch's dist inputs
/// (rows x dist_inputs_size() floats, a model's output for a frame): the same
/// draws, in row order, as calling sample_for_record row by row, with the
/// sizes checked once. `record_actions` and `env_actions` take rows x
/// flat_dim() values, `logp` rows values.
Status sample_rows_for_record(const Space& space, const float* dist_inputs, std::size_t rows, Rng& rng,
                              bool raw_box_samples, double* record_actions, double* env_actions, double* logp);

/// The action the engine executes for a recorded one: a Box action clipped
/// into the box and rounded to float32; other spaces copied unchanged.
Status to_env_action(const Space& space, const double* action, double* env_action, std::size_t action_size);

/// The distribution's mode: argmax of each categorical (plus start), the
/// clipped mean of a Box (§11.4 greedy mode).
Status deterministic(const Space& space, const float* dist_inputs, std::size_t n_inputs, double* action,
                     std::size_t action_size);

/// Whether a server announcing `protocol_version` (empty: none, RLlib's v1)
/// takes raw Box samples in records (§11.4): 1.3 and later, or no version.
bool server_takes_raw_box_samples(const std::string& protocol_version);

}  // namespace tether
