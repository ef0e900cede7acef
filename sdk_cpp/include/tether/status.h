// Exception-free results: every fallible call returns a Status or a Result<T>
// carrying an ErrorCode and a message that names what went wrong. The library
// builds and runs with -fno-exceptions (Unreal's default).
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace tether {

/// Why a call failed. The protocol codes are the `code` strings of an RLlink
/// ERROR message (docs/protocol.md §14); the SDK codes name failures that
/// happen on this side of the connection.
enum class ErrorCode {
  kOk = 0,
  // Protocol codes (the server's ERROR "code", or a frame/message this SDK refused).
  kBadHeader,
  kFrameTooLarge,
  kInvalidUtf8,
  kInvalidJson,
  kNotAnObject,
  kMissingType,
  kUnknownType,
  kNotARequest,
  kInvalidField,
  kEpisodeLengthMismatch,
  kObsShapeMismatch,
  kNonFiniteValue,
  kActionOutOfSpace,
  kMissingActionLogp,
  kAuthFailed,
  kVersionMismatch,
  kUnknownModule,
  kUnmappedAgent,
  kModuleMismatch,
  kAgentAlreadyDone,
  kGroupMemberOutsideGroup,
  kActionLogpMismatch,
  kDataRefused,
  kTooManyConnections,
  kHandshakeTimeout,
  kClientTimeout,
  kServerOverloaded,
  kAuthThrottled,  // wrong auth tokens from this address: refused for a while
  kTrainingDone,   // [1.3] the server's run is done (§6.6 "End of training"): not a failure
  kInvalidTensor,     // [1.4] a tensor object that cannot be read (§10.9)
  kObsDtypeMismatch,  // [1.4] observations of another element type than the space's (§10.6 checks 4, 11b)
  kObsLeafMismatch,   // [1.4] a composite observation lacks a leaf or has one the space does not (§10.6 check 4c)
  kInvalidActionMask,  // [1.4] an action mask holds a value other than 0 and 1 (§11.6)
  kActionMaskEmpty,    // [1.4] an action mask allows no action (of some entry) where one is taken (§11.6)
  kActionMasked,       // [1.4] an action its observation's mask forbids (§10.6 check 14d)
  kInternal,
  kUnknownServerCode,  // an ERROR code this SDK does not know (a newer server)
  // SDK codes.
  kInvalidArgument,   // the caller passed something the call cannot take
  kConnectionFailed,  // connecting, or the connection broke
  kTimeout,           // a wait ran past its limit
  kInferenceFailed,   // the inference backend refused the model or the run
  kNotReady,          // no config or model yet
  kClosed,            // the client was closed
};

/// The protocol spelling of a code ("INVALID_FIELD"); SDK codes have their own
/// spelling ("CONNECTION_FAILED").
std::string_view to_string(ErrorCode code) noexcept;

/// The code named by a protocol string; kUnknownServerCode if there is none.
ErrorCode error_code_from_string(std::string_view name) noexcept;

/// Success, or an error code with a message. Cheap to copy when ok.
class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const noexcept { return code_ == ErrorCode::kOk; }
  ErrorCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  /// "CODE: message", or "OK".
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

/// A value or a Status. Accessing value() of a failed result is a programming
/// error (checked with assert in debug builds).
template <class T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit, like std::optional
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  Result(ErrorCode code, std::string message) : status_(code, std::move(message)) {}

  bool ok() const noexcept { return status_.ok(); }
  const Status& status() const noexcept { return status_; }
  T& value() & { return value_; }
  const T& value() const& { return value_; }
  T&& value() && { return std::move(value_); }

 private:
  Status status_;
  T value_{};
};

}  // namespace tether
