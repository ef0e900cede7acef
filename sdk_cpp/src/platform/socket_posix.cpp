// POSIX sockets (Linux, macOS, Android, consoles with BSD sockets): poll(2)
// for readiness, a non-blocking self-pipe as the waker.
// (The guard lets a build that compiles every source file, e.g. an Unreal
// module, include both platform files.)
#ifndef _WIN32
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "tether/platform/socket.h"

namespace tether {
namespace platform {
namespace {

constexpr NativeSocket kInvalid = -1;

std::string errno_text(int error) { return std::strerror(error); }

bool set_nonblocking_cloexec(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return false;
  }
  int fd_flags = ::fcntl(fd, F_GETFD, 0);
  return fd_flags >= 0 && ::fcntl(fd, F_SETFD, fd_flags | FD_CLOEXEC) >= 0;
}

// Latency over throughput (RLlink exchanges small frames), and keepalive so a
// vanished server is noticed on an idle connection. Failures here are not fatal.
void tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
#ifdef SO_NOSIGPIPE
  ::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#endif
#if defined(TCP_KEEPIDLE) && defined(TCP_KEEPINTVL) && defined(TCP_KEEPCNT)
  int idle = 30;
  int interval = 10;
  int count = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
#endif
}

// poll(2) timeout from a duration: negative waits forever; rounds up so a
// wait never returns before its time.
int poll_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) {
    return -1;
  }
  if (timeout.count() > 0x7fffffff) {
    return 0x7fffffff;
  }
  return static_cast<int>(timeout.count());
}

// Waits on `fd` (and the waker); retries on EINTR with the remaining time.
Result<WaitResult> poll_one(int fd, short events, std::chrono::milliseconds timeout, const Waker* waker) {
  using Clock = std::chrono::steady_clock;
  const bool forever = timeout.count() < 0;
  const Clock::time_point deadline = forever ? Clock::time_point::max() : Clock::now() + timeout;
  for (;;) {
    pollfd fds[2];
    fds[0].fd = fd;
    fds[0].events = events;
    fds[0].revents = 0;
    nfds_t count = 1;
    if (waker != nullptr && waker->handle() != kInvalid) {
      fds[1].fd = waker->handle();
      fds[1].events = POLLIN;
      fds[1].revents = 0;
      count = 2;
    }
    std::chrono::milliseconds left(-1);
    if (!forever) {
      auto remaining = deadline - Clock::now();
      left = std::chrono::ceil<std::chrono::milliseconds>(remaining);
      if (left.count() < 0) left = std::chrono::milliseconds(0);
    }
    int ready = ::poll(fds, count, poll_timeout(left));
    if (ready < 0) {
      if (errno == EINTR) {
        continue;
      }
      return Status(ErrorCode::kConnectionFailed, "poll failed: " + errno_text(errno));
    }
    if (count == 2 && (fds[1].revents & POLLIN) != 0) {
      return WaitResult::kWoken;
    }
    if (ready > 0 && fds[0].revents != 0) {
      return WaitResult::kReady;  // readable/writable, or POLLERR/POLLHUP for the next call to report
    }
    if (!forever && Clock::now() >= deadline) {
      return WaitResult::kTimeout;
    }
  }
}

}  // namespace

// --- Waker -------------------------------------------------------------------

Waker::Waker() : read_(kInvalid), write_(kInvalid) {
  int fds[2];
  if (::pipe(fds) != 0) {
    status_ = Status(ErrorCode::kConnectionFailed, "cannot create the wake-up pipe: " + errno_text(errno));
    return;
  }
  read_ = fds[0];
  write_ = fds[1];
  if (!set_nonblocking_cloexec(read_) || !set_nonblocking_cloexec(write_)) {
    status_ = Status(ErrorCode::kConnectionFailed, "cannot configure the wake-up pipe: " + errno_text(errno));
  }
}

Waker::~Waker() {
  if (read_ != kInvalid) ::close(read_);
  if (write_ != kInvalid) ::close(write_);
}

void Waker::wake() const noexcept {
  if (write_ == kInvalid) {
    return;
  }
  const char byte = 1;
  // EAGAIN means the pipe is full: a wake is pending already.
  while (::write(write_, &byte, 1) < 0 && errno == EINTR) {
  }
}

void Waker::drain() const noexcept {
  if (read_ == kInvalid) {
    return;
  }
  char buffer[64];
  for (;;) {
    ssize_t n = ::read(read_, buffer, sizeof(buffer));
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    return;
  }
}

// --- Socket ------------------------------------------------------------------

Socket::Socket() noexcept : handle_(kInvalid) {}

Socket::~Socket() { close(); }

Socket::Socket(Socket&& other) noexcept : handle_(other.handle_), peer_(std::move(other.peer_)) {
  other.handle_ = kInvalid;
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    handle_ = other.handle_;
    peer_ = std::move(other.peer_);
    other.handle_ = kInvalid;
  }
  return *this;
}

void Socket::close() noexcept {
  if (handle_ != kInvalid) {
    ::close(handle_);
    handle_ = kInvalid;
  }
}

bool Socket::is_open() const noexcept { return handle_ != kInvalid; }

Result<Socket> Socket::connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                               const Waker* waker) {
  return connect_any(std::vector<std::string>{host}, port, timeout, waker);
}

Result<Socket> Socket::connect_any(const std::vector<std::string>& hosts, std::uint16_t port,
                                   std::chrono::milliseconds timeout, const Waker* waker) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + timeout;
  struct AddrInfoDeleter {
    void operator()(addrinfo* p) const noexcept { ::freeaddrinfo(p); }
  };
  using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

  // Resolve every host first, to know how many addresses share the time.
  // (getaddrinfo blocks, unbounded by the timeout, and nothing can cancel it:
  // a waker woken meanwhile is seen only once it returns.)
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  const std::string service = std::to_string(port);
  std::vector<std::pair<std::string, AddrInfoList>> resolved;  // (peer, addresses)
  std::size_t remaining = 0;
  Status last(ErrorCode::kConnectionFailed,
              "connect to " + format_peer(hosts.empty() ? std::string() : hosts.front(), port) +
                  " failed: no address to connect to");
  for (const std::string& host : hosts) {
    const std::string peer = format_peer(host, port);
    addrinfo* raw = nullptr;
    int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &raw);
    if (gai != 0) {
      std::string reason = gai == EAI_SYSTEM ? errno_text(errno) : ::gai_strerror(gai);
      last = Status(ErrorCode::kConnectionFailed, "connect to " + peer + " failed: cannot resolve '" + host +
                                                      "': " + reason);
      continue;
    }
    for (const addrinfo* a = raw; a != nullptr; a = a->ai_next) ++remaining;
    resolved.emplace_back(peer, AddrInfoList(raw));
  }

  for (const auto& entry : resolved) {
    const std::string& peer = entry.first;
    for (const addrinfo* address = entry.second.get(); address != nullptr; address = address->ai_next, --remaining) {
      Socket socket;
      socket.peer_ = peer;
      socket.handle_ = ::socket(address->ai_family, address->ai_socktype, address->ai_protocol);
      if (socket.handle_ == kInvalid) {
        last = Status(ErrorCode::kConnectionFailed, "connect to " + peer + " failed: socket(): " + errno_text(errno));
        continue;
      }
      if (!set_nonblocking_cloexec(socket.handle_)) {
        last = Status(ErrorCode::kConnectionFailed, "connect to " + peer + " failed: fcntl(): " + errno_text(errno));
        continue;
      }
      tune(socket.handle_);
      int rc;
      do {
        rc = ::connect(socket.handle_, address->ai_addr, address->ai_addrlen);
      } while (rc != 0 && errno == EINTR);
      if (rc != 0 && errno != EINPROGRESS) {
        last = Status(ErrorCode::kConnectionFailed, "connect to " + peer + " failed: " + errno_text(errno));
        continue;
      }
      if (rc != 0) {
        // An equal share of the time left for each address still to try: one
        // that never answers must not use up the time of those after it.
        auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
        if (left.count() < 0) left = std::chrono::milliseconds(0);
        const auto share = remaining > 1 ? left / static_cast<std::int64_t>(remaining) : left;
        Result<WaitResult> waited = poll_one(socket.handle_, POLLOUT, share, waker);
        if (!waited.ok()) {
          return Status(ErrorCode::kConnectionFailed, "connect to " + peer + " failed: " + waited.status().message());
        }
        if (waited.value() == WaitResult::kWoken) {
          return Status(ErrorCode::kClosed, "connect to " + peer + " interrupted");
        }
        if (waited.value() == WaitResult::kTimeout) {
          last = Status(ErrorCode::kTimeout, "connect to " + peer + " timed out after " + format_seconds(timeout));
          continue;  // the next address, if any, in the time left
        }
        int error = 0;
        socklen_t length = sizeof(error);
        if (::getsockopt(socket.handle_, SOL_SOCKET, SO_ERROR, &error, &length) != 0) {
          error = errno;
        }
        if (error != 0) {
          last = Status(ErrorCode::kConnectionFailed, "connect to " + peer + " failed: " + errno_text(error));
          continue;
        }
      }
      return Result<Socket>(std::move(socket));
    }
  }
  return last;
}

Result<IoResult> Socket::send(const void* data, std::size_t size) noexcept {
  if (handle_ == kInvalid) {
    return Status(ErrorCode::kClosed, "send to " + peer_ + " on a closed socket");
  }
#ifdef MSG_NOSIGNAL
  const int flags = MSG_NOSIGNAL;  // a closed peer is an error, not SIGPIPE
#else
  const int flags = 0;  // SO_NOSIGPIPE was set instead
#endif
  for (;;) {
    ssize_t n = ::send(handle_, data, size, flags);
    if (n >= 0) {
      return IoResult{static_cast<std::size_t>(n), IoState::kDone};
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return IoResult{0, IoState::kWouldBlock};
    }
    return Status(ErrorCode::kConnectionFailed, "send to " + peer_ + " failed: " + errno_text(errno));
  }
}

Result<IoResult> Socket::receive(void* buffer, std::size_t capacity) noexcept {
  if (handle_ == kInvalid) {
    return Status(ErrorCode::kClosed, "receive from " + peer_ + " on a closed socket");
  }
  for (;;) {
    ssize_t n = ::recv(handle_, buffer, capacity, 0);
    if (n > 0) {
      return IoResult{static_cast<std::size_t>(n), IoState::kDone};
    }
    if (n == 0) {
      return IoResult{0, capacity == 0 ? IoState::kDone : IoState::kClosed};
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return IoResult{0, IoState::kWouldBlock};
    }
    return Status(ErrorCode::kConnectionFailed, "receive from " + peer_ + " failed: " + errno_text(errno));
  }
}

Result<WaitResult> Socket::wait(WaitFor what, std::chrono::milliseconds timeout, const Waker* waker) noexcept {
  if (handle_ == kInvalid) {
    return Status(ErrorCode::kClosed, "wait on a closed socket (" + peer_ + ")");
  }
  return poll_one(handle_, what == WaitFor::kReadable ? POLLIN : POLLOUT, timeout, waker);
}

}  // namespace platform
}  // namespace tether

#endif  // !_WIN32
