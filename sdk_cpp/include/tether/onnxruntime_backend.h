// The ONNX Runtime inference backend (target tether::onnxruntime). It uses ONNX
// Runtime's stable C API only, so it works with any release archive of the
// same or a newer version; this header does not include ONNX Runtime's.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tether/inference.h"

namespace tether {

/// Runs the policy with ONNX Runtime on the CPU, one intra-op thread (a game
/// frame should not fan out over every core). Input and output tensors are
/// bound once per batch size over buffers the backend owns, so a run with a
/// batch size seen before allocates nothing (the last few sizes are kept).
/// The model's input is float32 (batch, obs_dim), or (protocol 1.4, §12.1)
/// uint8 (batch, d1, ..., dk) with static dimensions after the batch: the
/// observations given as floats are converted to bytes in the bound buffer.
/// A model of a composite observation (load_leaves, protocol 1.4) has one
/// such input per leaf, each bound over its own buffer: a run copies each
/// leaf's part of the flat rows into its input, allocating nothing either.
class OnnxRuntimeBackend final : public InferenceBackend {
 public:
  /// An empty backend; call load() before run().
  OnnxRuntimeBackend();
  ~OnnxRuntimeBackend() override;
  OnnxRuntimeBackend(const OnnxRuntimeBackend&) = delete;
  OnnxRuntimeBackend& operator=(const OnnxRuntimeBackend&) = delete;
  /// Moves the loaded model.
  OnnxRuntimeBackend(OnnxRuntimeBackend&&) noexcept;
  /// Moves the loaded model.
  OnnxRuntimeBackend& operator=(OnnxRuntimeBackend&&) noexcept;

  /// See InferenceBackend::load. Also fails with kInferenceFailed when the
  /// ONNX Runtime library is older than the headers the SDK was built with.
  Status load(const std::uint8_t* model, std::size_t size, const std::string& input_name,
              const std::string& output_name) override;
  /// See InferenceBackend::load_leaves. Also fails when an input's static
  /// dimensions do not hold the leaf's size.
  Status load_leaves(const std::uint8_t* model, std::size_t size, const std::vector<ModelLeafInput>& inputs,
                     const std::string& output_name) override;
  /// See InferenceBackend::bind_recurrent_state: the state tensors are
  /// bound with the observation's, per batch size, over buffers owned here.
  Status bind_recurrent_state(const std::vector<RecurrentStateSpec>& state) override;
  /// See InferenceBackend::run_recurrent: copies each row's state into the
  /// bound inputs and the bound outputs into `state_out` (no allocation for a
  /// batch size seen before). run() refuses a model with memory.
  Status run_recurrent(const float* obs, std::size_t batch, std::size_t obs_dim, const float* state_in,
                       float* state_out, std::size_t state_dim, float* out, std::size_t out_dim) override;
  /// See InferenceBackend::run.
  Status run(const float* obs, std::size_t batch, std::size_t obs_dim, float* out,
             std::size_t out_dim) override;
  /// See InferenceBackend::run_bytes: a uint8 input is filled by copying
  /// the bytes, a float32 one by widening them (no allocation either way).
  Status run_bytes(const std::uint8_t* obs, std::size_t batch, std::size_t obs_dim, float* out,
                   std::size_t out_dim) override;
  /// See InferenceBackend::run_bytes_recurrent (the bytes as run_bytes takes them).
  Status run_bytes_recurrent(const std::uint8_t* obs, std::size_t batch, std::size_t obs_dim, const float* state_in,
                             float* state_out, std::size_t state_dim, float* out, std::size_t out_dim) override;
  /// See InferenceBackend::loaded.
  bool loaded() const noexcept override;
  /// See InferenceBackend::obs_dim.
  std::size_t obs_dim() const noexcept override;
  /// See InferenceBackend::out_dim.
  std::size_t out_dim() const noexcept override;
  /// See InferenceBackend::input_type.
  ModelInputType input_type() const noexcept override;
  /// The loaded model input's dimensions after the batch, as the model
  /// declares them (-1 for a dynamic one; [obs_dim] for a float32 input, the
  /// observation's shape for a uint8 one); empty before a model is loaded.
  const std::vector<std::int64_t>& input_shape() const noexcept;
  /// The loaded model's inputs: 1, or one per leaf (load_leaves); 0 before a model is loaded.
  std::size_t input_count() const noexcept;

 private:
  struct Model;
  // `obs` or `bytes`: the observations as floats, or as bytes.
  Status run_bound(const float* obs, const std::uint8_t* bytes, std::size_t batch, std::size_t obs_dim,
                   const float* state_in, float* state_out, float* out, std::size_t out_dim);
  Status check_state(const float* state_in, const float* state_out, std::size_t state_dim) const;
  Status load_inputs(const std::uint8_t* model, std::size_t size, const std::vector<ModelLeafInput>& inputs,
                     const std::string& output_name, bool leaves);
  std::unique_ptr<Model> model_;
};

}  // namespace tether
