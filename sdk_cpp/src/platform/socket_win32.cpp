// Winsock: WSAPoll for readiness, a loopback UDP socket connected to itself as
// the waker (Windows has no pipe that WSAPoll can watch). Compiled on Windows only.
// (The guard lets a build that compiles every source file, e.g. an Unreal
// module, include both platform files.)
#ifdef _WIN32
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <winsock2.h>
#include <ws2tcpip.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tether/platform/socket.h"

namespace tether {
namespace platform {
namespace {

constexpr NativeSocket kInvalid = static_cast<NativeSocket>(INVALID_SOCKET);

SOCKET as_socket(NativeSocket handle) { return static_cast<SOCKET>(handle); }

// WSAStartup once per process; never cleaned up (Winsock is torn down at exit).
int ensure_winsock() {
  static int result = [] {
    WSADATA data;
    return WSAStartup(MAKEWORD(2, 2), &data);
  }();
  return result;
}

std::string error_text(int error) {
  char* text = nullptr;
  DWORD length = FormatMessageA(FORMAT_MESSAGE_ALLOCATE_BUFFER | FORMAT_MESSAGE_FROM_SYSTEM |
                                    FORMAT_MESSAGE_IGNORE_INSERTS,
                                nullptr, static_cast<DWORD>(error), 0, reinterpret_cast<LPSTR>(&text), 0, nullptr);
  std::string message = length > 0 && text != nullptr ? std::string(text, length) : "error " + std::to_string(error);
  if (text != nullptr) LocalFree(text);
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r' || message.back() == '.')) {
    message.pop_back();
  }
  return message;
}

bool set_nonblocking(SOCKET s) {
  u_long on = 1;
  return ioctlsocket(s, FIONBIO, &on) == 0;
}

void tune(SOCKET s) {
  BOOL on = TRUE;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, reinterpret_cast<const char*>(&on), sizeof(on));
  setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, reinterpret_cast<const char*>(&on), sizeof(on));
}

Result<WaitResult> poll_one(SOCKET s, SHORT events, std::chrono::milliseconds timeout, const Waker* waker) {
  using Clock = std::chrono::steady_clock;
  const bool forever = timeout.count() < 0;
  const Clock::time_point deadline = forever ? Clock::time_point::max() : Clock::now() + timeout;
  for (;;) {
    WSAPOLLFD fds[2];
    fds[0].fd = s;
    fds[0].events = events;
    fds[0].revents = 0;
    ULONG count = 1;
    if (waker != nullptr && waker->handle() != kInvalid) {
      fds[1].fd = as_socket(waker->handle());
      fds[1].events = POLLRDNORM;
      fds[1].revents = 0;
      count = 2;
    }
    INT wait_ms = -1;
    if (!forever) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
      wait_ms = left < 0 ? 0 : (left > 0x7fffffff ? 0x7fffffff : static_cast<INT>(left));
    }
    int ready = WSAPoll(fds, count, wait_ms);
    if (ready == SOCKET_ERROR) {
      return Status(ErrorCode::kConnectionFailed, "WSAPoll failed: " + error_text(WSAGetLastError()));
    }
    if (count == 2 && (fds[1].revents & POLLRDNORM) != 0) {
      return WaitResult::kWoken;
    }
    if (ready > 0 && fds[0].revents != 0) {
      return WaitResult::kReady;
    }
    if (!forever && Clock::now() >= deadline) {
      return WaitResult::kTimeout;
    }
  }
}

// Waits for a non-blocking connect with select(): WSAPoll does not report a
// refused connect before Windows 10 2004 (it waits out the timeout); select's
// except set does.
Result<WaitResult> wait_connect(SOCKET s, std::chrono::milliseconds timeout, const Waker* waker) {
  fd_set readable;
  fd_set writable;
  fd_set failed;
  FD_ZERO(&readable);
  FD_ZERO(&writable);
  FD_ZERO(&failed);
  FD_SET(s, &writable);
  FD_SET(s, &failed);
  if (waker != nullptr && waker->handle() != kInvalid) {
    FD_SET(as_socket(waker->handle()), &readable);
  }
  long long ms = timeout.count() < 0 ? 0 : static_cast<long long>(timeout.count());
  timeval limit;
  limit.tv_sec = static_cast<long>(ms / 1000);
  limit.tv_usec = static_cast<long>((ms % 1000) * 1000);
  int ready = select(0, &readable, &writable, &failed, &limit);
  if (ready == SOCKET_ERROR) {
    return Status(ErrorCode::kConnectionFailed, "select failed: " + error_text(WSAGetLastError()));
  }
  if (waker != nullptr && waker->handle() != kInvalid && FD_ISSET(as_socket(waker->handle()), &readable)) {
    return WaitResult::kWoken;
  }
  return ready == 0 ? WaitResult::kTimeout : WaitResult::kReady;  // kReady: SO_ERROR tells which
}

}  // namespace

// --- Waker -------------------------------------------------------------------

Waker::Waker() : read_(kInvalid), write_(kInvalid) {
  int started = ensure_winsock();
  if (started != 0) {
    status_ = Status(ErrorCode::kConnectionFailed, "WSAStartup failed: " + error_text(started));
    return;
  }
  // One UDP socket bound to 127.0.0.1 and connected to itself: a wake is a
  // datagram to self. read_ and write_ are the same socket.
  SOCKET s = socket(AF_INET, SOCK_DGRAM, IPPROTO_UDP);
  if (s == INVALID_SOCKET) {
    status_ = Status(ErrorCode::kConnectionFailed, "cannot create the wake-up socket: " + error_text(WSAGetLastError()));
    return;
  }
  read_ = static_cast<NativeSocket>(s);
  sockaddr_in address;
  std::memset(&address, 0, sizeof(address));
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int length = sizeof(address);
  if (bind(s, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(s, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
      connect(s, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || !set_nonblocking(s)) {
    status_ = Status(ErrorCode::kConnectionFailed, "cannot set up the wake-up socket: " + error_text(WSAGetLastError()));
  }
}

Waker::~Waker() {
  if (read_ != kInvalid) closesocket(as_socket(read_));
}

void Waker::wake() const noexcept {
  if (read_ != kInvalid) {
    const char byte = 1;
    send(as_socket(read_), &byte, 1, 0);  // a full buffer means a wake is pending already
  }
}

void Waker::drain() const noexcept {
  if (read_ == kInvalid) return;
  char buffer[64];
  while (recv(as_socket(read_), buffer, sizeof(buffer), 0) > 0) {
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
    closesocket(as_socket(handle_));
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
  const std::string first_peer = format_peer(hosts.empty() ? std::string() : hosts.front(), port);
  int started = ensure_winsock();
  if (started != 0) {
    return Status(ErrorCode::kConnectionFailed,
                  "connect to " + first_peer + " failed: WSAStartup: " + error_text(started));
  }
  struct AddrInfoDeleter {
    void operator()(addrinfo* p) const noexcept { freeaddrinfo(p); }
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
  Status last(ErrorCode::kConnectionFailed, "connect to " + first_peer + " failed: no address to connect to");
  for (const std::string& host : hosts) {
    const std::string peer = format_peer(host, port);
    addrinfo* raw = nullptr;
    int gai = getaddrinfo(host.c_str(), service.c_str(), &hints, &raw);
    if (gai != 0) {
      last = Status(ErrorCode::kConnectionFailed,
                    "connect to " + peer + " failed: cannot resolve '" + host + "': " + error_text(gai));
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
      SOCKET s = ::socket(address->ai_family, address->ai_socktype, address->ai_protocol);
      if (s == INVALID_SOCKET) {
        last = Status(ErrorCode::kConnectionFailed, "connect to " + peer + " failed: socket(): " +
                                                        error_text(WSAGetLastError()));
        continue;
      }
      socket.handle_ = static_cast<NativeSocket>(s);
      if (!set_nonblocking(s)) {
        last = Status(ErrorCode::kConnectionFailed, "connect to " + peer + " failed: " + error_text(WSAGetLastError()));
        continue;
      }
      tune(s);
      if (::connect(s, address->ai_addr, static_cast<int>(address->ai_addrlen)) != 0) {
        int error = WSAGetLastError();
        if (error != WSAEWOULDBLOCK) {
          last = Status(ErrorCode::kConnectionFailed, "connect to " + peer + " failed: " + error_text(error));
          continue;
        }
        // An equal share of the time left for each address still to try: one
        // that never answers must not use up the time of those after it.
        auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
        if (left.count() < 0) left = std::chrono::milliseconds(0);
        const auto share = remaining > 1 ? left / static_cast<long long>(remaining) : left;
        Result<WaitResult> waited = wait_connect(s, share, waker);
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
        int so_error = 0;
        int length = sizeof(so_error);
        getsockopt(s, SOL_SOCKET, SO_ERROR, reinterpret_cast<char*>(&so_error), &length);
        if (so_error != 0) {
          last = Status(ErrorCode::kConnectionFailed, "connect to " + peer + " failed: " + error_text(so_error));
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
  int chunk = size > 0x40000000 ? 0x40000000 : static_cast<int>(size);
  int n = ::send(as_socket(handle_), static_cast<const char*>(data), chunk, 0);
  if (n != SOCKET_ERROR) {
    return IoResult{static_cast<std::size_t>(n), IoState::kDone};
  }
  int error = WSAGetLastError();
  if (error == WSAEWOULDBLOCK) {
    return IoResult{0, IoState::kWouldBlock};
  }
  return Status(ErrorCode::kConnectionFailed, "send to " + peer_ + " failed: " + error_text(error));
}

Result<IoResult> Socket::receive(void* buffer, std::size_t capacity) noexcept {
  if (handle_ == kInvalid) {
    return Status(ErrorCode::kClosed, "receive from " + peer_ + " on a closed socket");
  }
  int chunk = capacity > 0x40000000 ? 0x40000000 : static_cast<int>(capacity);
  int n = ::recv(as_socket(handle_), static_cast<char*>(buffer), chunk, 0);
  if (n > 0) {
    return IoResult{static_cast<std::size_t>(n), IoState::kDone};
  }
  if (n == 0) {
    return IoResult{0, capacity == 0 ? IoState::kDone : IoState::kClosed};
  }
  int error = WSAGetLastError();
  if (error == WSAEWOULDBLOCK) {
    return IoResult{0, IoState::kWouldBlock};
  }
  return Status(ErrorCode::kConnectionFailed, "receive from " + peer_ + " failed: " + error_text(error));
}

Result<WaitResult> Socket::wait(WaitFor what, std::chrono::milliseconds timeout, const Waker* waker) noexcept {
  if (handle_ == kInvalid) {
    return Status(ErrorCode::kClosed, "wait on a closed socket (" + peer_ + ")");
  }
  return poll_one(as_socket(handle_), what == WaitFor::kReadable ? POLLRDNORM : POLLWRNORM, timeout, waker);
}

}  // namespace platform
}  // namespace tether

#endif  // _WIN32
