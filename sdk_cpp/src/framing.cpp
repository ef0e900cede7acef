// RLlink framing: the 8-digit length header and the incremental decoder.
#include "tether/framing.h"

#include <cstdio>

namespace tether {

Status append_frame(std::string_view body, std::string& out) {
  if (body.size() > kMaxEncodableBody) {
    return Status(ErrorCode::kFrameTooLarge, "a body of " + std::to_string(body.size()) +
                                                 " bytes does not fit an 8-digit header");
  }
  char header[kFrameHeaderSize + 1];
  std::snprintf(header, sizeof header, "%08zu", body.size());
  out.reserve(out.size() + kFrameHeaderSize + body.size());
  out.append(header, kFrameHeaderSize);
  out.append(body.data(), body.size());
  return Status::Ok();
}

Result<std::string> encode_frame(std::string_view body) {
  std::string out;
  Status status = append_frame(body, out);
  if (!status.ok()) return status;
  return out;
}

Status FrameDecoder::add(std::string_view data) {
  if (!error_.ok()) return error_;
  buffer_.append(data.data(), data.size());
  return Status::Ok();
}

Status FrameDecoder::feed(std::string_view data, std::vector<std::string>& bodies) {
  Status status = add(data);
  if (!status.ok()) return status;
  while (true) {
    Result<std::optional<std::string>> next = next_body();
    if (!next.ok()) return next.status();
    if (!next.value().has_value()) return Status::Ok();
    bodies.push_back(std::move(*next.value()));
  }
}

Result<std::optional<std::string>> FrameDecoder::next_body() {
  if (!error_.ok()) return error_;
  if (buffer_.size() - pos_ < kFrameHeaderSize) return std::optional<std::string>();
  std::size_t length = 0;
  for (std::size_t i = 0; i < kFrameHeaderSize; ++i) {
    const char c = buffer_[pos_ + i];
    if (c < '0' || c > '9') {
      std::string shown;
      for (std::size_t j = 0; j < kFrameHeaderSize; ++j) {
        const unsigned char b = static_cast<unsigned char>(buffer_[pos_ + j]);
        if (b >= 0x20 && b < 0x7f) {
          shown += static_cast<char>(b);
        } else {
          char hex[5];
          std::snprintf(hex, sizeof hex, "\\x%02x", b);
          shown += hex;
        }
      }
      return fail(ErrorCode::kBadHeader, "frame header must be 8 ASCII digits, got '" + shown + "'");
    }
    length = length * 10 + static_cast<std::size_t>(c - '0');
  }
  if (length > max_frame_bytes_) {
    return fail(ErrorCode::kFrameTooLarge, "frame body of " + std::to_string(length) +
                                               " bytes exceeds the limit of " +
                                               std::to_string(max_frame_bytes_) + " bytes");
  }
  const std::size_t start = pos_ + kFrameHeaderSize;
  if (buffer_.size() - start < length) return std::optional<std::string>();
  std::optional<std::string> body(std::in_place, buffer_, start, length);
  pos_ = start + length;
  // Compact once consumed bytes dominate, so the buffer does not grow forever.
  if (pos_ * 2 >= buffer_.size()) {
    buffer_.erase(0, pos_);
    pos_ = 0;
  }
  return body;
}

Status FrameDecoder::fail(ErrorCode code, std::string message) {
  error_ = Status(code, std::move(message));
  buffer_.clear();
  buffer_.shrink_to_fit();
  pos_ = 0;
  return error_;
}

}  // namespace tether
