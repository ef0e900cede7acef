// Action latency of the C++ SDK against bare ONNX Runtime on the same model
// (run by bench/act_latency.py, which starts the servers and exports the model).
//
//   act_latency_cpp --model policy.onnx --port P --sending-port Q [--calls N] ...
//
// * ort_cpp_us_p50 / ort_cpp_batch256_us_p50: ONNX Runtime's C API, one
//   intra-op thread, input and output tensors created once over our buffers,
//   one Run per call (batch 1, then a (256, obs) batch).
// * sdk_cpp_us_p50 / sdk_cpp_us_p99: TetherClient::get_action on one ongoing
//   episode against the server on --port (which never asks for a batch), with
//   the model the server sent: inference, sampling and recording. A reward is
//   logged between calls (untimed), as an engine loop would. Bare and SDK calls
//   alternate in blocks so background load affects both alike.
// * sdk_cpp_batch256_us_p50 / _p99: MultiAgentClient::get_action for one frame
//   of 256 agents of one module (the server maps every agent to its one
//   module): one inference run for all of them, sampling and recording each,
//   in steady state against the server on --sending-port (a batch cut every
//   --sending-batch agent steps). Frames are paced (--frame-interval-us) and a
//   bare batch-256 Run goes beside each (before it, then after it, in turn):
//   ort_cpp_batch256_paced_us_p50; sdk_cpp_batch256_ratio is the frame against
//   it; sdk_cpp_batch256_p99_vs_p50, and beside it the bare run's own tail at the
//   same pace: ort_cpp_batch256_paced_us_p99, ort_cpp_batch256_paced_p99_vs_p50
//   and sdk_cpp_batch256_p99_vs_bare_p99. At 1 ms the server does not keep up
//   (batches wait, and are dropped with the rest of their episode, whose frames
//   are then played unrecorded): sdk_cpp_batch256_server_agent_steps_per_s is
//   what it took, _agent_steps_sent, _frames, _frame_interval_us.
// * sdk_cpp_batch256_sustained_*: the same frames, with a new client, at a pace
//   the sending server keeps up with (--sustained-frame-interval-us; 0, the
//   default: twice the time the server took per frame's agent steps in the
//   first series, whole milliseconds, 2 to 50 ms), so that every frame is
//   recorded and every batch answered: _us_p50, _us_p99, _ratio (against
//   ort_cpp_batch256_sustained_paced_us_p50), _p99_vs_p50, _p99_vs_bare_p99
//   (with ort_cpp_batch256_sustained_paced_us_p99 / _p99_vs_p50), _frames,
//   _batches_dropped, _agent_steps_sent, _frame_interval_us,
//   _server_agent_steps_per_s and _server_kept_up (nothing dropped, at least
//   80 % of the timed agent steps answered).
// * --frames-out FILE writes every timed frame of both series as CSV
//   (frame_interval_us, frame, us, bare_us).
// * sdk_cpp_log_returns256_us_p50: the frame's 256 log_returns calls.
// * sdk_cpp_backend_batch256_us_p50: OnnxRuntimeBackend::run on 256 rows plus
//   sampling every row with its logp (the frame without recording).
// * sdk_cpp_us_p99_while_sending: the same loop against the server on
//   --sending-port, which asks for a batch every --sending-batch steps; only
//   calls made while a batch is queued or in flight (and the calls that cut
//   one) count.
// * ort_cpp_cnn_us_p50 / sdk_cpp_cnn_us_p50 (--cnn-model FILE --cnn-port P):
//   Nature-CNN on 84x84x4 uint8 images (a byte box) against the server on
//   --cnn-port that serves it: bare ONNX Runtime (a uint8 input bound once) on
//   the image's bytes against TetherClient::get_action on the same image's
//   bytes (its byte overload), and on the floats 0-255 (its float overload:
//   sdk_cpp_cnn_floats_*), --cnn-calls of each, alternating in
//   blocks of --cnn-block-calls; sdk_cpp_cnn_ratio (sdk / ort at p50), _us_p99
//   of both. The episode is flushed between blocks (untimed) so steps are
//   recorded into arrays that kept their capacity, as in a long run;
//   sdk_cpp_cnn_growing_*: a second client whose episode is never cut.
// * ort_cpp_lstm_us_p50 / sdk_cpp_lstm_us_p50 (--lstm-model FILE --lstm-port P):
//   a model with memory (protocol 1.5: obs Box[16], Discrete(4), an LSTM of 64
//   units) against the server on --lstm-port that serves it: bare ONNX Runtime
//   (C API, batch 1, the observation and both state tensors bound once as
//   inputs and outputs, the state copied back after each run) against
//   TetherClient::get_action, which carries the state itself; --lstm-calls of
//   each, alternating in blocks; sdk_cpp_lstm_ratio (sdk / ort at p50).
//   ort_cpp_lstm_batch256_us_p50 / sdk_cpp_lstm_batch256_us_p50: 256 rows
//   with their states, bare, against MultiAgentClient::get_action for a frame
//   of 256 agents (one run, states stacked row by row); _ratio.
//   Each part runs alone: --model (with its ports), --cnn-model and --lstm-model are each optional.
// Prints one JSON object on stdout.
#include <algorithm>
#include <cstdarg>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <onnxruntime_c_api.h>

#include "tether/client.h"
#include "tether/multi_agent_client.h"
#include "tether/distributions.h"
#include "tether/onnxruntime_backend.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model;
  std::uint16_t port = 0;
  std::uint16_t sending_port = 0;
  int calls = 20000;
  int warmup = 2000;
  int blocks = 10;
  int batch_calls = 2000;
  double sending_seconds = 60.0;
  int frame_interval_us = 1000;
  int sustained_frame_interval_us = 0;  // 0: twice the server's time per frame in the first series
  std::string frames_out;
  std::uint64_t seed = 0;
  std::string cnn_model;
  std::uint16_t cnn_port = 0;
  int cnn_calls = 300;
  int cnn_block_calls = 10;
  std::string lstm_model;
  std::uint16_t lstm_port = 0;
  int lstm_calls = 5000;
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "act_latency_cpp: %s\n", what.c_str());
  std::exit(1);
}

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) fail("missing value for " + flag);
    std::string value = argv[++i];
    if (flag == "--model") args.model = value;
    else if (flag == "--port") args.port = static_cast<std::uint16_t>(std::stoi(value));
    else if (flag == "--sending-port") args.sending_port = static_cast<std::uint16_t>(std::stoi(value));
    else if (flag == "--calls") args.calls = std::stoi(value);
    else if (flag == "--warmup") args.warmup = std::stoi(value);
    else if (flag == "--blocks") args.blocks = std::max(1, std::stoi(value));
    else if (flag == "--batch-calls") args.batch_calls = std::stoi(value);
    else if (flag == "--sending-seconds") args.sending_seconds = std::stod(value);
    else if (flag == "--seed") args.seed = std::stoull(value);
    else if (flag == "--frame-interval-us") args.frame_interval_us = std::max(0, std::stoi(value));
    else if (flag == "--sustained-frame-interval-us") args.sustained_frame_interval_us = std::max(0, std::stoi(value));
    else if (flag == "--frames-out") args.frames_out = value;
    else if (flag == "--cnn-model") args.cnn_model = value;
    else if (flag == "--cnn-port") args.cnn_port = static_cast<std::uint16_t>(std::stoi(value));
    else if (flag == "--cnn-calls") args.cnn_calls = std::max(1, std::stoi(value));
    else if (flag == "--cnn-block-calls") args.cnn_block_calls = std::max(1, std::stoi(value));
    else if (flag == "--lstm-model") args.lstm_model = value;
    else if (flag == "--lstm-port") args.lstm_port = static_cast<std::uint16_t>(std::stoi(value));
    else if (flag == "--lstm-calls") args.lstm_calls = std::max(1, std::stoi(value));
    else fail("unknown flag " + flag);
  }
  const bool cartpole = !args.model.empty() && args.port != 0 && args.sending_port != 0;
  const bool cnn = !args.cnn_model.empty() && args.cnn_port != 0;
  const bool lstm = !args.lstm_model.empty() && args.lstm_port != 0;
  if (!(cartpole || (args.model.empty() && args.port == 0 && args.sending_port == 0)) ||
      !(cnn || (args.cnn_model.empty() && args.cnn_port == 0)) ||
      !(lstm || (args.lstm_model.empty() && args.lstm_port == 0)) || !(cartpole || cnn || lstm)) {
    fail("usage: act_latency_cpp [--model FILE --port P --sending-port Q] [--calls N] [--warmup N] [--blocks N] "
         "[--batch-calls N] [--sending-seconds S] [--frame-interval-us N] [--sustained-frame-interval-us N] "
         "[--frames-out FILE] [--seed N] [--cnn-model FILE --cnn-port P [--cnn-calls N] [--cnn-block-calls N]] "
         "[--lstm-model FILE --lstm-port P [--lstm-calls N]]");
  }
  return args;
}

std::vector<std::uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read " + path);
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

double percentile_us(std::vector<std::int64_t> ns, double q) {
  if (ns.empty()) return 0.0;
  std::sort(ns.begin(), ns.end());
  const auto index = static_cast<std::size_t>(std::lround(q / 100.0 * static_cast<double>(ns.size() - 1)));
  return std::round(static_cast<double>(ns[std::min(index, ns.size() - 1)]) / 10.0) / 100.0;
}

std::int64_t since_ns(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list again;
  va_copy(again, args);
  const int size = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string text(static_cast<std::size_t>(std::max(0, size)) + 1, '\0');
  std::vsnprintf(text.data(), text.size(), fmt, again);
  va_end(again);
  text.resize(text.size() - 1);
  return text;
}

// Bare ONNX Runtime: a session with one intra-op thread and tensors bound once:
// a float32 (batch, obs_dim) input, or a uint8 (batch, *image_shape) one.
class BareSession {
 public:
  BareSession(const std::vector<std::uint8_t>& model, std::size_t batch, std::size_t obs_dim, std::size_t out_dim,
              const std::vector<std::int64_t>& image_shape = {})
      : api_(OrtGetApiBase()->GetApi(ORT_API_VERSION)),
        obs_(image_shape.empty() ? batch * obs_dim : 0),
        bytes_(image_shape.empty() ? 0 : batch * obs_dim),
        out_(batch * out_dim) {
    check(api_->CreateEnv(ORT_LOGGING_LEVEL_ERROR, "bench", &env_));
    OrtSessionOptions* options = nullptr;
    check(api_->CreateSessionOptions(&options));
    check(api_->SetIntraOpNumThreads(options, 1));
    check(api_->SetInterOpNumThreads(options, 1));
    check(api_->CreateSessionFromArray(env_, model.data(), model.size(), options, &session_));
    api_->ReleaseSessionOptions(options);
    OrtAllocator* allocator = nullptr;
    check(api_->GetAllocatorWithDefaultOptions(&allocator));
    char* name = nullptr;
    check(api_->SessionGetInputName(session_, 0, allocator, &name));
    input_name_ = name;
    check(api_->AllocatorFree(allocator, name));
    check(api_->SessionGetOutputName(session_, 0, allocator, &name));
    output_name_ = name;
    check(api_->AllocatorFree(allocator, name));
    OrtMemoryInfo* memory = nullptr;
    check(api_->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &memory));
    const std::int64_t out_shape[2] = {static_cast<std::int64_t>(batch), static_cast<std::int64_t>(out_dim)};
    if (image_shape.empty()) {
      const std::int64_t in_shape[2] = {static_cast<std::int64_t>(batch), static_cast<std::int64_t>(obs_dim)};
      check(api_->CreateTensorWithDataAsOrtValue(memory, obs_.data(), obs_.size() * sizeof(float), in_shape, 2,
                                                 ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &input_));
    } else {
      std::vector<std::int64_t> in_shape{static_cast<std::int64_t>(batch)};
      in_shape.insert(in_shape.end(), image_shape.begin(), image_shape.end());
      check(api_->CreateTensorWithDataAsOrtValue(memory, bytes_.data(), bytes_.size(), in_shape.data(),
                                                 in_shape.size(), ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, &input_));
    }
    check(api_->CreateTensorWithDataAsOrtValue(memory, out_.data(), out_.size() * sizeof(float), out_shape, 2,
                                               ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &output_));
    api_->ReleaseMemoryInfo(memory);
  }
  ~BareSession() {
    api_->ReleaseValue(input_);
    api_->ReleaseValue(output_);
    api_->ReleaseSession(session_);
    api_->ReleaseEnv(env_);
  }
  BareSession(const BareSession&) = delete;
  BareSession& operator=(const BareSession&) = delete;

  float* obs() { return obs_.data(); }
  std::uint8_t* bytes() { return bytes_.data(); }
  const std::string& input_name() const { return input_name_; }
  const std::string& output_name() const { return output_name_; }
  const float* out() const { return out_.data(); }
  void run() {
    const char* in_names[1] = {input_name_.c_str()};
    const char* out_names[1] = {output_name_.c_str()};
    check(api_->Run(session_, nullptr, in_names, &input_, 1, out_names, 1, &output_));
  }

 private:
  void check(OrtStatus* status) {
    if (status == nullptr) return;
    std::string message = api_->GetErrorMessage(status);
    api_->ReleaseStatus(status);
    fail("ONNX Runtime: " + message);
  }

  const OrtApi* api_;
  OrtEnv* env_ = nullptr;
  OrtSession* session_ = nullptr;
  OrtValue* input_ = nullptr;
  OrtValue* output_ = nullptr;
  std::string input_name_;
  std::string output_name_;
  std::vector<float> obs_;
  std::vector<std::uint8_t> bytes_;
  std::vector<float> out_;
};

std::unique_ptr<tether::TetherClient> connect(std::uint16_t port, std::uint64_t seed, const char* name) {
  tether::ClientOptions options;
  options.port = port;
  options.seed = seed;
  options.client_name = name;
  options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
  auto client = tether::TetherClient::connect(std::move(options));
  if (!client.ok()) fail("connect to port " + std::to_string(port) + ": " + client.status().to_string());
  return std::move(client).value();
}

constexpr std::size_t kObs = 4;
constexpr std::size_t kOut = 2;
constexpr std::size_t kBatch = 256;

// One paced series of multi-agent frames and its figures.
struct FrameSeries {
  int interval_us = 0;
  std::vector<std::int64_t> ns;          // get_action, per timed frame
  std::vector<std::int64_t> bare_ns;     // the bare batch-256 run beside it
  std::vector<std::int64_t> rewards_ns;  // the frame's 256 log_returns calls
  std::int64_t dropped = 0;              // batches dropped (the whole series)
  std::int64_t sent = 0;                 // agent steps the server answered during the timed frames
  std::int64_t total_sent = 0;           // ... during the whole series
  double server_steps_per_s = 0.0;       // `sent` per second of the timed frames
  double p50 = 0.0, p99 = 0.0, bare_p50 = 0.0, bare_p99 = 0.0;

  std::size_t frames() const { return ns.size(); }
  double ratio() const { return bare_p50 > 0 ? p50 / bare_p50 : 0.0; }
  double p99_vs_p50() const { return p50 > 0 ? p99 / p50 : 0.0; }
  // The bare run's own tail at the same pace: the baseline for the frame's.
  double bare_p99_vs_p50() const { return bare_p50 > 0 ? bare_p99 / bare_p50 : 0.0; }
  double p99_vs_bare_p99() const { return bare_p99 > 0 ? p99 / bare_p99 : 0.0; }
  // Nothing dropped, and at least 80 % of the timed agent steps answered.
  bool server_kept_up() const {
    return dropped == 0 && sent >= static_cast<std::int64_t>(frames() * kBatch * 8 / 10);
  }
};

// --batch-calls frames of 256 agents of one module through a new
// MultiAgentClient against the server on --sending-port (a batch cut every
// --sending-batch agent steps, the episode's arrays reused as in a long run),
// after 200 untimed frames, one every `interval_us` as an engine paces them;
// a bare batch-256 Run goes beside each frame (before it, then after it, in
// turn) so both see the same caches and background load.
FrameSeries run_frames(const Args& args, int interval_us, const char* name, BareSession& bare_batch,
                       const std::vector<float>& obs_pool, const std::vector<std::string>& ids, bool log_rewards) {
  FrameSeries series;
  series.interval_us = interval_us;
  const std::size_t n_obs = obs_pool.size() / kObs;
  tether::ClientOptions options;
  options.port = args.sending_port;
  options.seed = args.seed;
  options.client_name = name;
  options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
  auto connected = tether::MultiAgentClient::connect(std::move(options));
  if (!connected.ok()) fail("multi-agent connect: " + connected.status().to_string());
  tether::MultiAgentClient& multi = *connected.value();
  std::string episode = multi.start_episode().value();
  tether::AgentFrame frame;
  auto next_frame = Clock::now();
  const auto interval = std::chrono::microseconds(interval_us);
  std::int64_t sent_at_start = 0;
  Clock::time_point start;
  for (int i = -std::min(200, args.batch_calls); i < args.batch_calls; ++i) {
    frame.clear();
    for (std::size_t a = 0; a < kBatch; ++a) {
      frame.add(ids[a], &obs_pool[((static_cast<std::size_t>(i + 200) * kBatch + a) % n_obs) * kObs], kObs);
    }
    next_frame += interval;
    std::this_thread::sleep_until(next_frame);
    if (i == 0) {
      sent_at_start = multi.agent_steps_sent();
      start = Clock::now();
    }
    // Whichever runs first after the pause pays for waking up: they take turns.
    std::int64_t bare_time = 0;
    auto run_bare = [&] {
      const auto t0 = Clock::now();
      bare_batch.run();
      bare_time = since_ns(t0);
    };
    if (i % 2 == 0) run_bare();
    auto t0 = Clock::now();
    tether::Status acted = multi.get_action(episode, frame);
    const std::int64_t ns = since_ns(t0);
    if (!acted.ok()) fail("multi-agent get_action: " + acted.to_string());
    if (i % 2 != 0) run_bare();
    t0 = Clock::now();
    for (std::size_t a = 0; a < kBatch; ++a) multi.log_returns(episode, ids[a], 1.0);
    const std::int64_t rewards_ns = since_ns(t0);
    if (i >= 0) {
      series.ns.push_back(ns);
      series.bare_ns.push_back(bare_time);
      if (log_rewards) series.rewards_ns.push_back(rewards_ns);
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  series.dropped = multi.batches_dropped();
  series.total_sent = multi.agent_steps_sent();
  series.sent = series.total_sent - sent_at_start;
  series.server_steps_per_s = seconds > 0 ? static_cast<double>(series.sent) / seconds : 0.0;
  multi.close();
  series.p50 = percentile_us(series.ns, 50);
  series.p99 = percentile_us(series.ns, 99);
  series.bare_p50 = percentile_us(series.bare_ns, 50);
  series.bare_p99 = percentile_us(series.bare_ns, 99);
  return series;
}

// The CartPole figures (--model), as one JSON object.
// Single-agent get_action against the bare session's Run on the same observations (`pool`: `rows`
// rows of `obs_dim` floats, taken in turn): `warmup` untimed calls of each, then `calls` of each in
// alternating blocks of `block`, so that background load affects both alike.
template <class Bare>
void time_get_action(Bare& bare, tether::TetherClient& client, const std::string& episode, const float* pool,
                     std::size_t rows, std::size_t obs_dim, int warmup, int calls, int block, const char* what,
                     std::vector<std::int64_t>& bare_ns, std::vector<std::int64_t>& sdk_ns) {
  double action[1] = {0.0};
  auto bare_block = [&](int n, std::vector<std::int64_t>* out, int start) {
    for (int i = start; i < start + n; ++i) {
      std::memcpy(bare.obs(), &pool[(static_cast<std::size_t>(i) % rows) * obs_dim], obs_dim * sizeof(float));
      const auto t0 = Clock::now();
      bare.run();
      const std::int64_t ns = since_ns(t0);
      if (out) out->push_back(ns);
    }
  };
  auto sdk_block = [&](int n, std::vector<std::int64_t>* out, int start) {
    for (int i = start; i < start + n; ++i) {
      const float* obs = &pool[(static_cast<std::size_t>(i) % rows) * obs_dim];
      const auto t0 = Clock::now();
      tether::Status status = client.get_action(episode, obs, obs_dim, action, 1);
      const std::int64_t ns = since_ns(t0);
      if (!status.ok()) fail(std::string(what) + ": " + status.to_string());
      client.log_returns(episode, 1.0);
      if (out) out->push_back(ns);
    }
  };
  bare_block(warmup, nullptr, 0);
  sdk_block(warmup, nullptr, 0);
  for (int done = 0; done < calls; done += block) {
    const int n = std::min(block, calls - done);
    bare_block(n, &bare_ns, done);
    sdk_block(n, &sdk_ns, done);
  }
}

std::string measure_cartpole(const Args& args) {
  const std::vector<std::uint8_t> model = read_file(args.model);
  std::mt19937 rng(static_cast<std::uint32_t>(args.seed));
  std::normal_distribution<float> normal(0.0f, 0.5f);
  const std::size_t n_obs = 1024;
  std::vector<float> obs_pool(n_obs * kObs);
  for (float& value : obs_pool) value = normal(rng);

  BareSession bare(model, 1, kObs, kOut);
  BareSession bare_batch(model, kBatch, kObs, kOut);
  for (std::size_t i = 0; i < kBatch * kObs; ++i) bare_batch.obs()[i] = normal(rng);

  auto client = connect(args.port, args.seed, "bench-act-latency-cpp");
  if (client->observation_space().flat_dim() != kObs || client->action_space().dist_inputs_size() != kOut) {
    fail("the server's spaces are not CartPole's (4 observations, Discrete(2))");
  }
  std::string episode = client->start_episode().value();
  std::vector<std::int64_t> bare_ns;
  std::vector<std::int64_t> sdk_ns;
  time_get_action(bare, *client, episode, obs_pool.data(), n_obs, kObs, args.warmup, args.calls,
                  std::max(1, args.calls / args.blocks), "get_action", bare_ns, sdk_ns);

  // One frame of 256 agents of one module: bare Run vs the SDK's backend run + sampling.
  tether::OnnxRuntimeBackend backend;
  tether::Status loaded = backend.load(model.data(), model.size(), bare.input_name(), bare.output_name());
  if (!loaded.ok()) fail("backend load: " + loaded.to_string());
  const tether::Space& space = client->action_space();
  std::vector<float> dist(kBatch * kOut);
  std::vector<double> record(kBatch);
  std::vector<double> env_action(kBatch);
  std::vector<double> logp(kBatch);
  tether::Rng sampler;
  sampler.reseed(args.seed);
  std::vector<std::int64_t> batch_ns;
  std::vector<std::int64_t> sdk_batch_ns;
  for (int i = -std::min(200, args.batch_calls); i < args.batch_calls; ++i) {
    auto t0 = Clock::now();
    bare_batch.run();
    const std::int64_t bare_time = since_ns(t0);
    t0 = Clock::now();
    tether::Status ran = backend.run(bare_batch.obs(), kBatch, kObs, dist.data(), kOut);
    if (ran.ok()) {
      ran = tether::sample_rows_for_record(space, dist.data(), kBatch, sampler, true, record.data(), env_action.data(),
                                           logp.data());
    }
    const std::int64_t sdk_time = since_ns(t0);
    if (!ran.ok()) fail("batched run: " + ran.to_string());
    if (i >= 0) {
      batch_ns.push_back(bare_time);
      sdk_batch_ns.push_back(sdk_time);
    }
  }
  // 256 agents in one frame through the multi-agent client, in steady state,
  // at --frame-interval-us, then at a pace the sending server sustains.
  std::vector<std::string> ids;
  for (std::size_t a = 0; a < kBatch; ++a) ids.push_back("agent_" + std::to_string(a));
  const FrameSeries fast = run_frames(args, args.frame_interval_us, "bench-act-latency-cpp-multi", bare_batch, obs_pool,
                                      ids, true);
  int sustained_us = args.sustained_frame_interval_us;
  if (sustained_us <= 0) {
    // Twice the server's time per frame's agent steps at the first pace, in whole milliseconds.
    const double per_frame_us = fast.server_steps_per_s > 0 ? 1e6 * kBatch / fast.server_steps_per_s : 10000.0;
    sustained_us = static_cast<int>(std::min(50000.0, std::max(2000.0, 1000.0 * std::ceil(2.0 * per_frame_us / 1000.0))));
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // (the server finishes what the first client left)
  const FrameSeries sustained = run_frames(args, sustained_us, "bench-act-latency-cpp-multi-sustained", bare_batch,
                                           obs_pool, ids, false);
  if (!args.frames_out.empty()) {
    std::ofstream out(args.frames_out);
    out << "frame_interval_us,frame,us,bare_us\n";
    for (const FrameSeries* series : {&fast, &sustained}) {
      for (std::size_t i = 0; i < series->ns.size(); ++i) {
        out << series->interval_us << ',' << i << ',' << static_cast<double>(series->ns[i]) / 1000.0 << ','
            << static_cast<double>(series->bare_ns[i]) / 1000.0 << '\n';
      }
    }
  }

  bool same_outputs = true;
  for (std::size_t i = 0; i < dist.size(); ++i) same_outputs = same_outputs && std::fabs(dist[i] - bare_batch.out()[i]) < 1e-5f;
  client->close();

  // While a batch is queued or in flight.
  auto sending_client = connect(args.sending_port, args.seed, "bench-act-latency-cpp-sending");
  std::string sending_episode = sending_client->start_episode().value();
  double action[1] = {0.0};
  for (int i = 0; i < args.warmup; ++i) {
    sending_client->get_action(sending_episode, &obs_pool[(static_cast<std::size_t>(i) % n_obs) * kObs], kObs,
                               action, 1);
    sending_client->log_returns(sending_episode, 1.0);
  }
  std::vector<std::int64_t> sending_ns;
  const auto deadline = Clock::now() + std::chrono::duration<double>(args.sending_seconds);
  for (int i = 0; static_cast<int>(sending_ns.size()) < args.calls && Clock::now() < deadline; ++i) {
    const float* obs = &obs_pool[(static_cast<std::size_t>(i) % n_obs) * kObs];
    const bool busy_before = sending_client->sending();
    const auto t0 = Clock::now();
    tether::Status status = sending_client->get_action(sending_episode, obs, kObs, action, 1);
    const std::int64_t ns = since_ns(t0);
    if (!status.ok()) fail("get_action while sending: " + status.to_string());
    sending_client->log_returns(sending_episode, 1.0);
    if (busy_before || sending_client->sending()) sending_ns.push_back(ns);
  }
  sending_client->flush();
  const std::int64_t sent = sending_client->env_steps_sent();
  const std::int64_t dropped = sending_client->batches_dropped();
  sending_client->close();

  const double sdk_p99 = percentile_us(sdk_ns, 99);
  const double sending_p99 = percentile_us(sending_ns, 99);
  const double ort_batch = percentile_us(batch_ns, 50);
  const double sdk_batch = percentile_us(sdk_batch_ns, 50);
  const double frame = fast.p50;
  const double frame_bare = fast.bare_p50;
  return format(
      "{\"ort_cpp_us_p50\": %.2f, \"ort_cpp_us_p99\": %.2f, \"sdk_cpp_us_p50\": %.2f, \"sdk_cpp_us_p99\": %.2f, "
      "\"ort_cpp_batch256_us_p50\": %.2f, \"sdk_cpp_batch256_us_p50\": %.2f, \"sdk_cpp_batch256_us_p99\": %.2f, "
      "\"ort_cpp_batch256_paced_us_p50\": %.2f, \"sdk_cpp_batch256_ratio\": %.2f, "
      "\"sdk_cpp_batch256_vs_unpaced_ratio\": %.2f, \"sdk_cpp_batch256_batches_dropped\": %lld, "
      "\"sdk_cpp_log_returns256_us_p50\": %.2f, "
      "\"sdk_cpp_backend_batch256_us_p50\": %.2f, "
      "\"sdk_cpp_backend_batch256_ratio\": %.2f, \"sdk_cpp_us_p99_while_sending\": %.2f, "
      "\"sdk_cpp_us_p50_while_sending\": %.2f, \"sdk_cpp_while_sending_p99_ratio\": %.2f, "
      "\"sdk_cpp_calls_while_sending\": %zu, \"sdk_cpp_env_steps_sent_while_sending\": %lld, "
      "\"sdk_cpp_batches_dropped_while_sending\": %lld, \"sdk_cpp_overhead_us_p50\": %.2f, "
      "\"sdk_cpp_calls\": %zu, \"sdk_cpp_backend_matches_bare\": %s, "
      "\"sdk_cpp_batch256_p99_vs_p50\": %.2f, \"sdk_cpp_batch256_frames\": %zu, "
      "\"sdk_cpp_batch256_agent_steps_sent\": %lld, \"sdk_cpp_batch256_frame_interval_us\": %d, "
      "\"sdk_cpp_batch256_server_agent_steps_per_s\": %.0f, "
      "\"sdk_cpp_batch256_sustained_us_p50\": %.2f, \"sdk_cpp_batch256_sustained_us_p99\": %.2f, "
      "\"ort_cpp_batch256_sustained_paced_us_p50\": %.2f, \"sdk_cpp_batch256_sustained_ratio\": %.2f, "
      "\"sdk_cpp_batch256_sustained_p99_vs_p50\": %.2f, \"sdk_cpp_batch256_sustained_frames\": %zu, "
      "\"sdk_cpp_batch256_sustained_batches_dropped\": %lld, \"sdk_cpp_batch256_sustained_agent_steps_sent\": %lld, "
      "\"sdk_cpp_batch256_sustained_frame_interval_us\": %d, "
      "\"sdk_cpp_batch256_sustained_server_agent_steps_per_s\": %.0f, "
      "\"sdk_cpp_batch256_sustained_server_kept_up\": %s, "
      "\"ort_cpp_batch256_paced_us_p99\": %.2f, \"ort_cpp_batch256_paced_p99_vs_p50\": %.2f, "
      "\"sdk_cpp_batch256_p99_vs_bare_p99\": %.2f, \"ort_cpp_batch256_sustained_paced_us_p99\": %.2f, "
      "\"ort_cpp_batch256_sustained_paced_p99_vs_p50\": %.2f, \"sdk_cpp_batch256_sustained_p99_vs_bare_p99\": %.2f}",
      percentile_us(bare_ns, 50), percentile_us(bare_ns, 99), percentile_us(sdk_ns, 50), sdk_p99, ort_batch,
      frame, fast.p99, frame_bare, fast.ratio(),
      ort_batch > 0 ? frame / ort_batch : 0.0, static_cast<long long>(fast.dropped),
      percentile_us(fast.rewards_ns, 50), sdk_batch, ort_batch > 0 ? sdk_batch / ort_batch : 0.0, sending_p99, percentile_us(sending_ns, 50),
      sdk_p99 > 0 ? sending_p99 / sdk_p99 : 0.0, sending_ns.size(), static_cast<long long>(sent),
      static_cast<long long>(dropped), percentile_us(sdk_ns, 50) - percentile_us(bare_ns, 50), sdk_ns.size(),
      same_outputs ? "true" : "false", fast.p99_vs_p50(), fast.frames(), static_cast<long long>(fast.total_sent),
      fast.interval_us, fast.server_steps_per_s, sustained.p50, sustained.p99, sustained.bare_p50, sustained.ratio(),
      sustained.p99_vs_p50(), sustained.frames(), static_cast<long long>(sustained.dropped),
      static_cast<long long>(sustained.total_sent), sustained.interval_us, sustained.server_steps_per_s,
      sustained.server_kept_up() ? "true" : "false", fast.bare_p99, fast.bare_p99_vs_p50(), fast.p99_vs_bare_p99(),
      sustained.bare_p99, sustained.bare_p99_vs_p50(), sustained.p99_vs_bare_p99());
}


constexpr std::int64_t kImage[3] = {84, 84, 4};
constexpr std::size_t kImageSize = 84 * 84 * 4;
constexpr std::size_t kCnnActions = 6;

// The CNN figures (--cnn-model): bare ONNX Runtime on uint8 images against
// TetherClient::get_action on the same images, as one JSON object.
std::string measure_cnn(const Args& args) {
  const std::vector<std::uint8_t> model = read_file(args.cnn_model);
  BareSession bare(model, 1, kImageSize, kCnnActions, {kImage[0], kImage[1], kImage[2]});
  auto client = connect(args.cnn_port, args.seed, "bench-act-latency-cpp-cnn");
  if (!client->observation_space().is_bytes() || client->observation_space().flat_dim() != kImageSize ||
      client->action_space().dist_inputs_size() != kCnnActions) {
    fail("the CNN server's spaces are not an 84x84x4 byte box and Discrete(6)");
  }
  // 64 images as an engine's camera gives them (bytes), and as floats for the float run below.
  std::mt19937 rng(static_cast<std::uint32_t>(args.seed));
  std::uniform_int_distribution<int> pixel(0, 255);
  constexpr std::size_t kImages = 64;
  std::vector<std::uint8_t> images(kImages * kImageSize);
  for (std::uint8_t& value : images) value = static_cast<std::uint8_t>(pixel(rng));
  std::vector<float> float_images(images.begin(), images.end());

  // The SDK's backend and the bare session compute the same outputs from one image.
  tether::OnnxRuntimeBackend backend;
  tether::Status loaded = backend.load(model.data(), model.size(), bare.input_name(), bare.output_name());
  if (!loaded.ok()) fail("CNN backend load: " + loaded.to_string());
  float dist[kCnnActions] = {};
  float dist_from_bytes[kCnnActions] = {};
  if (!backend.run(float_images.data(), 1, kImageSize, dist, kCnnActions).ok()) fail("CNN backend run");
  if (!backend.run_bytes(images.data(), 1, kImageSize, dist_from_bytes, kCnnActions).ok()) fail("CNN backend run_bytes");
  std::memcpy(bare.bytes(), images.data(), kImageSize);
  bare.run();
  bool same_outputs = true;
  for (std::size_t i = 0; i < kCnnActions; ++i) {
    same_outputs = same_outputs && std::fabs(dist[i] - bare.out()[i]) < 1e-4f && dist_from_bytes[i] == dist[i];
  }

  // Steady state: the episode's steps are cut and sent between blocks (flush,
  // untimed), as a batch is every steps_per_batch() steps in a long run, so each
  // step is recorded into arrays that kept their capacity. A second client's
  // episode is never cut: every step it records lands in fresh memory (its
  // arrays grow without end), sdk_cpp_cnn_growing_*.
  auto growing_client = connect(args.cnn_port, args.seed, "bench-act-latency-cpp-cnn-growing");
  std::string episode = client->start_episode().value();
  std::string growing_episode = growing_client->start_episode().value();
  double action[1] = {0.0};
  auto bare_block = [&](int n, std::vector<std::int64_t>* out, int start) {
    for (int i = start; i < start + n; ++i) {
      // (the copy into the bound buffer is not timed: an engine could render into it)
      std::memcpy(bare.bytes(), &images[(static_cast<std::size_t>(i) % kImages) * kImageSize], kImageSize);
      const auto t0 = Clock::now();
      bare.run();
      const std::int64_t ns = since_ns(t0);
      if (out) out->push_back(ns);
    }
  };
  auto sdk_block = [&](tether::TetherClient& sdk, const std::string& id, int n, std::vector<std::int64_t>* out,
                       int start, bool as_floats = false) {
    for (int i = start; i < start + n; ++i) {
      const std::size_t at = (static_cast<std::size_t>(i) % kImages) * kImageSize;
      const auto t0 = Clock::now();
      tether::Status status = as_floats ? sdk.get_action(id, &float_images[at], kImageSize, action, 1)
                                        : sdk.get_action(id, &images[at], kImageSize, action, 1);
      const std::int64_t ns = since_ns(t0);
      if (!status.ok()) fail("CNN get_action: " + status.to_string());
      sdk.log_returns(id, 1.0);
      if (out) out->push_back(ns);
    }
  };
  auto flush = [&] {
    tether::Status flushed = client->flush();
    if (!flushed.ok()) fail("CNN flush: " + flushed.to_string());
  };
  const int warmup = std::min(50, args.cnn_calls);
  bare_block(warmup, nullptr, 0);
  sdk_block(*client, episode, warmup, nullptr, 0);
  sdk_block(*growing_client, growing_episode, warmup, nullptr, 0);
  flush();
  std::vector<std::int64_t> bare_ns;
  std::vector<std::int64_t> sdk_ns;
  std::vector<std::int64_t> floats_ns;
  std::vector<std::int64_t> growing_ns;
  // Short blocks, alternating, so background load hits all alike.
  for (int done = 0; done < args.cnn_calls; done += args.cnn_block_calls) {
    const int n = std::min(args.cnn_block_calls, args.cnn_calls - done);
    bare_block(n, &bare_ns, done);
    sdk_block(*client, episode, n, &sdk_ns, done);
    sdk_block(*client, episode, n, &floats_ns, done, /*as_floats=*/true);
    sdk_block(*growing_client, growing_episode, n, &growing_ns, done);
    flush();
    // (the server stores the batch after answering: let it finish before the next timed block)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::int64_t sent = client->env_steps_sent();
  growing_client->close();
  client->close();
  const double ort_p50 = percentile_us(bare_ns, 50);
  const double sdk_p50 = percentile_us(sdk_ns, 50);
  const double growing_p50 = percentile_us(growing_ns, 50);
  const double floats_p50 = percentile_us(floats_ns, 50);
  return format(
      "{\"ort_cpp_cnn_us_p50\": %.2f, \"ort_cpp_cnn_us_p99\": %.2f, \"sdk_cpp_cnn_us_p50\": %.2f, "
      "\"sdk_cpp_cnn_us_p99\": %.2f, \"sdk_cpp_cnn_ratio\": %.3f, \"sdk_cpp_cnn_calls\": %zu, "
      "\"sdk_cpp_cnn_backend_matches_bare\": %s, \"sdk_cpp_cnn_env_steps_sent\": %lld, "
      "\"sdk_cpp_cnn_growing_us_p50\": %.2f, \"sdk_cpp_cnn_growing_us_p99\": %.2f, \"sdk_cpp_cnn_growing_ratio\": %.3f, "
      "\"sdk_cpp_cnn_floats_us_p50\": %.2f, \"sdk_cpp_cnn_floats_ratio\": %.3f}",
      ort_p50, percentile_us(bare_ns, 99), sdk_p50, percentile_us(sdk_ns, 99), ort_p50 > 0 ? sdk_p50 / ort_p50 : 0.0,
      sdk_ns.size(), same_outputs ? "true" : "false", static_cast<long long>(sent), growing_p50,
      percentile_us(growing_ns, 99), ort_p50 > 0 ? growing_p50 / ort_p50 : 0.0, floats_p50,
      ort_p50 > 0 ? floats_p50 / ort_p50 : 0.0);
}

// Bare ONNX Runtime for a model with memory: the observation and every state
// tensor bound once as inputs, the dist inputs and the states after the step
// bound once as outputs; after each run the states are copied back into the
// inputs (the state fed back, as any engine loop must).
class BareRecurrentSession {
 public:
  BareRecurrentSession(const std::vector<std::uint8_t>& model, const std::vector<tether::RecurrentStateSpec>& state,
                       std::size_t batch, std::size_t obs_dim, std::size_t out_dim)
      : api_(OrtGetApiBase()->GetApi(ORT_API_VERSION)), obs_(batch * obs_dim), out_(batch * out_dim) {
    check(api_->CreateEnv(ORT_LOGGING_LEVEL_ERROR, "bench", &env_));
    OrtSessionOptions* options = nullptr;
    check(api_->CreateSessionOptions(&options));
    check(api_->SetIntraOpNumThreads(options, 1));
    check(api_->SetInterOpNumThreads(options, 1));
    check(api_->CreateSessionFromArray(env_, model.data(), model.size(), options, &session_));
    api_->ReleaseSessionOptions(options);
    // The observation's input and the dist inputs' output: the ones that are not state tensors.
    OrtAllocator* allocator = nullptr;
    check(api_->GetAllocatorWithDefaultOptions(&allocator));
    auto other_name = [&](bool input) {
      std::size_t count = 0;
      check(input ? api_->SessionGetInputCount(session_, &count) : api_->SessionGetOutputCount(session_, &count));
      for (std::size_t i = 0; i < count; ++i) {
        char* raw = nullptr;
        check(input ? api_->SessionGetInputName(session_, i, allocator, &raw)
                    : api_->SessionGetOutputName(session_, i, allocator, &raw));
        std::string name = raw;
        check(api_->AllocatorFree(allocator, raw));
        bool is_state = false;
        for (const tether::RecurrentStateSpec& s : state) is_state = is_state || name == (input ? s.input : s.output);
        if (!is_state) return name;
      }
      fail("the LSTM model has no observation input or dist output");
    };
    in_names_.push_back(other_name(true));
    out_names_.push_back(other_name(false));
    OrtMemoryInfo* memory = nullptr;
    check(api_->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &memory));
    auto tensor = [&](std::vector<float>& buffer, std::size_t width) {
      const std::int64_t shape[2] = {static_cast<std::int64_t>(batch), static_cast<std::int64_t>(width)};
      OrtValue* value = nullptr;
      check(api_->CreateTensorWithDataAsOrtValue(memory, buffer.data(), buffer.size() * sizeof(float), shape, 2,
                                                 ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value));
      return value;
    };
    states_in_.resize(state.size());
    states_out_.resize(state.size());
    inputs_.push_back(tensor(obs_, obs_dim));
    outputs_.push_back(tensor(out_, out_dim));
    for (std::size_t k = 0; k < state.size(); ++k) {
      states_in_[k].assign(batch * state[k].size, 0.0f);
      states_out_[k].assign(batch * state[k].size, 0.0f);
      inputs_.push_back(tensor(states_in_[k], state[k].size));
      outputs_.push_back(tensor(states_out_[k], state[k].size));
      in_names_.push_back(state[k].input);
      out_names_.push_back(state[k].output);
    }
    api_->ReleaseMemoryInfo(memory);
    for (const std::string& name : in_names_) in_ptrs_.push_back(name.c_str());
    for (const std::string& name : out_names_) out_ptrs_.push_back(name.c_str());
  }
  ~BareRecurrentSession() {
    for (OrtValue* value : inputs_) api_->ReleaseValue(value);
    for (OrtValue* value : outputs_) api_->ReleaseValue(value);
    api_->ReleaseSession(session_);
    api_->ReleaseEnv(env_);
  }
  BareRecurrentSession(const BareRecurrentSession&) = delete;
  BareRecurrentSession& operator=(const BareRecurrentSession&) = delete;

  float* obs() { return obs_.data(); }
  void run() {
    check(api_->Run(session_, nullptr, in_ptrs_.data(), inputs_.data(), inputs_.size(), out_ptrs_.data(),
                    outputs_.size(), outputs_.data()));
    for (std::size_t k = 0; k < states_in_.size(); ++k) {
      std::memcpy(states_in_[k].data(), states_out_[k].data(), states_in_[k].size() * sizeof(float));
    }
  }

 private:
  void check(OrtStatus* status) {
    if (status == nullptr) return;
    std::string message = api_->GetErrorMessage(status);
    api_->ReleaseStatus(status);
    fail("ONNX Runtime: " + message);
  }
  const OrtApi* api_;
  OrtEnv* env_ = nullptr;
  OrtSession* session_ = nullptr;
  std::vector<float> obs_, out_;
  std::vector<std::vector<float>> states_in_, states_out_;
  std::vector<OrtValue*> inputs_, outputs_;
  std::vector<std::string> in_names_, out_names_;
  std::vector<const char*> in_ptrs_, out_ptrs_;
};

constexpr std::size_t kLstmObs = 16;
constexpr std::size_t kLstmActions = 4;

// The LSTM figures (--lstm-model): bare ONNX Runtime with the state fed back
// against the SDK's clients, which carry it, at batch 1 and 256.
std::string measure_lstm(const Args& args) {
  const std::vector<std::uint8_t> model = read_file(args.lstm_model);
  auto client = connect(args.lstm_port, args.seed, "bench-act-latency-cpp-lstm");
  const std::vector<tether::RecurrentStateSpec> state = client->recurrent_state();
  if (state.empty() || client->observation_space().flat_dim() != kLstmObs ||
      client->action_space().dist_inputs_size() != kLstmActions) {
    fail("the LSTM server's model has no recurrent_state, or its spaces are not Box[16] and Discrete(4)");
  }
  std::mt19937 rng(static_cast<std::uint32_t>(args.seed));
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  constexpr std::size_t kRows = 64;
  std::vector<float> observations(kRows * kLstmObs * kBatch);
  for (float& v : observations) v = value(rng);

  // Batch 1, alternating blocks.
  BareRecurrentSession bare(model, state, 1, kLstmObs, kLstmActions);
  std::string episode = client->start_episode().value();
  std::vector<std::int64_t> bare_ns, sdk_ns;
  time_get_action(bare, *client, episode, observations.data(), kRows, kLstmObs, std::min(500, args.lstm_calls),
                  args.lstm_calls, 100, "LSTM get_action", bare_ns, sdk_ns);
  client->close();

  // Batch 256: bare rows with their states against a multi-agent frame of 256 agents.
  BareRecurrentSession bare256(model, state, kBatch, kLstmObs, kLstmActions);
  tether::ClientOptions options;
  options.port = args.lstm_port;
  options.seed = args.seed;
  options.client_name = "bench-act-latency-cpp-lstm-256";  // (a full queue drops its oldest batch: no frame waits)
  options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
  auto connected = tether::MultiAgentClient::connect(std::move(options));
  if (!connected.ok()) fail("LSTM multi-agent connect: " + connected.status().to_string());
  tether::MultiAgentClient& multi = *connected.value();
  std::string multi_episode = multi.start_episode().value();
  std::vector<std::string> ids(kBatch);
  for (std::size_t a = 0; a < kBatch; ++a) ids[a] = "a" + std::to_string(a);
  tether::AgentFrame frame;
  frame.reserve(kBatch, kBatch * kLstmObs);
  const int frames = std::max(50, args.lstm_calls / 20);
  std::vector<std::int64_t> bare256_ns, sdk256_ns;
  for (int f = -20; f < frames; ++f) {  // (20 untimed frames first)
    const float* rows = &observations[(static_cast<std::size_t>(f + 20) % kRows) * kLstmObs];
    frame.clear();
    for (std::size_t a = 0; a < kBatch; ++a) frame.add(ids[a], rows + (a % kRows) * kLstmObs, kLstmObs);
    std::memcpy(bare256.obs(), rows, kBatch * kLstmObs * sizeof(float));
    auto t0 = Clock::now();
    bare256.run();
    const std::int64_t bare_frame = since_ns(t0);
    t0 = Clock::now();
    tether::Status status = multi.get_action(multi_episode, frame);
    const std::int64_t sdk_frame = since_ns(t0);
    if (!status.ok()) fail("LSTM multi-agent get_action: " + status.to_string());
    for (std::size_t a = 0; a < kBatch; ++a) multi.log_returns(multi_episode, ids[a], 1.0);
    if (f >= 0) {
      bare256_ns.push_back(bare_frame);
      sdk256_ns.push_back(sdk_frame);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // (a paced frame: the I/O thread sends meanwhile)
  }
  multi.close();
  const double ort_p50 = percentile_us(bare_ns, 50);
  const double sdk_p50 = percentile_us(sdk_ns, 50);
  const double ort256 = percentile_us(bare256_ns, 50);
  const double sdk256 = percentile_us(sdk256_ns, 50);
  return format(
      "{\"ort_cpp_lstm_us_p50\": %.2f, \"ort_cpp_lstm_us_p99\": %.2f, \"sdk_cpp_lstm_us_p50\": %.2f, "
      "\"sdk_cpp_lstm_us_p99\": %.2f, \"sdk_cpp_lstm_ratio\": %.3f, \"sdk_cpp_lstm_calls\": %zu, "
      "\"ort_cpp_lstm_batch256_us_p50\": %.2f, \"sdk_cpp_lstm_batch256_us_p50\": %.2f, "
      "\"sdk_cpp_lstm_batch256_us_p99\": %.2f, \"sdk_cpp_lstm_batch256_ratio\": %.3f, \"sdk_cpp_lstm_batch256_frames\": %zu}",
      ort_p50, percentile_us(bare_ns, 99), sdk_p50, percentile_us(sdk_ns, 99), ort_p50 > 0 ? sdk_p50 / ort_p50 : 0.0,
      sdk_ns.size(), ort256, sdk256, percentile_us(sdk256_ns, 99), ort256 > 0 ? sdk256 / ort256 : 0.0,
      sdk256_ns.size());
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  std::string json;
  if (!args.model.empty()) json = measure_cartpole(args);
  if (!args.cnn_model.empty()) {
    const std::string cnn = measure_cnn(args);
    json = json.empty() ? cnn : json.substr(0, json.size() - 1) + ", " + cnn.substr(1);
  }
  if (!args.lstm_model.empty()) {
    const std::string lstm = measure_lstm(args);
    json = json.empty() ? lstm : json.substr(0, json.size() - 1) + ", " + lstm.substr(1);
  }
  std::printf("%s\n", json.c_str());
  return 0;
}
