// Runs the shared conformance vectors (tests/conformance/*.json) through the
// C++ core, the way tests/protocol/test_conformance.py runs them through the
// Python core. Every file this test claims must run all of its cases (a file
// with zero cases fails), and every vector file must be claimed or listed as
// needing a live server, so a new or emptied vector file cannot pass unseen.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "tether/action_mask.h"
#include "tether/demonstrations.h"
#include "tether/distributions.h"
#include "tether/env_params.h"
#include "tether/episode.h"
#include "tether/framing.h"
#include "tether/messages.h"
#include "tether/offline_policy.h"
#include "tether/observation_leaves.h"
#include "tether/policy_mapping.h"
#include "tether/recurrent_state.h"
#include "tether/session.h"
#include "tether/spaces.h"
#include "tether/tensors.h"

namespace tether {
namespace {

using nlohmann::json;

const std::string kDir = TETHER_CONFORMANCE_DIR;

// Files that need a live server (server-session vectors): not run here.
const std::set<std::string> kServerSessionFiles = {"connection.json", "counting.json", "exactly_once.json",
                                                   "map_agents.json", "multi_agent_sessions.json", "set_state.json"};
// Files this test runs.
const std::set<std::string> kClaimedFiles = {"framing.json",   "messages.json",  "spaces.json",
                                             "logp.json",      "policy_mapping.json", "episodes.json",
                                             "multi_agent_episodes.json", "groups.json", "value_obs.json",
                                             "client_pairing.json", "session.json", "tensors.json",
                                             "composite.json", "recurrent.json", "logged.json",
                                             "demonstrations.json", "rewards.json", "env_params.json",
                                             "run_ids.json", "rank_addresses.json", "offline_policy.json",
                                             "agent_modules.json", "cuts.json"};

json load(const std::string& name) {
  std::ifstream in(kDir + "/" + name, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  Result<json> parsed = parse_json(text.str());
  EXPECT_TRUE(parsed.ok()) << name << ": " << parsed.status().to_string();
  return parsed.ok() ? parsed.value() : json::object();
}

const json& cases_of(const json& file) {
  static const json kEmpty = json::array();
  const auto it = file.find("cases");
  return it != file.end() && it->is_array() ? *it : kEmpty;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return out;
}

// Flattens a nested JSON array of numbers.
void flat(const json& value, std::vector<double>& out) {
  if (value.is_array()) {
    for (const auto& v : value) flat(v, out);
  } else if (value.is_number()) {
    out.push_back(value.get<double>());
  }
}

std::vector<double> flat(const json& value) {
  std::vector<double> out;
  flat(value, out);
  return out;
}

// A leaf's values in a record: a tensor object (§10.9, in `attachment` or inline) or JSON numbers.
std::vector<double> leaf_values(const json& leaf, std::optional<std::string_view> attachment) {
  if (!leaf.is_object()) return flat(leaf);
  Result<Tensor> tensor = decode_tensor(leaf, attachment);
  EXPECT_TRUE(tensor.ok()) << tensor.status().to_string();
  std::vector<double> values;
  if (tensor.ok()) tensor.value().values(values);
  return values;
}

// The case's "flat_rows" (§8.6: each observation's leaves in leaf order) recorded as this SDK records
// them and encoded as it sends them, as JSON numbers and as tensors in an attachment: each leaf
// holds the values the case's body gives that leaf.
void expect_leaves_of_flat_rows(const json& c, const Message& body, const Space& obs, const Space& act) {
  const json& record = body.body["episodes"][0];
  EpisodeChunk chunk;
  for (double v : flat(c["flat_rows"])) chunk.obs.push_back(static_cast<float>(v));
  for (double v : flat(record["actions"])) chunk.actions.push_back(v);
  for (double v : flat(record["rewards"])) chunk.rewards.push_back(static_cast<float>(v));
  for (double v : flat(record["action_logp"])) chunk.action_logp.push_back(v);
  chunk.is_terminated = record["is_terminated"].get<bool>();
  std::optional<std::string_view> body_attachment;
  if (body.attachment) body_attachment = std::string_view(*body.attachment);
  std::string attachment;
  for (std::string* into : {static_cast<std::string*>(nullptr), &attachment}) {
    Result<json> encoded = encode_episode(chunk, obs, act, into);
    ASSERT_TRUE(encoded.ok()) << encoded.status().to_string();
    for (const SpaceLeaf& leaf : obs.leaves()) {
      const std::optional<std::string_view> ours =
          into ? std::optional<std::string_view>(attachment) : std::optional<std::string_view>();
      EXPECT_EQ(leaf_values(encoded.value()["obs"][leaf.path], ours),
                leaf_values(record["obs"][leaf.path], body_attachment))
          << c["name"] << " leaf " << leaf.path << (into ? " (tensors)" : " (JSON)");
    }
  }
}

std::vector<float> flat_float(const json& value) {
  std::vector<double> d = flat(value);
  return std::vector<float>(d.begin(), d.end());
}

Space space(const json& data) {
  Result<Space> s = Space::from_json(data);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? s.value() : Space();
}

// Checks a case's outcome. When the case names an error: that `got` failed
// with that code; returns false (nothing more to check). Otherwise: that `got`
// succeeded; returns whether it did (then the caller checks what it got).
bool succeeded_as_expected(const json& c, const Status& got) {
  if (c.contains("error")) {
    EXPECT_FALSE(got.ok()) << "expected " << c["error"];
    if (!got.ok()) EXPECT_EQ(to_string(got.code()), c["error"].get<std::string>()) << got.message();
    return false;
  }
  EXPECT_TRUE(got.ok()) << got.to_string();
  return got.ok();
}

template <class T>
bool succeeded_as_expected(const json& c, const Result<T>& got) {
  return succeeded_as_expected(c, got.status());
}

// Runs `body` for every case of `file`, then checks that all ran and there was at least one.
template <class F>
void run_cases(const std::string& file, F body) {
  const json data = load(file);
  const json& cases = cases_of(data);
  std::size_t ran = 0;
  for (const json& c : cases) {
    SCOPED_TRACE(file + ": " + c.value("name", std::string("?")));
    body(data, c);
    ++ran;
  }
  EXPECT_GT(ran, 0u) << file << " has no cases";
  EXPECT_EQ(ran, cases.size());
  std::printf("[ conformance ] %s: %zu of %zu cases run\n", file.c_str(), ran, cases.size());
}

TEST(Conformance, EveryVectorFileIsClaimed) {
  std::error_code error;
  std::set<std::string> seen;
  for (std::filesystem::directory_iterator it(kDir, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 5 && name.substr(name.size() - 5) == ".json") seen.insert(name);
  }
  ASSERT_FALSE(error) << kDir << ": " << error.message();
  for (const std::string& name : seen) {
    EXPECT_TRUE(kClaimedFiles.count(name) || kServerSessionFiles.count(name)) << name << " is neither run nor listed";
  }
  for (const std::string& name : kClaimedFiles) EXPECT_TRUE(seen.count(name)) << name << " is missing";
  for (const std::string& name : kServerSessionFiles) {
    EXPECT_TRUE(seen.count(name)) << name << " is missing";
    EXPECT_GT(cases_of(load(name)).size(), 0u) << name;  // needs a live server: not run here
  }
}

TEST(Conformance, Framing) {
  run_cases("framing.json", [](const json&, const json& c) {
    const std::string input = from_hex(c["input_hex"].get<std::string>());
    for (std::size_t step : {std::size_t{1}, std::size_t{7}, std::size_t{1} << 20}) {
      SCOPED_TRACE("step " + std::to_string(step));
      FrameDecoder decoder(c.contains("max_frame_bytes") ? c["max_frame_bytes"].get<std::size_t>()
                                                         : kDefaultMaxFrameBytes);
      std::vector<std::string> bodies;
      for (std::size_t i = 0; i < input.size(); i += step) {
        if (!decoder.feed(std::string_view(input).substr(i, step), bodies).ok()) break;
      }
      if (c.contains("error")) {
        std::vector<std::string> before;
        if (c.contains("bodies_before_error")) before = c["bodies_before_error"].get<std::vector<std::string>>();
        EXPECT_EQ(bodies, before);
        EXPECT_EQ(to_string(decoder.error().code()), c["error"].get<std::string>());
        std::vector<std::string> more;
        EXPECT_FALSE(decoder.feed("00000002{}", more).ok());  // a failed decoder stays failed
        EXPECT_TRUE(more.empty());
      } else {
        EXPECT_TRUE(decoder.error().ok()) << decoder.error().to_string();
        EXPECT_EQ(bodies, c["bodies"].get<std::vector<std::string>>());
      }
    }
  });
}

TEST(Conformance, Messages) {
  run_cases("messages.json", [](const json&, const json& c) {
    const std::string body = from_hex(c["body_hex"].get<std::string>());
    Result<Message> m = decode_message(body);
    if (!succeeded_as_expected(c, m)) return;
    EXPECT_EQ(to_string(m.value().type), c["type"].get<std::string>());
    EXPECT_EQ(m.value().body["type"], c["type"]);
    // 1.4: the bytes after the first NUL are the attachment, whatever they are (§4.3).
    const std::size_t nul = body.find('\0');
    ASSERT_EQ(m.value().attachment.has_value(), nul != std::string::npos);
    if (nul != std::string::npos) EXPECT_EQ(*m.value().attachment, std::string_view(body).substr(nul + 1));
  });
}

TEST(Conformance, Spaces) {
  run_cases("spaces.json", [](const json&, const json& c) {
    Result<Space> s = Space::from_json(c["space"]);
    if (!succeeded_as_expected(c, s)) return;
    EXPECT_EQ(s.value().shape(), c["shape"].get<std::vector<std::int64_t>>());
    EXPECT_EQ(s.value().dist_inputs_size(), c["dist_inputs_size"].get<std::size_t>());
    // The canonical JSON a peer writes back parses to the same space.
    Result<json> text = parse_json(encode_message(s.value().to_json()));
    ASSERT_TRUE(text.ok());
    Result<Space> again = Space::from_json(text.value());
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again.value().to_json(), s.value().to_json());
  });
}

TEST(Conformance, Logp) {
  run_cases("logp.json", [](const json&, const json& c) {
    const Space s = space(c["space"]);
    const std::vector<double> inputs = flat(c["dist_inputs"]);
    const std::vector<double> action = flat(c["action"]);
    Result<double> got = log_prob(s, inputs.data(), inputs.size(), action.data(), action.size());
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    const double expected = c["logp"].get<double>();
    EXPECT_LE(std::fabs(got.value() - expected), std::max(1e-9, 1e-9 * std::fabs(expected)));
    // float32 dist inputs (a model's output) agree to float precision.
    const std::vector<float> inputs32(inputs.begin(), inputs.end());
    EXPECT_NEAR(log_prob(s, inputs32.data(), inputs32.size(), action.data(), action.size()).value(), expected, 1e-5);
    if (c["name"].get<std::string>().rfind("masked_", 0) == 0) {
      // 1.4 (§11.4, §11.6): a masked logit (-1e9) has probability 0 and is never drawn;
      // the draws' logp are those of the masked distribution.
      const std::vector<float> dist(inputs.begin(), inputs.end());
      Rng rng(7);
      std::vector<double> record(action.size()), env(action.size());
      for (int draw = 0; draw < 2000; ++draw) {
        double logp = 0.0;
        ASSERT_TRUE(sample_for_record(s, dist.data(), dist.size(), rng, true, record.data(), env.data(), env.size(),
                                      &logp).ok());
        std::size_t first = 0;
        for (std::size_t j = 0; j < record.size(); ++j) {
          const std::size_t logit = first + static_cast<std::size_t>(record[j]) -
                                    static_cast<std::size_t>(s.kind() == SpaceKind::kDiscrete ? s.start() : 0);
          ASSERT_GT(inputs[logit], -1e8) << "drew a masked value";
          first += s.kind() == SpaceKind::kDiscrete ? static_cast<std::size_t>(s.n()) : static_cast<std::size_t>(s.nvec()[j]);
        }
        EXPECT_NEAR(logp, log_prob(s, dist.data(), dist.size(), record.data(), record.size()).value(), 1e-9);
      }
    }
    if (c.contains("env_action")) {  // 1.3: the record keeps the raw sample, the engine gets it clipped
      std::vector<double> env(action.size());
      ASSERT_TRUE(to_env_action(s, action.data(), env.data(), env.size()).ok());
      const std::vector<double> expected_env = flat(c["env_action"]);
      ASSERT_EQ(env.size(), expected_env.size());
      for (std::size_t i = 0; i < env.size(); ++i) EXPECT_NEAR(env[i], expected_env[i], 1e-6 * std::fabs(expected_env[i]) + 1e-12);
    }
  });
}

TEST(Conformance, Session) {
  run_cases("session.json", [](const json&, const json& c) {
    std::optional<std::string> token;
    if (c["server"].contains("auth_token")) token = c["server"]["auth_token"].get<std::string>();
    ServerConnection conn(token);
    FrameDecoder decoder;
    std::vector<std::string> got;
    for (const json& request : c["requests"]) {
      std::string frame;
      ASSERT_TRUE(append_message_frame(request, frame).ok());
      std::vector<std::string> bodies;
      ASSERT_TRUE(decoder.feed(frame, bodies).ok());
      ASSERT_EQ(bodies.size(), 1u);
      ServerEvent event = conn.handle_body(bodies[0]);
      if (!event.accepted()) {
        got.push_back("ERROR:" + std::string(to_string(event.refusal.code())));
      } else {
        std::optional<MessageType> response = expected_response(*event.type);
        got.push_back(response ? std::string(to_string(*response)) : std::string("null"));
      }
    }
    EXPECT_EQ(got, c["responses"].get<std::vector<std::string>>());
  });
}

TEST(Conformance, PolicyMapping) {
  run_cases("policy_mapping.json", [](const json& file, const json& c) {
    if (c.contains("fnv1a32")) {
      EXPECT_EQ(fnv1a32(from_hex(c["fnv1a32_of_hex"].get<std::string>())), c["fnv1a32"].get<std::uint32_t>());
      return;
    }
    Result<PolicyMapping> mapping = PolicyMapping::from_json(file["rules"]);
    ASSERT_TRUE(mapping.ok()) << mapping.status().to_string();
    Result<std::string> module =
        mapping.value().module_for(c["agent_id"].get<std::string>(), c["episode_id"].get<std::string>());
    if (succeeded_as_expected(c, module)) EXPECT_EQ(module.value(), c["module"].get<std::string>());
  });
}

TEST(Conformance, AgentModulesAnswers) {
  run_cases("agent_modules.json", [](const json&, const json& c) {
    const auto described = c["described"].get<std::set<std::string>>();
    const auto asked = c["asked"].get<std::vector<std::string>>();
    std::vector<std::string> modules{"left from before"};
    Status read = read_agent_modules(
        c["answer"], asked, [&](const std::string& id) { return described.count(id) != 0; }, modules);
    if (!succeeded_as_expected(c, read)) {
      EXPECT_TRUE(modules.empty()) << "a refused answer gave modules";
      return;
    }
    ASSERT_EQ(modules.size(), asked.size());
    for (std::size_t k = 0; k < asked.size(); ++k) EXPECT_EQ(modules[k], c["modules"][asked[k]].get<std::string>());
  });
}

TEST(Conformance, Episodes) {
  run_cases("episodes.json", [](const json&, const json& c) {
    const Space obs = space(c["observation_space"]);
    const Space act = space(c["action_space"]);
    Result<Message> m = decode_message(c["body"].get<std::string>());
    Result<std::size_t> steps =
        m.ok() ? validate_episodes(m.value().body, obs, act, c["require_logp"].get<bool>(), m.value().attachment)
               : Result<std::size_t>(m.status());
    if (succeeded_as_expected(c, steps)) EXPECT_EQ(steps.value(), c["env_steps"].get<std::size_t>());
  });
}

// Sets every leaf an observation written as JSON holds (a Dict's leaves by
// key, a Tuple's by position) as the engine would: a view of its values by
// leaf path; a value at a path that is no leaf's is set all the same, for
// the SDK to refuse. The first refusal is kept in `refused`.
void set_leaves(const json& value, const std::string& path, const Space& space, ObservationLeaves& obs,
                std::vector<std::vector<float>>& storage, Status& refused) {
  const bool inner = path.empty() || std::any_of(space.leaves().begin(), space.leaves().end(), [&](const SpaceLeaf& l) {
                       return l.path.compare(0, path.size() + 1, path + ".") == 0;
                     });
  if (space.leaf_index(path) < 0 && inner && (value.is_object() || value.is_array())) {
    std::size_t i = 0;
    for (auto it = value.begin(); it != value.end(); ++it, ++i) {
      const std::string key = value.is_object() ? it.key() : std::to_string(i);
      set_leaves(*it, path.empty() ? key : path + "." + key, space, obs, storage, refused);
    }
    return;
  }
  std::vector<double> numbers = flat(value);
  storage.emplace_back(numbers.begin(), numbers.end());
  Status status = obs.set(path, storage.back().data(), storage.back().size());
  if (refused.ok()) refused = status;
}

// 1.4: composite spaces and masks (§8.6, §11.6, §12.1): a space's leaves,
// flat row and model inputs; one observation as the engine sets it -> its
// flat row or the local refusal; records of leaves as a server validates
// them (§10.6 checks 4c, 14b-14d); a step's mask as a client checks it before sampling.
TEST(Conformance, Composite) {
  std::set<std::string> kinds;
  run_cases("composite.json", [&](const json&, const json& c) {
    const std::string kind = c["kind"].get<std::string>();
    kinds.insert(kind);
    if (kind == "space") {
      Result<Space> s = Space::from_json(c["space"]);
      if (!succeeded_as_expected(c, s)) return;
      const std::vector<SpaceLeaf>& leaves = s.value().leaves();
      ASSERT_EQ(leaves.size(), c["leaves"].size());
      for (std::size_t i = 0; i < leaves.size(); ++i) {
        const json& want = c["leaves"][i];
        EXPECT_EQ(leaves[i].path, want["path"].get<std::string>());
        EXPECT_EQ(leaves[i].offset, want["offset"].get<std::size_t>());
        EXPECT_EQ(leaves[i].size, want["size"].get<std::size_t>());
        EXPECT_EQ(leaves[i].is_bytes() ? "uint8" : "float32", want["dtype"].get<std::string>());
        EXPECT_EQ(s.value().leaf_index(leaves[i].path), static_cast<int>(i));
        // The model input of the leaf (§12.1): its path, uint8 in its shape, or float32 [size].
        const json& input = c["inputs"][i];
        EXPECT_EQ(input["name"].get<std::string>(), leaves[i].path);
        const std::vector<std::int64_t> dims =
            leaves[i].is_bytes() ? leaves[i].space.shape() : std::vector<std::int64_t>{static_cast<std::int64_t>(leaves[i].size)};
        EXPECT_EQ(dims, input["dims"].get<std::vector<std::int64_t>>());
      }
      EXPECT_EQ(s.value().flat_dim(), c["flat_dim"].get<std::size_t>());
      // The canonical JSON reads back as the same space; a composite is never an action space.
      Result<Space> again = Space::from_json(s.value().to_json());
      ASSERT_TRUE(again.ok());
      EXPECT_TRUE(again.value() == s.value());
      EXPECT_FALSE(ActionMask::of_action_space(s.value()).ok());
      return;
    }
    if (kind == "observation") {
      const Space s = space(c["space"]);
      ObservationLeaves obs(s);
      std::vector<std::vector<float>> storage;
      storage.reserve(256);  // (views of it must stay put)
      Status refused;
      set_leaves(c["observation"], "", s, obs, storage, refused);
      std::vector<float> row(s.flat_dim());
      Status written = refused.ok() ? obs.write_row(row.data(), row.size()) : refused;
      if (c.contains("error")) {
        ASSERT_FALSE(written.ok());
        EXPECT_EQ(to_string(written.code()), c["error"].get<std::string>()) << written.message();
        // A refused set() stays refused when the row is written.
        EXPECT_EQ(obs.write_row(row.data(), row.size()).code(), written.code());
        return;
      }
      ASSERT_TRUE(written.ok()) << written.to_string();
      const std::vector<double> want = flat(c["flat_row"]);
      ASSERT_EQ(row.size(), want.size());
      for (std::size_t i = 0; i < row.size(); ++i) EXPECT_EQ(row[i], static_cast<float>(want[i])) << i;
      return;
    }
    if (kind == "episode") {
      const Space obs = space(c["observation_space"]);
      const Space act = space(c["action_space"]);
      std::optional<ActionMask> mask;
      if (!c["action_mask"].is_null()) {
        Result<ActionMask> resolved = ActionMask::resolve(obs, act, c["action_mask"].get<std::string>());
        ASSERT_TRUE(resolved.ok()) << resolved.status().to_string();
        mask = resolved.value();
      }
      Result<Message> m = decode_message(c["body"].get<std::string>());
      Result<std::size_t> steps = m.ok() ? validate_episodes(m.value().body, obs, act, c["require_logp"].get<bool>(),
                                                             m.value().attachment, mask ? &*mask : nullptr)
                                         : Result<std::size_t>(m.status());
      if (succeeded_as_expected(c, steps)) EXPECT_EQ(steps.value(), c["env_steps"].get<std::size_t>());
      if (c.contains("flat_rows")) expect_leaves_of_flat_rows(c, m.value(), obs, act);
      return;
    }
    ASSERT_EQ(kind, "mask");
    Result<ActionMask> mask = ActionMask::of_action_space(space(c["action_space"]));
    ASSERT_TRUE(mask.ok()) << mask.status().to_string();
    const std::vector<double> values = flat(c["mask"]);
    ASSERT_EQ(values.size(), mask.value().size);
    const std::vector<float> as_float(values.begin(), values.end());
    const Status checked = mask.value().check(as_float.data(), "mask");
    if (c["error"].is_null()) {
      EXPECT_TRUE(checked.ok()) << checked.to_string();
    } else {
      EXPECT_EQ(to_string(checked.code()), c["error"].get<std::string>()) << checked.message();
    }
    EXPECT_EQ(mask.value().check(values.data(), "mask").code(), checked.code());
  });
  EXPECT_EQ(kinds, (std::set<std::string>{"space", "observation", "episode", "mask"}));
}

// 1.4: a tensor object (§10.9), with the body's attachment where the case has
// one, reads as its dtype, shape and values, or is INVALID_TENSOR; encoding
// the values inline gives the case's object, and into an attachment reads back.
TEST(Conformance, Tensors) {
  run_cases("tensors.json", [](const json&, const json& c) {
    std::optional<std::string> attachment;
    if (c.contains("attachment_hex")) attachment = from_hex(c["attachment_hex"].get<std::string>());
    std::optional<std::string_view> view;
    if (attachment) view = std::string_view(*attachment);
    Result<Tensor> tensor = decode_tensor(c["tensor"], view);
    if (!succeeded_as_expected(c, tensor)) return;
    const Tensor& t = tensor.value();
    EXPECT_EQ(to_string(t.dtype()), c["dtype"].get<std::string>());
    const auto shape = c["shape"].get<std::vector<std::int64_t>>();
    EXPECT_EQ(t.shape(), shape);
    std::vector<double> values;
    t.values(values);
    EXPECT_EQ(values, flat(c["values"]));  // float32 values exactly, as their float64 decimal
    EXPECT_EQ(t.in_attachment(), c["tensor"].contains("offset"));
    EXPECT_EQ(t.bytes().size(), t.size() * element_size(t.dtype()));

    Result<json> inline_object(Status(ErrorCode::kInternal, "not encoded"));
    std::string written;
    Result<json> at_object(Status(ErrorCode::kInternal, "not encoded"));
    if (t.dtype() == TensorDtype::kUint8) {
      std::vector<std::uint8_t> bytes(values.begin(), values.end());
      inline_object = encode_tensor(bytes.data(), bytes.size(), shape);
      at_object = encode_tensor_at(bytes.data(), bytes.size(), shape, written);
    } else {
      std::vector<float> floats(values.begin(), values.end());
      inline_object = encode_tensor(floats.data(), floats.size(), shape);
      at_object = encode_tensor_at(floats.data(), floats.size(), shape, written);
    }
    ASSERT_TRUE(inline_object.ok()) << inline_object.status().to_string();
    if (c["tensor"].contains("b64")) EXPECT_EQ(inline_object.value(), c["tensor"]);
    ASSERT_TRUE(at_object.ok()) << at_object.status().to_string();
    EXPECT_EQ(at_object.value()["offset"], 0);
    EXPECT_EQ(written, std::string(t.bytes()));
    Result<Tensor> again = decode_tensor(at_object.value(), std::string_view(written));
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    std::vector<double> read_back;
    again.value().values(read_back);
    EXPECT_EQ(read_back, values);
  });
}

TEST(Conformance, MultiAgentEpisodes) {
  run_cases("multi_agent_episodes.json", [](const json&, const json& c) {
    std::map<std::string, ModuleSpec> modules;
    for (const auto& item : c["modules"].items()) {
      Result<ModuleSpec> spec = ModuleSpec::from_json(item.key(), item.value());
      ASSERT_TRUE(spec.ok()) << spec.status().to_string();
      modules.emplace(item.key(), spec.value());
    }
    json record = c["record"];
    if (c.contains("record_json")) {
      Result<json> parsed = parse_json(c["record_json"].get<std::string>());
      ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
      record = parsed.value();
    }
    Result<std::size_t> steps = validate_multi_agent_record(record, 0, modules, c["require_logp"].get<bool>());
    if (succeeded_as_expected(c, steps)) EXPECT_EQ(steps.value(), c["agent_steps"].get<std::size_t>());
  });
}

TEST(Conformance, Groups) {
  run_cases("groups.json", [](const json&, const json& c) {
    if (c.contains("member_action_spaces")) {
      std::vector<Space> obs, act;
      for (const json& s : c["member_observation_spaces"]) obs.push_back(space(s));
      for (const json& s : c["member_action_spaces"]) act.push_back(space(s));
      Result<std::pair<Space, Space>> spaces = group_spaces(obs, act);
      if (c.contains("error")) {
        EXPECT_FALSE(spaces.ok());
        return;
      }
      ASSERT_TRUE(spaces.ok()) << spaces.status().to_string();
      EXPECT_EQ(spaces.value().first.to_json(), space(c["group_observation_space"]).to_json());
      EXPECT_EQ(spaces.value().second.to_json(), space(c["group_action_space"]).to_json());
      return;
    }
    Result<GroupSpec> group = GroupSpec::from_json("g", c["group"]);
    ASSERT_TRUE(group.ok()) << group.status().to_string();
    if (c.contains("member_observations")) {
      std::map<std::string, std::vector<float>> member_obs;
      for (const auto& item : c["member_observations"].items()) member_obs[item.key()] = flat_float(item.value());
      std::vector<float> joined;
      Status status = group.value().join_observations(member_obs, joined);
      if (c.contains("error")) {
        EXPECT_FALSE(status.ok());
        return;
      }
      ASSERT_TRUE(status.ok()) << status.to_string();
      EXPECT_EQ(joined, flat_float(c["group_observation"]));
    } else if (c.contains("group_action")) {
      const Space s = space(c["group_action_space"]);
      std::vector<std::vector<double>> parts;
      ASSERT_TRUE(group.value().split_action(flat(c["group_action"]), parts).ok());
      json got = json::object();
      for (std::size_t i = 0; i < parts.size(); ++i) {
        got[group.value().members[i]] = member_action_to_json(parts[i], s.kind() != SpaceKind::kBox);
      }
      EXPECT_EQ(got, c["member_actions"]);
      for (const auto& item : c["member_actions"].items()) {  // a bare integer stays bare, an array an array
        EXPECT_EQ(got[item.key()].is_array(), item.value().is_array()) << item.key();
      }
    } else {
      std::vector<double> received;
      for (const json& step : c["member_rewards"]) {
        for (const auto& item : step.items()) received.push_back(item.value().get<double>());
      }
      EXPECT_NEAR(group.value().combine_rewards(received), c["group_reward"].get<double>(), 1e-9);
    }
  });
}

TEST(Conformance, ValueObs) {
  run_cases("value_obs.json", [](const json&, const json& c) {
    const auto agents = c["value_obs_agents"].get<std::vector<std::string>>();
    const auto obs_dim = c["obs_dim"].get<std::size_t>();
    std::map<std::string, std::vector<float>> latest;
    for (const json& step : c["steps"]) {
      for (const char* key : {"observe", "leave"}) {
        if (!step.contains(key)) continue;
        for (const auto& item : step[key].items()) latest[item.key()] = flat_float(item.value());
      }
      std::vector<float> row(agents.size() * obs_dim);
      ASSERT_TRUE(value_obs_row(agents, latest, obs_dim, row.data()).ok());
      EXPECT_EQ(row, flat_float(step["row"]));
    }
  });
}

// [1.5] Models with memory: a module's recurrent_state parsed (kind "module").
// Kind "carry" needs ONNX Runtime: test_ort_recurrent.cpp runs it (here it is
// only checked to be well formed); kind "episode" is the server's (§10.6 check 19).
TEST(Conformance, Recurrent) {
  std::size_t modules = 0;
  run_cases("recurrent.json", [&](const json&, const json& c) {
    const std::string kind = c["kind"].get<std::string>();
    if (kind == "carry") {
      EXPECT_TRUE(c.contains("model_b64") && c.contains("records_state_in"));
      return;
    }
    if (kind == "episode") return;
    ASSERT_EQ(kind, "module");
    ++modules;
    Result<ModuleSpec> spec = ModuleSpec::from_json("m", c["module"]);
    if (c.contains("error")) {
      ASSERT_FALSE(spec.ok());
      EXPECT_EQ(std::string(to_string(spec.status().code())), c["error"].get<std::string>()) << spec.status().to_string();
      // (the default module's top-level field in SET_CONFIG is refused alike, §7.4)
      Result<std::vector<RecurrentStateSpec>> top =
          recurrent_state_from_json(&c["module"]["recurrent_state"], "SET_CONFIG");
      EXPECT_FALSE(top.ok());
      return;
    }
    ASSERT_TRUE(spec.ok()) << spec.status().to_string();
    json got = json::array();
    for (const RecurrentStateSpec& s : spec.value().recurrent_state) {
      got.push_back({{"input", s.input}, {"output", s.output}, {"size", s.size}});
    }
    EXPECT_EQ(got, c["recurrent_state"]);
  });
  EXPECT_GT(modules, 0u);
}

// The logged step indices a case lists (a JSON array of integers).
std::vector<std::size_t> indices(const json& value) {
  std::vector<std::size_t> out;
  for (const json& v : value) out.push_back(v.get<std::size_t>());
  return out;
}

// [1.6] Logged steps (§10.1, §10.6 check 20, §10.7): a record's logged_runs
// read as a server reads them (kinds "episode" and "agent_entry"); and the
// logged_runs of the records a client cuts its calls into (kind "record":
// here the runs as add_logged_step builds them for each record's own steps;
// test_logged_actions.cpp plays the same calls through a TetherClient).
TEST(Conformance, Logged) {
  std::set<std::string> kinds;
  run_cases("logged.json", [&](const json&, const json& c) {
    const std::string kind = c["kind"].get<std::string>();
    kinds.insert(kind);
    if (kind == "episode") {
      const Space obs = space(c["observation_space"]);
      const Space act = space(c["action_space"]);
      Result<Message> m = decode_message(c["body"].get<std::string>());
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      Result<std::size_t> steps = validate_episodes(m.value().body, obs, act, c["require_logp"].get<bool>());
      if (!succeeded_as_expected(c, steps)) return;
      EXPECT_EQ(steps.value(), c["env_steps"].get<std::size_t>());
      Result<std::vector<std::size_t>> logged = read_logged_steps(m.value().body["episodes"][0], steps.value());
      ASSERT_TRUE(logged.ok()) << logged.status().to_string();
      EXPECT_EQ(logged.value(), indices(c["logged_steps"]));
      return;
    }
    if (kind == "agent_entry") {
      std::map<std::string, ModuleSpec> modules;
      for (const auto& item : c["modules"].items()) modules.emplace(item.key(), ModuleSpec::from_json(item.key(), item.value()).value());
      Result<std::size_t> steps = validate_multi_agent_record(c["record"], 0, modules, c["require_logp"].get<bool>());
      if (!succeeded_as_expected(c, steps)) return;
      EXPECT_EQ(steps.value(), c["agent_steps"].get<std::size_t>());
      for (const auto& item : c["logged_steps"].items()) {
        const json& entry = c["record"]["agents"][item.key()];
        Result<std::vector<std::size_t>> logged = read_logged_steps(entry, entry["actions"].size());
        ASSERT_TRUE(logged.ok()) << logged.status().to_string();
        EXPECT_EQ(logged.value(), indices(item.value())) << item.key();
      }
      return;
    }
    ASSERT_EQ(kind, "record");
    const json& calls = c["calls"];
    std::vector<std::size_t> bounds;  // each record's first step; the last record takes the rest
    std::size_t at = 0;
    for (const json& cut : c["cuts"]) bounds.push_back(at += cut.get<std::size_t>());
    bounds.push_back(calls.size());
    json records = json::array();
    std::size_t first = 0;
    for (std::size_t end : bounds) {
      std::vector<std::pair<std::int64_t, std::int64_t>> runs;
      for (std::size_t t = first; t < end; ++t) {
        if (calls[t] == "log") add_logged_step(runs, static_cast<std::int64_t>(t - first));
      }
      json out = nullptr;
      for (const auto& [start, n] : runs) {
        if (out.is_null()) out = json::array();
        out.push_back({start, n});
      }
      records.push_back(out);
      first = end;
    }
    EXPECT_EQ(records, c["records_logged_runs"]);
  });
  EXPECT_EQ(kinds, (std::set<std::string>{"episode", "agent_entry", "record"}));
}

// [1.6] Step rewards (§10.5), kind "single": one episode's calls, "act" (a
// recorded step) or a reward logged, summed per step as both clients sum
// them (check_step_reward before each addition, nothing added when it
// refuses) -> the steps' rewards (within 1e-9 relative, and the same float32
// the record carries) and the calls refused (NON_FINITE_VALUE). A reward
// before the first action goes to no step. test_step_rewards.cpp plays the
// same calls through a TetherClient.
TEST(Conformance, Rewards) {
  run_cases("rewards.json", [](const json&, const json& c) {
    ASSERT_EQ(c["kind"], "single");
    std::vector<double> steps;
    std::vector<std::size_t> refused;
    const json& calls = c["calls"];
    for (std::size_t i = 0; i < calls.size(); ++i) {
      if (calls[i] == "act") {
        steps.push_back(0.0);
        continue;
      }
      ASSERT_TRUE(calls[i].is_number()) << calls[i];
      const double reward = calls[i].get<double>();
      if (steps.empty()) continue;  // (no step: not limited)
      const Status checked = check_step_reward(steps.back(), reward, kDefaultAgentId);
      if (!checked.ok()) {
        EXPECT_EQ(checked.code(), ErrorCode::kNonFiniteValue) << checked.to_string();
        EXPECT_NE(checked.message().find("float32"), std::string::npos) << checked.message();
        refused.push_back(i);
        continue;
      }
      steps.back() += reward;
    }
    EXPECT_EQ(refused, indices(c["refused"]));
    const std::vector<double> expected = flat(c["step_rewards"]);
    ASSERT_EQ(steps.size(), expected.size());
    for (std::size_t t = 0; t < steps.size(); ++t) {
      EXPECT_LE(std::fabs(steps[t] - expected[t]), 1e-9 * std::fabs(expected[t])) << "step " << t;
      EXPECT_LT(std::fabs(steps[t]), kFloat32Overflow) << "step " << t;
      EXPECT_EQ(step_reward_float32(steps[t]), step_reward_float32(expected[t])) << "step " << t;
      EXPECT_TRUE(std::isfinite(step_reward_float32(steps[t]))) << "step " << t;
    }
  });
}

// The lines of a text file (each without its LF).
std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// A demonstration file's text as §18's reader checks it: the header, then
// each episode line against its module's spaces (§10.6 checks 1-14d and 20)
// with one flag true. Returns the 1-based number of the first line refused
// (0 when none is), and the episodes and steps per module read.
std::size_t read_demonstrations(const std::vector<std::string>& lines, std::size_t& episodes,
                                std::map<std::string, std::size_t>& steps) {
  if (lines.empty()) return 1;
  Result<json> head = parse_json(lines[0]);
  if (!head.ok() || !head.value().is_object() || head.value().value("format", json()) != kDemoFormat ||
      head.value().value("version", json()) != kDemoVersion || !head.value().value("modules", json()).is_object()) {
    return 1;
  }
  std::map<std::string, ModuleSpec> modules;
  for (const auto& item : head.value()["modules"].items()) {
    Result<ModuleSpec> spec = ModuleSpec::from_json(item.key(), item.value());
    if (!spec.ok()) return 1;
    modules.emplace(item.key(), spec.value());
  }
  for (std::size_t i = 1; i < lines.size(); ++i) {
    Result<json> line = parse_json(lines[i]);
    if (!line.ok() || !line.value().is_object()) return i + 1;
    const json& episode = line.value();
    auto module = modules.find(episode.value("module", std::string()));
    if (module == modules.end() || !episode.value("agent_id", json()).is_string() ||
        !episode.value("episode_id", json()).is_string()) {
      return i + 1;
    }
    const ModuleSpec& spec = module->second;
    Result<std::size_t> n = validate_episode(episode, 0, spec.observation_space, spec.action_space, false,
                                             std::nullopt, spec.action_mask ? &*spec.action_mask : nullptr);
    if (!n.ok() || (!episode["is_terminated"].get<bool>() && !episode["is_truncated"].get<bool>())) {
      return i + 1;
    }
    ++episodes;
    steps[module->first] += n.value();
  }
  return 0;
}

// [1.6] Demonstration files (§18): kind "write", a DemoWriter given the
// calls writes the case's lines (compared as JSON values); kind "read", the
// lines read with this SDK's validators as §18's reader reads them.
TEST(Conformance, Demonstrations) {
  std::set<std::string> kinds;
  run_cases("demonstrations.json", [&](const json&, const json& c) {
    const std::string kind = c["kind"].get<std::string>();
    kinds.insert(kind);
    if (kind == "read") {
      std::vector<std::string> lines;
      for (const json& line : c["lines"]) lines.push_back(line.get<std::string>());
      std::size_t episodes = 0;
      std::map<std::string, std::size_t> steps;
      // (the lines as a reader splits the file: a last line without its LF reads the same)
      const std::size_t refused = read_demonstrations(lines, episodes, steps);
      if (c.contains("error_line")) {
        EXPECT_EQ(refused, c["error_line"].get<std::size_t>());
        return;
      }
      EXPECT_EQ(refused, 0u);
      EXPECT_EQ(episodes, c["episodes"].get<std::size_t>());
      for (const auto& item : c["steps"].items()) EXPECT_EQ(steps[item.key()], item.value().get<std::size_t>());
      return;
    }
    ASSERT_EQ(kind, "write");
    const std::string path =
        (std::filesystem::temp_directory_path() / ("tether_demo_" + c["name"].get<std::string>() + ".jsonl")).string();
    std::map<std::string, DemoModuleSpaces> modules;
    for (const auto& item : c["modules"].items()) {
      DemoModuleSpaces& spaces = modules[item.key()];
      spaces.observation_space = item.value()["observation_space"];
      spaces.action_space = item.value()["action_space"];
      if (item.value().contains("action_mask")) spaces.action_mask = item.value()["action_mask"].get<std::string>();
    }
    const std::string module = modules.begin()->first;
    {
      Result<std::unique_ptr<DemoWriter>> created = DemoWriter::create(path, modules);
      ASSERT_TRUE(created.ok()) << created.status().to_string();
      DemoWriter& writer = *created.value();
      for (const json& episode : c["episodes"]) {
        const std::string id = episode["episode_id"].get<std::string>();
        const std::string agent = episode.value("agent_id", std::string(kDefaultAgentId));
        for (const json& step : episode["steps"]) {
          const std::vector<float> obs = flat_float(step[0]);
          const std::vector<double> action = flat(step[1]);
          ASSERT_TRUE(writer.step(id, agent, module, obs.data(), obs.size(), action.data(), action.size(),
                                  step[3].get<bool>()).ok());
          ASSERT_TRUE(writer.add_reward(id, agent, step[2].get<double>()).ok());
        }
        if (episode["final_obs"].is_null()) continue;  // (still running when the writer closes)
        const std::vector<float> final_obs = flat_float(episode["final_obs"]);
        ASSERT_TRUE(writer.end(id, agent, final_obs.data(), final_obs.size(), episode["terminated"].get<bool>()).ok());
      }
      ASSERT_TRUE(writer.close().ok());
      EXPECT_EQ(writer.episodes_written(), c["lines"].size() - 1);
    }
    const std::vector<std::string> lines = lines_of(path);
    std::remove(path.c_str());
    ASSERT_EQ(lines.size(), c["lines"].size());
    for (std::size_t i = 0; i < lines.size(); ++i) {
      Result<json> got = parse_json(lines[i]);
      ASSERT_TRUE(got.ok()) << lines[i];
      EXPECT_EQ(got.value(), c["lines"][i]) << "line " << i + 1 << ": " << lines[i];
    }
  });
  EXPECT_TRUE(kinds.count("write"));
}

// [1.8] Server runs (§6.5, §7.2): the run_id of the connection on which
// steps' versions were learned (acted_in) and that of the connection now
// (connected_to), each as PONG's member was received (null: absent) ->
// whether the steps are sent, or dropped as another run's.
TEST(Conformance, RunIds) {
  run_cases("run_ids.json", [](const json& file, const json& c) {
    EXPECT_EQ(file.value("version", json()), "1.9");
    EXPECT_EQ(file.value("version", json()), std::string(kProtocolVersion));
    const std::optional<std::string> acted_in = run_id_of(json{{"type", "PONG"}, {"run_id", c["acted_in"]}});
    const std::optional<std::string> connected_to = run_id_of(json{{"type", "PONG"}, {"run_id", c["connected_to"]}});
    EXPECT_EQ(!from_another_run(acted_in, connected_to), c["send"].get<bool>());
    // A member left out is absent too.
    if (c["acted_in"].is_null()) EXPECT_EQ(run_id_of(json{{"type", "PONG"}}), acted_in);
  });
}

// [§20] An offline policy file's text: its three messages, or the error
// (code, and a word its message holds).
TEST(Conformance, OfflinePolicy) {
  run_cases("offline_policy.json", [](const json& /*file*/, const json& c) {
    Result<OfflinePolicy> parsed = parse_offline_policy(c["text"].get<std::string>());
    if (c.contains("messages")) {
      ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
      EXPECT_EQ(parsed.value().pong, c["messages"][0]);
      EXPECT_EQ(parsed.value().config, c["messages"][1]);
      EXPECT_EQ(parsed.value().state, c["messages"][2]);
      return;
    }
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(std::string(to_string(parsed.status().code())), c["code"].get<std::string>());
    EXPECT_NE(parsed.status().message().find(c["names"].get<std::string>()), std::string::npos)
        << parsed.status().to_string();
  });
}

// [1.9] Servers in a group (§6.7): how an address reads ([host, port], null:
// not an address), what a client takes from a PONG (the ranks it remembers,
// the address it moves to), and where its attempts go after a connection to
// `lost` ended (attempt k: element k % n of the reconnect order).
TEST(Conformance, RankAddresses) {
  run_cases("rank_addresses.json", [](const json& file, const json& c) {
    EXPECT_EQ(file.value("version", json()), std::string(kProtocolVersion));
    auto as_json = [](const std::optional<Address>& address) {
      return address ? json::array({address->host, address->port}) : json();
    };
    auto read = [](const json& text) {
      const std::optional<Address> address = parse_address(text);
      EXPECT_TRUE(address.has_value()) << text.dump();
      return address.value_or(Address{});
    };
    const std::string kind = c.value("kind", std::string());
    if (kind == "parse") {
      EXPECT_EQ(as_json(parse_address(c["value"])), c["address"]) << c["value"].dump();
    } else if (kind == "pong") {
      json ranks = json::array();
      for (const Address& address : rank_addresses(c["pong"])) ranks.push_back(as_json(address));
      EXPECT_EQ(ranks, c["ranks"]);
      EXPECT_EQ(as_json(redirect_of(c["pong"], read(c["current"]), c["redirected"].get<bool>())), c["follow"]);
    } else {
      ASSERT_EQ(kind, "reconnect");
      std::vector<Address> ranks;
      for (const json& rank : c["ranks"]) ranks.push_back(read(rank));
      const std::vector<Address> order = reconnect_order(read(c["given"]), ranks, read(c["lost"]));
      ASSERT_FALSE(order.empty());
      json attempts = json::array();
      json expected = json::array();
      for (std::size_t k = 0; k < c["attempts"].size(); ++k) {
        attempts.push_back(as_json(order[k % order.size()]));
        expected.push_back(as_json(read(c["attempts"][k])));
      }
      EXPECT_EQ(attempts, expected);
    }
  });
}

TEST(Conformance, ClientPairing) {
  run_cases("client_pairing.json", [](const json&, const json& c) {
    ClientConnection conn;
    std::string sent;
    for (const json& kind : c["sent"]) ASSERT_TRUE(conn.send({{"type", kind}}, sent).ok());
    std::string data;
    for (const json& body : c["received"]) ASSERT_TRUE(append_message_frame(body, data).ok());
    std::vector<Response> responses;
    Status status = conn.receive_data(data, responses);
    if (c.value("violation", false)) {
      ASSERT_FALSE(status.ok());
      EXPECT_TRUE(status.code() == ErrorCode::kNotARequest || status.code() == ErrorCode::kUnknownType)
          << status.to_string();
      EXPECT_TRUE(conn.closed());
      return;
    }
    json pairs = json::array();
    for (const Response& r : responses) {
      pairs.push_back(r.request ? json(std::string(to_string(*r.request))) : json(nullptr));
    }
    EXPECT_EQ(pairs, c["pairs"]);
    // Only a connection-level ERROR (one that closes) may end the connection here.
    if (!status.ok()) {
      EXPECT_TRUE(closes_connection(status.code())) << status.to_string();
    }
  });
}

// [1.7] Environment parameters (§19): kind "set", a SET_STATE env_params a
// client takes (valid) or ignores; "draw", one sampler's value for the given
// uniform draws; "draw_all", a whole set drawn in the order of its names
// (UTF-8 bytes); "record", a record's env_params a server checks (the C++ SDK
// writes records, it does not check them: here the held set parses, a
// record accepted round-trips through record_env_params with values the set
// can give, and a well-formed one refused has names or a value the set cannot give).
bool env_close(double got, double expect) {
  return std::fabs(got - expect) <= 1e-12 * std::max(std::fabs(got), std::fabs(expect)) + 1e-300;
}

UniformSource uniforms_of(const json& c, std::size_t& used) {
  return [&c, &used]() {
    const json& list = c["uniforms"];
    EXPECT_LT(used, list.size()) << "more uniform draws than the vector gives";
    return used < list.size() ? list[used++].get<double>() : 0.0;
  };
}

TEST(Conformance, EnvParams) {
  run_cases("env_params.json", [](const json&, const json& c) {
    const std::string kind = c["kind"].get<std::string>();
    if (kind == "set") {
      Result<EnvParams> params = EnvParams::from_json(c["env_params"]);
      if (!c["valid"].get<bool>()) {
        EXPECT_FALSE(params.ok()) << "a set that breaks §19.1 was taken";
        if (!params.ok()) EXPECT_EQ(params.status().code(), ErrorCode::kInvalidField);
        return;
      }
      ASSERT_TRUE(params.ok()) << params.status().to_string();
      const json& body = c["env_params"];
      EXPECT_EQ(params.value().seq, body["seq"].get<std::int64_t>());
      EXPECT_EQ(params.value().lesson, body["lesson"].get<std::int64_t>());
      EXPECT_EQ(params.value().values.size(), body["values"].size());
      // Its JSON is the set's, numbers as doubles.
      const json again = params.value().to_json();
      for (auto it = body["values"].begin(); it != body["values"].end(); ++it) {
        ASSERT_TRUE(again["values"].contains(it.key())) << it.key();
        if (it.value().is_number()) {
          EXPECT_EQ(again["values"][it.key()].get<double>(), it.value().get<double>());
        } else {
          EXPECT_EQ(again["values"][it.key()].dump(), it.value().dump()) << it.key();
        }
      }
      return;
    }
    if (kind == "draw") {
      Result<EnvParamValue> value = parse_env_param_value(c["value"]);
      ASSERT_TRUE(value.ok()) << value.status().to_string();
      std::size_t used = 0;
      const double got = draw_env_param(value.value(), uniforms_of(c, used));
      EXPECT_TRUE(env_close(got, c["expect"].get<double>())) << got << " != " << c["expect"];
      EXPECT_EQ(used, c["uniforms"].size()) << "every given draw is used";
      return;
    }
    if (kind == "draw_all") {
      Result<EnvParams> params = EnvParams::from_json(json{{"seq", 1}, {"lesson", 0}, {"values", c["values"]}});
      ASSERT_TRUE(params.ok()) << params.status().to_string();
      std::size_t used = 0;
      const EnvValues got = draw_env_params(params.value().values, uniforms_of(c, used));
      EXPECT_EQ(used, c["uniforms"].size());
      std::vector<std::string> names;
      for (const auto& entry : got) names.push_back(entry.first);
      std::vector<std::string> expected;
      for (auto it = c["expect"].begin(); it != c["expect"].end(); ++it) expected.push_back(it.key());
      std::sort(expected.begin(), expected.end());
      EXPECT_EQ(names, expected);
      for (const auto& [name, x] : got) {
        EXPECT_TRUE(env_close(x, c["expect"][name].get<double>())) << name << ": " << x;
      }
      return;
    }
    ASSERT_EQ(kind, "record");
    Result<EnvParams> held = EnvParams::from_json(c["held"]);
    ASSERT_TRUE(held.ok()) << held.status().to_string();
    const json& record = c["record"];
    bool well_formed = record.is_object() && record.contains("seq") && record["seq"].is_number_integer() &&
                       record["seq"].get<std::int64_t>() >= 1 && record.contains("values") &&
                       record["values"].is_object();
    for (auto it = record.begin(); well_formed && it != record.end(); ++it) {
      well_formed = it.key() == "seq" || it.key() == "values" ||
                    (it.key() == "measure" && it.value().is_number() && check_measure(it.value().get<double>()).ok());
    }
    EnvValues values;
    if (well_formed) {
      for (auto it = record["values"].begin(); it != record["values"].end(); ++it) {
        well_formed = well_formed && it.value().is_number();
        if (it.value().is_number()) values[it.key()] = it.value().get<double>();
      }
    }
    bool played_with = true;
    if (well_formed && record["seq"].get<std::int64_t>() == held.value().seq) {
      played_with = values.size() == held.value().values.size();
      for (const auto& [name, x] : values) {
        auto it = held.value().values.find(name);
        played_with = played_with && it != held.value().values.end() && it->second.allows(x);
      }
    }
    if (c["error"].is_null()) {
      ASSERT_TRUE(well_formed);
      EXPECT_TRUE(played_with);
      std::optional<double> measure;
      if (record.contains("measure")) measure = record["measure"].get<double>();
      EXPECT_EQ(record_env_params(record["seq"].get<std::int64_t>(), values, measure), record);
    } else {
      EXPECT_EQ(c["error"], "INVALID_FIELD");
      EXPECT_FALSE(well_formed && played_with) << "a record the server refuses looks fine";
    }
  });
}

}  // namespace
}  // namespace tether
