// Models with memory (protocol 1.5): the state tensors a module's model takes
// and returns beside the observation and the dist inputs (§9.1, §12.1), and
// the record field that says which state a chunk started from (§10.1 state_in).
// The client, never the engine, carries the state from step to step (§12.4).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/status.h"

namespace tether {

/// One state tensor of a model with memory (§9.1 "recurrent_state"): the
/// model takes the state before a step as input `input` and returns the state
/// after it as output `output`, both float32 (batch, size).
struct RecurrentStateSpec {
  std::string input;      ///< the model input that takes the state before the step ("state_in_h")
  std::string output;     ///< the model output that returns the state after it ("state_out_h")
  std::size_t size = 0;   ///< units per row, 1..kMaxRecurrentStateSize

  /// Same names and size (a model of another state cannot continue this one's, §12.4).
  bool operator==(const RecurrentStateSpec& other) const noexcept {
    return input == other.input && output == other.output && size == other.size;
  }
  /// Not operator==.
  bool operator!=(const RecurrentStateSpec& other) const noexcept { return !(*this == other); }
};

/// The most units one state tensor may have (§9.1).
inline constexpr std::size_t kMaxRecurrentStateSize = 4096;

/// Parses a "recurrent_state" member (§9.1, §7.4): absent (null pointer) or
/// JSON null gives an empty list (a model without memory). INVALID_FIELD,
/// naming `where`, for anything but a non-empty array of objects with
/// non-empty string "input" and "output" and an integer "size" from 1 to
/// kMaxRecurrentStateSize (not a boolean, not 3.5), for a name used twice
/// (inputs and outputs together), or for entries of different sizes.
Result<std::vector<RecurrentStateSpec>> recurrent_state_from_json(const nlohmann::json* value,
                                                                  const std::string& where);

/// The floats one actor's state holds: tensors x size (0 without memory).
/// An actor's state is laid out tensor after tensor, in the order of `state`.
inline std::size_t recurrent_state_dim(const std::vector<RecurrentStateSpec>& state) noexcept {
  return state.empty() ? 0 : state.size() * state.front().size;
}

/// The "state_in" object of a record (§10.1): input name -> its `size` values
/// of `values` (recurrent_state_dim(state) floats, tensor after tensor), as
/// JSON numbers of the float32 values.
nlohmann::json state_in_json(const std::vector<RecurrentStateSpec>& state, const float* values);

}  // namespace tether
