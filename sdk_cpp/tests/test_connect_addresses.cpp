// Socket::connect tries every address in turn within the overall timeout: an
// address that never answers (a connect timeout, not a refusal) must leave
// time for the next one. A listener whose accept queue is full drops SYNs,
// which makes such an address on loopback; 127.0.0.2 (loopback on Linux)
// holds it and 127.0.0.1 the listener that answers.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tether/platform/socket.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A listening socket on `ip`:`port` (0: any port); -1 if it cannot be made.
int listen_on(const char* ip, std::uint16_t port, int backlog) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, ip, &addr.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, backlog) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::uint16_t port_of(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

// A listener on 127.0.0.2 that never answers a connect: its accept queue is
// filled by connections it never accepts, so new SYNs are dropped.
struct Blackhole {
  int listener = -1;
  std::vector<int> fillers;
  std::uint16_t port = 0;
  bool ok = false;

  Blackhole() {
    listener = listen_on("127.0.0.2", 0, 0);
    if (listener < 0) return;
    port = port_of(listener);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    ::inet_pton(AF_INET, "127.0.0.2", &addr.sin_addr);
    for (int i = 0; i < 16 && !ok; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
      fillers.push_back(fd);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) continue;
      pollfd p{fd, POLLOUT, 0};
      ok = ::poll(&p, 1, 200) == 0;  // this one hangs: the queue is full
    }
  }
  ~Blackhole() {
    for (int fd : fillers) ::close(fd);
    if (listener >= 0) ::close(listener);
  }
};

}  // namespace

TEST(ConnectAddresses, AnAddressThatTimesOutLeavesTimeForTheNext) {
  Blackhole hole;
  if (!hole.ok) GTEST_SKIP() << "no loopback 127.0.0.2, or its full accept queue does not drop SYNs here";
  int answering = listen_on("127.0.0.1", hole.port, 8);
  if (answering < 0) GTEST_SKIP() << "port " << hole.port << " is taken on 127.0.0.1";
  const auto start = Clock::now();
  tether::Result<tether::platform::Socket> socket =
      tether::platform::Socket::connect_any({"127.0.0.2", "127.0.0.1"}, hole.port, std::chrono::milliseconds(2000));
  const double took = seconds_since(start);
  ASSERT_TRUE(socket.ok()) << socket.status().to_string();
  EXPECT_EQ(socket.value().peer(), "127.0.0.1:" + std::to_string(hole.port));
  // The first address had half the time: it timed out after ~1 s, not 2.
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 1.8);
  ::close(answering);
}

TEST(ConnectAddresses, AllTimingOutEndsAtTheOverallDeadline) {
  Blackhole hole;
  if (!hole.ok) GTEST_SKIP() << "no loopback 127.0.0.2, or its full accept queue does not drop SYNs here";
  const auto start = Clock::now();
  tether::Result<tether::platform::Socket> socket = tether::platform::Socket::connect_any(
      {"127.0.0.2", "127.0.0.2"}, hole.port, std::chrono::milliseconds(600));
  const double took = seconds_since(start);
  EXPECT_EQ(socket.status().code(), tether::ErrorCode::kTimeout) << socket.status().to_string();
  EXPECT_GE(took, 0.55);
  EXPECT_LT(took, 1.2);
}

#endif  // _WIN32
