// Helpers both clients use on flat row-major step arrays, their random ids and
// their queues of errors (internal to the SDK's sources).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "tether/distributions.h"
#include "tether/status.h"

namespace tether {
namespace detail {

/// Removes the first `rows` rows of `width` values, keeping the capacity.
template <class T>
void erase_rows(std::vector<T>& values, std::size_t rows, std::size_t width) {
  const std::size_t n = std::min(values.size(), rows * width);
  values.erase(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(n));
}

/// Replaces `to` with the first `rows` rows of `width` values of `from`.
template <class T, class U>
void copy_rows(const std::vector<T>& from, std::size_t rows, std::size_t width, std::vector<U>& to) {
  const std::size_t n = std::min(from.size(), rows * width);
  to.assign(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(n));
}

/// The oldest of the errors not returned yet (removed: each is returned
/// once), or ok when there is none.
inline Status take_oldest(std::deque<Status>& errors) {
  if (errors.empty()) return Status::Ok();
  Status status = std::move(errors.front());
  errors.pop_front();
  return status;
}

/// 32 random hex digits (an episode or client-session id).
inline std::string random_hex_id(Rng& rng) {
  static const char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  std::uint64_t bits = 0;
  for (std::size_t i = 0; i < id.size(); ++i) {
    if (i % 16 == 0) bits = rng.next_u64();
    id[i] = kHex[bits & 15u];
    bits >>= 4;
  }
  return id;
}

}  // namespace detail
}  // namespace tether
