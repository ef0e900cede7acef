// base64 and gzip decoding for onnx_file (§12.3). The inflate follows the
// structure of zlib's reference decoder "puff" (canonical Huffman codes
// decoded bit by bit): small and dependency-free; a model is decoded once per
// update on the I/O thread, so speed matters little.
#include "tether/onnx_codec.h"

#include <array>
#include <cstring>
#include <string>

namespace tether {

namespace {

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

constexpr int kMaxBits = 15;
constexpr const char* kOverLimit = "model larger than the decoding limit";

struct Huffman {
  std::array<short, kMaxBits + 1> count{};
  std::array<short, 288> symbol{};
};

class Inflater {
 public:
  Inflater(const std::uint8_t* in, std::size_t size, std::size_t max_out, std::vector<std::uint8_t>& out)
      : in_(in), size_(size), max_out_(max_out), out_(out) {}

  // Inflates one raw deflate stream; returns an empty string on success, else why it failed.
  std::string run() {
    int last = 0;
    do {
      last = static_cast<int>(bits(1));
      int type = static_cast<int>(bits(2));
      if (!error_.empty()) break;
      if (type == 0) {
        stored();
      } else if (type == 1) {
        fixed();
      } else if (type == 2) {
        dynamic();
      } else {
        fail("invalid deflate block type 3");
      }
    } while (!last && error_.empty());
    return error_;
  }
  std::size_t consumed() const noexcept { return pos_; }

 private:
  void fail(const char* why) {
    if (error_.empty()) error_ = why;
  }

  std::uint32_t bits(int need) {
    std::uint32_t value = bitbuf_;
    while (bitcnt_ < need) {
      if (pos_ == size_) {
        fail("deflate data ends early");
        return 0;
      }
      value |= static_cast<std::uint32_t>(in_[pos_++]) << bitcnt_;
      bitcnt_ += 8;
    }
    bitbuf_ = value >> need;
    bitcnt_ -= need;
    return value & ((1u << need) - 1u);
  }

  void emit(std::uint8_t byte) {
    if (out_.size() >= max_out_) {
      fail(kOverLimit);
      return;
    }
    out_.push_back(byte);
  }

  void stored() {
    bitbuf_ = 0;
    bitcnt_ = 0;
    if (pos_ + 4 > size_) return fail("stored block header ends early");
    unsigned len = in_[pos_] | (in_[pos_ + 1] << 8);
    unsigned nlen = in_[pos_ + 2] | (in_[pos_ + 3] << 8);
    pos_ += 4;
    if (len != (~nlen & 0xffffu)) return fail("stored block length check failed");
    if (pos_ + len > size_) return fail("stored block ends early");
    if (out_.size() + len > max_out_) return fail(kOverLimit);
    out_.insert(out_.end(), in_ + pos_, in_ + pos_ + len);
    pos_ += len;
  }

  int decode(const Huffman& h) {
    int code = 0, first = 0, index = 0;
    for (int len = 1; len <= kMaxBits; ++len) {
      code |= static_cast<int>(bits(1));
      if (!error_.empty()) return -1;
      int count = h.count[len];
      if (code - count < first) return h.symbol[index + (code - first)];
      index += count;
      first += count;
      first <<= 1;
      code <<= 1;
    }
    fail("invalid Huffman code");
    return -1;
  }

  static int construct(Huffman& h, const short* length, int n) {
    h.count.fill(0);
    for (int symbol = 0; symbol < n; ++symbol) h.count[length[symbol]]++;
    if (h.count[0] == n) return 0;
    int left = 1;
    for (int len = 1; len <= kMaxBits; ++len) {
      left <<= 1;
      left -= h.count[len];
      if (left < 0) return left;
    }
    std::array<short, kMaxBits + 1> offs{};
    for (int len = 1; len < kMaxBits; ++len) offs[len + 1] = static_cast<short>(offs[len] + h.count[len]);
    for (int symbol = 0; symbol < n; ++symbol) {
      if (length[symbol] != 0) h.symbol[offs[length[symbol]]++] = static_cast<short>(symbol);
    }
    return left;
  }

  void codes(const Huffman& lencode, const Huffman& distcode) {
    static const short kLens[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                    31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
    static const short kLext[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
    static const int kDists[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                                   193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
    static const short kDext[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
    for (;;) {
      int symbol = decode(lencode);
      if (symbol < 0 || !error_.empty()) return;
      if (symbol < 256) {
        emit(static_cast<std::uint8_t>(symbol));
        if (!error_.empty()) return;
      } else if (symbol == 256) {
        return;
      } else {
        symbol -= 257;
        if (symbol >= 29) return fail("invalid length symbol");
        std::size_t len = static_cast<std::size_t>(kLens[symbol]) + bits(kLext[symbol]);
        symbol = decode(distcode);
        if (symbol < 0 || symbol >= 30) return fail("invalid distance symbol");
        std::size_t dist = static_cast<std::size_t>(kDists[symbol]) + bits(kDext[symbol]);
        if (!error_.empty()) return;
        if (dist > out_.size()) return fail("distance too far back");
        if (out_.size() + len > max_out_) return fail(kOverLimit);
        for (std::size_t i = 0; i < len; ++i) out_.push_back(out_[out_.size() - dist]);
      }
    }
  }

  struct FixedCodes {
    Huffman lencode, distcode;
    FixedCodes() {
      short lengths[288];
      int symbol = 0;
      for (; symbol < 144; ++symbol) lengths[symbol] = 8;
      for (; symbol < 256; ++symbol) lengths[symbol] = 9;
      for (; symbol < 280; ++symbol) lengths[symbol] = 7;
      for (; symbol < 288; ++symbol) lengths[symbol] = 8;
      construct(lencode, lengths, 288);
      for (symbol = 0; symbol < 30; ++symbol) lengths[symbol] = 5;
      construct(distcode, lengths, 30);
    }
  };

  void fixed() {
    static const FixedCodes tables;  // built once, thread-safe (magic statics)
    codes(tables.lencode, tables.distcode);
  }

  void dynamic() {
    static const short kOrder[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
    short lengths[320] = {0};
    Huffman lencode, distcode;
    int nlen = static_cast<int>(bits(5)) + 257;
    int ndist = static_cast<int>(bits(5)) + 1;
    int ncode = static_cast<int>(bits(4)) + 4;
    if (!error_.empty()) return;
    if (nlen > 286 || ndist > 30) return fail("bad dynamic block counts");
    int index = 0;
    for (; index < ncode; ++index) lengths[kOrder[index]] = static_cast<short>(bits(3));
    for (; index < 19; ++index) lengths[kOrder[index]] = 0;
    if (!error_.empty()) return;
    if (construct(lencode, lengths, 19) != 0) return fail("incomplete code-length code");
    index = 0;
    while (index < nlen + ndist) {
      int symbol = decode(lencode);
      if (symbol < 0) return fail("invalid code-length symbol");
      if (symbol < 16) {
        lengths[index++] = static_cast<short>(symbol);
      } else {
        short len = 0;
        if (symbol == 16) {
          if (index == 0) return fail("repeat with no first length");
          len = lengths[index - 1];
          symbol = 3 + static_cast<int>(bits(2));
        } else if (symbol == 17) {
          symbol = 3 + static_cast<int>(bits(3));
        } else {
          symbol = 11 + static_cast<int>(bits(7));
        }
        if (!error_.empty()) return;
        if (index + symbol > nlen + ndist) return fail("too many code lengths");
        while (symbol--) lengths[index++] = len;
      }
    }
    if (lengths[256] == 0) return fail("no end-of-block code");
    int err = construct(lencode, lengths, nlen);
    if (err < 0 || (err > 0 && nlen - lencode.count[0] != 1)) return fail("incomplete literal/length code");
    err = construct(distcode, lengths + nlen, ndist);
    if (err < 0 || (err > 0 && ndist - distcode.count[0] != 1)) return fail("incomplete distance code");
    codes(lencode, distcode);
  }

  const std::uint8_t* in_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::uint32_t bitbuf_ = 0;
  int bitcnt_ = 0;
  std::size_t max_out_;
  std::vector<std::uint8_t>& out_;
  std::string error_;
};

std::uint32_t crc32(const std::uint8_t* data, std::size_t size) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t n = 0; n < 256; ++n) {
      std::uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) c = table[(c ^ data[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t read_le32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

Status invalid(const std::string& why) { return Status(ErrorCode::kInvalidField, "onnx_file is not base64(gzip(onnx)): " + why); }

}  // namespace

Result<std::vector<std::uint8_t>> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) return invalid("base64 length " + std::to_string(text.size()) + " is not a multiple of 4");
  std::vector<std::uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      unsigned char c = static_cast<unsigned char>(text[i + k]);
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return invalid("base64 padding in the middle");
      v[k] = base64_value(c);
      if (v[k] < 0) return invalid("character " + std::to_string(i + k) + " is not base64");
    }
    std::uint32_t triple = (static_cast<std::uint32_t>(v[0]) << 18) | (static_cast<std::uint32_t>(v[1]) << 12) |
                           (static_cast<std::uint32_t>(v[2]) << 6) | static_cast<std::uint32_t>(v[3]);
    out.push_back(static_cast<std::uint8_t>(triple >> 16));
    if (pad < 2) out.push_back(static_cast<std::uint8_t>((triple >> 8) & 0xFFu));
    if (pad < 1) out.push_back(static_cast<std::uint8_t>(triple & 0xFFu));
  }
  return out;
}

std::string base64_encode(const std::uint8_t* data, std::size_t size) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  for (std::size_t i = 0; i < size; i += 3) {
    std::uint32_t triple = static_cast<std::uint32_t>(data[i]) << 16;
    if (i + 1 < size) triple |= static_cast<std::uint32_t>(data[i + 1]) << 8;
    if (i + 2 < size) triple |= data[i + 2];
    out += kAlphabet[(triple >> 18) & 63u];
    out += kAlphabet[(triple >> 12) & 63u];
    out += i + 1 < size ? kAlphabet[(triple >> 6) & 63u] : '=';
    out += i + 2 < size ? kAlphabet[triple & 63u] : '=';
  }
  return out;
}

Result<std::vector<std::uint8_t>> gunzip(const std::uint8_t* data, std::size_t size, std::size_t max_size) {
  std::vector<std::uint8_t> out;
  std::size_t pos = 0;
  do {
    if (size - pos < 18) return invalid("gzip data too short");
    const std::uint8_t* p = data + pos;
    if (p[0] != 0x1f || p[1] != 0x8b) return invalid("no gzip magic bytes");
    if (p[2] != 8) return invalid("gzip compression method is not deflate");
    const std::uint8_t flags = p[3];
    std::size_t at = pos + 10;
    if (flags & 4u) {
      if (at + 2 > size) return invalid("gzip header ends early");
      at += 2 + (data[at] | (data[at + 1] << 8));
    }
    for (std::uint8_t flag : {std::uint8_t{8}, std::uint8_t{16}}) {
      if (flags & flag) {
        while (at < size && data[at] != 0) ++at;
        ++at;
      }
    }
    if (flags & 2u) at += 2;
    if (at >= size) return invalid("gzip header ends early");
    const std::size_t start = out.size();
    Inflater inflater(data + at, size - at, max_size, out);
    std::string error = inflater.run();
    if (error == kOverLimit) error += " of " + std::to_string(max_size) + " bytes";
    if (!error.empty()) return invalid(error);
    at += inflater.consumed();
    if (at + 8 > size) return invalid("gzip trailer missing");
    if (crc32(out.data() + start, out.size() - start) != read_le32(data + at)) return invalid("gzip CRC-32 mismatch");
    if (static_cast<std::uint32_t>(out.size() - start) != read_le32(data + at + 4)) return invalid("gzip length mismatch");
    pos = at + 8;
  } while (pos < size && data[pos] == 0x1f);
  return out;
}

Result<std::vector<std::uint8_t>> decode_onnx_file(std::string_view field, std::size_t max_size) {
  Result<std::vector<std::uint8_t>> compressed = base64_decode(field);
  if (!compressed.ok()) return compressed.status();
  return gunzip(compressed.value().data(), compressed.value().size(), max_size);
}

}  // namespace tether
