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

/// The payload of one or more gzip members (RFC 1952), CRC-32 and length checked.
/// INVALID_FIELD when the data is not gzip or is corrupt; `max_size` bounds the output.
Result<std::vector<std::uint8_t>> gunzip(const std::uint8_t* data, std::size_t size,
                                         std::size_t max_size = 1u << 30);

/// The model bytes of an onnx_file field: base64 decode then gunzip. INVALID_FIELD when corrupt.
Result<std::vector<std::uint8_t>> decode_onnx_file(std::string_view field);

}  // namespace tether
