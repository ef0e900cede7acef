// Tensor objects (§10.9): reading them with the errors of INVALID_TENSOR, and
// writing bytes and floats inline (base64) or into an attachment.
#include "tether/tensors.h"

#include <cstring>
#include <utility>

#include "json_util.h"
#include "tether/onnx_codec.h"

namespace tether {
namespace {

// Byte counts saturate here: 32 dimensions of 2^31 - 1 overflow any integer,
// and no body holds this much, so a saturated count is always refused.
constexpr std::uint64_t kByteCap = std::uint64_t{1} << 60;

Status invalid_tensor(const std::string& why) { return Status(ErrorCode::kInvalidTensor, why); }

std::string dims_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// prod(shape) * item bytes, saturating at kByteCap (0 when a dimension is 0).
std::uint64_t byte_count(const std::vector<std::int64_t>& shape, std::size_t item) {
  std::uint64_t n = item;
  for (std::int64_t d : shape) {
    if (d == 0) return 0;
  }
  for (std::int64_t d : shape) {
    const auto u = static_cast<std::uint64_t>(d);
    n = n > kByteCap / u ? kByteCap : n * u;
  }
  return n;
}

// A shape an encoder may write: 1 to 32 dimensions from 0 to 2^31 - 1 holding `count` elements.
Status check_shape(const void* values, const std::vector<std::int64_t>& shape, std::size_t count) {
  if (values == nullptr && count > 0) return Status(ErrorCode::kInvalidArgument, "a tensor's values are missing");
  bool valid = !shape.empty() && shape.size() <= kMaxTensorRank;
  for (std::int64_t d : shape) valid = valid && d >= 0 && d <= kMaxTensorDim;
  if (!valid) {
    return Status(ErrorCode::kInvalidArgument, "a tensor's shape is 1 to " + std::to_string(kMaxTensorRank) +
                                                   " dimensions from 0 to " + std::to_string(kMaxTensorDim) +
                                                   ", got " + dims_text(shape));
  }
  if (byte_count(shape, 1) != count) {
    return Status(ErrorCode::kInvalidArgument, "a tensor of shape " + dims_text(shape) + " holds prod(shape) elements, got " +
                                                   std::to_string(count));
  }
  return Status::Ok();
}

void append_float_le(float value, std::string& out) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  const char bytes[4] = {static_cast<char>(bits & 0xFFu), static_cast<char>((bits >> 8) & 0xFFu),
                         static_cast<char>((bits >> 16) & 0xFFu), static_cast<char>(bits >> 24)};
  out.append(bytes, 4);
}

nlohmann::json tensor_object(TensorDtype dtype, const std::vector<std::int64_t>& shape) {
  nlohmann::json dims = nlohmann::json::array();
  for (std::int64_t d : shape) dims.push_back(d);
  return {{"dtype", std::string(to_string(dtype))}, {"shape", std::move(dims)}};
}

nlohmann::json inline_object(TensorDtype dtype, const std::vector<std::int64_t>& shape, const std::uint8_t* data,
                             std::size_t size) {
  nlohmann::json out = tensor_object(dtype, shape);
  out["b64"] = base64_encode(data, size);
  return out;
}

}  // namespace

std::string_view to_string(TensorDtype dtype) noexcept {
  return dtype == TensorDtype::kFloat32 ? std::string_view("float32") : std::string_view("uint8");
}

std::size_t element_size(TensorDtype dtype) noexcept { return dtype == TensorDtype::kFloat32 ? 4 : 1; }

std::string_view Tensor::bytes() const noexcept {
  if (in_attachment_) return view_;
  return std::string_view(reinterpret_cast<const char*>(decoded_.data()), decoded_.size());
}

double Tensor::value(std::size_t i) const noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes().data());
  if (dtype_ == TensorDtype::kUint8) return static_cast<double>(p[i]);
  p += i * 4;  // (no alignment is required in an attachment: read byte by byte)
  const std::uint32_t bits = static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
                             (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
  float value = 0.0f;
  std::memcpy(&value, &bits, sizeof value);
  return static_cast<double>(value);
}

void Tensor::values(std::vector<double>& out) const {
  out.resize(size_);
  for (std::size_t i = 0; i < size_; ++i) out[i] = value(i);
}

Result<Tensor> decode_tensor(const nlohmann::json& object, std::optional<std::string_view> attachment) {
  if (!object.is_object()) return invalid_tensor(std::string("a tensor is a JSON object, got ") + object.type_name());
  const nlohmann::json* dtype = detail::member(object, "dtype");
  const nlohmann::json* shape = detail::member(object, "shape");
  const nlohmann::json* offset = detail::member(object, "offset");
  const nlohmann::json* b64 = detail::member(object, "b64");
  if (dtype == nullptr || shape == nullptr || (offset == nullptr) == (b64 == nullptr) || object.size() != 3) {
    std::string members;
    for (const auto& item : object.items()) members += (members.empty() ? "'" : ", '") + item.key() + "'";
    return invalid_tensor("a tensor has exactly the members dtype, shape and one of b64 and offset, got [" + members + "]");
  }
  Tensor tensor;
  const std::string* name = dtype->is_string() ? &dtype->get_ref<const std::string&>() : nullptr;
  if (name != nullptr && *name == "uint8") {
    tensor.dtype_ = TensorDtype::kUint8;
  } else if (name != nullptr && *name == "float32") {
    tensor.dtype_ = TensorDtype::kFloat32;
  } else {
    return invalid_tensor("tensor dtype must be one of uint8, float32, got " + detail::describe(*dtype));
  }
  bool valid_shape = shape->is_array() && !shape->empty() && shape->size() <= kMaxTensorRank;
  if (valid_shape) {
    for (const nlohmann::json& d : *shape) {
      // (a JSON integer: not a boolean, not 2.0; as_int64 clamps a huge unsigned one, still out of range)
      if (!detail::is_integer(d) || detail::as_int64(d) < 0 || detail::as_int64(d) > kMaxTensorDim) {
        valid_shape = false;
        break;
      }
      tensor.shape_.push_back(detail::as_int64(d));
    }
  }
  if (!valid_shape) {
    return invalid_tensor("tensor shape must be a list of 1 to " + std::to_string(kMaxTensorRank) + " integers from 0 to " +
                   std::to_string(kMaxTensorDim) + ", got " + detail::describe(*shape));
  }
  const std::uint64_t expected = byte_count(tensor.shape_, element_size(tensor.dtype_));
  const std::string what = "tensor of shape " + dims_text(tensor.shape_) + " and dtype " +
                           std::string(to_string(tensor.dtype_));
  if (offset != nullptr) {
    if (!detail::is_integer(*offset) || detail::as_int64(*offset) < 0) {
      return invalid_tensor("tensor offset must be an integer >= 0, got " + detail::describe(*offset));
    }
    if (!attachment) return invalid_tensor("tensor offset refers to the attachment, but the body has none");
    // (as_int64 clamps a huge unsigned offset to INT64_MAX: past any attachment's end all the same)
    const auto start = static_cast<std::uint64_t>(detail::as_int64(*offset));
    const std::uint64_t held = attachment->size();
    if (start > held || expected > held - start) {
      return invalid_tensor(what + " needs " + std::to_string(expected) + " bytes at offset " + std::to_string(start) +
                     ", but the attachment holds " + std::to_string(held));
    }
    tensor.in_attachment_ = true;
    tensor.view_ = attachment->substr(static_cast<std::size_t>(start), static_cast<std::size_t>(expected));
  } else {
    if (!b64->is_string()) return invalid_tensor(std::string("tensor b64 must be a string, got ") + b64->type_name());
    const std::string& text = b64->get_ref<const std::string&>();
    // Checked before decoding: a short header cannot make this side decode (or allocate) more than it got.
    const std::uint64_t chars = 4 * ((expected + 2) / 3);
    if (text.size() != chars) {
      return invalid_tensor(what + " holds " + std::to_string(expected) + " bytes: its b64 must be " + std::to_string(chars) +
                     " characters, got " + std::to_string(text.size()));
    }
    Result<std::vector<std::uint8_t>> raw = base64_decode(text);
    if (!raw.ok()) return invalid_tensor("tensor b64 is not valid base64 (standard alphabet, padded)");
    if (raw.value().size() != expected) {
      return invalid_tensor("tensor b64 decodes to " + std::to_string(raw.value().size()) + " bytes, its shape and dtype need " +
                     std::to_string(expected));
    }
    tensor.decoded_ = std::move(raw).value();
  }
  tensor.size_ = static_cast<std::size_t>(expected / element_size(tensor.dtype_));
  return tensor;
}

Result<nlohmann::json> encode_tensor(const std::uint8_t* values, std::size_t count,
                                     const std::vector<std::int64_t>& shape) {
  Status status = check_shape(values, shape, count);
  if (!status.ok()) return status;
  return inline_object(TensorDtype::kUint8, shape, values, count);
}

Result<nlohmann::json> encode_tensor(const float* values, std::size_t count, const std::vector<std::int64_t>& shape) {
  Status status = check_shape(values, shape, count);
  if (!status.ok()) return status;
  std::string bytes;
  bytes.reserve(count * 4);
  for (std::size_t i = 0; i < count; ++i) append_float_le(values[i], bytes);
  return inline_object(TensorDtype::kFloat32, shape, reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
}

Result<nlohmann::json> encode_tensor_at(const std::uint8_t* values, std::size_t count,
                                        const std::vector<std::int64_t>& shape, std::string& attachment) {
  Status status = check_shape(values, shape, count);
  if (!status.ok()) return status;
  nlohmann::json out = tensor_object(TensorDtype::kUint8, shape);
  out["offset"] = static_cast<std::uint64_t>(attachment.size());
  if (count > 0) attachment.append(reinterpret_cast<const char*>(values), count);
  return out;
}

Result<nlohmann::json> encode_tensor_at(const float* values, std::size_t count,
                                        const std::vector<std::int64_t>& shape, std::string& attachment) {
  Status status = check_shape(values, shape, count);
  if (!status.ok()) return status;
  nlohmann::json out = tensor_object(TensorDtype::kFloat32, shape);
  out["offset"] = static_cast<std::uint64_t>(attachment.size());
  attachment.reserve(attachment.size() + count * 4);
  for (std::size_t i = 0; i < count; ++i) append_float_le(values[i], attachment);
  return out;
}

}  // namespace tether
