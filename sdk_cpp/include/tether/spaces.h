// Observation and action spaces in the JSON form SET_CONFIG carries
// (docs/protocol.md §8): Box, Discrete and MultiDiscrete, as gymnasium's, and
// (protocol 1.4, §8.6) the composite Dict and Tuple, for observations only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/status.h"

namespace tether {

/// Which kind of space. kDict and kTuple (protocol 1.4, §8.6) are composite:
/// observation spaces only.
enum class SpaceKind { kBox, kDiscrete, kMultiDiscrete, kDict, kTuple };

/// Limits on composite spaces (§8.6): nesting levels (the outermost space is
/// level 1) and leaves; a deeper or wider space is refused.
inline constexpr std::size_t kMaxSpaceDepth = 8;
inline constexpr std::size_t kMaxSpaceLeaves = 64;

struct SpaceLeaf;
namespace detail {
struct CompositeParts;
}

/// The most numbers a space may need per value or per distribution
/// (prod(Box shape), Discrete n, sum of MultiDiscrete nvec): buffers of these
/// sizes are allocated per agent, so a larger space is refused (INVALID_FIELD
/// from from_json, INVALID_ARGUMENT from the factories) before anything is allocated.
inline constexpr std::int64_t kMaxSpaceElements = std::int64_t{1} << 22;

/// One space. A value of the space is handled as a flat row-major array of
/// `flat_dim()` numbers (a Discrete value is one number, start included); a
/// composite (Dict/Tuple) value as its flat row (§8.6): every leaf's values,
/// flattened, concatenated in leaf order.
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
  /// A Dict (protocol 1.4, §8.6) of named subspaces, in any order (its
  /// leaves follow the keys sorted by code point). INVALID_ARGUMENT when
  /// empty, for a key that is empty, repeated or has a character outside
  /// A-Z a-z 0-9 _ -, or beyond kMaxSpaceDepth levels or kMaxSpaceLeaves leaves.
  static Result<Space> dict(std::vector<std::pair<std::string, Space>> spaces);
  /// A Tuple (protocol 1.4, §8.6) of subspaces in order; INVALID_ARGUMENT
  /// when empty or beyond the limits.
  static Result<Space> tuple(std::vector<Space> spaces);

  /// Parses the JSON form (§8); INVALID_FIELD when malformed, including
  /// (protocol 1.4, §8.4) a Box dtype that is not a string, a "uint8" Box
  /// with a bound below 0 or above 255, and a Dict or Tuple that breaks §8.6.
  static Result<Space> from_json(const nlohmann::json& data);
  /// The canonical JSON form (bounds as one number when all equal, "inf"/"-inf" strings).
  nlohmann::json to_json() const;

  /// The kind of space.
  SpaceKind kind() const noexcept { return kind_; }
  /// The shape of one value: [] for Discrete, [len(nvec)] for MultiDiscrete,
  /// [flat_dim()] (its flat row) for Dict and Tuple.
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  /// Number of elements of one value (1 for Discrete and for a Box of shape
  /// []; the flat row's length for Dict and Tuple).
  std::size_t flat_dim() const noexcept;
  /// Whether this is a Dict or a Tuple (protocol 1.4, §8.6).
  bool is_composite() const noexcept { return kind_ == SpaceKind::kDict || kind_ == SpaceKind::kTuple; }
  /// A composite space's leaves in leaf order (§8.6: Dict keys sorted, Tuple
  /// items in order, depth first); empty for any other space.
  const std::vector<SpaceLeaf>& leaves() const noexcept;
  /// The index in leaves() of the leaf at `path` ("camera", "sensors.0"), or -1.
  int leaf_index(std::string_view path) const noexcept;
  /// A Dict's (key, space) pairs sorted by key, a Tuple's ("0", space), ("1",
  /// space)... in order; empty for any other space.
  const std::vector<std::pair<std::string, Space>>& children() const noexcept;
  /// Number of action_dist_inputs a model outputs for this action space (§11; 0 for Dict and Tuple).
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

  /// Structural equality (same kind, shape, bounds, n, start, nvec; of a Box's dtype only whether
  /// it is uint8, a byte box, §8.1: every other dtype is handled as float32).
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
  std::shared_ptr<const detail::CompositeParts> composite_;  // Dict and Tuple (immutable, shared by copies)

  static Result<Space> composite(SpaceKind kind, std::vector<std::pair<std::string, Space>> children);
};

/// One leaf of a composite space (§8.6): a subspace, at any depth, that is
/// not composite, and where its values sit in the flat row.
struct SpaceLeaf {
  std::string path;         ///< keys and tuple indices from the root joined by '.' ("camera", "sensors.0")
  Space space;              ///< a Box, Discrete or MultiDiscrete
  std::size_t offset = 0;   ///< position of its first value in the flat row
  std::size_t size = 0;     ///< its values in the flat row (space.flat_dim())
  /// Whether it is a byte box (§8.1): its model input is uint8 in its shape (§12.1).
  bool is_bytes() const noexcept { return space.is_bytes(); }
};

/// The index of the first of `n` values that a byte box (Space::is_bytes)
/// does not take, one that is not an integer from 0 to 255 (7.0 is 7), or `n`
/// when every value is one. A server refuses such an observation with
/// OBS_DTYPE_MISMATCH (§10.6 check 11b).
std::size_t first_non_byte(const float* values, std::size_t n) noexcept;

}  // namespace tether
