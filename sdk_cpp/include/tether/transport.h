// One TCP connection to an RLlink server, as the client's I/O thread uses it:
// it sends whole frames, receives whatever bytes arrived (the framing decoder
// reassembles them), and can be woken or cancelled from another thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tether/platform/socket.h"
#include "tether/status.h"

namespace tether {

/// What Transport::receive got: some bytes, or a wake-up from interrupt().
struct Received {
  std::size_t bytes = 0;     ///< bytes written to the buffer (0 when interrupted)
  bool interrupted = false;  ///< interrupt() was called; no bytes were read
};

/// Owns one connection. connect/send_all/receive/close belong to one thread
/// (the I/O thread); interrupt() and cancel() may be called from any thread.
/// Not copyable or movable: other threads hold a reference to it.
class Transport {
 public:
  /// The clock deadlines are measured on.
  using Clock = std::chrono::steady_clock;
  /// When a call gives up; kNoDeadline waits as long as it takes.
  using Deadline = Clock::time_point;
  /// A deadline that never comes.
  static constexpr Deadline kNoDeadline = Deadline::max();

  /// A transport with no connection yet.
  Transport();
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  /// Connects to host:port (name, IPv4 or IPv6), closing any previous
  /// connection. kTimeout ("connect to 127.0.0.1:5555 timed out after 5 s"),
  /// kConnectionFailed with the system's reason, kClosed after cancel() or if
  /// interrupt() is called while it waits.
  Status connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout);

  /// Sends all `size` bytes, waiting for room as needed, until `deadline`.
  /// interrupt() does not stop it (the wake is kept for the next receive());
  /// cancel() does, with kClosed. kTimeout or kConnectionFailed otherwise; after
  /// any failure the connection is unusable (part of a frame may have gone out).
  Status send_all(const void* data, std::size_t size, Deadline deadline);

  /// Reads the bytes available (at most `capacity`), waiting for some until
  /// `deadline`. Returns interrupted = true if interrupt() was called (before
  /// or during the wait), kConnectionFailed ("server 127.0.0.1:5555 closed the
  /// connection") when the server closed it, kTimeout, kClosed after cancel().
  Result<Received> receive(void* buffer, std::size_t capacity, Deadline deadline);

  /// Wakes the I/O thread: its current or next receive() returns interrupted.
  /// Safe from any thread; wakes do not queue up (several are one).
  void interrupt() noexcept;

  /// Makes the current and every later call fail with kClosed, promptly,
  /// except a name lookup in progress in connect(): getaddrinfo cannot be
  /// cancelled, so that connect() fails once it returns. Safe from any
  /// thread; permanent for this transport.
  void cancel() noexcept;

  /// Closes the connection (idempotent). I/O thread only.
  void close() noexcept;

  /// True between a successful connect() and close() or a failure that closed it. I/O thread only.
  bool is_open() const noexcept { return socket_.is_open(); }

  /// "host:port" of the current (or last) connection.
  const std::string& peer() const noexcept { return peer_; }

 private:
  Status cancelled_status(const char* what) const;
  Status closed_after(Status failure) noexcept;
  std::chrono::milliseconds remaining(Deadline deadline) const;

  platform::Waker waker_;
  platform::Socket socket_;
  std::string peer_;
  std::atomic<bool> cancelled_{false};
  bool pending_interrupt_ = false;  // a wake send_all consumed, owed to the next receive
};

}  // namespace tether
