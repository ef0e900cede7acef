// Action masks: resolving the mask leaf against the spaces, and the checks a
// client makes before sampling (§11.6).
#include "tether/action_mask.h"

#include <cmath>

namespace tether {

Result<ActionMask> ActionMask::of_action_space(const Space& action_space) {
  ActionMask mask;
  if (action_space.kind() == SpaceKind::kDiscrete) {
    mask.segments.emplace_back(0, static_cast<std::size_t>(action_space.n()));
    mask.shift = -action_space.start();
  } else if (action_space.kind() == SpaceKind::kMultiDiscrete) {
    std::size_t first = 0;
    for (std::int64_t n : action_space.nvec()) {
      mask.segments.emplace_back(first, static_cast<std::size_t>(n));
      first += static_cast<std::size_t>(n);
    }
  } else {
    return Status(ErrorCode::kInvalidField, "an action mask needs a Discrete or MultiDiscrete action space");
  }
  mask.size = action_space.dist_inputs_size();
  return mask;
}

Result<ActionMask> ActionMask::resolve(const Space& observation_space, const Space& action_space,
                                       const std::string& leaf) {
  const int index = observation_space.leaf_index(leaf);
  if (index < 0) {
    return Status(ErrorCode::kInvalidField,
                  "action_mask names the leaf '" + leaf + "', but the observation space has no such leaf" +
                      (observation_space.is_composite() ? "" : " (it is not a Dict or Tuple)"));
  }
  Result<ActionMask> mask = of_action_space(action_space);
  if (!mask.ok()) {
    return Status(ErrorCode::kInvalidField, "the action mask '" + leaf + "' needs a Discrete or MultiDiscrete action space");
  }
  const SpaceLeaf& found = observation_space.leaves()[static_cast<std::size_t>(index)];
  if (found.space.kind() != SpaceKind::kBox || found.size != mask.value().size) {
    return Status(ErrorCode::kInvalidField, "the action mask '" + leaf + "' must be a Box of " +
                                                std::to_string(mask.value().size) +
                                                " values (one per logit of the action distribution)");
  }
  mask.value().leaf = leaf;
  mask.value().offset = found.offset;
  return mask;
}

template <class T>
Status ActionMask::check(const T* mask, const char* what) const {
  for (std::size_t i = 0; i < size; ++i) {
    const double v = static_cast<double>(mask[i]);
    if (v != 0.0 && v != 1.0) {
      return Status(ErrorCode::kInvalidActionMask, std::string(what) + ": the action mask '" + leaf + "'[" +
                                                       std::to_string(i) + "] holds a value other than 0 and 1");
    }
  }
  for (std::size_t entry = 0; entry < segments.size(); ++entry) {
    bool any = false;
    for (std::size_t i = 0; i < segments[entry].second; ++i) any = any || mask[segments[entry].first + i] != T(0);
    if (!any) {
      return Status(ErrorCode::kActionMaskEmpty,
                    std::string(what) + ": the action mask '" + leaf + "' allows no action" +
                        (segments.size() > 1 ? " for entry " + std::to_string(entry) : std::string()));
    }
  }
  return Status::Ok();
}

template <class T>
bool ActionMask::allows(const T* mask, const double* action) const noexcept {
  for (std::size_t entry = 0; entry < segments.size(); ++entry) {
    const double index = std::round(action[entry]) + static_cast<double>(shift);
    if (!(index >= 0.0 && index < static_cast<double>(segments[entry].second))) return false;
    if (mask[segments[entry].first + static_cast<std::size_t>(index)] != T(1)) return false;
  }
  return true;
}

template Status ActionMask::check<float>(const float*, const char*) const;
template Status ActionMask::check<double>(const double*, const char*) const;
template bool ActionMask::allows<float>(const float*, const double*) const noexcept;
template bool ActionMask::allows<double>(const double*, const double*) const noexcept;

}  // namespace tether
