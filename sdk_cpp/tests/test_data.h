// Where the tests' data files are (sdk_cpp/tests/data: the test policy model
// and its expected outputs), and a file's bytes.
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace test_data {

/// sdk_cpp/tests/data/ (TETHER_REPO_DIR comes from tests/CMakeLists.txt).
inline const std::string kDir = std::string(TETHER_REPO_DIR) + "/sdk_cpp/tests/data/";

/// The bytes of the file at `path` (none if it cannot be read).
inline std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace test_data
