// Unit tests of the frame encoder and the incremental decoder.
#include <gtest/gtest.h>

#include "tether/framing.h"

namespace tether {
namespace {

TEST(Framing, EncodesEightDigitHeader) {
  Result<std::string> frame = encode_frame("{\"type\": \"PING\"}");
  ASSERT_TRUE(frame.ok());
  EXPECT_EQ(frame.value(), "00000016{\"type\": \"PING\"}");
  EXPECT_EQ(encode_frame("").value(), "00000000");
}

TEST(Framing, RoundTripInPieces) {
  std::string stream;
  ASSERT_TRUE(append_frame("abc", stream).ok());
  ASSERT_TRUE(append_frame("", stream).ok());
  ASSERT_TRUE(append_frame("{\"x\":1}", stream).ok());
  for (std::size_t step : {std::size_t{1}, std::size_t{3}, stream.size()}) {
    FrameDecoder decoder;
    std::vector<std::string> bodies;
    for (std::size_t i = 0; i < stream.size(); i += step) {
      ASSERT_TRUE(decoder.feed(std::string_view(stream).substr(i, step), bodies).ok());
    }
    EXPECT_EQ(bodies, (std::vector<std::string>{"abc", "", "{\"x\":1}"}));
    EXPECT_EQ(decoder.buffered_bytes(), 0u);
  }
}

TEST(Framing, ErrorIsSticky) {
  FrameDecoder decoder;
  std::vector<std::string> bodies;
  Status status = decoder.feed("00000002{}xxxxxxxx", bodies);
  EXPECT_EQ(status.code(), ErrorCode::kBadHeader);
  EXPECT_EQ(bodies, std::vector<std::string>{"{}"});
  EXPECT_EQ(decoder.feed("00000002{}", bodies).code(), ErrorCode::kBadHeader);
  EXPECT_EQ(decoder.next_body().status().code(), ErrorCode::kBadHeader);
  EXPECT_TRUE(decoder.failed());
}

TEST(Framing, LimitAppliesPerFrame) {
  FrameDecoder decoder(4);
  ASSERT_TRUE(decoder.add("00000004abcd00000005abcde").ok());
  Result<std::optional<std::string>> first = decoder.next_body();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first.value(), "abcd");
  decoder.set_max_frame_bytes(5);
  Result<std::optional<std::string>> second = decoder.next_body();
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second.value(), "abcde");
  FrameDecoder small(4);
  std::vector<std::string> bodies;
  EXPECT_EQ(small.feed("00000005", bodies).code(), ErrorCode::kFrameTooLarge);
}

TEST(Framing, PartialFrameWaits) {
  FrameDecoder decoder;
  std::vector<std::string> bodies;
  ASSERT_TRUE(decoder.feed("0000000", bodies).ok());
  ASSERT_TRUE(decoder.feed("5ab", bodies).ok());
  EXPECT_TRUE(bodies.empty());
  EXPECT_EQ(decoder.buffered_bytes(), 10u);
  ASSERT_TRUE(decoder.feed("cde", bodies).ok());
  EXPECT_EQ(bodies, std::vector<std::string>{"abcde"});
}

}  // namespace
}  // namespace tether
