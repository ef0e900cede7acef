// Logged actions (docs/protocol.md §10.1, protocol 1.6): an action the
// policy did not choose (a human player, a scripted bot, another controller),
// which a client records beside the sampled ones. It is checked here as a
// server checks a record's action (§10.6 checks 12-14d), so that a step the
// server would refuse the whole batch for is refused at the call instead.
#pragma once

#include <cstddef>

#include "tether/action_mask.h"
#include "tether/spaces.h"
#include "tether/status.h"

namespace tether {

/// Checks a logged action of `action_size` flat values against `action_space`:
/// ACTION_OUT_OF_SPACE for another size than action_space.flat_dim() (or a
/// null `action`), or a Discrete / MultiDiscrete value that is not an
/// integer in the space; NON_FINITE_VALUE for a NaN or an infinity; with
/// `mask` (the module's action mask, §11.6) and `obs_row` (the flat
/// observation the action was taken on) ACTION_MASKED for an action the
/// mask forbids. A Box action may lie outside its bounds: a record carries
/// actions as taken (§11.4). `what` starts the message ("log_action: the action").
Status check_logged_action(const Space& action_space, const double* action, std::size_t action_size,
                           const ActionMask* mask, const float* obs_row, const char* what);

}  // namespace tether
