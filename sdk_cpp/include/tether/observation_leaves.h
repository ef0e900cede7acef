// One composite observation (protocol 1.4, §8.6) as an engine hands it: each
// leaf's values straight from the engine's own arrays, by leaf, with nothing
// concatenated by the engine and nothing allocated per frame.
//
//   tether::ObservationLeaves obs(client->observation_space());   // once
//   const int board = obs.index("observation"), mask = obs.index("action_mask");
//   // every frame:
//   obs.set(board, board_values, 18);     // float or uint8 arrays, by index or path
//   obs.set(mask, legal_moves, 9);
//   client->get_action(episode, obs, &action, 1);
//
// The arrays are not copied by set(): they must stay valid until the call
// that reads them (get_action, end_episode) returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tether/spaces.h"
#include "tether/status.h"

namespace tether {

/// The leaves of one observation of a Dict or Tuple space, each a view of
/// the engine's values. Reuse one object per agent: set every leaf, act,
/// set them again the next frame (a set() replaces the leaf's view).
class ObservationLeaves {
 public:
  /// An object bound to no space (every set() fails): bind() it first.
  ObservationLeaves() = default;
  /// Bound to `space`'s leaves (see bind()).
  explicit ObservationLeaves(const Space& space) { bind(space); }

  /// Binds to `space`'s leaves, forgetting every view (allocates: once, at
  /// setup). INVALID_ARGUMENT when the space is not a Dict or Tuple.
  Status bind(const Space& space);
  /// The space bound.
  const Space& space() const noexcept { return space_; }
  /// The index of the leaf at `path` (resolve it once, then set by index), or -1.
  int index(std::string_view path) const noexcept { return space_.leaf_index(path); }

  /// Views `count` floats as leaf `leaf`'s values (flattened row-major; a
  /// byte box's as integers 0-255). OBS_LEAF_MISMATCH for no such leaf,
  /// OBS_SHAPE_MISMATCH when count is not the leaf's size. A refused set()
  /// is also returned by write_row() (so by get_action) until clear().
  Status set(int leaf, const float* values, std::size_t count);
  /// Views `count` bytes as leaf `leaf`'s values (a camera image, or any leaf).
  Status set(int leaf, const std::uint8_t* values, std::size_t count);
  /// set() by leaf path (a lookup per call; no allocation).
  Status set(std::string_view path, const float* values, std::size_t count);
  /// set() by leaf path, bytes.
  Status set(std::string_view path, const std::uint8_t* values, std::size_t count);
  /// Forgets every view and refused set().
  void clear() noexcept;

  /// Writes the observation's flat row (`size` = space().flat_dim() floats,
  /// leaves in leaf order). The first refused set(), else OBS_LEAF_MISMATCH
  /// naming a leaf never set; INVALID_ARGUMENT for a wrong `size`.
  /// Values are copied as they are: the client checks them (finite, bytes, mask).
  Status write_row(float* row, std::size_t size) const;

 private:
  struct View {
    const float* floats = nullptr;
    const std::uint8_t* bytes = nullptr;
  };
  Status accept(int leaf, const float* floats, const std::uint8_t* bytes, std::size_t count);
  Status refuse(Status status);
  Status unknown(std::string_view path);

  Space space_;
  std::vector<View> views_;
  Status refused_;
};

/// Checks one flat row of a space (`what` starts the messages):
/// NON_FINITE_VALUE for a NaN or infinity, OBS_DTYPE_MISMATCH for a byte
/// box's (or byte leaf's) value that is not an integer 0-255, naming the
/// leaf of a composite space. `size` must be space.flat_dim().
Status check_observation_row(const Space& space, const float* row, std::size_t size, const char* what);

/// check_observation_row without the finiteness scan, for a row whose values
/// are already known to be finite (a frame checked whole): OBS_DTYPE_MISMATCH
/// only.
Status check_observation_bytes(const Space& space, const float* row, std::size_t size, const char* what);

}  // namespace tether
