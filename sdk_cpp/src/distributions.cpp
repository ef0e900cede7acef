// Categorical and diagonal-Gaussian distributions over the action spaces.
#include "tether/distributions.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "tether/messages.h"

namespace tether {
namespace {

constexpr double kLogSqrt2Pi = 0.91893853320467274178;  // 0.5 * ln(2 pi)

std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

Status check_sizes(const Space& space, std::size_t n_inputs, std::size_t action_size) {
  if (n_inputs != space.dist_inputs_size()) {
    return Status(ErrorCode::kInvalidArgument, "dist_inputs has " + std::to_string(n_inputs) +
                                                   " numbers, the action space needs " +
                                                   std::to_string(space.dist_inputs_size()));
  }
  if (action_size != space.flat_dim()) {
    return Status(ErrorCode::kInvalidArgument, "the action has " + std::to_string(action_size) +
                                                   " elements, the action space needs " +
                                                   std::to_string(space.flat_dim()));
  }
  return Status::Ok();
}

// What a Dict or Tuple space gets where an action space is needed.
Status not_an_action_space() {
  return Status(ErrorCode::kInvalidArgument, "a Dict or Tuple is never an action space (§8.6)");
}

// A Box action's value `j` clipped into the box, as the float32 the engine gets.
double clip_to_box(const Space& space, std::size_t j, double value) {
  return static_cast<double>(static_cast<float>(std::min(std::max(value, space.low()[j]), space.high()[j])));
}

// What every function of an action's distribution checks first: the sizes,
// and that the space can be an action space at all.
Status check_action_space(const Space& space, std::size_t n_inputs, std::size_t action_size) {
  Status status = check_sizes(space, n_inputs, action_size);
  if (!status.ok()) return status;
  if (space.is_composite()) return not_an_action_space();
  return Status::Ok();
}

template <class T>
double categorical_logp(const T* logits, std::size_t n, std::size_t index) {
  double top = static_cast<double>(logits[0]);
  for (std::size_t i = 1; i < n; ++i) top = std::max(top, static_cast<double>(logits[i]));
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) total += std::exp(static_cast<double>(logits[i]) - top);
  return static_cast<double>(logits[index]) - (top + std::log(total));
}

// Inverse-CDF draw from softmax(logits). The exponentials are kept (on the
// stack for up to kKeptExps categories) so each is computed once; the draw is
// the same either way.
constexpr std::size_t kKeptExps = 64;

template <class T>
std::size_t categorical_sample(const T* logits, std::size_t n, Rng& rng, double* logp) {
  double top = static_cast<double>(logits[0]);
  for (std::size_t i = 1; i < n; ++i) top = std::max(top, static_cast<double>(logits[i]));
  if (n > kKeptExps) {
    double total = 0.0;
    for (std::size_t i = 0; i < n; ++i) total += std::exp(static_cast<double>(logits[i]) - top);
    const double threshold = rng.uniform() * total;
    double acc = 0.0;
    // A threshold that rounding puts past the last sum takes the last value of
    // nonzero probability, never a masked one (§11.4).
    std::size_t choice = n;
    std::size_t last_possible = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double e = std::exp(static_cast<double>(logits[i]) - top);
      acc += e;
      if (e > 0.0) last_possible = i;
      if (threshold < acc && e > 0.0) {
        choice = i;
        break;
      }
    }
    if (choice == n) choice = last_possible;
    *logp = static_cast<double>(logits[choice]) - top - std::log(total);
    return choice;
  }
  if (n == 2) {
    // The most common case (two actions), with one exp instead of two: the
    // larger logit's term is exp(0), exactly 1. The same numbers as below, bit for bit.
    const double first = static_cast<double>(logits[0]);
    const double other = static_cast<double>(logits[1]) > first ? first : static_cast<double>(logits[1]);
    const double e = std::exp(other - top);
    const double kept0 = static_cast<double>(logits[1]) > first ? e : 1.0;
    const double total = kept0 + (static_cast<double>(logits[1]) > first ? 1.0 : e);
    const double threshold = rng.uniform() * total;
    const std::size_t choice = static_cast<std::size_t>(kept0 <= threshold);
    *logp = static_cast<double>(logits[choice]) - top - std::log(total);
    return choice;
  }
  double kept[kKeptExps];
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    kept[i] = std::exp(static_cast<double>(logits[i]) - top);
    total += kept[i];
  }
  const double threshold = rng.uniform() * total;
  // The first category whose cumulative sum passes the threshold, counted
  // without a branch per category (which would mispredict half the time).
  double acc = 0.0;
  std::size_t choice = 0;
  for (std::size_t i = 0; i + 1 < n; ++i) {
    acc += kept[i];
    choice += static_cast<std::size_t>(acc <= threshold);
  }
  // Only a threshold rounded past the last sum lands on a value of probability
  // 0 (the last ones masked, §11.4): it takes the last value of nonzero probability.
  while (choice > 0 && kept[choice] == 0.0) --choice;
  *logp = static_cast<double>(logits[choice]) - top - std::log(total);
  return choice;
}

template <class T>
std::size_t categorical_mode(const T* logits, std::size_t n) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

template <class T>
double gaussian_logp(const T* inputs, std::size_t k, const double* action) {
  double total = 0.0;
  for (std::size_t j = 0; j < k; ++j) {
    const double mean = static_cast<double>(inputs[j]);
    const double log_std = static_cast<double>(inputs[k + j]);
    const double z = (action[j] - mean) / std::exp(log_std);
    total += -0.5 * z * z - log_std - kLogSqrt2Pi;
  }
  return total;
}

// A discrete action value as an index, or false if it is not a valid one.
bool discrete_index(double value, std::int64_t offset, std::int64_t n, std::size_t* index) {
  if (!std::isfinite(value)) return false;
  const double i = std::trunc(value) - static_cast<double>(offset);  // int() as in Python
  if (i < 0 || i >= static_cast<double>(n)) return false;
  *index = static_cast<std::size_t>(i);
  return true;
}

// A Discrete action drawn from its logits (its log-probability in `logp`).
template <class T>
double discrete_sample(const Space& space, const T* inputs, Rng& rng, double* logp) {
  const std::size_t index = categorical_sample(inputs, static_cast<std::size_t>(space.n()), rng, logp);
  return static_cast<double>(static_cast<std::int64_t>(index) + space.start());
}

// A MultiDiscrete action drawn, each value from its own logits; returns its log-probability.
template <class T>
double multi_discrete_sample(const Space& space, const T* inputs, Rng& rng, double* action) {
  double total = 0.0;
  std::size_t offset = 0;
  for (std::size_t d = 0; d < space.nvec().size(); ++d) {
    const auto n = static_cast<std::size_t>(space.nvec()[d]);
    double lp = 0.0;
    action[d] = static_cast<double>(categorical_sample(inputs + offset, n, rng, &lp));
    total += lp;
    offset += n;
  }
  return total;
}

// A Box action of `k` values drawn from its diagonal Gaussian.
template <class T>
void gaussian_sample(const T* inputs, std::size_t k, Rng& rng, double* action) {
  for (std::size_t j = 0; j < k; ++j) {
    const double mean = static_cast<double>(inputs[j]);
    const double std_dev = std::exp(static_cast<double>(inputs[k + j]));
    // The density is taken at the float32 value that is recorded and sent.
    action[j] = static_cast<double>(static_cast<float>(mean + std_dev * rng.normal()));
  }
}

template <class T>
Result<double> log_prob_impl(const Space& space, const T* inputs, std::size_t n_inputs, const double* action,
                             std::size_t action_size) {
  Status status = check_action_space(space, n_inputs, action_size);
  if (!status.ok()) return status;
  switch (space.kind()) {
    case SpaceKind::kDiscrete: {
      std::size_t index = 0;
      if (!discrete_index(action[0], space.start(), space.n(), &index)) {
        return Result<double>(ErrorCode::kInvalidArgument, "action " + std::to_string(action[0]) +
                                                               " is outside the Discrete space");
      }
      return categorical_logp(inputs, static_cast<std::size_t>(space.n()), index);
    }
    case SpaceKind::kMultiDiscrete: {
      double total = 0.0;
      std::size_t offset = 0;
      for (std::size_t d = 0; d < space.nvec().size(); ++d) {
        const std::int64_t n = space.nvec()[d];
        std::size_t index = 0;
        if (!discrete_index(action[d], 0, n, &index)) {
          return Result<double>(ErrorCode::kInvalidArgument,
                                "action[" + std::to_string(d) + "] is outside the MultiDiscrete space");
        }
        total += categorical_logp(inputs + offset, static_cast<std::size_t>(n), index);
        offset += static_cast<std::size_t>(n);
      }
      return total;
    }
    case SpaceKind::kBox:
      return gaussian_logp(inputs, space.flat_dim(), action);
    case SpaceKind::kDict:
    case SpaceKind::kTuple:
      break;  // (refused by check_action_space)
  }
  return Result<double>(ErrorCode::kInvalidArgument, "unknown space");
}

template <class T>
Status sample_impl(const Space& space, const T* inputs, std::size_t n_inputs, Rng& rng, double* action,
                   std::size_t action_size, double* logp) {
  Status status = check_action_space(space, n_inputs, action_size);
  if (!status.ok()) return status;
  switch (space.kind()) {
    case SpaceKind::kDiscrete:
      action[0] = discrete_sample(space, inputs, rng, logp);
      return Status::Ok();
    case SpaceKind::kMultiDiscrete:
      *logp = multi_discrete_sample(space, inputs, rng, action);
      return Status::Ok();
    case SpaceKind::kBox: {
      const std::size_t k = space.flat_dim();
      gaussian_sample(inputs, k, rng, action);
      *logp = gaussian_logp(inputs, k, action);
      return Status::Ok();
    }
    case SpaceKind::kDict:
    case SpaceKind::kTuple:
      break;  // (refused by check_action_space)
  }
  return Status(ErrorCode::kInvalidArgument, "unknown space");
}

}  // namespace

void Rng::reseed(std::uint64_t seed) noexcept {
  for (auto& word : s_) {  // splitmix64
    seed += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    word = z ^ (z >> 31);
  }
  has_spare_ = false;
}

std::uint64_t Rng::next_u64() noexcept {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Rng::normal() noexcept {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = 1.0 - uniform();  // (0, 1]: log is finite
  const double u2 = uniform();
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 6.283185307179586476925 * u2;
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

Result<double> log_prob(const Space& space, const double* dist_inputs, std::size_t n_inputs, const double* action,
                        std::size_t action_size) {
  return log_prob_impl(space, dist_inputs, n_inputs, action, action_size);
}

Result<double> log_prob(const Space& space, const float* dist_inputs, std::size_t n_inputs, const double* action,
                        std::size_t action_size) {
  return log_prob_impl(space, dist_inputs, n_inputs, action, action_size);
}

Status sample(const Space& space, const float* dist_inputs, std::size_t n_inputs, Rng& rng, double* action,
              std::size_t action_size, double* logp) {
  return sample_impl(space, dist_inputs, n_inputs, rng, action, action_size, logp);
}

Status sample(const Space& space, const double* dist_inputs, std::size_t n_inputs, Rng& rng, double* action,
              std::size_t action_size, double* logp) {
  return sample_impl(space, dist_inputs, n_inputs, rng, action, action_size, logp);
}

Status to_env_action(const Space& space, const double* action, double* env_action, std::size_t action_size) {
  if (action_size != space.flat_dim()) {
    return Status(ErrorCode::kInvalidArgument, "the action has " + std::to_string(action_size) +
                                                   " elements, the action space needs " +
                                                   std::to_string(space.flat_dim()));
  }
  for (std::size_t j = 0; j < action_size; ++j) {
    env_action[j] = space.kind() == SpaceKind::kBox ? clip_to_box(space, j, action[j]) : action[j];
  }
  return Status::Ok();
}

Status sample_for_record(const Space& space, const float* dist_inputs, std::size_t n_inputs, Rng& rng,
                         bool raw_box_samples, double* record_action, double* env_action, std::size_t action_size,
                         double* logp) {
  Status status = check_sizes(space, n_inputs, action_size);
  if (!status.ok()) return status;
  return sample_rows_for_record(space, dist_inputs, 1, rng, raw_box_samples, record_action, env_action, logp);
}

Status sample_rows_for_record(const Space& space, const float* dist_inputs, std::size_t rows, Rng& rng,
                              bool raw_box_samples, double* record_actions, double* env_actions, double* logp) {
  const std::size_t n_inputs = space.dist_inputs_size();
  const std::size_t k = space.flat_dim();
  switch (space.kind()) {
    case SpaceKind::kDiscrete:
      for (std::size_t r = 0; r < rows; ++r) {
        record_actions[r] = env_actions[r] = discrete_sample(space, dist_inputs + r * n_inputs, rng, &logp[r]);
      }
      return Status::Ok();
    case SpaceKind::kMultiDiscrete:
      for (std::size_t r = 0; r < rows; ++r) {
        double* record = record_actions + r * k;
        logp[r] = multi_discrete_sample(space, dist_inputs + r * n_inputs, rng, record);
        std::copy(record, record + k, env_actions + r * k);
      }
      return Status::Ok();
    case SpaceKind::kBox:
      for (std::size_t r = 0; r < rows; ++r) {
        const float* inputs = dist_inputs + r * n_inputs;
        double* record = record_actions + r * k;
        double* env = env_actions + r * k;
        gaussian_sample(inputs, k, rng, record);
        for (std::size_t j = 0; j < k; ++j) env[j] = clip_to_box(space, j, record[j]);
        if (!raw_box_samples) {
          // The 1.2 rule: record the clipped action and the density at it.
          std::copy(env, env + k, record);
        }
        logp[r] = gaussian_logp(inputs, k, record);
      }
      return Status::Ok();
    case SpaceKind::kDict:
    case SpaceKind::kTuple:
      return not_an_action_space();
  }
  return Status(ErrorCode::kInvalidArgument, "unknown space");
}

Status deterministic(const Space& space, const float* dist_inputs, std::size_t n_inputs, double* action,
                     std::size_t action_size) {
  Status status = check_action_space(space, n_inputs, action_size);
  if (!status.ok()) return status;
  switch (space.kind()) {
    case SpaceKind::kDiscrete:
      action[0] = static_cast<double>(static_cast<std::int64_t>(
                                          categorical_mode(dist_inputs, static_cast<std::size_t>(space.n()))) +
                                      space.start());
      break;
    case SpaceKind::kMultiDiscrete: {
      std::size_t offset = 0;
      for (std::size_t d = 0; d < space.nvec().size(); ++d) {
        const auto n = static_cast<std::size_t>(space.nvec()[d]);
        action[d] = static_cast<double>(categorical_mode(dist_inputs + offset, n));
        offset += n;
      }
      break;
    }
    case SpaceKind::kBox:
      for (std::size_t j = 0; j < action_size; ++j) action[j] = clip_to_box(space, j, static_cast<double>(dist_inputs[j]));
      break;
    case SpaceKind::kDict:
    case SpaceKind::kTuple:
      break;  // (refused by check_action_space)
  }
  return Status::Ok();
}

bool server_takes_raw_box_samples(const std::string& protocol_version) {
  if (protocol_version.empty()) return true;  // RLlib's v1 server does not check actions
  Result<ProtocolVersion> version = parse_version(protocol_version);
  if (!version.ok()) return true;
  const ProtocolVersion& v = version.value();
  return v.major > 1 || (v.major == 1 && v.minor >= 3);
}

}  // namespace tether
