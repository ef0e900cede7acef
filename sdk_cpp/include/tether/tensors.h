// Binary tensors (docs/protocol.md §10.9, protocol 1.4): an array of numbers
// written as its raw bytes instead of one JSON number per value, either in the
// body's binary attachment (§4.3) or inline as base64:
//   {"dtype": "uint8", "shape": [3, 84, 84, 4], "offset": 0}
//   {"dtype": "uint8", "shape": [3, 84, 84, 4], "b64": "AAECAwQF..."}
// The bytes are the elements in row-major (C) order, each little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/status.h"

namespace tether {

/// The element type of a tensor (§10.9).
enum class TensorDtype {
  kUint8,    ///< "uint8": one byte, 0-255
  kFloat32,  ///< "float32": IEEE 754 binary32, four bytes
};

/// The wire spelling of a dtype ("uint8", "float32").
std::string_view to_string(TensorDtype dtype) noexcept;

/// The bytes of one element: 1 for uint8, 4 for float32.
std::size_t element_size(TensorDtype dtype) noexcept;

/// The most dimensions a tensor may have (§10.9).
inline constexpr std::size_t kMaxTensorRank = 32;
/// The largest dimension a tensor may have (2^31 - 1, §10.9).
inline constexpr std::int64_t kMaxTensorDim = 2147483647;

class Tensor;

/// Reads a tensor object (§10.9). `attachment` is the body's attachment
/// (Message::attachment; std::nullopt when the body has none). INVALID_TENSOR,
/// naming the member, when a member is missing, unknown or of the wrong type,
/// when dtype is not "uint8" or "float32", when the shape is not 1 to 32 JSON
/// integers from 0 to 2^31 - 1, when both or neither of "offset" and "b64"
/// are present, when "offset" refers to bytes past the attachment's end (or
/// there is no attachment), or when "b64" is not padded standard base64 of
/// exactly prod(shape) * element_size(dtype) bytes. The length of "b64" is
/// checked before anything is decoded. A tensor read at an offset is a view
/// into the attachment: it is valid only as long as the body is.
Result<Tensor> decode_tensor(const nlohmann::json& object,
                             std::optional<std::string_view> attachment = std::nullopt);

/// A tensor read from a tensor object: its dtype, its shape and its
/// elements' bytes (row-major, little-endian).
class Tensor {
 public:
  /// An empty uint8 tensor; decode_tensor makes the ones that hold data.
  Tensor() = default;

  /// The element type.
  TensorDtype dtype() const noexcept { return dtype_; }
  /// The shape (1 to 32 dimensions).
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  /// The number of elements, prod(shape).
  std::size_t size() const noexcept { return size_; }
  /// The elements' bytes, size() * element_size(dtype()) of them: a view into
  /// the attachment (in_attachment()) or into this tensor's decoded base64.
  std::string_view bytes() const noexcept;
  /// Whether the bytes are read in place from the attachment ("offset").
  bool in_attachment() const noexcept { return in_attachment_; }
  /// Element `i` (< size()): a byte as 0-255, or the float32 value, exactly.
  double value(std::size_t i) const noexcept;
  /// Every element as by value(), in row-major order, replacing `out`'s contents.
  void values(std::vector<double>& out) const;

 private:
  friend Result<Tensor> decode_tensor(const nlohmann::json& object, std::optional<std::string_view> attachment);

  TensorDtype dtype_ = TensorDtype::kUint8;
  std::vector<std::int64_t> shape_;
  std::size_t size_ = 0;
  bool in_attachment_ = false;
  std::string_view view_;              // the attachment's bytes (offset)
  std::vector<std::uint8_t> decoded_;  // the decoded bytes (b64)
};

/// The inline tensor object {"dtype": "uint8", "shape": shape, "b64": ...} of
/// `count` bytes. INVALID_ARGUMENT when `shape` is not 1 to 32 dimensions
/// from 0 to 2^31 - 1 or `count` is not prod(shape).
Result<nlohmann::json> encode_tensor(const std::uint8_t* values, std::size_t count,
                                     const std::vector<std::int64_t>& shape);

/// The inline tensor object {"dtype": "float32", "shape": shape, "b64": ...}
/// of `count` floats (written little-endian). Errors as for bytes.
Result<nlohmann::json> encode_tensor(const float* values, std::size_t count, const std::vector<std::int64_t>& shape);

/// The tensor object {"dtype": "uint8", "shape": shape, "offset": N} whose
/// `count` bytes are appended to `attachment`, N being its size before.
/// Errors as for encode_tensor (nothing is appended then).
Result<nlohmann::json> encode_tensor_at(const std::uint8_t* values, std::size_t count,
                                        const std::vector<std::int64_t>& shape, std::string& attachment);

/// The tensor object {"dtype": "float32", "shape": shape, "offset": N} whose
/// `count` floats are appended to `attachment` (little-endian), N being its
/// size before. Errors as for encode_tensor (nothing is appended then).
Result<nlohmann::json> encode_tensor_at(const float* values, std::size_t count,
                                        const std::vector<std::int64_t>& shape, std::string& attachment);

}  // namespace tether
