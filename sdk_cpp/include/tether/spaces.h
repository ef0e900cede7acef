// Observation and action spaces in the JSON form SET_CONFIG carries
// (docs/protocol.md §8): Box, Discrete and MultiDiscrete, as gymnasium's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/status.h"

namespace tether {

/// Which kind of space.
enum class SpaceKind { kBox, kDiscrete, kMultiDiscrete };

/// The most numbers a space may need per value or per distribution
/// (prod(Box shape), Discrete n, sum of MultiDiscrete nvec): buffers of these
/// sizes are allocated per agent, so a larger space is refused (INVALID_FIELD
/// from from_json, INVALID_ARGUMENT from the factories) before anything is allocated.
inline constexpr std::int64_t kMaxSpaceElements = std::int64_t{1} << 22;

/// One space. A value of the space is handled as a flat row-major array of
/// `flat_dim()` numbers (a Discrete value is one number, start included).
class Space {
 public:
  /// Discrete(2), so that a Space is default-constructible.
  Space() = default;

  /// A Box with per-element bounds (flat, row-major, prod(shape) entries each;
  /// +-infinity for unbounded); INVALID_ARGUMENT if sizes disagree or low > high,
  /// or for dtype "uint8" (a byte box, protocol 1.4) a bound outside [0, 255].
  static Result<Space> box(std::vector<std::int64_t> shape, std::vector<double> low, std::vector<double> high,
                           std::string dtype = "float32");
  /// A Box with the same bounds everywhere.
  static Result<Space> box(std::vector<std::int64_t> shape, double low, double high);
  /// The integers start .. start + n - 1; INVALID_ARGUMENT for n < 1.
  static Result<Space> discrete(std::int64_t n, std::int64_t start = 0);
  /// Independent choices, entry i in [0, nvec[i]); INVALID_ARGUMENT if empty or an entry < 1.
  static Result<Space> multi_discrete(std::vector<std::int64_t> nvec);

  /// Parses the JSON form (§8); INVALID_FIELD when malformed, including
  /// (protocol 1.4, §8.4) a Box dtype that is not a string and a "uint8" Box
  /// with a bound below 0 or above 255.
  static Result<Space> from_json(const nlohmann::json& data);
  /// The canonical JSON form (bounds as one number when all equal, "inf"/"-inf" strings).
  nlohmann::json to_json() const;

  /// The kind of space.
  SpaceKind kind() const noexcept { return kind_; }
  /// The shape of one value: [] for Discrete, [len(nvec)] for MultiDiscrete.
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  /// Number of elements of one value (1 for Discrete and for a Box of shape []).
  std::size_t flat_dim() const noexcept;
  /// Number of action_dist_inputs a model outputs for this action space (§11).
  std::size_t dist_inputs_size() const noexcept;
  /// Whether the flat value `x` (flat_dim() numbers) lies in the space;
  /// a Box compares at float32 precision, discrete values must be integers.
  bool contains(const double* x, std::size_t n) const noexcept;

  /// Box lower bounds, flat (empty for other kinds).
  const std::vector<double>& low() const noexcept { return low_; }
  /// Box upper bounds, flat (empty for other kinds).
  const std::vector<double>& high() const noexcept { return high_; }
  /// Box dtype as declared ("float32").
  const std::string& dtype() const noexcept { return dtype_; }
  /// Whether this is a byte box (protocol 1.4, §8.1): a Box of dtype "uint8",
  /// whose values are the integers 0 to 255 (a camera image, shape [height,
  /// width, channels]). Its model takes uint8 input (§12.1). Every other Box
  /// is handled as float32, whatever its dtype.
  bool is_bytes() const noexcept { return kind_ == SpaceKind::kBox && dtype_ == "uint8"; }
  /// Discrete n.
  std::int64_t n() const noexcept { return n_; }
  /// Discrete start.
  std::int64_t start() const noexcept { return start_; }
  /// MultiDiscrete nvec.
  const std::vector<std::int64_t>& nvec() const noexcept { return nvec_; }

  /// Structural equality (same kind, shape, bounds, n, start, nvec; a Box's dtype aside).
  bool operator==(const Space& other) const noexcept;
  /// Structural inequality.
  bool operator!=(const Space& other) const noexcept { return !(*this == other); }

 private:
  SpaceKind kind_ = SpaceKind::kDiscrete;
  std::vector<std::int64_t> shape_;
  std::vector<double> low_, high_;
  std::string dtype_ = "float32";
  std::int64_t n_ = 2;
  std::int64_t start_ = 0;
  std::vector<std::int64_t> nvec_;
};

/// The index of the first of `n` values that a byte box (Space::is_bytes)
/// does not take, one that is not an integer from 0 to 255 (7.0 is 7), or `n`
/// when every value is one. A server refuses such an observation with
/// OBS_DTYPE_MISMATCH (§10.6 check 11b).
std::size_t first_non_byte(const float* values, std::size_t n) noexcept;

}  // namespace tether
