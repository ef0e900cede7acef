// Space parsing, writing and membership.
#include "tether/spaces.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#endif

#include "json_util.h"

namespace tether {
namespace detail {

// What a Dict or Tuple holds: its children in leaf order and its leaves.
struct CompositeParts {
  std::vector<std::pair<std::string, Space>> children;
  std::vector<SpaceLeaf> leaves;
  std::size_t depth = 1;  // levels of nesting, this one included
};

}  // namespace detail
namespace {

bool valid_key(const std::string& key) {
  if (key.empty()) return false;
  for (char c : key) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

Status invalid_space(const std::string& detail) {
  return Status(ErrorCode::kInvalidField, "invalid space: " + detail);
}

// One bound entry: a number (not a boolean) or "inf"/"-inf".
bool bound_number(const nlohmann::json& v, double& out) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s == "inf") {
      out = kInf;
      return true;
    }
    if (s == "-inf") {
      out = -kInf;
      return true;
    }
    return false;
  }
  if (!v.is_number()) return false;
  out = v.get<double>();
  return true;
}

Status bound_from_json(const nlohmann::json& value, std::size_t size, const char* what, std::vector<double>& out) {
  out.assign(size, 0.0);
  if (value.is_array()) {
    if (value.size() != size) {
      return invalid_space(std::string("Box ") + what + " has " + std::to_string(value.size()) +
                           " entries, the shape needs " + std::to_string(size));
    }
    for (std::size_t i = 0; i < size; ++i) {
      if (!bound_number(value[i], out[i])) {
        return invalid_space(std::string("Box ") + what + " entries must be numbers or 'inf'/'-inf', got " +
                             detail::describe(value[i]));
      }
    }
    return Status::Ok();
  }
  double v = 0;
  if (!bound_number(value, v)) {
    return invalid_space(std::string("Box ") + what + " entries must be numbers or 'inf'/'-inf', got " +
                         detail::describe(value));
  }
  out.assign(size, v);
  return Status::Ok();
}

nlohmann::json number_to_json(double v) {
  if (v == kInf) return "inf";
  if (v == -kInf) return "-inf";
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    return static_cast<std::int64_t>(v);
  }
  return v;
}

nlohmann::json bound_to_json(const std::vector<double>& values) {
  bool all_equal = !values.empty();
  for (double v : values) all_equal = all_equal && v == values[0];
  if (all_equal) return number_to_json(values[0]);
  nlohmann::json out = nlohmann::json::array();
  for (double v : values) out.push_back(number_to_json(v));
  return out;
}

std::size_t product(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (std::int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

// prod(shape) without overflow; kMaxSpaceElements + 1 once it is beyond the limit.
std::int64_t capped_product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d == 0) return 0;
    if (d < 0 || d > kMaxSpaceElements || n > kMaxSpaceElements / d) n = kMaxSpaceElements + 1;
    else n *= d;
  }
  return std::min(n, kMaxSpaceElements + 1);
}

std::string too_large(const char* what, std::int64_t limit) {
  return std::string(what) + " exceeds the " + std::to_string(limit) + " numbers a space may need";
}

bool is_whole(double x) { return std::isfinite(x) && x == std::round(x); }

// A byte box's bounds lie within [0, 255] (§8.1); the default bounds (+-inf) do not.
bool bounds_are_bytes(const std::vector<double>& low, const std::vector<double>& high) {
  for (double v : low) {
    if (!(v >= 0.0)) return false;
  }
  for (double v : high) {
    if (!(v <= 255.0)) return false;
  }
  return true;
}

constexpr const char* kByteBoundsText = "a uint8 Box's bounds must lie within [0, 255]";

}  // namespace

Result<Space> Space::box(std::vector<std::int64_t> shape, std::vector<double> low, std::vector<double> high,
                         std::string dtype) {
  for (std::int64_t d : shape) {
    if (d < 0) return Result<Space>(ErrorCode::kInvalidArgument, "Box shape must be non-negative");
  }
  if (capped_product(shape) > kMaxSpaceElements) {
    return Result<Space>(ErrorCode::kInvalidArgument, too_large("Box prod(shape)", kMaxSpaceElements));
  }
  const std::size_t size = product(shape);
  if (low.size() != size || high.size() != size) {
    return Result<Space>(ErrorCode::kInvalidArgument, "Box bounds need prod(shape) = " + std::to_string(size) +
                                                          " entries each");
  }
  for (std::size_t i = 0; i < size; ++i) {
    if (low[i] > high[i]) return Result<Space>(ErrorCode::kInvalidArgument, "Box low must not exceed high");
  }
  if (dtype == "uint8" && !bounds_are_bytes(low, high)) {
    return Result<Space>(ErrorCode::kInvalidArgument, kByteBoundsText);
  }
  Space space;
  space.kind_ = SpaceKind::kBox;
  space.shape_ = std::move(shape);
  space.low_ = std::move(low);
  space.high_ = std::move(high);
  space.dtype_ = std::move(dtype);
  return space;
}

Result<Space> Space::box(std::vector<std::int64_t> shape, double low, double high) {
  if (capped_product(shape) > kMaxSpaceElements) {
    return Result<Space>(ErrorCode::kInvalidArgument, too_large("Box prod(shape)", kMaxSpaceElements));
  }
  std::size_t size = 1;
  for (std::int64_t d : shape) size *= d < 0 ? 0 : static_cast<std::size_t>(d);
  return box(std::move(shape), std::vector<double>(size, low), std::vector<double>(size, high));
}

Result<Space> Space::discrete(std::int64_t n, std::int64_t start) {
  if (n < 1) return Result<Space>(ErrorCode::kInvalidArgument, "Discrete n must be a positive integer");
  if (n > kMaxSpaceElements) return Result<Space>(ErrorCode::kInvalidArgument, too_large("Discrete n", kMaxSpaceElements));
  Space space;
  space.kind_ = SpaceKind::kDiscrete;
  space.n_ = n;
  space.start_ = start;
  return space;
}

Result<Space> Space::multi_discrete(std::vector<std::int64_t> nvec) {
  if (nvec.empty()) return Result<Space>(ErrorCode::kInvalidArgument, "MultiDiscrete nvec must not be empty");
  std::int64_t total = 0;
  for (std::int64_t v : nvec) {
    if (v < 1) return Result<Space>(ErrorCode::kInvalidArgument, "MultiDiscrete nvec must be positive integers");
    total += std::min(v, kMaxSpaceElements + 1);  // no overflow: stops growing past the limit below
    if (total > kMaxSpaceElements) {
      return Result<Space>(ErrorCode::kInvalidArgument, too_large("MultiDiscrete sum(nvec)", kMaxSpaceElements));
    }
  }
  Space space;
  space.kind_ = SpaceKind::kMultiDiscrete;
  space.shape_ = {static_cast<std::int64_t>(nvec.size())};
  space.nvec_ = std::move(nvec);
  return space;
}

namespace {

Result<Space> space_at_depth(const nlohmann::json& data, std::size_t depth) {
  if (!data.is_object()) {
    return invalid_space(std::string("a space must be a JSON object, got ") + data.type_name());
  }
  const std::string* kind = detail::string_member(data, "type");
  if (kind != nullptr && (*kind == "Dict" || *kind == "Tuple")) {
    // The depth is checked before the children are read: a hostile nesting never recurses far.
    if (depth > kMaxSpaceDepth) {
      return invalid_space("composite spaces nest at most " + std::to_string(kMaxSpaceDepth) + " levels deep");
    }
    const nlohmann::json* children = detail::member(data, "spaces");
    if (children == nullptr) return invalid_space("missing key 'spaces'");
    // (the factories' INVALID_ARGUMENT is a malformed space here)
    const auto as_field = [](Result<Space> made) -> Result<Space> { return made.ok() ? made : invalid_space(made.status().message()); };
    if (*kind == "Dict") {
      if (!children->is_object() || children->empty()) {
        return invalid_space("a Dict's spaces must be a non-empty object of named spaces");
      }
      std::vector<std::pair<std::string, Space>> named;
      for (auto it = children->begin(); it != children->end(); ++it) {
        if (!valid_key(it.key())) {
          return invalid_space("a Dict key must be a non-empty string of A-Z a-z 0-9 _ -, got " +
                               detail::describe(nlohmann::json(it.key())));
        }
        Result<Space> child = space_at_depth(it.value(), depth + 1);
        if (!child.ok()) return child;
        named.emplace_back(it.key(), std::move(child).value());
      }
      return as_field(Space::dict(std::move(named)));
    }
    {
      if (!children->is_array() || children->empty()) {
        return invalid_space("a Tuple's spaces must be a non-empty array of spaces");
      }
      std::vector<Space> items;
      for (const nlohmann::json& value : *children) {
        Result<Space> child = space_at_depth(value, depth + 1);
        if (!child.ok()) return child;
        items.push_back(std::move(child).value());
      }
      return as_field(Space::tuple(std::move(items)));
    }
  }
  if (kind != nullptr && *kind == "Box") {
    const nlohmann::json* shape_json = detail::member(data, "shape");
    if (shape_json == nullptr) return invalid_space("missing key 'shape'");
    if (!shape_json->is_array()) return invalid_space("Box shape must be a list of integers");
    std::vector<std::int64_t> shape;
    for (const auto& d : *shape_json) {
      if (!detail::is_integer(d)) return invalid_space("Box shape must be a list of integers");
      const std::int64_t v = detail::as_int64(d);
      if (v < 0) return invalid_space("Box shape must be non-negative");
      shape.push_back(v);
    }
    if (capped_product(shape) > kMaxSpaceElements) return invalid_space(too_large("Box prod(shape)", kMaxSpaceElements));
    const std::size_t size = product(shape);
    std::vector<double> low, high;
    const nlohmann::json* low_json = detail::member(data, "low");
    const nlohmann::json* high_json = detail::member(data, "high");
    Status status = bound_from_json(low_json ? *low_json : nlohmann::json("-inf"), size, "low", low);
    if (!status.ok()) return status;
    status = bound_from_json(high_json ? *high_json : nlohmann::json("inf"), size, "high", high);
    if (!status.ok()) return status;
    for (std::size_t i = 0; i < size; ++i) {
      if (low[i] > high[i]) return invalid_space("Box low must not exceed high");
    }
    std::string dtype = "float32";
    if (const nlohmann::json* d = detail::member(data, "dtype")) {
      if (!d->is_string()) return invalid_space("Box dtype must be a string, got " + detail::describe(*d));
      dtype = d->get_ref<const std::string&>();
    }
    if (dtype == "uint8" && !bounds_are_bytes(low, high)) return invalid_space(kByteBoundsText);
    return Space::box(std::move(shape), std::move(low), std::move(high), std::move(dtype));
  }
  if (kind != nullptr && *kind == "Discrete") {
    const nlohmann::json* n = detail::member(data, "n");
    if (n == nullptr) return invalid_space("missing key 'n'");
    if (!detail::is_integer(*n) || detail::as_int64(*n) < 1) {
      return invalid_space("Discrete n must be a positive integer, got " + detail::describe(*n));
    }
    std::int64_t start = 0;
    if (const nlohmann::json* s = detail::member(data, "start")) {
      if (!detail::is_integer(*s)) return invalid_space("Discrete start must be an integer");
      start = detail::as_int64(*s);
    }
    Result<Space> space = Space::discrete(detail::as_int64(*n), start);
    if (!space.ok()) return invalid_space(space.status().message());
    return space;
  }
  if (kind != nullptr && *kind == "MultiDiscrete") {
    const nlohmann::json* nvec_json = detail::member(data, "nvec");
    if (nvec_json == nullptr) return invalid_space("missing key 'nvec'");
    if (!nvec_json->is_array()) return invalid_space("MultiDiscrete nvec must be a list of positive integers");
    std::vector<std::int64_t> nvec;
    for (const auto& v : *nvec_json) {
      if (!detail::is_integer(v) || detail::as_int64(v) < 1) {
        return invalid_space("MultiDiscrete nvec must be positive integers");
      }
      nvec.push_back(detail::as_int64(v));
    }
    if (nvec.empty()) return invalid_space("MultiDiscrete nvec must be positive integers, got []");
    Result<Space> space = Space::multi_discrete(std::move(nvec));
    if (!space.ok()) return invalid_space(space.status().message());
    return space;
  }
  const nlohmann::json* type = detail::member(data, "type");
  return invalid_space("unknown space type " + (type ? detail::describe(*type) : std::string("None")) +
                       " (Box, Discrete, MultiDiscrete, Dict, Tuple)");
}

}  // namespace

Result<Space> Space::from_json(const nlohmann::json& data) { return space_at_depth(data, 1); }

Result<Space> Space::dict(std::vector<std::pair<std::string, Space>> spaces) {
  for (const auto& entry : spaces) {
    if (!valid_key(entry.first)) {
      return Result<Space>(ErrorCode::kInvalidArgument,
                           "a Dict key must be a non-empty string of A-Z a-z 0-9 _ -, got '" + entry.first + "'");
    }
  }
  // Leaf order sorts the keys by code point (gymnasium's order); the keys are ASCII, so bytes compare alike.
  std::sort(spaces.begin(), spaces.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (std::size_t i = 1; i < spaces.size(); ++i) {
    if (spaces[i].first == spaces[i - 1].first) {
      return Result<Space>(ErrorCode::kInvalidArgument, "a Dict key appears twice: '" + spaces[i].first + "'");
    }
  }
  return composite(SpaceKind::kDict, std::move(spaces));
}

Result<Space> Space::tuple(std::vector<Space> spaces) {
  std::vector<std::pair<std::string, Space>> children;
  children.reserve(spaces.size());
  for (std::size_t i = 0; i < spaces.size(); ++i) children.emplace_back(std::to_string(i), std::move(spaces[i]));
  return composite(SpaceKind::kTuple, std::move(children));
}

Result<Space> Space::composite(SpaceKind kind, std::vector<std::pair<std::string, Space>> children) {
  const char* name = kind == SpaceKind::kDict ? "Dict" : "Tuple";
  if (children.empty()) {
    return Result<Space>(ErrorCode::kInvalidArgument, std::string("a ") + name + " needs at least one subspace");
  }
  auto parts = std::make_shared<detail::CompositeParts>();
  std::size_t offset = 0;
  for (const auto& [key, child] : children) {
    if (child.composite_) {
      parts->depth = std::max(parts->depth, child.composite_->depth + 1);
      for (const SpaceLeaf& leaf : child.composite_->leaves) {
        parts->leaves.push_back(SpaceLeaf{key + "." + leaf.path, leaf.space, offset, leaf.size});
        offset += leaf.size;
      }
    } else {
      parts->leaves.push_back(SpaceLeaf{key, child, offset, child.flat_dim()});
      offset += child.flat_dim();
    }
    if (parts->leaves.size() > kMaxSpaceLeaves) break;
  }
  if (parts->depth > kMaxSpaceDepth) {
    return Result<Space>(ErrorCode::kInvalidArgument,
                         "composite spaces nest at most " + std::to_string(kMaxSpaceDepth) + " levels deep");
  }
  if (parts->leaves.size() > kMaxSpaceLeaves) {
    return Result<Space>(ErrorCode::kInvalidArgument, "a composite space has at most " +
                                                          std::to_string(kMaxSpaceLeaves) + " leaves");
  }
  if (offset > static_cast<std::size_t>(kMaxSpaceElements)) {
    return Result<Space>(ErrorCode::kInvalidArgument, too_large("a composite space's flat row", kMaxSpaceElements));
  }
  parts->children = std::move(children);
  Space space;
  space.kind_ = kind;
  space.shape_ = {static_cast<std::int64_t>(offset)};
  space.composite_ = std::move(parts);
  return space;
}

const std::vector<SpaceLeaf>& Space::leaves() const noexcept {
  static const std::vector<SpaceLeaf> kNone;
  return composite_ ? composite_->leaves : kNone;
}

const std::vector<std::pair<std::string, Space>>& Space::children() const noexcept {
  static const std::vector<std::pair<std::string, Space>> kNone;
  return composite_ ? composite_->children : kNone;
}

int Space::leaf_index(std::string_view path) const noexcept {
  const std::vector<SpaceLeaf>& all = leaves();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].path == path) return static_cast<int>(i);
  }
  return -1;
}

nlohmann::json Space::to_json() const {
  switch (kind_) {
    case SpaceKind::kBox: {
      nlohmann::json shape = nlohmann::json::array();
      for (std::int64_t d : shape_) shape.push_back(d);
      return {{"type", "Box"}, {"shape", shape}, {"dtype", dtype_}, {"low", bound_to_json(low_)},
              {"high", bound_to_json(high_)}};
    }
    case SpaceKind::kDiscrete:
      return {{"type", "Discrete"}, {"n", n_}, {"start", start_}};
    case SpaceKind::kMultiDiscrete: {
      nlohmann::json nvec = nlohmann::json::array();
      for (std::int64_t v : nvec_) nvec.push_back(v);
      return {{"type", "MultiDiscrete"}, {"nvec", nvec}};
    }
    case SpaceKind::kDict: {
      nlohmann::json spaces = nlohmann::json::object();
      for (const auto& [key, child] : children()) spaces[key] = child.to_json();
      return {{"type", "Dict"}, {"spaces", spaces}};
    }
    case SpaceKind::kTuple: {
      nlohmann::json spaces = nlohmann::json::array();
      for (const auto& entry : children()) spaces.push_back(entry.second.to_json());
      return {{"type", "Tuple"}, {"spaces", spaces}};
    }
  }
  return nullptr;
}

std::size_t Space::flat_dim() const noexcept {
  switch (kind_) {
    case SpaceKind::kBox:
      return product(shape_);
    case SpaceKind::kDiscrete:
      return 1;
    case SpaceKind::kMultiDiscrete:
      return nvec_.size();
    case SpaceKind::kDict:
    case SpaceKind::kTuple:
      return static_cast<std::size_t>(shape_[0]);
  }
  return 0;
}

std::size_t Space::dist_inputs_size() const noexcept {
  switch (kind_) {
    case SpaceKind::kBox:
      return 2 * flat_dim();
    case SpaceKind::kDiscrete:
      return static_cast<std::size_t>(n_);
    case SpaceKind::kMultiDiscrete: {
      std::size_t total = 0;
      for (std::int64_t v : nvec_) total += static_cast<std::size_t>(v);
      return total;
    }
    case SpaceKind::kDict:
    case SpaceKind::kTuple:
      return 0;  // (observations only)
  }
  return 0;
}

bool Space::contains(const double* x, std::size_t n) const noexcept {
  if (n != flat_dim()) return false;
  switch (kind_) {
    case SpaceKind::kBox:
      for (std::size_t i = 0; i < n; ++i) {
        // Compare at float32 precision: a float32 action clipped to 0.1 is 0.100000001.
        const float v = static_cast<float>(x[i]);
        if (!(v >= static_cast<float>(low_[i]) && v <= static_cast<float>(high_[i]))) return false;
      }
      return true;
    case SpaceKind::kDiscrete:
      return is_whole(x[0]) && x[0] >= static_cast<double>(start_) && x[0] < static_cast<double>(start_ + n_);
    case SpaceKind::kMultiDiscrete:
      for (std::size_t i = 0; i < n; ++i) {
        if (!is_whole(x[i]) || x[i] < 0 || x[i] >= static_cast<double>(nvec_[i])) return false;
      }
      return true;
    case SpaceKind::kDict:
    case SpaceKind::kTuple:
      for (const SpaceLeaf& leaf : leaves()) {
        if (!leaf.space.contains(x + leaf.offset, leaf.size)) return false;
      }
      return true;
  }
  return false;
}

std::size_t first_non_byte(const float* values, std::size_t n) noexcept {
  std::size_t i = 0;
#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
  // An image is tens of thousands of values checked every frame: 16 at a time,
  // branch-free; the scalar loop below finds which one failed, if any did.
  // (v + 2^23) - 2^23 == v holds, in any rounding mode, only for a whole v in [0, 2^23].
  const __m128 zero = _mm_setzero_ps();
  const __m128 top = _mm_set1_ps(255.0f);
  const __m128 shift = _mm_set1_ps(8388608.0f);
  for (; i + 16 <= n; i += 16) {
    __m128 good = _mm_castsi128_ps(_mm_set1_epi32(-1));
    for (std::size_t j = 0; j < 16; j += 4) {
      const __m128 v = _mm_loadu_ps(values + i + j);
      const __m128 in_range = _mm_and_ps(_mm_cmpge_ps(v, zero), _mm_cmple_ps(v, top));  // (false for NaN)
      const __m128 whole = _mm_cmpeq_ps(_mm_sub_ps(_mm_add_ps(v, shift), shift), v);
      good = _mm_and_ps(good, _mm_and_ps(in_range, whole));
    }
    if (_mm_movemask_ps(good) != 0xF) break;
  }
#endif
  for (; i < n; ++i) {
    const float v = values[i];
    // (NaN fails the range test; a value in range is whole when truncation keeps it)
    if (!(v >= 0.0f && v <= 255.0f) || static_cast<float>(static_cast<int>(v)) != v) return i;
  }
  return n;
}

bool Space::operator==(const Space& other) const noexcept {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case SpaceKind::kBox:
      return is_bytes() == other.is_bytes() && shape_ == other.shape_ && low_ == other.low_ && high_ == other.high_;
    case SpaceKind::kDiscrete:
      return n_ == other.n_ && start_ == other.start_;
    case SpaceKind::kMultiDiscrete:
      return nvec_ == other.nvec_;
    case SpaceKind::kDict:
    case SpaceKind::kTuple: {
      const auto& mine = children();
      const auto& theirs = other.children();
      if (mine.size() != theirs.size()) return false;
      for (std::size_t i = 0; i < mine.size(); ++i) {
        if (mine[i].first != theirs[i].first || mine[i].second != theirs[i].second) return false;
      }
      return true;
    }
  }
  return false;
}

}  // namespace tether
