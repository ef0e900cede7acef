// Spellings of the error codes and the text form of a Status.
#include "tether/status.h"

#include <array>
#include <utility>

namespace tether {
namespace {

// Every code with its spelling, in enum order; kOk has none on the wire.
constexpr std::array<std::pair<ErrorCode, std::string_view>, 44> kNames{{
    {ErrorCode::kOk, "OK"},
    {ErrorCode::kBadHeader, "BAD_HEADER"},
    {ErrorCode::kFrameTooLarge, "FRAME_TOO_LARGE"},
    {ErrorCode::kInvalidUtf8, "INVALID_UTF8"},
    {ErrorCode::kInvalidJson, "INVALID_JSON"},
    {ErrorCode::kNotAnObject, "NOT_AN_OBJECT"},
    {ErrorCode::kMissingType, "MISSING_TYPE"},
    {ErrorCode::kUnknownType, "UNKNOWN_TYPE"},
    {ErrorCode::kNotARequest, "NOT_A_REQUEST"},
    {ErrorCode::kInvalidField, "INVALID_FIELD"},
    {ErrorCode::kEpisodeLengthMismatch, "EPISODE_LENGTH_MISMATCH"},
    {ErrorCode::kObsShapeMismatch, "OBS_SHAPE_MISMATCH"},
    {ErrorCode::kNonFiniteValue, "NON_FINITE_VALUE"},
    {ErrorCode::kActionOutOfSpace, "ACTION_OUT_OF_SPACE"},
    {ErrorCode::kMissingActionLogp, "MISSING_ACTION_LOGP"},
    {ErrorCode::kAuthFailed, "AUTH_FAILED"},
    {ErrorCode::kVersionMismatch, "VERSION_MISMATCH"},
    {ErrorCode::kUnknownModule, "UNKNOWN_MODULE"},
    {ErrorCode::kUnmappedAgent, "UNMAPPED_AGENT"},
    {ErrorCode::kModuleMismatch, "MODULE_MISMATCH"},
    {ErrorCode::kAgentAlreadyDone, "AGENT_ALREADY_DONE"},
    {ErrorCode::kGroupMemberOutsideGroup, "GROUP_MEMBER_OUTSIDE_GROUP"},
    {ErrorCode::kActionLogpMismatch, "ACTION_LOGP_MISMATCH"},
    {ErrorCode::kDataRefused, "DATA_REFUSED"},
    {ErrorCode::kTooManyConnections, "TOO_MANY_CONNECTIONS"},
    {ErrorCode::kHandshakeTimeout, "HANDSHAKE_TIMEOUT"},
    {ErrorCode::kClientTimeout, "CLIENT_TIMEOUT"},
    {ErrorCode::kServerOverloaded, "SERVER_OVERLOADED"},
    {ErrorCode::kAuthThrottled, "AUTH_THROTTLED"},
    {ErrorCode::kTrainingDone, "TRAINING_DONE"},
    {ErrorCode::kInvalidTensor, "INVALID_TENSOR"},
    {ErrorCode::kObsDtypeMismatch, "OBS_DTYPE_MISMATCH"},
    {ErrorCode::kObsLeafMismatch, "OBS_LEAF_MISMATCH"},
    {ErrorCode::kInvalidActionMask, "INVALID_ACTION_MASK"},
    {ErrorCode::kActionMaskEmpty, "ACTION_MASK_EMPTY"},
    {ErrorCode::kActionMasked, "ACTION_MASKED"},
    {ErrorCode::kInternal, "INTERNAL"},
    {ErrorCode::kUnknownServerCode, "UNKNOWN_SERVER_CODE"},
    {ErrorCode::kInvalidArgument, "INVALID_ARGUMENT"},
    {ErrorCode::kConnectionFailed, "CONNECTION_FAILED"},
    {ErrorCode::kTimeout, "TIMEOUT"},
    {ErrorCode::kInferenceFailed, "INFERENCE_FAILED"},
    {ErrorCode::kNotReady, "NOT_READY"},
    {ErrorCode::kClosed, "CLOSED"},
}};

// The last protocol code: error_code_from_string maps only the wire codes.
constexpr ErrorCode kLastProtocolCode = ErrorCode::kInternal;

}  // namespace

std::string_view to_string(ErrorCode code) noexcept {
  for (const auto& entry : kNames) {
    if (entry.first == code) return entry.second;
  }
  return "UNKNOWN";
}

ErrorCode error_code_from_string(std::string_view name) noexcept {
  for (const auto& entry : kNames) {
    if (entry.first == ErrorCode::kOk) continue;
    if (static_cast<int>(entry.first) > static_cast<int>(kLastProtocolCode)) break;
    if (entry.second == name) return entry.first;
  }
  return ErrorCode::kUnknownServerCode;
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  std::string out(tether::to_string(code_));
  out += ": ";
  out += message_;
  return out;
}

}  // namespace tether
