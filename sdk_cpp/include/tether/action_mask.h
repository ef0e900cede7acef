// Action masks (docs/protocol.md §11.6, protocol 1.4): a leaf of a composite
// observation that says, per step, which discrete actions the game allows.
// The model applies it inside its graph (a forbidden logit is -1e9), so a
// client samples as always; it only checks the mask before sampling, so an
// action the server would refuse is never drawn or sent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tether/spaces.h"
#include "tether/status.h"

namespace tether {

/// The logit a forbidden action gets inside the model (§11.6, a float32 value).
inline constexpr float kMaskedLogit = -1e9f;

/// Where a module's mask sits in its flat observation row (§8.6), and the
/// categoricals of its action space: one value per logit, 1 allowed, 0 forbidden.
struct ActionMask {
  std::string leaf;         ///< the mask leaf's path ("" for a bare mask, see of_action_space)
  std::size_t offset = 0;   ///< its first value in the flat row
  std::size_t size = 0;     ///< its values: K, the action's logits (n, or sum of nvec)
  /// Per categorical (one for Discrete, one per MultiDiscrete entry): (first logit, count).
  std::vector<std::pair<std::size_t, std::size_t>> segments;
  std::int64_t shift = 0;   ///< added to a Discrete action to get its logit (-start); 0 for MultiDiscrete

  /// The mask leaf `leaf` of `observation_space` for `action_space`:
  /// INVALID_FIELD when the observation space is not composite or has no such
  /// leaf, the action space is not Discrete or MultiDiscrete, or the leaf is
  /// not a Box of exactly K values.
  static Result<ActionMask> resolve(const Space& observation_space, const Space& action_space,
                                    const std::string& leaf);
  /// A mask of K values at offset 0 for `action_space` (checking a mask given
  /// on its own); INVALID_FIELD for an action space that is not Discrete or MultiDiscrete.
  static Result<ActionMask> of_action_space(const Space& action_space);

  /// Whether one step's mask (`size` values at `mask`) can be acted on
  /// (§11.6): INVALID_ACTION_MASK for a value other than 0 and 1,
  /// ACTION_MASK_EMPTY when it allows nothing (for MultiDiscrete: nothing for
  /// some entry); ok otherwise. `what` starts the message.
  template <class T>
  Status check(const T* mask, const char* what) const;
  /// check() of the mask inside a flat observation row.
  Status check_row(const float* row, const char* what) const { return check(row + offset, what); }
  /// Whether the flat action `action` (the action space's flat_dim values) is
  /// allowed by the mask at `mask` (§10.6 check 14d).
  template <class T>
  bool allows(const T* mask, const double* action) const noexcept;
};

}  // namespace tether
