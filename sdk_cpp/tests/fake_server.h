// A fake RLlink server for the client tests, built from the SDK's own framing
// and message code: a loopback listening socket and one thread serving one
// connection at a time, with scripted answers. POSIX only.
#pragma once

#ifndef _WIN32

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/framing.h"
#include "tether/messages.h"
#include "tether/onnx_codec.h"
#include "tether/session.h"

namespace fake {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// gzip with one stored deflate block (enough for the client's decoder).
inline std::uint32_t crc32(const std::uint8_t* data, std::size_t size) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) {
    c ^= data[i];
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

// base64(gzip(model)) with stored deflate blocks.
inline std::string onnx_file_of(const std::vector<std::uint8_t>& model) {
  std::vector<std::uint8_t> gz = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff, 0x01};
  gz.pop_back();  // blocks of at most 65535 bytes follow
  std::size_t at = 0;
  do {
    const std::size_t n = std::min<std::size_t>(65535, model.size() - at);
    const std::uint16_t len = static_cast<std::uint16_t>(n);
    gz.push_back(at + n == model.size() ? 1 : 0);
    gz.push_back(len & 0xFF);
    gz.push_back(len >> 8);
    gz.push_back(~len & 0xFF);
    gz.push_back((~len >> 8) & 0xFF);
    gz.insert(gz.end(), model.begin() + static_cast<std::ptrdiff_t>(at), model.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  } while (at < model.size());
  const std::uint32_t crc = crc32(model.data(), model.size());
  for (int i = 0; i < 4; ++i) gz.push_back((crc >> (8 * i)) & 0xFF);
  for (int i = 0; i < 4; ++i) gz.push_back((model.size() >> (8 * i)) & 0xFF);
  return tether::base64_encode(gz.data(), gz.size());
}

/// A fake model for FakeBackend: its first byte is the action it prefers.
inline std::string onnx_file(std::uint8_t model_byte) { return onnx_file_of({model_byte, 1, 2, 3}); }

/// A PONG announcing protocol `version` (a server of that version).
inline json pong(const std::string& version) {
  return {{"type", "PONG"}, {"protocol_version", version}, {"server", "fake"}};
}

// -- a fake server -----------------------------------------------------------------------

class Conn {
 public:
  explicit Conn(int fd) : fd_(fd) {}
  ~Conn() { ::close(fd_); }
  // The next message, or nullopt on close/timeout/stop.
  std::optional<tether::Message> read(double timeout_s, const std::atomic<bool>& stop) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int>(timeout_s * 1000));
    for (;;) {
      std::optional<std::string> body = next();
      if (body) {
        tether::Result<tether::Message> message = tether::decode_message(*body);
        if (!message.ok()) return std::nullopt;
        // (a view of `body`, which ends here: kept as a copy, the last message's)
        attachment = message.value().attachment ? std::string(*message.value().attachment) : std::string();
        message.value().attachment.reset();
        return message.value();
      }
      if (stop.load() || Clock::now() > deadline) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buffer[65536];
      ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) return std::nullopt;
      if (!decoder_.add(std::string_view(buffer, static_cast<std::size_t>(n))).ok()) return std::nullopt;
    }
  }
  /// The binary attachment (§4.3) of the last message read ("" when it had none).
  std::string attachment;
  void send_raw(const std::string& bytes) { (void)::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  void send(const json& message) {
    std::string out;
    tether::append_message_frame(message, out);
    send_raw(out);
  }

 private:
  std::optional<std::string> next() {
    tether::Result<std::optional<std::string>> body = decoder_.next_body();
    if (!body.ok()) return std::nullopt;
    return body.value();
  }
  int fd_;
  tether::FrameDecoder decoder_;
};

struct ServerScript {
  std::int64_t steps_per_sample = 20;
  bool force_on_policy = true;
  double heartbeat_interval_s = 0;
  std::function<bool(Conn&, const tether::Message&)> on_ping;  // return false to close
  // Answers the n-th batch (1-based, counting every batch received).
  std::function<bool(Conn&, const tether::Message&, int)> on_batch;
  // Fields replacing the default SET_CONFIG's (e.g. the ONNX names of a real model).
  json config_overrides = json::object();
  // The onnx_file of model `n` (default: a FakeBackend model preferring action n).
  std::function<std::string(std::uint8_t)> model_file;
  // The whole SET_CONFIG instead of the default one (config_overrides still apply).
  std::optional<json> full_config;
  // The SET_CONFIG of the `connection`-th connection (1-based), when set: a
  // server that comes back with another config.
  std::function<json(int connection)> config_of_connection;
  // Answers GET_STATE on the `connection`-th connection (1-based); return false to close.
  std::function<bool(Conn&, const tether::Message&, int connection)> on_get_state;
  // Answers MAP_AGENTS; return false to close. Default: AGENT_MODULES from map_agent.
  std::function<bool(Conn&, const tether::Message&)> on_map_agents;
  // The module of an agent id for the default MAP_AGENTS answer.
  std::function<std::string(const std::string&)> map_agent;
  // False: messages and batches are counted but not kept (a test that measures
  // the client's heap, which the server's copies would swamp).
  bool keep_messages = true;
};

class FakeServer {
 public:
  explicit FakeServer(ServerScript script) : script_(std::move(script)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(fd_, 8);
    socklen_t len = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~FakeServer() { stop(); }
  // Goes away: stops listening first, then closes the connection it serves
  // (a client that reconnects at once finds nobody listening).
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    close_listener();
  }
  std::uint16_t port() const { return port_; }
  std::vector<json> batches() {
    std::lock_guard<std::mutex> lock(mutex_);
    return batches_;
  }
  /// The attachment of each batch (parallel to batches(); "" for none).
  std::vector<std::string> attachments() {
    std::lock_guard<std::mutex> lock(mutex_);
    return attachments_;
  }
  int connections() const { return connections_.load(); }
  /// Waits until no message has been handled for `quiet_ms` (the server thread is idle, its
  /// allocations for the last message freed): for a test that measures the process's heap.
  void wait_until_idle(int quiet_ms = 50) const {
    for (int seen = handled_.load();;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(quiet_ms));
      const int now = handled_.load();
      if (now == seen) return;
      seen = now;
    }
  }
  int pings() const { return pings_.load(); }
  // Every message received, in order (all connections).
  std::vector<json> messages() {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }
  json config() const {
    if (script_.full_config) {
      json out = *script_.full_config;
      for (auto it = script_.config_overrides.begin(); it != script_.config_overrides.end(); ++it) out[it.key()] = *it;
      return out;
    }
    json out = {{"type", "SET_CONFIG"},
            {"observation_space", {{"type", "Box"}, {"shape", {4}}, {"low", -10.0}, {"high", 10.0}}},
            {"action_space", {{"type", "Discrete"}, {"n", 2}}},
            {"onnx_input_names", {"obs"}},
            {"onnx_output_names", {"action_dist_inputs"}},
            {"env_steps_per_sample", script_.steps_per_sample},
            {"force_on_policy", script_.force_on_policy},
            {"heartbeat_interval_s", script_.heartbeat_interval_s},
            {"protocol_version", "1.3"}};
    for (auto it = script_.config_overrides.begin(); it != script_.config_overrides.end(); ++it) out[it.key()] = *it;
    return out;
  }
  json state(std::int64_t seq, std::uint8_t model) const {
    return {{"type", "SET_STATE"},
            {"weights_seq_no", seq},
            {"onnx_file", script_.model_file ? script_.model_file(model) : onnx_file(model)}};
  }

 private:
  void run() {
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int client = ::accept(fd_, nullptr, nullptr);
      if (client < 0) continue;
      const int number = connections_.fetch_add(1) + 1;
      Conn conn(client);
      serve(conn, number);
      if (stop_.load()) close_listener();  // (before `conn` closes)
    }
  }
  void close_listener() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void serve(Conn& conn, int number) {
    for (;;) {
      Handled handled{handled_};  // (declared first: counts once the message's memory is freed)
      std::optional<tether::Message> message = conn.read(30.0, stop_);
      if (!message) return;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (script_.keep_messages) messages_.push_back(message->body);
      }
      switch (message->type) {
        case tether::MessageType::kPing:
          pings_.fetch_add(1);
          if (script_.on_ping && !script_.on_ping(conn, *message)) return;
          if (!script_.on_ping) conn.send(tether::ServerConnection::pong());
          break;
        case tether::MessageType::kGetConfig:
          conn.send(script_.config_of_connection ? script_.config_of_connection(number) : config());
          break;
        case tether::MessageType::kGetState:
          if (script_.on_get_state) {
            if (!script_.on_get_state(conn, *message, number)) return;
          } else {
            conn.send(state(0, 0));
          }
          break;
        case tether::MessageType::kMapAgents:
          if (script_.on_map_agents) {
            if (!script_.on_map_agents(conn, *message)) return;
          } else {
            json modules = json::object();
            for (const json& id : message->body["agent_ids"]) {
              modules[id.get<std::string>()] = script_.map_agent ? script_.map_agent(id.get<std::string>()) : "";
            }
            conn.send({{"type", "AGENT_MODULES"}, {"modules", modules}});
          }
          break;
        case tether::MessageType::kEpisodes:
        case tether::MessageType::kEpisodesAndGetState: {
          int n = 0;
          {
            std::lock_guard<std::mutex> lock(mutex_);
            if (script_.keep_messages) {
              batches_.push_back(message->body);
              attachments_.push_back(conn.attachment);
            }
            n = ++batches_received_;
          }
          if (script_.on_batch) {
            if (!script_.on_batch(conn, *message, n)) return;
          } else if (message->type == tether::MessageType::kEpisodesAndGetState) {
            conn.send(state(n, static_cast<std::uint8_t>(n % 2)));
          }
          break;
        }
        default:
          return;
      }
    }
  }

  ServerScript script_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::atomic<int> pings_{0};
  std::atomic<int> handled_{0};
  struct Handled {
    std::atomic<int>& count;
    ~Handled() { count.fetch_add(1); }
  };
  std::mutex mutex_;
  std::vector<json> batches_;
  int batches_received_ = 0;
  std::vector<std::string> attachments_;
  std::vector<json> messages_;
  std::thread thread_;
};

/// A loopback port nobody listens on, kept so while this lives: a socket
/// bound to it that does not listen, so connecting there is refused.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~RefusingPort() { ::close(fd_); }
  RefusingPort(const RefusingPort&) = delete;
  RefusingPort& operator=(const RefusingPort&) = delete;
  std::uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

/// "127.0.0.1:port", a loopback server's address as a group's PONG names it (§6.7).
inline std::string loopback_address(std::uint16_t port) { return "127.0.0.1:" + std::to_string(port); }

/// Every record of every batch the server received, a resent batch counted once (its last sending).
inline std::vector<json> records_of(FakeServer& server) {
  std::map<std::int64_t, json> by_seq;
  for (const json& batch : server.batches()) by_seq[batch.value("batch_seq", std::int64_t{0})] = batch;
  std::vector<json> out;
  for (const auto& entry : by_seq) {
    for (const json& record : entry.second["episodes"]) out.push_back(record);
  }
  return out;
}

}  // namespace fake

#endif  // _WIN32
