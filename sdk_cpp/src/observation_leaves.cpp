// Composite observations from per-leaf views, and the checks of a flat row.
#include "tether/observation_leaves.h"

#include <cmath>
#include <string>

namespace tether {

Status ObservationLeaves::bind(const Space& space) {
  space_ = Space();
  views_.clear();
  refused_ = Status::Ok();
  if (!space.is_composite()) {
    return refused_ = Status(ErrorCode::kInvalidArgument, "ObservationLeaves needs a Dict or Tuple observation space");
  }
  space_ = space;
  views_.assign(space.leaves().size(), View());
  return Status::Ok();
}

void ObservationLeaves::clear() noexcept {
  for (View& view : views_) view = View();
  refused_ = Status::Ok();
}

Status ObservationLeaves::refuse(Status status) {
  if (refused_.ok()) refused_ = status;
  return status;
}

Status ObservationLeaves::unknown(std::string_view path) {
  std::string known;
  for (const SpaceLeaf& leaf : space_.leaves()) known += (known.empty() ? "" : ", ") + leaf.path;
  return refuse(Status(ErrorCode::kObsLeafMismatch, "the observation space has no leaf '" + std::string(path) +
                                                        "' (its leaves: " + known + ")"));
}

Status ObservationLeaves::accept(int leaf, const float* floats, const std::uint8_t* bytes, std::size_t count) {
  if (leaf < 0 || static_cast<std::size_t>(leaf) >= views_.size()) {
    return unknown("#" + std::to_string(leaf));
  }
  const SpaceLeaf& found = space_.leaves()[static_cast<std::size_t>(leaf)];
  if ((floats == nullptr && bytes == nullptr) || count != found.size) {
    return refuse(Status(ErrorCode::kObsShapeMismatch, "observation leaf '" + found.path + "' has " +
                                                           std::to_string(count) + " values; its space has " +
                                                           std::to_string(found.size)));
  }
  views_[static_cast<std::size_t>(leaf)] = View{floats, bytes};
  return Status::Ok();
}

Status ObservationLeaves::set(int leaf, const float* values, std::size_t count) {
  return accept(leaf, values, nullptr, count);
}

Status ObservationLeaves::set(int leaf, const std::uint8_t* values, std::size_t count) {
  return accept(leaf, nullptr, values, count);
}

Status ObservationLeaves::set(std::string_view path, const float* values, std::size_t count) {
  const int leaf = index(path);
  return leaf < 0 ? unknown(path) : accept(leaf, values, nullptr, count);
}

Status ObservationLeaves::set(std::string_view path, const std::uint8_t* values, std::size_t count) {
  const int leaf = index(path);
  return leaf < 0 ? unknown(path) : accept(leaf, nullptr, values, count);
}

Status ObservationLeaves::write_row(float* row, std::size_t size) const {
  if (!refused_.ok()) return refused_;
  if (views_.empty()) return Status(ErrorCode::kInvalidArgument, "ObservationLeaves is bound to no Dict or Tuple space");
  if (row == nullptr || size != space_.flat_dim()) {
    return Status(ErrorCode::kInvalidArgument, "the flat row needs " + std::to_string(space_.flat_dim()) + " values");
  }
  const std::vector<SpaceLeaf>& leaves = space_.leaves();
  for (std::size_t i = 0; i < views_.size(); ++i) {
    const View& view = views_[i];
    float* to = row + leaves[i].offset;
    if (view.floats != nullptr) {
      for (std::size_t j = 0; j < leaves[i].size; ++j) to[j] = view.floats[j];
    } else if (view.bytes != nullptr) {
      for (std::size_t j = 0; j < leaves[i].size; ++j) to[j] = static_cast<float>(view.bytes[j]);
    } else {
      return Status(ErrorCode::kObsLeafMismatch, "the observation has no leaf '" + leaves[i].path + "' (not set)");
    }
  }
  return Status::Ok();
}

Status check_observation_row(const Space& space, const float* row, std::size_t size, const char* what) {
  for (std::size_t i = 0; i < size; ++i) {
    if (std::isfinite(row[i])) continue;
    std::string where = std::string(what) + "[" + std::to_string(i) + "]";
    for (const SpaceLeaf& leaf : space.leaves()) {
      if (i >= leaf.offset && i < leaf.offset + leaf.size) where = std::string(what) + " leaf '" + leaf.path + "'";
    }
    return Status(ErrorCode::kNonFiniteValue, where + " is not finite");
  }
  return check_observation_bytes(space, row, size, what);
}

Status check_observation_bytes(const Space& space, const float* row, std::size_t size, const char* what) {
  if (space.is_bytes()) {
    const std::size_t bad = first_non_byte(row, size);
    if (bad != size) {
      return Status(ErrorCode::kObsDtypeMismatch, std::string(what) + "[" + std::to_string(bad) + "] is " +
                                                      std::to_string(row[bad]) +
                                                      ": the observation space is a uint8 Box (integers 0-255)");
    }
  }
  for (const SpaceLeaf& leaf : space.leaves()) {
    if (!leaf.is_bytes()) continue;
    const std::size_t bad = first_non_byte(row + leaf.offset, leaf.size);
    if (bad != leaf.size) {
      return Status(ErrorCode::kObsDtypeMismatch, std::string(what) + " leaf '" + leaf.path + "'[" +
                                                      std::to_string(bad) + "] is " +
                                                      std::to_string(row[leaf.offset + bad]) +
                                                      ": the leaf is a uint8 Box (integers 0-255)");
    }
  }
  return Status::Ok();
}

}  // namespace tether
