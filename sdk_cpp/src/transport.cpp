// Transport: deadlines, interruption and clear messages over platform::Socket.
#include "tether/transport.h"

#include <algorithm>
#include <utility>

namespace tether {

using platform::IoState;
using platform::WaitFor;
using platform::WaitResult;

namespace {

// The wait a timeout message reports: what the caller allowed, to the millisecond.
std::chrono::milliseconds waited_for(Transport::Clock::time_point start, Transport::Deadline deadline) {
  return std::max(std::chrono::round<std::chrono::milliseconds>(deadline - start), std::chrono::milliseconds(0));
}

}  // namespace

Transport::Transport() = default;

Transport::~Transport() { close(); }

std::chrono::milliseconds Transport::remaining(Deadline deadline) const {
  if (deadline == kNoDeadline) {
    return std::chrono::milliseconds(-1);  // forever
  }
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

Status Transport::cancelled_status(const char* what) const {
  return Status(ErrorCode::kClosed, std::string(what) + (peer_.empty() ? "" : " " + peer_) + " cancelled: the transport was closed");
}

// A socket call failed: the connection is unusable, so it is closed; the failure is returned.
Status Transport::closed_after(Status failure) noexcept {
  close();
  return failure;
}

Status Transport::connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout) {
  close();
  peer_ = platform::format_peer(host, port);
  if (!waker_.status().ok()) {
    return waker_.status();
  }
  if (cancelled_.load()) {
    return cancelled_status("connect to");
  }
  Result<platform::Socket> connected = platform::Socket::connect(host, port, timeout, &waker_);
  if (!connected.ok()) {
    if (connected.status().code() == ErrorCode::kClosed) {
      waker_.drain();
      if (cancelled_.load()) {
        return cancelled_status("connect to");
      }
    }
    return connected.status();
  }
  socket_ = std::move(connected).value();
  return Status::Ok();
}

Status Transport::send_all(const void* data, std::size_t size, Deadline deadline) {
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  const Clock::time_point start = Clock::now();
  std::size_t sent = 0;
  while (sent < size) {
    if (cancelled_.load()) {
      return cancelled_status("send to");
    }
    Result<platform::IoResult> result = socket_.send(bytes + sent, size - sent);
    if (!result.ok()) return closed_after(result.status());
    if (result.value().state == IoState::kDone) {
      sent += result.value().bytes;
      continue;
    }
    Result<WaitResult> waited = socket_.wait(WaitFor::kWritable, remaining(deadline), &waker_);
    if (!waited.ok()) return closed_after(waited.status());
    if (waited.value() == WaitResult::kWoken) {
      waker_.drain();
      pending_interrupt_ = true;  // cancel() is checked at the top of the loop
    } else if (waited.value() == WaitResult::kTimeout) {
      return Status(ErrorCode::kTimeout,
                    "send to server " + peer_ + " timed out after " +
                        platform::format_seconds(waited_for(start, deadline)) +
                        " (" + std::to_string(sent) + " of " + std::to_string(size) + " bytes sent)");
    }
  }
  return Status::Ok();
}

Result<Received> Transport::receive(void* buffer, std::size_t capacity, Deadline deadline) {
  const Clock::time_point start = Clock::now();
  for (;;) {
    if (cancelled_.load()) {
      return cancelled_status("receive from");
    }
    if (pending_interrupt_) {
      pending_interrupt_ = false;
      return Received{0, true};
    }
    Result<platform::IoResult> result = socket_.receive(buffer, capacity);
    if (!result.ok()) return closed_after(result.status());
    if (result.value().state == IoState::kDone) {
      return Received{result.value().bytes, false};
    }
    if (result.value().state == IoState::kClosed) {
      close();
      return Status(ErrorCode::kConnectionFailed, "server " + peer_ + " closed the connection");
    }
    Result<WaitResult> waited = socket_.wait(WaitFor::kReadable, remaining(deadline), &waker_);
    if (!waited.ok()) return closed_after(waited.status());
    if (waited.value() == WaitResult::kWoken) {
      waker_.drain();
      if (cancelled_.load()) {
        return cancelled_status("receive from");
      }
      return Received{0, true};
    }
    if (waited.value() == WaitResult::kTimeout) {
      return Status(ErrorCode::kTimeout,
                    "receive from server " + peer_ + " timed out after " +
                        platform::format_seconds(waited_for(start, deadline)));
    }
  }
}

void Transport::interrupt() noexcept { waker_.wake(); }

void Transport::cancel() noexcept {
  cancelled_.store(true);
  waker_.wake();
}

void Transport::close() noexcept { socket_.close(); }

}  // namespace tether
