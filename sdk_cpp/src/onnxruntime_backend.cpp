// ONNX Runtime backend over the C API: every OrtStatus* is checked and
// released, every Ort object has a unique_ptr owner with its Release function.
#include "tether/onnxruntime_backend.h"

#include <onnxruntime_c_api.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

namespace tether {
namespace {

// The function table of the loaded library; null if the library is older than
// the headers (ORT_API_VERSION). Fetched once: GetApi is cheap but not free.
const OrtApi* ort_api() noexcept {
  static const OrtApi* api = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  return api;
}

// unique_ptr deleters calling the matching OrtApi::ReleaseX.
struct EnvDeleter { void operator()(OrtEnv* p) const noexcept { ort_api()->ReleaseEnv(p); } };
struct SessionOptionsDeleter {
  void operator()(OrtSessionOptions* p) const noexcept { ort_api()->ReleaseSessionOptions(p); }
};
struct SessionDeleter { void operator()(OrtSession* p) const noexcept { ort_api()->ReleaseSession(p); } };
struct MemoryInfoDeleter {
  void operator()(OrtMemoryInfo* p) const noexcept { ort_api()->ReleaseMemoryInfo(p); }
};
struct ValueDeleter { void operator()(OrtValue* p) const noexcept { ort_api()->ReleaseValue(p); } };
struct TypeInfoDeleter { void operator()(OrtTypeInfo* p) const noexcept { ort_api()->ReleaseTypeInfo(p); } };
struct StatusDeleter { void operator()(OrtStatus* p) const noexcept { ort_api()->ReleaseStatus(p); } };
struct IoBindingDeleter { void operator()(OrtIoBinding* p) const noexcept { ort_api()->ReleaseIoBinding(p); } };

using EnvPtr = std::unique_ptr<OrtEnv, EnvDeleter>;
using SessionOptionsPtr = std::unique_ptr<OrtSessionOptions, SessionOptionsDeleter>;
using SessionPtr = std::unique_ptr<OrtSession, SessionDeleter>;
using MemoryInfoPtr = std::unique_ptr<OrtMemoryInfo, MemoryInfoDeleter>;
using ValuePtr = std::unique_ptr<OrtValue, ValueDeleter>;
using TypeInfoPtr = std::unique_ptr<OrtTypeInfo, TypeInfoDeleter>;
using OrtStatusPtr = std::unique_ptr<OrtStatus, StatusDeleter>;
using IoBindingPtr = std::unique_ptr<OrtIoBinding, IoBindingDeleter>;

// Converts an OrtStatus* (null = success) into a Status, releasing it.
Status check(OrtStatus* raw, const char* what) {
  if (raw == nullptr) {
    return Status::Ok();
  }
  OrtStatusPtr status(raw);
  return Status(ErrorCode::kInferenceFailed,
                std::string("ONNX Runtime: ") + what + " failed: " + ort_api()->GetErrorMessage(raw));
}

// A string ONNX Runtime allocated (an input/output name), freed with its allocator.
class AllocatedName {
 public:
  explicit AllocatedName(OrtAllocator* allocator) : allocator_(allocator) {}
  ~AllocatedName() {
    if (name_ != nullptr) {
      OrtStatusPtr ignored(ort_api()->AllocatorFree(allocator_, name_));  // nothing to do if freeing fails
    }
  }
  AllocatedName(const AllocatedName&) = delete;
  AllocatedName& operator=(const AllocatedName&) = delete;
  char** out() noexcept { return &name_; }
  const char* get() const noexcept { return name_ != nullptr ? name_ : ""; }

 private:
  OrtAllocator* allocator_;
  char* name_ = nullptr;
};

// The shape and element type of one model input or output.
struct TensorSignature {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<std::int64_t> shape;
  bool is_tensor = false;
};

// Index of the input (or output) named `name`, and the list of all names for messages.
Status find_name(OrtSession* session, OrtAllocator* allocator, bool input, const std::string& name,
                 std::size_t* index) {
  const OrtApi* api = ort_api();
  std::size_t count = 0;
  Status status = check(input ? api->SessionGetInputCount(session, &count)
                              : api->SessionGetOutputCount(session, &count),
                        "reading the model's inputs/outputs");
  if (!status.ok()) {
    return status;
  }
  std::string names;
  for (std::size_t i = 0; i < count; ++i) {
    AllocatedName current(allocator);
    status = check(input ? api->SessionGetInputName(session, i, allocator, current.out())
                         : api->SessionGetOutputName(session, i, allocator, current.out()),
                   "reading a model input/output name");
    if (!status.ok()) {
      return status;
    }
    if (name == current.get()) {
      *index = i;
      return Status::Ok();
    }
    names += names.empty() ? "'" : ", '";
    names += current.get();
    names += "'";
  }
  return Status(ErrorCode::kInferenceFailed, std::string("the model has no ") + (input ? "input" : "output") +
                                                 " named '" + name + "' (its " + (input ? "inputs" : "outputs") +
                                                 ": " + (names.empty() ? "none" : names) + ")");
}

Status read_signature(OrtSession* session, bool input, std::size_t index, TensorSignature* signature) {
  const OrtApi* api = ort_api();
  OrtTypeInfo* raw_info = nullptr;
  Status status = check(input ? api->SessionGetInputTypeInfo(session, index, &raw_info)
                              : api->SessionGetOutputTypeInfo(session, index, &raw_info),
                        "reading a model input/output type");
  if (!status.ok()) {
    return status;
  }
  TypeInfoPtr info(raw_info);
  const OrtTensorTypeAndShapeInfo* tensor = nullptr;  // owned by `info`
  status = check(api->CastTypeInfoToTensorInfo(info.get(), &tensor), "reading a tensor type");
  if (!status.ok() || tensor == nullptr) {
    signature->is_tensor = false;
    return Status::Ok();
  }
  signature->is_tensor = true;
  status = check(api->GetTensorElementType(tensor, &signature->type), "reading a tensor element type");
  if (!status.ok()) {
    return status;
  }
  std::size_t rank = 0;
  status = check(api->GetDimensionsCount(tensor, &rank), "reading a tensor rank");
  if (!status.ok()) {
    return status;
  }
  signature->shape.assign(rank, 0);
  return check(api->GetDimensions(tensor, signature->shape.data(), rank), "reading a tensor shape");
}

// A (batch, width) float32 tensor of the model's, as this backend needs it;
// or, for the input, `bytes_allowed`, a uint8 (batch, d1, ..., dk) tensor with
// static dimensions after the batch: a byte box's image in its own shape (§12.1).
Status check_signature(const TensorSignature& signature, const char* role, const std::string& name,
                       bool bytes_allowed) {
  std::string prefix = std::string("model ") + role + " '" + name + "'";
  if (!signature.is_tensor) {
    return Status(ErrorCode::kInferenceFailed, prefix + " is not a tensor");
  }
  if (bytes_allowed && signature.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8) {
    if (signature.shape.empty()) {
      return Status(ErrorCode::kInferenceFailed, prefix + " has rank 0, expected (batch, *observation shape)");
    }
    for (std::size_t i = 1; i < signature.shape.size(); ++i) {
      if (signature.shape[i] < 0) {
        return Status(ErrorCode::kInferenceFailed, prefix + " is uint8 with a dynamic dimension " + std::to_string(i) +
                                                       ": only the batch may be dynamic");
      }
    }
    return Status::Ok();
  }
  if (signature.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    return Status(ErrorCode::kInferenceFailed, prefix + " is not float32" + (bytes_allowed ? " or uint8" : "") +
                                                   " (ONNX element type " + std::to_string(signature.type) + ")");
  }
  if (signature.shape.size() != 2) {
    return Status(ErrorCode::kInferenceFailed,
                  prefix + " has rank " + std::to_string(signature.shape.size()) + ", expected 2 (batch, features)");
  }
  return Status::Ok();
}

// Input and output tensors of one batch size, bound over buffers owned here.
struct Binding {
  std::size_t batch = 0;
  std::uint64_t last_used = 0;
  std::vector<float> input;              // a float32 input
  std::vector<std::uint8_t> input_bytes;  // a uint8 input: the observations converted, in place
  std::vector<float> output;
  ValuePtr input_value;
  ValuePtr output_value;
  // Both tensors bound by name once: a run skips ONNX Runtime's per-run name lookups.
  IoBindingPtr io;
};

// Batch sizes kept bound at once; a game usually runs one or two.
constexpr std::size_t kMaxBindings = 4;

}  // namespace

struct OnnxRuntimeBackend::Model {
  EnvPtr env;
  SessionPtr session;
  MemoryInfoPtr memory_info;
  std::string input_name;
  std::string output_name;
  std::int64_t fixed_batch = -1;  // the model's batch size if it is not dynamic
  std::size_t obs_dim = 0;        // 0 = dynamic
  std::size_t out_dim = 0;        // 0 = dynamic
  ModelInputType input_type = ModelInputType::kFloat32;
  std::vector<std::int64_t> input_dims;  // the input's dimensions after the batch
  std::vector<Binding> bindings;
  std::uint64_t runs = 0;
};

OnnxRuntimeBackend::OnnxRuntimeBackend() = default;
OnnxRuntimeBackend::~OnnxRuntimeBackend() = default;
OnnxRuntimeBackend::OnnxRuntimeBackend(OnnxRuntimeBackend&&) noexcept = default;
OnnxRuntimeBackend& OnnxRuntimeBackend::operator=(OnnxRuntimeBackend&&) noexcept = default;

Status OnnxRuntimeBackend::load(const std::uint8_t* model, std::size_t size, const std::string& input_name,
                                const std::string& output_name) {
  const OrtApi* api = ort_api();
  if (api == nullptr) {
    return Status(ErrorCode::kInferenceFailed,
                  "the ONNX Runtime library is older than the headers the SDK was built with (API version " +
                      std::to_string(ORT_API_VERSION) + " unavailable; it has " +
                      OrtGetApiBase()->GetVersionString() + ")");
  }
  if (model == nullptr || size == 0) {
    return Status(ErrorCode::kInferenceFailed, "the model is empty");
  }
  if (input_name.empty() || output_name.empty()) {
    return Status(ErrorCode::kInferenceFailed, "the model's input and output names must not be empty");
  }
  auto next = std::make_unique<Model>();
  OrtEnv* raw_env = nullptr;  // ONNX Runtime shares one reference-counted env per process
  Status status = check(api->CreateEnv(ORT_LOGGING_LEVEL_ERROR, "tether", &raw_env), "creating the environment");
  if (!status.ok()) {
    return status;
  }
  next->env.reset(raw_env);

  OrtSessionOptions* raw_options = nullptr;
  status = check(api->CreateSessionOptions(&raw_options), "creating session options");
  if (!status.ok()) {
    return status;
  }
  SessionOptionsPtr options(raw_options);
  status = check(api->SetIntraOpNumThreads(options.get(), 1), "setting one intra-op thread");
  if (status.ok()) {
    status = check(api->SetInterOpNumThreads(options.get(), 1), "setting one inter-op thread");
  }
  if (status.ok()) {
    status = check(api->SetSessionExecutionMode(options.get(), ORT_SEQUENTIAL), "setting sequential execution");
  }
  if (status.ok()) {
    status = check(api->SetSessionGraphOptimizationLevel(options.get(), ORT_ENABLE_ALL), "enabling optimizations");
  }
  if (!status.ok()) {
    return status;
  }

  OrtSession* raw_session = nullptr;
  OrtStatus* created = api->CreateSessionFromArray(next->env.get(), model, size, options.get(), &raw_session);
  if (created != nullptr) {
    OrtStatusPtr owned(created);
    return Status(ErrorCode::kInferenceFailed, "ONNX Runtime could not load the model (" + std::to_string(size) +
                                                   " bytes): " + api->GetErrorMessage(created));
  }
  next->session.reset(raw_session);

  OrtAllocator* allocator = nullptr;  // the default allocator is owned by ONNX Runtime
  status = check(api->GetAllocatorWithDefaultOptions(&allocator), "getting the default allocator");
  if (!status.ok()) {
    return status;
  }
  std::size_t input_index = 0;
  std::size_t output_index = 0;
  status = find_name(next->session.get(), allocator, true, input_name, &input_index);
  if (!status.ok()) {
    return status;
  }
  status = find_name(next->session.get(), allocator, false, output_name, &output_index);
  if (!status.ok()) {
    return status;
  }
  TensorSignature input;
  TensorSignature output;
  status = read_signature(next->session.get(), true, input_index, &input);
  if (status.ok()) {
    status = check_signature(input, "input", input_name, /*bytes_allowed=*/true);
  }
  if (status.ok()) {
    status = read_signature(next->session.get(), false, output_index, &output);
  }
  if (status.ok()) {
    status = check_signature(output, "output", output_name, /*bytes_allowed=*/false);
  }
  if (!status.ok()) {
    return status;
  }
  next->fixed_batch = input.shape[0] > 0 ? input.shape[0] : -1;
  next->input_dims.assign(input.shape.begin() + 1, input.shape.end());
  if (input.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8) {
    // Static dimensions (checked above): the observation's flat width is their product.
    next->input_type = ModelInputType::kUint8;
    std::size_t width = 1;
    for (std::int64_t d : next->input_dims) width *= static_cast<std::size_t>(d);
    next->obs_dim = width;
  } else {
    next->obs_dim = input.shape[1] > 0 ? static_cast<std::size_t>(input.shape[1]) : 0;
  }
  next->out_dim = output.shape[1] > 0 ? static_cast<std::size_t>(output.shape[1]) : 0;

  OrtMemoryInfo* raw_info = nullptr;
  status = check(api->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &raw_info), "creating memory info");
  if (!status.ok()) {
    return status;
  }
  next->memory_info.reset(raw_info);
  next->input_name = input_name;
  next->output_name = output_name;
  next->bindings.reserve(kMaxBindings);
  model_ = std::move(next);
  return Status::Ok();
}

Status OnnxRuntimeBackend::run(const float* obs, std::size_t batch, std::size_t obs_dim, float* out,
                               std::size_t out_dim) {
  if (!model_) {
    return Status(ErrorCode::kNotReady, "no model loaded");
  }
  Model& m = *model_;
  if (obs == nullptr || out == nullptr || batch == 0 || obs_dim == 0 || out_dim == 0) {
    return Status(ErrorCode::kInvalidArgument, "run needs observations, an output buffer and non-zero sizes");
  }
  // (a uint8 input's width is always static: its tensor is shaped from the model's dimensions)
  if ((m.obs_dim != 0 || m.input_type == ModelInputType::kUint8) && obs_dim != m.obs_dim) {
    return Status(ErrorCode::kInvalidArgument, "observation width " + std::to_string(obs_dim) +
                                                   " does not match the model's " + std::to_string(m.obs_dim));
  }
  if (m.out_dim != 0 && out_dim != m.out_dim) {
    return Status(ErrorCode::kInvalidArgument, "output width " + std::to_string(out_dim) +
                                                   " does not match the model's " + std::to_string(m.out_dim));
  }
  if (m.fixed_batch > 0 && static_cast<std::int64_t>(batch) != m.fixed_batch) {
    return Status(ErrorCode::kInvalidArgument, "batch " + std::to_string(batch) + " but the model's batch is fixed at " +
                                                   std::to_string(m.fixed_batch));
  }
  const OrtApi* api = ort_api();
  ++m.runs;

  const bool bytes = m.input_type == ModelInputType::kUint8;
  const std::size_t input_count = batch * obs_dim;

  // Find (or make) the binding for this batch size; evict the least recently used.
  Binding* binding = nullptr;
  for (Binding& candidate : m.bindings) {
    if (candidate.batch == batch && (bytes ? candidate.input_bytes.size() : candidate.input.size()) == input_count &&
        candidate.output.size() == batch * out_dim) {
      binding = &candidate;
      break;
    }
  }
  if (binding == nullptr) {
    Binding fresh;
    fresh.batch = batch;
    fresh.output.assign(batch * out_dim, 0.0f);
    std::array<std::int64_t, 2> out_shape{static_cast<std::int64_t>(batch), static_cast<std::int64_t>(out_dim)};
    OrtValue* raw_in = nullptr;
    Status status;
    if (bytes) {
      // (batch, d1, ..., dk): obs_dim matched the static dimensions' product above.
      std::vector<std::int64_t> in_shape{static_cast<std::int64_t>(batch)};
      in_shape.insert(in_shape.end(), m.input_dims.begin(), m.input_dims.end());
      fresh.input_bytes.assign(input_count, 0);
      status = check(api->CreateTensorWithDataAsOrtValue(m.memory_info.get(), fresh.input_bytes.data(),
                                                         fresh.input_bytes.size(), in_shape.data(), in_shape.size(),
                                                         ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, &raw_in),
                     "creating the input tensor");
    } else {
      std::array<std::int64_t, 2> in_shape{static_cast<std::int64_t>(batch), static_cast<std::int64_t>(obs_dim)};
      fresh.input.assign(input_count, 0.0f);
      status = check(api->CreateTensorWithDataAsOrtValue(
                         m.memory_info.get(), fresh.input.data(), fresh.input.size() * sizeof(float), in_shape.data(),
                         in_shape.size(), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &raw_in),
                     "creating the input tensor");
    }
    if (!status.ok()) {
      return status;
    }
    fresh.input_value.reset(raw_in);
    OrtValue* raw_out = nullptr;
    status = check(api->CreateTensorWithDataAsOrtValue(
                       m.memory_info.get(), fresh.output.data(), fresh.output.size() * sizeof(float),
                       out_shape.data(), out_shape.size(), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &raw_out),
                   "creating the output tensor");
    if (!status.ok()) {
      return status;
    }
    fresh.output_value.reset(raw_out);
    OrtIoBinding* raw_io = nullptr;
    status = check(api->CreateIoBinding(m.session.get(), &raw_io), "creating the tensors' binding");
    if (!status.ok()) {
      return status;
    }
    fresh.io.reset(raw_io);
    status = check(api->BindInput(fresh.io.get(), m.input_name.c_str(), fresh.input_value.get()), "binding the input");
    if (status.ok()) {
      status = check(api->BindOutput(fresh.io.get(), m.output_name.c_str(), fresh.output_value.get()),
                     "binding the output");
    }
    if (!status.ok()) {
      return status;
    }
    if (m.bindings.size() < kMaxBindings) {
      m.bindings.push_back(std::move(fresh));
      binding = &m.bindings.back();
    } else {
      binding = &m.bindings.front();
      for (Binding& candidate : m.bindings) {
        if (candidate.last_used < binding->last_used) {
          binding = &candidate;
        }
      }
      *binding = std::move(fresh);  // vectors move their buffers: the tensors stay valid
    }
  }
  binding->last_used = m.runs;

  if (bytes) {
    // Integers 0-255 (checked by the client) become those bytes; anything else is clamped (NaN as 0).
    std::uint8_t* to = binding->input_bytes.data();
    for (std::size_t i = 0; i < input_count; ++i) {
      const float v = obs[i];
      to[i] = !(v > 0.0f) ? std::uint8_t{0} : v >= 255.0f ? std::uint8_t{255} : static_cast<std::uint8_t>(v + 0.5f);
    }
  } else {
    std::memcpy(binding->input.data(), obs, input_count * sizeof(float));
  }
  Status status = check(api->RunWithBinding(m.session.get(), nullptr, binding->io.get()), "running the model");
  if (!status.ok()) {
    return status;
  }
  std::memcpy(out, binding->output.data(), binding->output.size() * sizeof(float));
  return Status::Ok();
}

bool OnnxRuntimeBackend::loaded() const noexcept { return model_ != nullptr; }

std::size_t OnnxRuntimeBackend::obs_dim() const noexcept { return model_ ? model_->obs_dim : 0; }

std::size_t OnnxRuntimeBackend::out_dim() const noexcept { return model_ ? model_->out_dim : 0; }

ModelInputType OnnxRuntimeBackend::input_type() const noexcept {
  return model_ ? model_->input_type : ModelInputType::kFloat32;
}

const std::vector<std::int64_t>& OnnxRuntimeBackend::input_shape() const noexcept {
  static const std::vector<std::int64_t> kNone;
  return model_ ? model_->input_dims : kNone;
}

}  // namespace tether
