// Where actions come from when the client runs the policy itself: an
// inference backend turns a batch of observations into action_dist_inputs
// with the ONNX model the server sent (MODEL_UPDATE). The protocol core never
// depends on a particular runtime; onnxruntime_backend.h is one implementation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tether/recurrent_state.h"
#include "tether/status.h"

namespace tether {

/// The element type of a model's observation input (§12.1).
enum class ModelInputType {
  kFloat32,  ///< float32 (batch, obs_dim): every space but a byte box
  kUint8,    ///< uint8 (batch, *observation_space.shape): a byte box (protocol 1.4)
};

/// One input of a model that takes a composite observation (protocol 1.4,
/// §12.1): the leaf's values, `size` of them at `offset` in each flat row,
/// fed to the input named by its leaf path.
struct ModelLeafInput {
  std::string name;         ///< the leaf path, the input's name
  std::size_t offset = 0;   ///< the leaf's first value in the flat row
  std::size_t size = 0;     ///< the leaf's values
};

/// Runs a policy model: observations (batch, obs_dim) -> outputs (batch, out_dim),
/// row-major float32. Implementations are not thread-safe: use one backend per
/// thread (or guard it). In steady state (the same batch sizes again and again)
/// run() allocates nothing.
class InferenceBackend {
 public:
  virtual ~InferenceBackend() = default;

  /// Loads a serialized model whose input `input_name` is (batch, obs_dim)
  /// float32 and whose output `output_name` is (batch, out_dim) float32. A
  /// backend that supports byte boxes (protocol 1.4, §12.1) also loads a
  /// model whose input is uint8 (batch, *shape) and reports it through
  /// input_type(). Replaces the current model only on success: on failure the
  /// previous model (if any) stays loaded. Fails with kInferenceFailed naming
  /// what was wrong.
  virtual Status load(const std::uint8_t* model, std::size_t size, const std::string& input_name,
                      const std::string& output_name) = 0;

  /// Loads a serialized model that takes a composite observation (protocol
  /// 1.4, §12.1): one input per leaf, by name, float32 (batch, size) or, for
  /// a byte box's leaf, uint8 (batch, *shape); run() then takes flat rows
  /// (obs_dim = the leaves' sizes summed) and feeds each leaf its part. The
  /// default refuses (kInferenceFailed): a backend without composite support.
  virtual Status load_leaves(const std::uint8_t* model, std::size_t size, const std::vector<ModelLeafInput>& inputs,
                             const std::string& output_name) {
    (void)model;
    (void)size;
    (void)inputs;
    (void)output_name;
    return Status(ErrorCode::kInferenceFailed, "this inference backend runs no models of Dict or Tuple observations");
  }

  /// Computes `out` (batch * out_dim floats) from `obs` (batch * obs_dim floats).
  /// For a uint8 input each value, an integer 0-255 (a byte box's
  /// observation, checked by the client), is fed as that byte.
  /// kNotReady before a model is loaded, kInvalidArgument if the sizes do not
  /// match the model, kInferenceFailed if the runtime fails.
  virtual Status run(const float* obs, std::size_t batch, std::size_t obs_dim, float* out,
                     std::size_t out_dim) = 0;

  /// True once a model is loaded.
  virtual bool loaded() const noexcept = 0;

  /// The model's observation width (0 before a model is loaded, or if the
  /// model leaves it dynamic).
  virtual std::size_t obs_dim() const noexcept = 0;

  /// The model's output width (0 before a model is loaded, or if dynamic).
  virtual std::size_t out_dim() const noexcept = 0;

  /// The element type of the loaded model's input (float32 before a model is
  /// loaded, and for a backend that only runs float32 models).
  virtual ModelInputType input_type() const noexcept { return ModelInputType::kFloat32; }

  /// [1.5] Declares the loaded model's recurrent state (§9.1, §12.1): one
  /// float32 (batch, size) input and output per state tensor, fed and read
  /// by name. Called once after load()/load_leaves(); the backend binds the
  /// state tensors then, so that run_recurrent() looks nothing up.
  /// INVALID_FIELD when the model lacks an announced input or output (or one
  /// is not float32 (batch, size)); NOT_READY before a model is loaded. The
  /// default accepts an empty list and refuses any other (INFERENCE_FAILED):
  /// a backend that runs no models with memory.
  virtual Status bind_recurrent_state(const std::vector<RecurrentStateSpec>& state) {
    if (state.empty()) return Status::Ok();
    return Status(ErrorCode::kInferenceFailed, "this inference backend runs no models with memory");
  }

  /// [1.5] run() for a model with memory: row `b` of `state_in` (batch rows
  /// of `state_dim` = tensors x size floats, each row tensor after tensor, in
  /// the order bind_recurrent_state() was given) is fed with observation row
  /// `b`; `state_out` (the same layout) receives the state after the step.
  /// `state_in` and `state_out` may be the same buffer; `state_out` is
  /// written only when the run succeeds. Codes as run(); the default
  /// refuses (INFERENCE_FAILED).
  virtual Status run_recurrent(const float* obs, std::size_t batch, std::size_t obs_dim, const float* state_in,
                               float* state_out, std::size_t state_dim, float* out, std::size_t out_dim) {
    (void)obs;
    (void)batch;
    (void)obs_dim;
    (void)state_in;
    (void)state_out;
    (void)state_dim;
    (void)out;
    (void)out_dim;
    return Status(ErrorCode::kInferenceFailed, "this inference backend runs no models with memory");
  }

  /// [1.4] run() on observations given as bytes (batch * obs_dim of them,
  /// row-major: a byte box's, §8.1, such as a camera image as the engine
  /// holds it). A uint8 input is fed the bytes as they are. The default
  /// widens them to floats in a buffer the backend keeps (it grows only for a
  /// larger batch) and calls run(). Codes as run()'s.
  virtual Status run_bytes(const std::uint8_t* obs, std::size_t batch, std::size_t obs_dim, float* out,
                           std::size_t out_dim) {
    if (obs == nullptr) return Status(ErrorCode::kInvalidArgument, "run_bytes needs observations");
    widened_bytes_.assign(obs, obs + batch * obs_dim);
    return run(widened_bytes_.data(), batch, obs_dim, out, out_dim);
  }

  /// [1.4, 1.5] run_recurrent() on observations given as bytes (as
  /// run_bytes()'s); the default widens them and calls run_recurrent().
  /// Codes as run_recurrent()'s.
  virtual Status run_bytes_recurrent(const std::uint8_t* obs, std::size_t batch, std::size_t obs_dim,
                                     const float* state_in, float* state_out, std::size_t state_dim, float* out,
                                     std::size_t out_dim) {
    if (obs == nullptr) return Status(ErrorCode::kInvalidArgument, "run_bytes_recurrent needs observations");
    widened_bytes_.assign(obs, obs + batch * obs_dim);
    return run_recurrent(widened_bytes_.data(), batch, obs_dim, state_in, state_out, state_dim, out, out_dim);
  }

 protected:
  /// run_bytes()'s and run_bytes_recurrent()'s floats (the defaults').
  std::vector<float> widened_bytes_;
};

}  // namespace tether
