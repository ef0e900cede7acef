// A fake inference backend for the client tests that need no real model: the
// model's first byte is the value every categorical prefers (a logit of 30,
// the others 0), and a shared log counts the runs and records which thread
// destroyed each backend (models must be freed off the engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tether/inference.h"
#include "tether/status.h"

namespace fake {

/// What the backends of one test did.
struct BackendLog {
  std::mutex mutex;
  std::vector<std::thread::id> destroyed_on;  // one entry per backend destroyed
  int runs = 0;

  std::vector<std::thread::id> destroyers() {
    std::lock_guard<std::mutex> lock(mutex);
    return destroyed_on;
  }
};

/// Accepts any model of at least one byte; widths are left dynamic (0).
class Backend final : public tether::InferenceBackend {
 public:
  explicit Backend(std::shared_ptr<BackendLog> log = nullptr) : log_(std::move(log)) {}
  ~Backend() override {
    if (!log_) return;
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->destroyed_on.push_back(std::this_thread::get_id());
  }
  tether::Status load(const std::uint8_t* model, std::size_t size, const std::string&, const std::string&) override {
    if (size == 0) return tether::Status(tether::ErrorCode::kInferenceFailed, "empty model");
    preferred_ = model[0];
    loaded_ = true;
    return tether::Status::Ok();
  }
  tether::Status load_leaves(const std::uint8_t* model, std::size_t size,
                             const std::vector<tether::ModelLeafInput>& inputs, const std::string& output) override {
    leaf_inputs_ = inputs.size();
    return load(model, size, inputs.empty() ? std::string() : inputs[0].name, output);
  }
  /// Inputs of the last load_leaves (0 after load).
  std::size_t leaf_inputs() const noexcept { return leaf_inputs_; }
  tether::Status run(const float*, std::size_t batch, std::size_t, float* out, std::size_t out_dim) override {
    for (std::size_t b = 0; b < batch; ++b) {
      for (std::size_t k = 0; k < out_dim; ++k) out[b * out_dim + k] = k % 2 == preferred_ % 2 ? 30.0f : 0.0f;
    }
    if (log_) {
      std::lock_guard<std::mutex> lock(log_->mutex);
      ++log_->runs;
    }
    return tether::Status::Ok();
  }
  bool loaded() const noexcept override { return loaded_; }
  std::size_t obs_dim() const noexcept override { return 0; }
  std::size_t out_dim() const noexcept override { return 0; }

 private:
  std::shared_ptr<BackendLog> log_;
  std::size_t preferred_ = 0;
  std::size_t leaf_inputs_ = 0;
  bool loaded_ = false;
};

}  // namespace fake
