// ONNX Runtime backend over the C API: every OrtStatus* is checked and
// released, every Ort object has a unique_ptr owner with its Release function.
#include "tether/onnxruntime_backend.h"

#include <onnxruntime_c_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#endif

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

// One model input: where its values sit in a flat row, and its tensor type.
struct Input {
  std::string name;
  std::size_t offset = 0;
  std::size_t width = 0;  // values per row; 0 = dynamic (a single float32 input of dynamic width)
  ModelInputType type = ModelInputType::kFloat32;
  std::vector<std::int64_t> dims;  // its dimensions after the batch
};

// One input's tensor of one batch size, bound over a buffer owned here.
struct BoundInput {
  std::vector<float> floats;        // a float32 input
  std::vector<std::uint8_t> bytes;  // a uint8 input: the observations converted, in place
  ValuePtr value;
};

// Input and output tensors of one batch size, bound over buffers owned here.
struct Binding {
  std::size_t batch = 0;
  std::size_t obs_dim = 0;
  std::uint64_t last_used = 0;
  std::vector<BoundInput> inputs;
  std::vector<float> output;
  ValuePtr output_value;
  // [1.5] A model with memory's state tensors, one input and one output per
  // state object, (batch, size) each.
  std::vector<BoundInput> state_inputs;
  std::vector<std::vector<float>> state_outputs;
  std::vector<ValuePtr> state_output_values;
  // Every tensor bound by name once: a run skips ONNX Runtime's per-run name lookups.
  IoBindingPtr io;
};

// Batch sizes kept bound at once; a game usually runs one or two.
constexpr std::size_t kMaxBindings = 4;

}  // namespace

struct OnnxRuntimeBackend::Model {
  EnvPtr env;
  SessionPtr session;
  MemoryInfoPtr memory_info;
  std::vector<Input> inputs;
  std::string output_name;
  std::int64_t fixed_batch = -1;  // the model's batch size if it is not dynamic
  std::size_t obs_dim = 0;        // 0 = dynamic
  std::size_t out_dim = 0;        // 0 = dynamic
  std::vector<Binding> bindings;
  std::uint64_t runs = 0;
  std::vector<RecurrentStateSpec> states;  // [1.5] its state tensors (bind_recurrent_state); empty: no memory
};

OnnxRuntimeBackend::OnnxRuntimeBackend() = default;
OnnxRuntimeBackend::~OnnxRuntimeBackend() = default;
OnnxRuntimeBackend::OnnxRuntimeBackend(OnnxRuntimeBackend&&) noexcept = default;
OnnxRuntimeBackend& OnnxRuntimeBackend::operator=(OnnxRuntimeBackend&&) noexcept = default;

Status OnnxRuntimeBackend::load(const std::uint8_t* model, std::size_t size, const std::string& input_name,
                                const std::string& output_name) {
  return load_inputs(model, size, {ModelLeafInput{input_name, 0, 0}}, output_name, false);
}

Status OnnxRuntimeBackend::load_leaves(const std::uint8_t* model, std::size_t size,
                                       const std::vector<ModelLeafInput>& inputs, const std::string& output_name) {
  if (inputs.empty()) return Status(ErrorCode::kInferenceFailed, "a composite observation has at least one leaf");
  return load_inputs(model, size, inputs, output_name, true);
}

Status OnnxRuntimeBackend::load_inputs(const std::uint8_t* model, std::size_t size,
                                       const std::vector<ModelLeafInput>& inputs, const std::string& output_name,
                                       bool leaves) {
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
  for (const ModelLeafInput& input : inputs) {
    if (input.name.empty() || output_name.empty()) {
      return Status(ErrorCode::kInferenceFailed, "the model's input and output names must not be empty");
    }
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
  std::size_t output_index = 0;
  status = find_name(next->session.get(), allocator, false, output_name, &output_index);
  if (!status.ok()) {
    return status;
  }
  TensorSignature output;
  status = read_signature(next->session.get(), false, output_index, &output);
  if (status.ok()) {
    status = check_signature(output, "output", output_name, /*bytes_allowed=*/false);
  }
  if (!status.ok()) {
    return status;
  }
  for (const ModelLeafInput& wanted : inputs) {
    std::size_t index = 0;
    status = find_name(next->session.get(), allocator, true, wanted.name, &index);
    if (!status.ok()) {
      return status;
    }
    TensorSignature signature;
    status = read_signature(next->session.get(), true, index, &signature);
    if (status.ok()) {
      status = check_signature(signature, "input", wanted.name, /*bytes_allowed=*/true);
    }
    if (!status.ok()) {
      return status;
    }
    Input input;
    input.name = wanted.name;
    input.offset = wanted.offset;
    input.dims.assign(signature.shape.begin() + 1, signature.shape.end());
    if (signature.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8) {
      // Static dimensions (checked above): the observation's flat width is their product.
      input.type = ModelInputType::kUint8;
      std::size_t width = 1;
      for (std::int64_t d : input.dims) width *= static_cast<std::size_t>(d);
      input.width = width;
    } else {
      input.width = signature.shape[1] > 0 ? static_cast<std::size_t>(signature.shape[1]) : 0;
    }
    if (leaves) {
      // A leaf's width is known from its space: a dynamic one takes it, a static one must hold it.
      if (input.width != 0 && input.width != wanted.size) {
        return Status(ErrorCode::kInferenceFailed, "model input '" + wanted.name + "' takes " +
                                                       std::to_string(input.width) + " values per row; the leaf has " +
                                                       std::to_string(wanted.size));
      }
      input.width = wanted.size;
      input.dims = input.type == ModelInputType::kUint8 ? input.dims
                                                        : std::vector<std::int64_t>{static_cast<std::int64_t>(wanted.size)};
    }
    if (next->inputs.empty()) {
      next->fixed_batch = signature.shape[0] > 0 ? signature.shape[0] : -1;
    }
    next->inputs.push_back(std::move(input));
  }
  std::size_t obs_dim = 0;
  for (const Input& input : next->inputs) {
    obs_dim = input.width == 0 ? 0 : obs_dim + input.width;
    if (input.width == 0) break;
  }
  next->obs_dim = obs_dim;
  next->out_dim = output.shape[1] > 0 ? static_cast<std::size_t>(output.shape[1]) : 0;

  OrtMemoryInfo* raw_info = nullptr;
  status = check(api->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &raw_info), "creating memory info");
  if (!status.ok()) {
    return status;
  }
  next->memory_info.reset(raw_info);
  next->output_name = output_name;
  next->bindings.reserve(kMaxBindings);
  model_ = std::move(next);
  return Status::Ok();
}

namespace {

// A tensor of `type` in `shape` (of `rank` dimensions) over the `size` bytes
// at `data`, which stay the caller's; owned by `out` once made.
Status wrap_buffer(const OrtApi* api, const OrtMemoryInfo* memory_info, void* data, std::size_t size,
                   const std::int64_t* shape, std::size_t rank, ONNXTensorElementDataType type, const char* what,
                   ValuePtr& out) {
  OrtValue* raw = nullptr;
  Status status = check(api->CreateTensorWithDataAsOrtValue(memory_info, data, size, shape, rank, type, &raw), what);
  if (status.ok()) out.reset(raw);
  return status;
}

// Binds every input and the output of one batch size over fresh buffers.
Status make_binding(const OrtApi* api, OrtSession* session, const OrtMemoryInfo* memory_info,
                    const std::vector<Input>& inputs, const std::vector<RecurrentStateSpec>& states,
                    const std::string& output_name, std::size_t batch, std::size_t obs_dim, std::size_t out_dim,
                    Binding& fresh) {
  fresh.batch = batch;
  fresh.obs_dim = obs_dim;
  fresh.output.assign(batch * out_dim, 0.0f);
  OrtIoBinding* raw_io = nullptr;
  Status status = check(api->CreateIoBinding(session, &raw_io), "creating the tensors' binding");
  if (!status.ok()) {
    return status;
  }
  fresh.io.reset(raw_io);
  fresh.inputs.resize(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Input& input = inputs[i];
    BoundInput& bound = fresh.inputs[i];
    // (a single input of dynamic width takes the whole row)
    const std::size_t width = input.width != 0 ? input.width : obs_dim;
    if (input.type == ModelInputType::kUint8) {
      // (batch, d1, ..., dk): the width matched the static dimensions' product at load.
      std::vector<std::int64_t> shape{static_cast<std::int64_t>(batch)};
      shape.insert(shape.end(), input.dims.begin(), input.dims.end());
      bound.bytes.assign(batch * width, 0);
      status = wrap_buffer(api, memory_info, bound.bytes.data(), bound.bytes.size(), shape.data(), shape.size(),
                           ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, "creating an input tensor", bound.value);
    } else {
      std::array<std::int64_t, 2> shape{static_cast<std::int64_t>(batch), static_cast<std::int64_t>(width)};
      bound.floats.assign(batch * width, 0.0f);
      status = wrap_buffer(api, memory_info, bound.floats.data(), bound.floats.size() * sizeof(float), shape.data(),
                           shape.size(), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "creating an input tensor", bound.value);
    }
    if (!status.ok()) {
      return status;
    }
    status = check(api->BindInput(fresh.io.get(), input.name.c_str(), bound.value.get()), "binding an input");
    if (!status.ok()) {
      return status;
    }
  }
  // [1.5] The state tensors, each (batch, size), in and out.
  fresh.state_inputs.resize(states.size());
  fresh.state_outputs.resize(states.size());
  fresh.state_output_values.resize(states.size());
  for (std::size_t k = 0; k < states.size(); ++k) {
    std::array<std::int64_t, 2> shape{static_cast<std::int64_t>(batch), static_cast<std::int64_t>(states[k].size)};
    BoundInput& bound = fresh.state_inputs[k];
    bound.floats.assign(batch * states[k].size, 0.0f);
    status = wrap_buffer(api, memory_info, bound.floats.data(), bound.floats.size() * sizeof(float), shape.data(),
                         shape.size(), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "creating a state input tensor", bound.value);
    if (status.ok()) {
      status = check(api->BindInput(fresh.io.get(), states[k].input.c_str(), bound.value.get()), "binding a state input");
    }
    if (!status.ok()) {
      return status;
    }
    std::vector<float>& out = fresh.state_outputs[k];
    out.assign(batch * states[k].size, 0.0f);
    status = wrap_buffer(api, memory_info, out.data(), out.size() * sizeof(float), shape.data(), shape.size(),
                         ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "creating a state output tensor",
                         fresh.state_output_values[k]);
    if (status.ok()) {
      status = check(api->BindOutput(fresh.io.get(), states[k].output.c_str(), fresh.state_output_values[k].get()),
                     "binding a state output");
    }
    if (!status.ok()) {
      return status;
    }
  }
  std::array<std::int64_t, 2> out_shape{static_cast<std::int64_t>(batch), static_cast<std::int64_t>(out_dim)};
  status = wrap_buffer(api, memory_info, fresh.output.data(), fresh.output.size() * sizeof(float), out_shape.data(),
                       out_shape.size(), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "creating the output tensor",
                       fresh.output_value);
  if (!status.ok()) {
    return status;
  }
  return check(api->BindOutput(fresh.io.get(), output_name.c_str(), fresh.output_value.get()), "binding the output");
}

// Integers 0-255 (checked by the client) become those bytes; anything else is
// clamped (NaN as 0), halves rounded up.
void floats_to_bytes(const float* from, std::uint8_t* to, std::size_t n) noexcept {
  std::size_t j = 0;
#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
  // An image is tens of thousands of values every run: 16 at a time. max(v, 0)
  // gives 0 for NaN (maxps returns its second operand when unordered).
  const __m128 zero = _mm_setzero_ps();
  const __m128 top = _mm_set1_ps(255.0f);
  const __m128 half = _mm_set1_ps(0.5f);
  for (; j + 16 <= n; j += 16) {
    __m128i ints[4];
    for (int k = 0; k < 4; ++k) {
      const __m128 v = _mm_min_ps(_mm_max_ps(_mm_loadu_ps(from + j + 4 * k), zero), top);
      ints[k] = _mm_cvttps_epi32(_mm_add_ps(v, half));
    }
    const __m128i words = _mm_packs_epi32(ints[0], ints[1]);
    const __m128i words2 = _mm_packs_epi32(ints[2], ints[3]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + j), _mm_packus_epi16(words, words2));
  }
#endif
  for (; j < n; ++j) {
    const float v = from[j];
    to[j] = !(v > 0.0f) ? std::uint8_t{0} : v >= 255.0f ? std::uint8_t{255} : static_cast<std::uint8_t>(v + 0.5f);
  }
}

}  // namespace

Status OnnxRuntimeBackend::run(const float* obs, std::size_t batch, std::size_t obs_dim, float* out,
                               std::size_t out_dim) {
  if (model_ && !model_->states.empty()) {
    return Status(ErrorCode::kInvalidArgument, "the model has memory (a recurrent state): run it with run_recurrent");
  }
  return run_bound(obs, nullptr, batch, obs_dim, nullptr, nullptr, out, out_dim);
}

Status OnnxRuntimeBackend::run_recurrent(const float* obs, std::size_t batch, std::size_t obs_dim,
                                         const float* state_in, float* state_out, std::size_t state_dim, float* out,
                                         std::size_t out_dim) {
  Status state = check_state(state_in, state_out, state_dim);
  if (!state.ok()) return state;
  return run_bound(obs, nullptr, batch, obs_dim, state_in, state_out, out, out_dim);
}

Status OnnxRuntimeBackend::run_bytes(const std::uint8_t* obs, std::size_t batch, std::size_t obs_dim, float* out,
                                     std::size_t out_dim) {
  if (model_ && !model_->states.empty()) {
    return Status(ErrorCode::kInvalidArgument,
                  "the model has memory (a recurrent state): run it with run_bytes_recurrent");
  }
  return run_bound(nullptr, obs, batch, obs_dim, nullptr, nullptr, out, out_dim);
}

Status OnnxRuntimeBackend::run_bytes_recurrent(const std::uint8_t* obs, std::size_t batch, std::size_t obs_dim,
                                               const float* state_in, float* state_out, std::size_t state_dim,
                                               float* out, std::size_t out_dim) {
  Status state = check_state(state_in, state_out, state_dim);
  if (!state.ok()) return state;
  return run_bound(nullptr, obs, batch, obs_dim, state_in, state_out, out, out_dim);
}

// A model with memory's state rows are `state_dim` wide (bind_recurrent_state's tensors, summed), in and out.
Status OnnxRuntimeBackend::check_state(const float* state_in, const float* state_out, std::size_t state_dim) const {
  if (!model_) {
    return Status(ErrorCode::kNotReady, "no model loaded");
  }
  const std::size_t want = recurrent_state_dim(model_->states);
  if (want == 0) {
    return Status(ErrorCode::kInvalidArgument, "the model has no memory (no recurrent state bound): run it with run");
  }
  if (state_in == nullptr || state_out == nullptr || state_dim != want) {
    return Status(ErrorCode::kInvalidArgument, "state rows of " + std::to_string(state_dim) +
                                                   " values, the model's state has " + std::to_string(want));
  }
  return Status::Ok();
}

Status OnnxRuntimeBackend::run_bound(const float* obs, const std::uint8_t* bytes, std::size_t batch,
                                     std::size_t obs_dim, const float* state_in, float* state_out, float* out,
                                     std::size_t out_dim) {
  if (!model_) {
    return Status(ErrorCode::kNotReady, "no model loaded");
  }
  Model& m = *model_;
  if ((obs == nullptr && bytes == nullptr) || out == nullptr || batch == 0 || obs_dim == 0 || out_dim == 0) {
    return Status(ErrorCode::kInvalidArgument, "run needs observations, an output buffer and non-zero sizes");
  }
  // (a uint8 input's width is always static, as is every leaf's)
  if (m.obs_dim != 0 && obs_dim != m.obs_dim) {
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

  // Find (or make) the binding for this batch size; evict the least recently used.
  Binding* binding = nullptr;
  for (Binding& candidate : m.bindings) {
    if (candidate.batch == batch && candidate.obs_dim == obs_dim && candidate.output.size() == batch * out_dim) {
      binding = &candidate;
      break;
    }
  }
  if (binding == nullptr) {
    Binding fresh;
    Status status = make_binding(api, m.session.get(), m.memory_info.get(), m.inputs, m.states, m.output_name, batch,
                                 obs_dim, out_dim, fresh);
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

  for (std::size_t i = 0; i < m.inputs.size(); ++i) {
    const Input& input = m.inputs[i];
    BoundInput& bound = binding->inputs[i];
    const std::size_t width = input.width != 0 ? input.width : obs_dim;
    for (std::size_t b = 0; b < batch; ++b) {
      const std::size_t at = b * obs_dim + input.offset;
      if (bytes != nullptr) {  // (a byte box's values: as they are, or widened for a float32 input)
        if (input.type == ModelInputType::kUint8) {
          std::memcpy(bound.bytes.data() + b * width, bytes + at, width);
        } else {
          std::copy(bytes + at, bytes + at + width, bound.floats.data() + b * width);
        }
      } else if (input.type == ModelInputType::kUint8) {
        floats_to_bytes(obs + at, bound.bytes.data() + b * width, width);
      } else {
        std::memcpy(bound.floats.data() + b * width, obs + at, width * sizeof(float));
      }
    }
  }
  // [1.5] Each row's state, tensor after tensor, into the tensors' (batch, size) inputs.
  const std::size_t units = m.states.empty() ? 0 : m.states.front().size;
  const std::size_t state_dim = units * m.states.size();
  for (std::size_t k = 0; k < m.states.size(); ++k) {
    float* to = binding->state_inputs[k].floats.data();
    for (std::size_t b = 0; b < batch; ++b) {
      std::memcpy(to + b * units, state_in + b * state_dim + k * units, units * sizeof(float));
    }
  }
  Status status = check(api->RunWithBinding(m.session.get(), nullptr, binding->io.get()), "running the model");
  if (!status.ok()) {
    return status;
  }
  std::memcpy(out, binding->output.data(), binding->output.size() * sizeof(float));
  for (std::size_t k = 0; k < m.states.size(); ++k) {
    const float* from = binding->state_outputs[k].data();
    for (std::size_t b = 0; b < batch; ++b) {
      std::memcpy(state_out + b * state_dim + k * units, from + b * units, units * sizeof(float));
    }
  }
  return Status::Ok();
}

Status OnnxRuntimeBackend::bind_recurrent_state(const std::vector<RecurrentStateSpec>& state) {
  if (!model_) {
    return Status(ErrorCode::kNotReady, "no model loaded");
  }
  Model& m = *model_;
  const OrtApi* api = ort_api();
  OrtAllocator* allocator = nullptr;  // the default allocator is owned by ONNX Runtime
  Status status = check(api->GetAllocatorWithDefaultOptions(&allocator), "getting the default allocator");
  if (!status.ok()) {
    return status;
  }
  // A model lacking an announced state tensor, or one of another shape, is
  // refused (§12.1): it cannot carry the state the server trains it with.
  for (const RecurrentStateSpec& tensor : state) {
    for (bool input : {true, false}) {
      const std::string& name = input ? tensor.input : tensor.output;
      std::size_t index = 0;
      status = find_name(m.session.get(), allocator, input, name, &index);
      TensorSignature signature;
      if (status.ok()) {
        status = read_signature(m.session.get(), input, index, &signature);
      }
      if (status.ok()) {
        status = check_signature(signature, input ? "state input" : "state output", name, /*bytes_allowed=*/false);
      }
      if (status.ok() && signature.shape[1] >= 0 && static_cast<std::size_t>(signature.shape[1]) != tensor.size) {
        status = Status(ErrorCode::kInferenceFailed, "model " + std::string(input ? "input" : "output") + " '" + name +
                                                         "' has " + std::to_string(signature.shape[1]) +
                                                         " units; the announced recurrent_state has " +
                                                         std::to_string(tensor.size));
      }
      if (!status.ok()) {
        return Status(ErrorCode::kInvalidField, "recurrent_state: " + status.message());
      }
    }
  }
  m.states = state;
  m.bindings.clear();  // (bound again with the state tensors)
  return Status::Ok();
}

bool OnnxRuntimeBackend::loaded() const noexcept { return model_ != nullptr; }

std::size_t OnnxRuntimeBackend::obs_dim() const noexcept { return model_ ? model_->obs_dim : 0; }

std::size_t OnnxRuntimeBackend::out_dim() const noexcept { return model_ ? model_->out_dim : 0; }

ModelInputType OnnxRuntimeBackend::input_type() const noexcept {
  return model_ ? model_->inputs[0].type : ModelInputType::kFloat32;
}

const std::vector<std::int64_t>& OnnxRuntimeBackend::input_shape() const noexcept {
  static const std::vector<std::int64_t> kNone;
  return model_ ? model_->inputs[0].dims : kNone;
}

std::size_t OnnxRuntimeBackend::input_count() const noexcept { return model_ ? model_->inputs.size() : 0; }

}  // namespace tether
