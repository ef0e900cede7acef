// RLlink framing (docs/protocol.md §3): every message is an 8-digit ASCII
// decimal length header followed by that many bytes of body. Sans-I/O: bytes
// in, bodies out; the transport only moves bytes.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tether/status.h"

namespace tether {

/// Bytes of the length header.
inline constexpr std::size_t kFrameHeaderSize = 8;
/// The largest body 8 decimal digits can announce.
inline constexpr std::size_t kMaxEncodableBody = 99999999;
/// Default receive limit (64 MiB), as the Python core.
inline constexpr std::size_t kDefaultMaxFrameBytes = 64u * 1024u * 1024u;

/// Appends the frame of `body` (header then body) to `out`; FRAME_TOO_LARGE
/// when the body does not fit in 8 digits (nothing is appended then).
Status append_frame(std::string_view body, std::string& out);

/// The frame of `body`; FRAME_TOO_LARGE when it does not fit in 8 digits.
Result<std::string> encode_frame(std::string_view body);

/// Incremental frame parser: feed bytes in any pieces, take complete bodies.
///
/// A header that is not 8 ASCII digits (BAD_HEADER) or that announces more
/// than `max_frame_bytes` (FRAME_TOO_LARGE) breaks the stream: the error is
/// sticky, every later call returns it, and buffered bytes are dropped.
/// Complete frames received before the bad header are still delivered.
class FrameDecoder {
 public:
  /// A decoder refusing bodies larger than `max_frame_bytes`.
  explicit FrameDecoder(std::size_t max_frame_bytes = kDefaultMaxFrameBytes)
      : max_frame_bytes_(max_frame_bytes) {}

  /// Adds bytes and appends every body they complete to `bodies`, in order.
  /// Returns the framing error if the stream broke (now or before); bodies
  /// completed before the bad header are appended all the same.
  Status feed(std::string_view data, std::vector<std::string>& bodies);

  /// Buffers bytes without parsing them (take bodies with next_body()).
  Status add(std::string_view data);

  /// The next complete body, std::nullopt until more bytes arrive, or the
  /// framing error. Taking one body at a time lets a caller change the limit
  /// between frames.
  Result<std::optional<std::string>> next_body();

  /// The error that ended this stream (ok while the stream is sound).
  const Status& error() const noexcept { return error_; }
  /// Whether the stream is broken.
  bool failed() const noexcept { return !error_.ok(); }
  /// Bytes received but not yet returned as a body (a partial frame).
  std::size_t buffered_bytes() const noexcept { return buffer_.size() - pos_; }
  /// The current limit on a body's size.
  std::size_t max_frame_bytes() const noexcept { return max_frame_bytes_; }
  /// Changes the limit for the frames not yet parsed.
  void set_max_frame_bytes(std::size_t limit) noexcept { max_frame_bytes_ = limit; }

 private:
  Status fail(ErrorCode code, std::string message);

  std::size_t max_frame_bytes_;
  std::string buffer_;
  std::size_t pos_ = 0;
  Status error_;
};

}  // namespace tether
