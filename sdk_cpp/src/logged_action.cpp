// A logged action checked as a server checks a record's action (§10.6 checks 12-14d).
#include "tether/logged_action.h"

#include <cmath>
#include <string>

#include "json_util.h"

namespace tether {

namespace {

std::string values_text(const double* action, std::size_t size) {
  std::string out = "[";
  for (std::size_t i = 0; i < size && i < 8; ++i) {
    const double v = action[i];
    std::string text = std::isfinite(v) && v == std::round(v) && std::fabs(v) < 1e15
                           ? std::to_string(static_cast<long long>(v))
                           : std::to_string(v);
    out += (i > 0 ? ", " : "") + text;
  }
  if (size > 8) out += ", ...";
  return out + "]";
}

}  // namespace

Status check_logged_action(const Space& action_space, const double* action, std::size_t action_size,
                           const ActionMask* mask, const float* obs_row, const char* what) {
  const std::size_t dim = action_space.flat_dim();
  if (action == nullptr || action_size != dim) {
    return Status(ErrorCode::kActionOutOfSpace, std::string(what) + " has " + std::to_string(action == nullptr ? 0 : action_size) +
                                                    " values, the action space " +
                                                    detail::dump_json(action_space.to_json()) + " needs " +
                                                    std::to_string(dim));
  }
  const bool box = action_space.kind() == SpaceKind::kBox;
  for (std::size_t i = 0; i < action_size; ++i) {
    // (a Box action travels as float32: 1e39 is finite as a double but not there, and the server would
    // refuse the whole batch for it)
    if (!std::isfinite(action[i]) || (box && !std::isfinite(static_cast<float>(action[i])))) {
      return Status(ErrorCode::kNonFiniteValue, std::string(what) + "[" + std::to_string(i) + "] is not finite" +
                                                    (box && std::isfinite(action[i]) ? " as float32" : ""));
    }
  }
  // A Box action is any finite value (§10.6 check 14): the record carries it as taken.
  if (box) return Status::Ok();
  if (!action_space.contains(action, action_size)) {
    return Status(ErrorCode::kActionOutOfSpace, std::string(what) + " " + values_text(action, action_size) +
                                                    " is outside the action space " +
                                                    detail::dump_json(action_space.to_json()));
  }
  if (mask != nullptr && obs_row != nullptr && !mask->allows(obs_row + mask->offset, action)) {
    return Status(ErrorCode::kActionMasked, std::string(what) + " " + values_text(action, action_size) +
                                                " is not allowed by the observation's action mask '" + mask->leaf +
                                                "'");
  }
  return Status::Ok();
}

}  // namespace tether
