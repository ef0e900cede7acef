// Unit tests of tensor objects (protocol 1.4, §10.9) beyond the shared vectors:
// attachments shared and read in place, sizes that overflow, what the encoders refuse.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "tether/tensors.h"

namespace tether {
namespace {

using nlohmann::json;

json tensor(const char* dtype, json shape, const char* where, json value) {
  return {{"dtype", dtype}, {"shape", std::move(shape)}, {where, std::move(value)}};
}

ErrorCode code_of(const json& object, std::optional<std::string_view> attachment = std::nullopt) {
  return decode_tensor(object, attachment).status().code();
}

TEST(Tensors, ReadsInPlaceFromASharedAttachment) {
  const std::string attachment("\x01\x02\x03\x04\x00\x00\xc0\x3f", 8);
  // Two tensors over overlapping bytes: both read, neither copies.
  Result<Tensor> bytes = decode_tensor(tensor("uint8", {2, 2}, "offset", 0), attachment);
  Result<Tensor> floats = decode_tensor(tensor("float32", {1}, "offset", 4), attachment);
  Result<Tensor> overlapping = decode_tensor(tensor("uint8", {6}, "offset", 2), attachment);
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  ASSERT_TRUE(floats.ok()) << floats.status().to_string();
  ASSERT_TRUE(overlapping.ok()) << overlapping.status().to_string();
  EXPECT_TRUE(bytes.value().in_attachment());
  EXPECT_EQ(bytes.value().bytes().data(), attachment.data());
  EXPECT_EQ(bytes.value().value(3), 4.0);
  EXPECT_EQ(floats.value().value(0), 1.5);
  EXPECT_EQ(overlapping.value().size(), 6u);
  // The last byte exactly, and one past it.
  EXPECT_TRUE(decode_tensor(tensor("uint8", {1}, "offset", 7), attachment).ok());
  EXPECT_EQ(code_of(tensor("uint8", {1}, "offset", 8), attachment), ErrorCode::kInvalidTensor);
  EXPECT_TRUE(decode_tensor(tensor("uint8", {0}, "offset", 8), attachment).ok());
  EXPECT_EQ(code_of(tensor("uint8", {0}, "offset", 9), attachment), ErrorCode::kInvalidTensor);
}

TEST(Tensors, AnEmptyAttachmentIsNotNone) {
  // A body ending in its NUL has an attachment of 0 bytes: an empty tensor fits it.
  EXPECT_TRUE(decode_tensor(tensor("uint8", {0, 3}, "offset", 0), std::string_view()).ok());
  EXPECT_EQ(code_of(tensor("uint8", {0, 3}, "offset", 0)), ErrorCode::kInvalidTensor);
}

TEST(Tensors, SizesThatOverflowAreRefusedNotWrapped) {
  const std::string attachment(16, '\0');
  json huge = json::array();
  for (int i = 0; i < 32; ++i) huge.push_back(kMaxTensorDim);
  EXPECT_EQ(code_of(tensor("float32", huge, "offset", 0), attachment), ErrorCode::kInvalidTensor);
  EXPECT_EQ(code_of(tensor("float32", huge, "b64", "AAAA")), ErrorCode::kInvalidTensor);
  // 2^64 / 4 elements of float32 would wrap to 0 bytes in 64 bits.
  EXPECT_EQ(code_of(tensor("float32", {65536, 65536, 65536, 16384}, "b64", "")), ErrorCode::kInvalidTensor);
  // A zero dimension makes the product 0 bytes.
  EXPECT_TRUE(decode_tensor(tensor("float32", {0, 84, 84, 4}, "b64", "")).ok());
  // An offset beyond int64 and one beyond the end.
  EXPECT_EQ(code_of(tensor("uint8", {1}, "offset", std::numeric_limits<std::uint64_t>::max()), attachment),
            ErrorCode::kInvalidTensor);
  EXPECT_EQ(code_of(tensor("uint8", {2}, "offset", 15), attachment), ErrorCode::kInvalidTensor);
}

TEST(Tensors, Base64IsStrict) {
  EXPECT_TRUE(decode_tensor(tensor("uint8", {2}, "b64", "AAE=")).ok());
  EXPECT_EQ(code_of(tensor("uint8", {2}, "b64", "AA==")), ErrorCode::kInvalidTensor);   // decodes to 1 byte
  EXPECT_EQ(code_of(tensor("uint8", {2}, "b64", "AAE")), ErrorCode::kInvalidTensor);    // unpadded
  EXPECT_EQ(code_of(tensor("uint8", {2}, "b64", "A=E=")), ErrorCode::kInvalidTensor);   // padding inside
  EXPECT_EQ(code_of(tensor("uint8", {2}, "b64", "AA\nE")), ErrorCode::kInvalidTensor);  // a line break
  EXPECT_EQ(code_of(tensor("uint8", {3}, "b64", "AAE=")), ErrorCode::kInvalidTensor);   // needs 3 bytes
  EXPECT_EQ(code_of(tensor("uint8", {1}, "b64", nullptr)), ErrorCode::kInvalidTensor);
  EXPECT_EQ(code_of(json::array({1, 2})), ErrorCode::kInvalidTensor);
  EXPECT_EQ(code_of(tensor("uint8", {1}, "offset", true), std::string("x")), ErrorCode::kInvalidTensor);
}

TEST(Tensors, EncodesInlineAndIntoAnAttachment) {
  const std::uint8_t image[6] = {0, 1, 127, 128, 254, 255};
  Result<json> inline_bytes = encode_tensor(image, 6, {2, 3});
  ASSERT_TRUE(inline_bytes.ok()) << inline_bytes.status().to_string();
  EXPECT_EQ(inline_bytes.value(), tensor("uint8", {2, 3}, "b64", "AAF/gP7/"));

  const float values[2] = {1.5f, -2.0f};
  std::string attachment = "xy";  // bytes already there: the tensor starts after them
  Result<json> at = encode_tensor_at(values, 2, {2}, attachment);
  ASSERT_TRUE(at.ok()) << at.status().to_string();
  EXPECT_EQ(at.value(), tensor("float32", {2}, "offset", 2));
  EXPECT_EQ(attachment, std::string("xy\x00\x00\xc0\x3f\x00\x00\x00\xc0", 10));
  Result<Tensor> back = decode_tensor(at.value(), attachment);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  std::vector<double> read;
  back.value().values(read);
  EXPECT_EQ(read, (std::vector<double>{1.5, -2.0}));

  // Refused, and nothing appended: a count that is not prod(shape), a shape out of range.
  EXPECT_EQ(encode_tensor(image, 5, {2, 3}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(encode_tensor(image, 1, {}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(encode_tensor(image, 0, {-1}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(encode_tensor(static_cast<const std::uint8_t*>(nullptr), 1, {1}).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(encode_tensor_at(image, 0, std::vector<std::int64_t>(33, 1), attachment).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(attachment.size(), 10u);
  // An empty tensor: no bytes, and a nullptr is fine.
  EXPECT_EQ(encode_tensor(static_cast<const float*>(nullptr), 0, {0, 4}).value(), tensor("float32", {0, 4}, "b64", ""));
}

}  // namespace
}  // namespace tether
