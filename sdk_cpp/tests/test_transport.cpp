// Transport against real local sockets: a listening socket in the test and a
// server thread. Connect, frames of many sizes, peer close, refused and timed
// out connects, receive timeouts, interrupt() and cancel() from another thread.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <thread>
#include <vector>

#include "tether/transport.h"

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// A listening socket on the loopback interface (port chosen by the kernel).
class Listener {
 public:
  explicit Listener(bool ipv6 = false, int backlog = 16) {
    fd_ = ::socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ipv6) {
      sockaddr_in6 address{};
      address.sin6_family = AF_INET6;
      address.sin6_addr = in6addr_loopback;
      ok_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    } else {
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ok_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    }
    ok_ = ok_ && ::listen(fd_, backlog) == 0;
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &length);
    port_ = ntohs(ipv6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                       : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  ~Listener() { close(); }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  bool ok() const { return ok_; }
  std::uint16_t port() const { return port_; }
  int accept() const { return ::accept(fd_, nullptr, nullptr); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
  std::uint16_t port_ = 0;
};

bool read_exact(int fd, void* buffer, std::size_t size) {
  auto* bytes = static_cast<std::uint8_t*>(buffer);
  std::size_t got = 0;
  while (got < size) {
    ssize_t n = ::recv(fd, bytes + got, size - got, 0);
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return true;
}

bool write_all(int fd, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  std::size_t sent = 0;
  while (sent < size) {
    ssize_t n = ::send(fd, bytes + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

// Frames as [u32 big-endian length][payload], like RLlink's 8-byte header in spirit.
std::vector<std::uint8_t> make_frame(std::size_t size, std::uint8_t seed) {
  std::vector<std::uint8_t> frame(4 + size);
  frame[0] = static_cast<std::uint8_t>(size >> 24);
  frame[1] = static_cast<std::uint8_t>(size >> 16);
  frame[2] = static_cast<std::uint8_t>(size >> 8);
  frame[3] = static_cast<std::uint8_t>(size);
  for (std::size_t i = 0; i < size; ++i) frame[4 + i] = static_cast<std::uint8_t>(i * 31 + seed);
  return frame;
}

// Receives exactly `size` bytes through the transport.
tether::Status receive_exact(tether::Transport& transport, std::uint8_t* out, std::size_t size,
                             tether::Transport::Deadline deadline) {
  std::size_t got = 0;
  while (got < size) {
    tether::Result<tether::Received> r = transport.receive(out + got, std::min<std::size_t>(size - got, 65536), deadline);
    if (!r.ok()) return r.status();
    got += r.value().bytes;
  }
  return tether::Status::Ok();
}

tether::Transport::Deadline in(milliseconds ms) { return Clock::now() + ms; }

// Connects `transport` to `listener` (the kernel completes a connect before
// accept()) and returns the server's end of the connection; -1, and a test
// failure, if the listener or the connect failed.
int connect_pair(tether::Transport& transport, const Listener& listener) {
  EXPECT_TRUE(listener.ok());
  tether::Status status = transport.connect("127.0.0.1", listener.port(), milliseconds(2000));
  EXPECT_TRUE(status.ok()) << status.message();
  return listener.ok() && status.ok() ? listener.accept() : -1;
}

// The server's end `fd` of a connection: silent until the client closes it, then closed.
void silent_until_closed(int fd) {
  std::uint8_t byte;
  read_exact(fd, &byte, 1);
  ::close(fd);
}

// A transport connected to a server end that stays silent until the
// transport closes it; when it goes, it closes the transport and waits for that end.
struct SilentPeer {
  Listener listener;
  tether::Transport transport;
  std::thread server;

  // Connects; false, and a test failure, when it could not.
  bool connect() {
    const int fd = connect_pair(transport, listener);
    if (fd >= 0) server = std::thread(silent_until_closed, fd);
    return fd >= 0;
  }
  ~SilentPeer() {
    transport.close();
    if (server.joinable()) server.join();
  }
};

TEST(Transport, ConnectsAndEchoesFramesOfManySizes) {
  Listener listener;
  ASSERT_TRUE(listener.ok());
  const std::vector<std::size_t> sizes = {0, 1, 2, 3, 7, 8, 100, 1400, 4095, 4096, 65535, 65536, 1 << 20, 5 << 20};
  std::thread server([&] {
    int fd = listener.accept();
    // Reads a whole frame before echoing it: no deadlock on frames larger than the socket buffers.
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      std::uint8_t header[4];
      if (!read_exact(fd, header, 4)) break;
      std::size_t size = (std::size_t(header[0]) << 24) | (std::size_t(header[1]) << 16) |
                         (std::size_t(header[2]) << 8) | header[3];
      std::vector<std::uint8_t> payload(size);
      if (!read_exact(fd, payload.data(), size)) break;
      if (!write_all(fd, header, 4) || !write_all(fd, payload.data(), size)) break;
    }
    ::close(fd);
  });

  tether::Transport transport;
  tether::Status status = transport.connect("127.0.0.1", listener.port(), milliseconds(2000));
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_TRUE(transport.is_open());
  EXPECT_EQ(transport.peer(), "127.0.0.1:" + std::to_string(listener.port()));
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    std::vector<std::uint8_t> frame = make_frame(sizes[k], static_cast<std::uint8_t>(k));
    status = transport.send_all(frame.data(), frame.size(), in(milliseconds(10000)));
    ASSERT_TRUE(status.ok()) << "size " << sizes[k] << ": " << status.message();
    std::vector<std::uint8_t> echoed(frame.size());
    status = receive_exact(transport, echoed.data(), echoed.size(), in(milliseconds(10000)));
    ASSERT_TRUE(status.ok()) << "size " << sizes[k] << ": " << status.message();
    EXPECT_TRUE(echoed == frame) << "size " << sizes[k];
  }
  server.join();
  // The server closed after the last frame.
  std::uint8_t byte;
  tether::Result<tether::Received> r = transport.receive(&byte, 1, in(milliseconds(2000)));
  EXPECT_EQ(r.status().code(), tether::ErrorCode::kConnectionFailed);
}

TEST(Transport, ConnectsByNameAndOverIpv6) {
  Listener listener4;
  ASSERT_TRUE(listener4.ok());
  std::thread accept4([&] { ::close(listener4.accept()); });
  tether::Transport by_name;
  tether::Status status = by_name.connect("localhost", listener4.port(), milliseconds(2000));
  // "localhost" may resolve to ::1 first; the IPv4 address is then tried next.
  EXPECT_TRUE(status.ok()) << status.message();
  accept4.join();

  Listener listener6(true);
  if (!listener6.ok()) {
    GTEST_SKIP() << "no IPv6 loopback here";
  }
  std::thread accept6([&] { ::close(listener6.accept()); });
  tether::Transport transport;
  status = transport.connect("::1", listener6.port(), milliseconds(2000));
  EXPECT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(transport.peer(), "[::1]:" + std::to_string(listener6.port()));
  accept6.join();
}

TEST(Transport, PeerCloseIsAClearStatus) {
  Listener listener;
  tether::Transport transport;
  const int fd = connect_pair(transport, listener);
  ASSERT_GE(fd, 0);
  write_all(fd, "abc", 3);
  ::close(fd);
  std::uint8_t buffer[16];
  tether::Result<tether::Received> r = transport.receive(buffer, sizeof(buffer), in(milliseconds(2000)));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value().bytes, 3u);  // what was sent before the close still arrives
  r = transport.receive(buffer, sizeof(buffer), in(milliseconds(2000)));
  EXPECT_EQ(r.status().code(), tether::ErrorCode::kConnectionFailed);
  EXPECT_EQ(r.status().message(), "server 127.0.0.1:" + std::to_string(listener.port()) + " closed the connection");
  EXPECT_FALSE(transport.is_open());
}

TEST(Transport, SendToAClosedPeerFails) {
  Listener listener;
  tether::Transport transport;
  const int fd = connect_pair(transport, listener);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::vector<std::uint8_t> data(1 << 20, 7);
  tether::Status status;
  for (int i = 0; i < 20 && status.ok(); ++i) {  // the first send may still be accepted by the kernel
    status = transport.send_all(data.data(), data.size(), in(milliseconds(2000)));
  }
  EXPECT_EQ(status.code(), tether::ErrorCode::kConnectionFailed) << status.message();
  EXPECT_NE(status.message().find("127.0.0.1:" + std::to_string(listener.port())), std::string::npos)
      << status.message();
}

TEST(Transport, ConnectRefused) {
  std::uint16_t port;
  {
    Listener listener;
    ASSERT_TRUE(listener.ok());
    port = listener.port();
  }  // closed: nothing listens there now
  tether::Transport transport;
  tether::Status status = transport.connect("127.0.0.1", port, milliseconds(2000));
  EXPECT_EQ(status.code(), tether::ErrorCode::kConnectionFailed);
  EXPECT_EQ(status.message(), "connect to 127.0.0.1:" + std::to_string(port) + " failed: Connection refused");
  EXPECT_FALSE(transport.is_open());
}

TEST(Transport, ConnectTimesOut) {
  // A listener whose accept queue is full drops further SYNs (Linux): connects hang.
  Listener listener(false, 0);
  ASSERT_TRUE(listener.ok());
  std::vector<tether::Transport> fillers(8);
  bool hanging = false;
  for (auto& filler : fillers) {
    tether::Status status = filler.connect("127.0.0.1", listener.port(), milliseconds(200));
    if (status.code() == tether::ErrorCode::kTimeout) {
      hanging = true;
      break;
    }
  }
  if (!hanging) {
    GTEST_SKIP() << "this kernel completes connects to a full accept queue";
  }
  tether::Transport transport;
  auto start = Clock::now();
  tether::Status status = transport.connect("127.0.0.1", listener.port(), milliseconds(300));
  double elapsed = ms_since(start);
  EXPECT_EQ(status.code(), tether::ErrorCode::kTimeout);
  EXPECT_EQ(status.message(), "connect to 127.0.0.1:" + std::to_string(listener.port()) + " timed out after 0.3 s");
  EXPECT_GE(elapsed, 290.0);
  EXPECT_LT(elapsed, 1500.0);
}

TEST(Transport, ReceiveTimesOut) {
  SilentPeer peer;
  ASSERT_TRUE(peer.connect());
  tether::Transport& transport = peer.transport;
  std::uint8_t buffer[16];
  auto start = Clock::now();
  tether::Result<tether::Received> r = transport.receive(buffer, sizeof(buffer), in(milliseconds(200)));
  double elapsed = ms_since(start);
  EXPECT_EQ(r.status().code(), tether::ErrorCode::kTimeout);
  EXPECT_EQ(r.status().message(),
            "receive from server 127.0.0.1:" + std::to_string(peer.listener.port()) + " timed out after 0.2 s");
  EXPECT_GE(elapsed, 195.0);
  EXPECT_LT(elapsed, 1500.0);
  EXPECT_TRUE(transport.is_open());  // a timeout leaves the connection usable
}

TEST(Transport, InterruptUnblocksAWaitPromptly) {
  SilentPeer peer;
  ASSERT_TRUE(peer.connect());
  tether::Transport& transport = peer.transport;
  std::vector<double> latencies;
  for (int i = 0; i < 20; ++i) {
    std::atomic<bool> waiting{false};
    Clock::time_point returned;
    tether::Result<tether::Received> r(tether::ErrorCode::kInternal, "not run");
    std::thread io([&] {
      std::uint8_t buffer[16];
      waiting = true;
      r = transport.receive(buffer, sizeof(buffer), in(milliseconds(10000)));
      returned = Clock::now();
    });
    while (!waiting) std::this_thread::yield();
    std::this_thread::sleep_for(milliseconds(20));  // let it block in poll
    Clock::time_point woken = Clock::now();
    transport.interrupt();
    io.join();
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(r.value().interrupted);
    EXPECT_EQ(r.value().bytes, 0u);
    latencies.push_back(std::chrono::duration<double, std::milli>(returned - woken).count());
  }
  std::sort(latencies.begin(), latencies.end());
  std::cout << "[ timing ] interrupt() -> receive() returned: median " << latencies[latencies.size() / 2]
            << " ms, max " << latencies.back() << " ms\n";
  RecordProperty("interrupt_median_ms", std::to_string(latencies[latencies.size() / 2]));
  EXPECT_LT(latencies.back(), 100.0);
}

TEST(Transport, AnInterruptBeforeTheWaitIsNotLost) {
  SilentPeer peer;
  ASSERT_TRUE(peer.connect());
  tether::Transport& transport = peer.transport;
  transport.interrupt();
  transport.interrupt();  // several wakes are one
  std::uint8_t buffer[16];
  auto start = Clock::now();
  tether::Result<tether::Received> r = transport.receive(buffer, sizeof(buffer), in(milliseconds(5000)));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.value().interrupted);
  EXPECT_LT(ms_since(start), 100.0);
  r = transport.receive(buffer, sizeof(buffer), in(milliseconds(100)));
  EXPECT_EQ(r.status().code(), tether::ErrorCode::kTimeout);
}

TEST(Transport, CancelStopsABlockedSendPromptly) {
  Listener listener;
  tether::Transport transport;
  const int server_fd = connect_pair(transport, listener);  // never reads
  ASSERT_GE(server_fd, 0);
  std::vector<std::uint8_t> data(64 << 20, 1);  // more than the socket buffers hold
  Clock::time_point cancelled_at;
  std::thread canceller([&] {
    std::this_thread::sleep_for(milliseconds(100));
    transport.interrupt();  // does not stop a send
    std::this_thread::sleep_for(milliseconds(50));
    cancelled_at = Clock::now();
    transport.cancel();
  });
  tether::Status status = transport.send_all(data.data(), data.size(), in(milliseconds(10000)));
  Clock::time_point returned = Clock::now();
  canceller.join();
  EXPECT_EQ(status.code(), tether::ErrorCode::kClosed) << status.message();
  double latency = std::chrono::duration<double, std::milli>(returned - cancelled_at).count();
  EXPECT_LT(latency, 100.0);
  // Every later call fails too.
  std::uint8_t byte;
  EXPECT_EQ(transport.receive(&byte, 1, in(milliseconds(100))).status().code(), tether::ErrorCode::kClosed);
  EXPECT_EQ(transport.connect("127.0.0.1", listener.port(), milliseconds(100)).code(), tether::ErrorCode::kClosed);
  ::close(server_fd);
}

TEST(Transport, SendTimesOutWhenThePeerDoesNotRead) {
  Listener listener;
  tether::Transport transport;
  const int server_fd = connect_pair(transport, listener);  // never reads
  ASSERT_GE(server_fd, 0);
  std::vector<std::uint8_t> data(64 << 20, 1);
  tether::Status status = transport.send_all(data.data(), data.size(), in(milliseconds(200)));
  EXPECT_EQ(status.code(), tether::ErrorCode::kTimeout);
  EXPECT_NE(status.message().find("send to server 127.0.0.1:" + std::to_string(listener.port()) +
                                  " timed out after 0.2 s"),
            std::string::npos)
      << status.message();
  ::close(server_fd);
}

TEST(Transport, FormatsDurations) {
  EXPECT_EQ(tether::platform::format_seconds(milliseconds(5000)), "5 s");
  EXPECT_EQ(tether::platform::format_seconds(milliseconds(250)), "0.25 s");
  EXPECT_EQ(tether::platform::format_seconds(milliseconds(1005)), "1.005 s");
  EXPECT_EQ(tether::platform::format_peer("::1", 80), "[::1]:80");
}

}  // namespace

#endif  // _WIN32
