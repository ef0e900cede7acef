// The onnx_file field of SET_STATE (docs/protocol.md §12.3):
// base64(gzip(ONNX model bytes)). Decoding needs no zlib: a small inflate
// (RFC 1951) and gzip member reader (RFC 1952) live in onnx_codec.cpp.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tether/status.h"

namespace tether {

/// Standard base64 (RFC 4648, with padding; whitespace is not accepted).
/// INVALID_FIELD when the text is not base64.
Result<std::vector<std::uint8_t>> base64_decode(std::string_view text);

/// The standard base64 text of `data` (with padding).
std::string base64_encode(const std::uint8_t* data, std::size_t size);

/// The largest model a client decodes (256 MiB). A game policy is kilobytes
/// to a few megabytes; the bound keeps a compressed "model" of a few
/// kilobytes (gzip expands up to ~1000x) from taking gigabytes.
inline constexpr std::size_t kMaxModelBytes = 256u << 20;

/// The payload of one or more gzip members (RFC 1952), CRC-32 and length checked.
/// INVALID_FIELD when the data is not gzip or is corrupt, or when the output
/// would exceed `max_size` bytes (checked while decoding, before it is reached).
Result<std::vector<std::uint8_t>> gunzip(const std::uint8_t* data, std::size_t size,
                                         std::size_t max_size = kMaxModelBytes);

/// The model bytes of an onnx_file field: base64 decode then gunzip. INVALID_FIELD when corrupt
/// or larger than `max_size` bytes.
Result<std::vector<std::uint8_t>> decode_onnx_file(std::string_view field, std::size_t max_size = kMaxModelBytes);

}  // namespace tether
