// The one place the SDK touches the operating system's sockets: a TCP
// connection with non-blocking I/O and a waker another thread can use to cut
// a wait short. socket_posix.cpp and socket_win32.cpp implement it; the rest
// of the SDK (transport.h) is portable.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tether/status.h"

namespace tether {
namespace platform {

#ifdef _WIN32
/// The operating system's socket handle (a Winsock SOCKET).
using NativeSocket = std::uintptr_t;
#else
/// The operating system's socket handle (a file descriptor).
using NativeSocket = int;
#endif

/// How a non-blocking send or receive went.
enum class IoState {
  kDone,        // `bytes` were transferred (at least one)
  kWouldBlock,  // nothing now: wait for readiness and try again
  kClosed,      // the peer closed the connection (receive only)
};

/// The outcome of Socket::send / Socket::receive when there was no error.
struct IoResult {
  std::size_t bytes = 0;  ///< bytes transferred when state is kDone
  IoState state = IoState::kDone;
};

/// What Socket::wait waits for.
enum class WaitFor { kReadable, kWritable };

/// Why Socket::wait returned.
enum class WaitResult {
  kReady,    // the socket is readable/writable (or has an error to report)
  kTimeout,  // the timeout ran out
  kWoken,    // the waker was woken; call Waker::drain before waiting again
};

/// Lets another thread interrupt a Socket::wait (and Socket::connect): a
/// self-pipe on POSIX, a loopback UDP socket on Windows. A wake stays pending
/// until drain(), so a wake that comes before the wait is not lost.
class Waker {
 public:
  /// Creates the waker; check status() before use.
  Waker();
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;

  /// Ok, or why the waker could not be created.
  const Status& status() const noexcept { return status_; }
  /// Makes the current or next wait return kWoken. Safe from any thread.
  void wake() const noexcept;
  /// Clears pending wakes. Call from the waiting thread only.
  void drain() const noexcept;
  /// The handle a wait polls for readability.
  NativeSocket handle() const noexcept { return read_; }

 private:
  NativeSocket read_;
  NativeSocket write_;
  Status status_;
};

/// One TCP connection: non-blocking, TCP_NODELAY, TCP keepalive. Move-only; the
/// destructor closes it. One thread uses a Socket at a time (the waker is the
/// only cross-thread part).
class Socket {
 public:
  /// A closed socket.
  Socket() noexcept;
  ~Socket();
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  /// Takes over the connection; `other` is left closed.
  Socket(Socket&& other) noexcept;
  /// Closes this connection and takes over `other`'s.
  Socket& operator=(Socket&& other) noexcept;

  /// Connects to host:port (a name, IPv4 or IPv6 address; every address the
  /// name resolves to is tried in turn) within `timeout` overall: each
  /// attempt gets an equal share of the time left, so an address that never
  /// answers (a timeout) still leaves time for the next. kTimeout when the
  /// last attempt runs out, kConnectionFailed naming host:port and the
  /// system's reason, kClosed if `waker` (optional) is woken meanwhile. Name
  /// resolution itself is not bounded by the timeout nor woken by `waker`:
  /// getaddrinfo blocks and cannot be cancelled.
  static Result<Socket> connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                                const Waker* waker = nullptr);
  /// connect() over several hosts: every address of each, in the order given,
  /// within `timeout` overall (connect(host, ...) is this with one host).
  static Result<Socket> connect_any(const std::vector<std::string>& hosts, std::uint16_t port,
                                    std::chrono::milliseconds timeout, const Waker* waker = nullptr);

  /// Sends up to `size` bytes without blocking. kConnectionFailed on error
  /// (a peer that closed shows up here as "Broken pipe" or a reset).
  Result<IoResult> send(const void* data, std::size_t size) noexcept;
  /// Receives up to `capacity` bytes without blocking; state kClosed when the
  /// peer has closed its side. kConnectionFailed on error.
  Result<IoResult> receive(void* buffer, std::size_t capacity) noexcept;
  /// Waits until the socket is readable/writable, `timeout` runs out (negative:
  /// forever) or `waker` (optional) is woken.
  Result<WaitResult> wait(WaitFor what, std::chrono::milliseconds timeout, const Waker* waker = nullptr) noexcept;

  /// Closes the connection (idempotent).
  void close() noexcept;
  /// True while connected (until close()).
  bool is_open() const noexcept;
  /// "host:port" as given to connect(), for messages.
  const std::string& peer() const noexcept { return peer_; }
  /// The operating system's handle (for tests and diagnostics).
  NativeSocket native() const noexcept { return handle_; }

 private:
  NativeSocket handle_;
  std::string peer_;
};

/// "5 s", "0.25 s": a duration as messages show it.
inline std::string format_seconds(std::chrono::milliseconds duration) {
  long long ms = static_cast<long long>(duration.count());
  std::string text = std::to_string(ms / 1000);
  long long rest = (ms < 0 ? -ms : ms) % 1000;
  if (rest != 0) {
    std::string fraction = std::to_string(rest + 1000).substr(1);  // three digits, leading zeros kept
    while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
    text += "." + fraction;
  }
  return text + " s";
}

/// "host:port", with brackets around an IPv6 address ("[::1]:5555").
inline std::string format_peer(const std::string& host, std::uint16_t port) {
  bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace platform
}  // namespace tether
