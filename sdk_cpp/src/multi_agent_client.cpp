// MultiAgentClient: agents, groups and modules on the engine thread (one
// inference run per module per frame); everything on the network goes
// through the ServerLink's I/O thread (see multi_agent_client.h).
#include "tether/multi_agent_client.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "json_util.h"
#include "rows.h"
#include "tether/logged_action.h"
#include "tether/observation_leaves.h"

namespace tether {

namespace {

constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

// Whether no value is a NaN or an infinity: every value is looked at (no
// early exit), so the loop vectorizes; the caller then finds which one.
bool all_finite(const float* values, std::size_t n) noexcept {
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, values + i, sizeof bits);
    bad |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

// The serial of a frame's next fill (AgentFrame::fill_): unique in the process.
std::atomic<std::uint64_t> next_fill{1};

}  // namespace

// -- AgentFrame ------------------------------------------------------------------------------

void AgentFrame::clear() noexcept {
  last_fill_ = fill_;
  last_count_ = count_;
  fill_ = next_fill.fetch_add(1, std::memory_order_relaxed);
  same_ids_ = true;
  count_ = 0;
  obs_.clear();
  obs_offsets_.resize(1);
  obs_offsets_[0] = 0;
  truncated_.clear();
  actions_.clear();
  action_offsets_.clear();
  logged_count_ = 0;
  logged_values_.clear();
  logged_offsets_.resize(1);
}

void AgentFrame::reserve(std::size_t agents, std::size_t obs_values) {
  if (ids_.size() < agents) ids_.resize(agents);
  obs_.reserve(obs_values);
  obs_offsets_.reserve(agents + 1);
  truncated_.reserve(agents);
  action_offsets_.reserve(agents + 1);
}

float* AgentFrame::add_uninitialized(const std::string& agent_id, std::size_t obs_size, bool truncated) {
  if (count_ < ids_.size()) {
    // The previous fill's id at this index, if it is this one, stays as it is.
    if (!(same_ids_ && count_ < last_count_ && ids_[count_] == agent_id)) {
      same_ids_ = false;
      ids_[count_].assign(agent_id);  // reuses the string's capacity
    }
  } else {
    same_ids_ = false;
    ids_.push_back(agent_id);
  }
  const std::size_t at = obs_.size();
  obs_.resize(at + obs_size);
  obs_offsets_.resize(count_ + 1);
  obs_offsets_.push_back(at + obs_size);
  truncated_.resize(count_);
  truncated_.push_back(truncated ? 1 : 0);
  ++count_;
  actions_.clear();
  action_offsets_.clear();
  return obs_.data() + at;
}

std::size_t AgentFrame::add(const std::string& agent_id, const float* obs, std::size_t obs_size, bool truncated) {
  float* out = add_uninitialized(agent_id, obs_size, truncated);
  if (obs != nullptr && obs_size > 0) std::copy(obs, obs + obs_size, out);
  return count_ - 1;
}

std::size_t AgentFrame::add(const std::string& agent_id, const std::uint8_t* obs, std::size_t obs_size,
                            bool truncated) {
  float* out = add_uninitialized(agent_id, obs_size, truncated);
  if (obs != nullptr && obs_size > 0) std::copy(obs, obs + obs_size, out);
  return count_ - 1;
}

void AgentFrame::log_action(const std::string& actor_id, const double* action, std::size_t action_size) {
  if (logged_count_ < logged_ids_.size()) {
    logged_ids_[logged_count_].assign(actor_id);  // (reuses the string's capacity)
  } else {
    logged_ids_.push_back(actor_id);
  }
  if (action != nullptr) logged_values_.insert(logged_values_.end(), action, action + action_size);
  logged_offsets_.resize(logged_count_ + 1);
  logged_offsets_.push_back(logged_values_.size());
  ++logged_count_;
}

std::int64_t AgentFrame::discrete_action(std::size_t i) const noexcept {
  if (action_size(i) == 0) return 0;
  return static_cast<std::int64_t>(std::llround(action(i)[0]));
}

// -- the client's state ----------------------------------------------------------------------

struct MultiAgentClient::Module {
  std::string id;
  ModuleSpec spec;
  std::shared_ptr<LoadedPolicy> policy;
  std::optional<std::int64_t> seq;
  std::int64_t seq_connection = 0;  // the connection `seq` was learned on
  std::size_t obs_dim = 0, act_dim = 0, dist_dim = 0, value_dim = 0;
  // Its rows need checks beyond sizes and finiteness: a byte box or byte leaf
  // (0-255 only, §8.1, §8.6) or an action mask (§11.6).
  bool checks_rows = false;
  // Frame scratch: the rows of the actors acting with this module now.
  std::vector<float> batch_obs;
  std::vector<float> batch_value_obs;  // rows x value_dim (a centralized critic's module)
  std::vector<float> dist;
  std::vector<double> record_actions;  // the frame's draws, rows x act_dim: what the records carry
  std::vector<double> env_actions;     // rows x act_dim: what the engine executes
  std::vector<double> logp;            // rows
  // [1.5] A model with memory (§12.4): each row's state holder, the states
  // fed (rows x state_dim, moved into the frame's block) and those returned.
  std::vector<std::vector<float>*> row_states;
  std::vector<float> batch_state;
  std::vector<float> state_out;
  std::size_t rows = 0;                // its actors in the frame
  bool in_frame = false;
  // [1.6] Rows of logged actions in the frame (rows, 1: logged), when `logs`.
  std::vector<unsigned char> logged_rows;
  bool logs = false;
  bool demo = false;  // [1.6] its actors' steps go to the demonstration file (its header names these spaces)
  StepBlock* block = nullptr;  // while a frame is recorded: the block its rows go to

  void set_spec(const ModuleSpec& s) {
    spec = s;
    obs_dim = s.obs_dim();
    act_dim = s.action_space.flat_dim();
    dist_dim = s.action_space.dist_inputs_size();
    value_dim = s.value_obs_dim();
    checks_rows = s.observation_space.is_bytes() || s.observation_space.is_composite() || s.action_mask.has_value();
  }
};

// One module's rows of one recorded frame, kept as the frame ran them: the
// batch that went into the model, its outputs and the draws, row by row in
// slot order. Recording a frame of 256 agents thus moves a few arrays into a
// block instead of writing 256 actors' own arrays (each a cache miss after
// the pause between frames); a cut takes each actor's rows out again.
struct MultiAgentClient::StepBlock {
  Module* module = nullptr;
  std::size_t obs_dim = 0, value_dim = 0, dist_dim = 0, act_dim = 0;
  std::vector<Actor*> actors;   // per row: whose step it is; nullptr once cut or dropped
  std::vector<float> obs;       // rows x obs_dim
  std::vector<float> value_obs; // rows x value_dim
  std::vector<float> dist;      // rows x dist_dim
  std::vector<double> actions;  // rows x act_dim: the draws the records carry
  std::vector<double> logp;     // rows
  std::vector<double> rewards;  // rows: each step's rewards summed (|sum| < kFloat32Overflow, §10.5), rounded to float32 when cut
  std::size_t state_dim = 0;    // [1.5] its model's state floats (0: no memory)
  std::vector<float> states;    // rows x state_dim: the state each row's step was fed with
  std::vector<unsigned char> logged;  // [1.6] rows (1: chosen outside the policy), or empty: none is
  Stamp stamp{-1, -1};          // (connection, weights version) of the model that ran, or (-1, -1)
  std::size_t live = 0;         // rows not cut or dropped yet; a block with none is reused
  std::size_t kept = 0;         // during a cut: its rows that stay (held-back steps)
  bool ends_chunk = false;      // during a cut: one of those is the observation after an actor's steps cut

  const float* obs_row(std::size_t row) const noexcept { return obs.data() + row * obs_dim; }
  const float* value_obs_row(std::size_t row) const noexcept { return value_obs.data() + row * value_dim; }

  // Takes the module, row sizes and model version of `like`, with no live row.
  void shape_like(const StepBlock& like) noexcept {
    module = like.module;
    obs_dim = like.obs_dim;
    value_dim = like.value_dim;
    dist_dim = like.dist_dim;
    act_dim = like.act_dim;
    state_dim = like.state_dim;
    stamp = like.stamp;
    live = 0;
  }
};

struct alignas(64) MultiAgentClient::Actor {
  // What a frame reads and writes of an actor comes first (one cache line).
  Module* module = nullptr;
  StepBlock* last_block = nullptr;  // where its latest uncut step lies (while rows > 0)
  std::size_t rows = 0;             // its recorded steps not cut yet (each an observation and an action)
  std::uint64_t frame_mark = 0;
  std::uint32_t last_row = 0;
  bool training = true;
  bool shared_latest = false;  // a centralized critic sees it: also in Episode::latest_obs
  bool has_final = false;      // it left with final_obs, which ends its last chunk
  bool is_group = false;
  std::string id;
  std::int64_t start_step = 0;
  std::vector<float> latest;       // its latest observation while it has no uncut step (else its last row's)
  std::vector<float> final_obs;    // the observation it left with (has_final)
  std::vector<float> final_value_obs;
  // [1.5] The state its next step starts from (empty: zeros, not made yet;
  // §12.4): one per agent (or group) per episode, dropped when it leaves.
  std::vector<float> state;
  // Rewards logged while it is in the episode's actors: added up here (no
  // ordered-map update per reward) and folded into Episode::returns when it leaves.
  double reward_sum = 0.0;
  bool rewarded = false;
  bool terminated = false;
  bool truncated = false;

  // A single agent's latest observation: its final one, or its last recorded
  // row's (no second copy per frame), else `latest`.
  const float* latest_obs() const {
    if (has_final) return final_obs.data();
    return rows > 0 ? last_block->obs_row(last_row) : latest.data();
  }
  std::size_t latest_size() const {
    if (has_final) return final_obs.size();
    return rows > 0 ? last_block->obs_dim : latest.size();
  }
};

struct MultiAgentClient::Episode {
  std::string id;
  bool training = true;    // its steps are recorded (and sent)
  bool held_back = false;  // a training episode not recorded (record_share): played, counted, not sent
  std::int64_t t = 0;
  std::unordered_map<std::string, std::unique_ptr<Actor>> actors;
  std::vector<Actor*> roster;  // the same actors, walked by a cut without chasing the map's nodes
  // The last frame's actors by slot: an engine usually sends the same agents
  // in the same order, and a slot whose id matches skips the map lookup.
  // Cleared whenever an actor leaves `actors`, so it never dangles.
  std::vector<Actor*> actor_by_slot;
  // Without groups, the last frame's agent ids (slot i is frame entry i): a
  // frame with the same ids in the same order has no new agent and no
  // duplicate, and takes its actors from actor_by_slot without a lookup.
  std::vector<std::string> slot_ids;
  std::vector<Module*> module_by_slot;  // (so that such a frame reads no actor before inference)
  std::uint64_t slot_fill = 0;  // the AgentFrame fill that named them (AgentFrame::same_ids_as)
  Module* slot_module = nullptr;  // their module when all are single agents of one module, in frame order
  // Every actor of the last frame was recorded, trains, and no critic
  // watches it: in a frame with the same agents, none has a latest
  // observation to keep (its last row is that).
  bool steady = false;
  std::vector<std::unique_ptr<Actor>> finished;  // left, steps not cut yet
  std::vector<std::unique_ptr<StepBlock>> blocks;  // recorded frames with uncut rows, oldest first
  // Latest observations of group members and of agents a centralized critic sees.
  std::unordered_map<std::string, std::vector<float>> latest_obs;
  std::map<std::string, double> returns;  // per actor id; an actor still in `actors` holds its own part
  std::unordered_map<std::string, bool> ended;  // agents (and members) that left
  bool done = false;
  bool truncated = false;
  EpisodeEnv env;  // [1.7] its drawn environment parameters and measure (§19): every record carries them
};

struct MultiAgentClient::Slot {
  const std::string* actor_id = nullptr;  // the frame's agent id, or the group id
  Actor* actor = nullptr;
  Module* module = nullptr;
  std::size_t frame_index = kNone;  // a single agent's index in the frame
  std::size_t group = kNone;        // a group's index in group_list_
  std::size_t row = 0;              // its row in the module's batch
  std::size_t logged = kNone;       // [1.6] its logged action's index in the frame, or none
};

// One actor's steps in a cut, as the engine thread hands them over: what
// its agent entry needs besides the rows (which stay in the cut's blocks).
struct MultiAgentClient::CutEntry {
  const Actor* key = nullptr;  // its rows' mark in the blocks (compared on the I/O thread, never read there)
  std::string actor_id;
  std::string module_id;
  std::int64_t start_step = 0;
  std::size_t take = 0;  // its steps; one more observation ends them (its held-back step's, or its final one)
  std::size_t obs_dim = 0, value_dim = 0, act_dim = 0, dist_dim = 0;  // its module's
  std::size_t state_dim = 0;  // [1.5] its module's state floats: its first row's state is the entry's state_in
  bool has_final = false;
  bool terminated = false;
  bool truncated = false;
  std::vector<float> final_obs;
  std::vector<float> final_value_obs;
  // The I/O thread's, while it builds the entry: the entry, the rows seen,
  // and the versions of the steps taken (§10.1): the current run's version
  // and length, and whether runs may be sent (every version so far known and
  // learned on the cut's connection, a server that takes them).
  AgentEntry* out = nullptr;
  std::size_t seen = 0;
  std::int64_t version = 0;
  std::int64_t run = 0;
  bool runs = false;
};

// One episode's steps in a cut: its blocks (in time order) and its actors' entries.
struct MultiAgentClient::CutRecord {
  std::string episode_id;
  bool terminated = false;
  bool truncated = false;
  RecordEnvParams env_params;         // [1.7] the record's "env_params" (§19.3), or none
  std::size_t entries = 0;            // entry_pool[0, entries) are this cut's
  std::vector<CutEntry> entry_pool;   // (kept with their capacity for the next cuts)
  std::vector<std::unique_ptr<StepBlock>> blocks;
  std::vector<std::pair<const Actor*, std::uint32_t>> by_key;  // (I/O thread) entries sorted by key
};

// A batch's steps as the engine cut them: the I/O thread builds the records
// (build()); the client takes it back, blocks and all, once the batch is done.
class MultiAgentClient::CutSteps final : public RecordSource {
 public:
  std::int64_t connection = 0;     // the client's connection at the cut
  bool server_takes_runs = false;  // its server announced a protocol version (runs may go)
  std::size_t used = 0;            // records[0, used) are this cut's
  std::vector<CutRecord> records;
  std::vector<std::uint32_t> hint;  // (I/O thread) per row, the entry the row of the last block held

  CutRecord& next_record() {
    if (used == records.size()) records.emplace_back();
    CutRecord& record = records[used++];
    record.entries = 0;
    record.terminated = record.truncated = false;
    record.env_params = RecordEnvParams();
    return record;
  }
  CutEntry& next_entry(CutRecord& record) {
    if (record.entries == record.entry_pool.size()) record.entry_pool.emplace_back();
    return record.entry_pool[record.entries++];
  }
  void build(Batch& batch) override;

 private:
  void take_rows(CutRecord& from, MultiAgentRecord& record, Batch& batch);
  CutEntry* entry_of(CutRecord& from, const Actor* key, std::size_t row);
};

void MultiAgentClient::CutSteps::build(Batch& batch) {
  std::size_t next = 0;  // the next record kept (the others' episodes were dropped)
  for (std::size_t i = 0; i < used && next < batch.pending_records.size(); ++i) {
    CutRecord& from = records[i];
    if (from.episode_id != batch.pending_records[next].episode_id) continue;
    ++next;
    MultiAgentRecord& record = batch.records.emplace_back();
    record.episode_id = from.episode_id;
    record.is_terminated = from.terminated;
    record.is_truncated = from.truncated;
    record.env_params = std::move(from.env_params);
    take_rows(from, record, batch);
  }
}

// The entry of the actor whose row `row` of a block is, or null (a row that
// stays without steps before it in the cut). Consecutive frames usually put
// an actor at the same row: that row's last entry is tried first.
MultiAgentClient::CutEntry* MultiAgentClient::CutSteps::entry_of(CutRecord& from, const Actor* key,
                                                                 std::size_t row) {
  if (row < hint.size() && hint[row] < from.entries && from.entry_pool[hint[row]].key == key) {
    return &from.entry_pool[hint[row]];
  }
  auto it = std::lower_bound(from.by_key.begin(), from.by_key.end(), key,
                             [](const std::pair<const Actor*, std::uint32_t>& a, const Actor* k) {
                               return std::less<const Actor*>()(a.first, k);
                             });
  if (it == from.by_key.end() || it->first != key) return nullptr;
  if (row >= hint.size()) hint.resize(row + 1, 0);
  hint[row] = it->second;
  return &from.entry_pool[it->second];
}

// Takes each entry's steps out of the record's blocks, rows in time order:
// its steps, then the observation after them (T+1: its held-back step's or
// its final one). A row's sizes are its block's (the same as its module's:
// blocks of a module whose spaces changed were dropped).
void MultiAgentClient::CutSteps::take_rows(CutRecord& from, MultiAgentRecord& record, Batch& batch) {
  record.agents.reserve(from.entries);  // (entries stay put while rows go in)
  from.by_key.clear();
  for (std::size_t j = 0; j < from.entries; ++j) {
    CutEntry& e = from.entry_pool[j];
    record.agents.emplace_back(e.actor_id, AgentEntry());
    AgentEntry& entry = record.agents.back().second;
    entry.module = e.module_id;
    entry.start_step = e.start_step;
    EpisodeChunk& chunk = entry.chunk;
    chunk.obs.assign((e.take + 1) * e.obs_dim, 0.0f);
    entry.value_obs.assign(e.value_dim > 0 ? (e.take + 1) * e.value_dim : 0, 0.0f);
    chunk.actions.resize(e.take * e.act_dim);
    chunk.action_dist_inputs.resize(e.take * e.dist_dim);
    chunk.action_logp.resize(e.take);
    chunk.rewards.resize(e.take);
    chunk.is_terminated = e.has_final && e.terminated;
    chunk.is_truncated = e.has_final && e.truncated;
    chunk.state_in.clear();
    e.out = &entry;
    e.seen = 0;
    e.version = 0;
    e.run = 0;
    e.runs = server_takes_runs;
    from.by_key.emplace_back(e.key, static_cast<std::uint32_t>(j));
  }
  std::sort(from.by_key.begin(), from.by_key.end(),
            [](const std::pair<const Actor*, std::uint32_t>& a, const std::pair<const Actor*, std::uint32_t>& b) {
              return std::less<const Actor*>()(a.first, b.first);
            });
  auto copy_row = [](const float* in, std::size_t n, std::vector<float>& to, std::size_t at) {
    std::copy(in, in + std::min(n, to.size() - std::min(to.size(), at)), to.begin() + static_cast<std::ptrdiff_t>(at));
  };
  for (const auto& block : from.blocks) {
    const StepBlock& b = *block;
    for (std::size_t r = 0; r < b.actors.size(); ++r) {
      const Actor* key = b.actors[r];
      if (key == nullptr) continue;
      CutEntry* found = entry_of(from, key, r);
      if (found == nullptr) continue;
      CutEntry& e = *found;
      AgentEntry& entry = *e.out;
      EpisodeChunk& chunk = entry.chunk;
      const std::size_t i = e.seen;
      if (i > e.take) continue;
      if (i == 0 && e.state_dim > 0 && b.state_dim == e.state_dim) {
        // [1.5] The state fed with the entry's first observation (§10.1).
        const float* state = b.states.data() + r * b.state_dim;
        chunk.state_in.assign(state, state + b.state_dim);
      }
      copy_row(b.obs_row(r), b.obs_dim, chunk.obs, i * b.obs_dim);
      if (b.value_dim > 0) copy_row(b.value_obs_row(r), b.value_dim, entry.value_obs, i * b.value_dim);
      ++e.seen;
      if (i == e.take) continue;  // the held-back step: its observation ends the chunk
      const double* action = b.actions.data() + r * b.act_dim;
      std::copy(action, action + b.act_dim, chunk.actions.begin() + static_cast<std::ptrdiff_t>(i * b.act_dim));
      const float* dist = b.dist.data() + r * b.dist_dim;
      std::copy(dist, dist + b.dist_dim, chunk.action_dist_inputs.begin() + static_cast<std::ptrdiff_t>(i * b.dist_dim));
      chunk.action_logp[i] = b.logp[r];
      chunk.rewards[i] = step_reward_float32(b.rewards[r]);
      if (!b.logged.empty() && b.logged[r] != 0) add_logged_step(chunk.logged_runs, static_cast<std::int64_t>(i));
      // The step's version goes into the entry's runs; a run is stored only
      // once another version follows it (one version: no runs, nothing allocated).
      if (b.stamp.first != connection || b.stamp.second < 0 || b.stamp.second > kMaxRunVersion) {
        // A step of unknown version, or of one learned on an earlier
        // connection (maybe another server run): the entry has the claim.
        e.runs = false;
      } else if (e.runs) {
        if (e.run > 0 && b.stamp.second != e.version) {
          chunk.weights_seq_no_runs.emplace_back(e.version, e.run);
          e.run = 0;
        }
        e.version = b.stamp.second;
        ++e.run;
      }
    }
  }
  for (std::size_t j = 0; j < from.entries; ++j) {
    CutEntry& e = from.entry_pool[j];
    AgentEntry& entry = *e.out;
    if (e.has_final) {
      copy_row(e.final_obs.data(), e.final_obs.size(), entry.chunk.obs, e.take * e.obs_dim);
      copy_row(e.final_value_obs.data(), e.final_value_obs.size(), entry.value_obs, e.take * e.value_dim);
    }
    // Runs when the steps used more than one version (§10.1); the link leaves
    // them out if the batch goes on a later connection than this one.
    std::vector<std::pair<std::int64_t, std::int64_t>>& runs = entry.chunk.weights_seq_no_runs;
    if (e.runs && !runs.empty()) {
      runs.emplace_back(e.version, e.run);
      batch.runs_connection = connection;
    } else {
      runs.clear();
    }
    e.out = nullptr;
  }
}

void MultiAgentClient::append_actor_obs(const AgentFrame& frame, const Slot& slot, std::vector<float>& out) const {
  if (slot.group == kNone) {
    const float* obs = frame.obs(slot.frame_index);
    out.insert(out.end(), obs, obs + frame.obs_size(slot.frame_index));
    return;
  }
  // A group's observation: its members' observations in member order.
  const GroupSpec& group = *group_list_[slot.group];
  for (std::size_t k = 0; k < group.members.size(); ++k) {
    const std::size_t i = member_index_[group_member_offset_[slot.group] + k];
    out.insert(out.end(), frame.obs(i), frame.obs(i) + frame.obs_size(i));
  }
}

// -- connecting ------------------------------------------------------------------------------

MultiAgentClient::MultiAgentClient(ClientOptions options) : ClientBase(std::move(options)) {}

MultiAgentClient::~MultiAgentClient() { close(); }

Result<std::unique_ptr<MultiAgentClient>> MultiAgentClient::connect(ClientOptions options) {
  if (options.client_name == "tether-cpp") options.client_name = "tether-cpp-multiagent";
  return connect_as<MultiAgentClient>(std::move(options), /*multi_agent=*/true);
}

Result<std::string> MultiAgentClient::module_of(const std::string& episode_id, const std::string& actor_id) const {
  auto e = episodes_.find(episode_id);
  if (e != episodes_.end()) {
    auto a = e->second->actors.find(actor_id);
    if (a != e->second->actors.end()) return a->second->module->id;
    for (const auto& actor : e->second->finished) {
      if (actor->id == actor_id) return actor->module->id;
    }
  }
  return Status(ErrorCode::kInvalidArgument, "module_of: '" + actor_id + "' has not acted in episode '" +
                                                 episode_id + "'");
}

Result<std::vector<float>> MultiAgentClient::actor_state(const std::string& episode_id,
                                                          const std::string& actor_id) const {
  auto running = episodes_.find(episode_id);
  if (running == episodes_.end()) {
    return Status(ErrorCode::kInvalidArgument, "actor_state: no running episode '" + episode_id + "'");
  }
  auto actor = running->second->actors.find(actor_id);
  if (actor == running->second->actors.end()) {
    return Status(ErrorCode::kInvalidArgument, "actor_state: '" + actor_id + "' is not in episode '" + episode_id + "'");
  }
  if (actor->second->module->spec.recurrent_state.empty()) {
    return Status(ErrorCode::kInvalidArgument, "actor_state: module '" + actor->second->module->id + "' has no memory");
  }
  return actor->second->state;
}

std::optional<std::int64_t> MultiAgentClient::weights_seq_no(const std::string& module_id) const {
  auto it = modules_.find(module_id);
  if (it == modules_.end()) return std::nullopt;
  return it->second->seq;
}

// -- events from the I/O thread --------------------------------------------------------------

void MultiAgentClient::apply_models(LinkEvent& event) {
  for (auto& entry : event.module_policies) {
    auto it = modules_.find(entry.first);
    if (it == modules_.end() || !entry.second) {
      link_->retire(std::move(entry.second));  // (not freed with the event, on this thread)
      continue;
    }
    std::shared_ptr<LoadedPolicy> old = std::move(it->second->policy);
    it->second->policy = std::move(entry.second);  // the swap: the next frame uses the new model
    link_->retire(std::move(old));  // destroyed on the I/O thread, not in this frame
    ++models_loaded_;
  }
  for (const auto& entry : event.module_seqs) {
    auto it = modules_.find(entry.first);
    if (it == modules_.end()) continue;
    it->second->seq = entry.second;
    it->second->seq_connection = event.connection;  // (a version kept across a reconnect keeps its own)
  }
}

void MultiAgentClient::on_connected(LinkEvent& event) {
  take_connection(event);
  if (run_changed_) {
    // [1.8] Another server run (§6.5): every module's steps not cut yet were
    // acted with weights whose versions name other weights in this run; they
    // go (counted), as for a module whose spaces changed, and recurrent states
    // start from zeros. Each model stays until this connection's replaces it.
    recount_pending();
    other_run_unsent_dropped_.fetch_add(pending_steps_, std::memory_order_relaxed);
    for (auto& entry : modules_) {
      reset_states_of(*entry.second);
      drop_rows_of(*entry.second);
    }
  }
  // Modules are kept (actors point at them). Each acts with its model
  // until the new connection's arrives, as TetherClient does, unless its
  // spaces changed (that model cannot serve them) or the server no
  // longer describes it: then it is reset (NOT_READY until a new model).
  std::size_t widest = 0;
  for (const auto& entry : config_->modules) {
    std::unique_ptr<Module>& module = modules_[entry.first];
    if (!module) {
      module = std::make_unique<Module>();
    } else {
      // [1.5] A model of another recurrent state cannot go on from the states
      // kept (§12.4): they start again from zeros, and the steps not cut yet go.
      // (Other spaces, too, make another model, whose states these are not.)
      const bool state_changed = module->spec.recurrent_state != entry.second.recurrent_state;
      const bool spaces_changed = !(module->spec.observation_space == entry.second.observation_space) ||
                                  !(module->spec.action_space == entry.second.action_space) || state_changed;
      if (spaces_changed) reset_states_of(*module);
      // Unsent steps no longer fit (other sizes, or critic rows laid
      // out for other agents): they go (§6.5).
      if (spaces_changed || module->spec.value_obs_agents != entry.second.value_obs_agents) drop_rows_of(*module);
      if (spaces_changed) {
        link_->retire(std::move(module->policy));
        module->policy = nullptr;
        module->seq.reset();
      }
    }
    module->id = entry.first;
    module->set_spec(entry.second);
    widest = std::max(widest, module->act_dim);
  }
  for (auto& entry : modules_) {
    if (config_->modules.count(entry.first) != 0) continue;
    reset_states_of(*entry.second);
    drop_rows_of(*entry.second);  // the server would refuse them (UNKNOWN_MODULE), with their batch
    link_->retire(std::move(entry.second->policy));
    entry.second->policy = nullptr;
    entry.second->seq.reset();
  }
  // The new connection's server may map differently: MAP_AGENTS is asked again.
  mapped_.clear();
  mapped_order_.clear();
  mapped_count_ = 0;
  env_action_.resize(widest);
  group_list_.clear();
  group_of_.clear();
  group_member_offset_.clear();
  std::size_t members = 0;
  for (const auto& entry : config_->groups) {
    group_member_offset_.push_back(members);
    for (std::size_t k = 0; k < entry.second.members.size(); ++k) {
      group_of_[entry.second.members[k]] = {group_list_.size(), k};
    }
    members += entry.second.members.size();
    group_list_.push_back(&entry.second);
  }
  member_index_.assign(members, kNone);
  critic_agents_.clear();
  for (const auto& entry : config_->modules) {
    critic_agents_.insert(entry.second.value_obs_agents.begin(), entry.second.value_obs_agents.end());
  }
  group_slot_.assign(group_list_.size(), kNone);
  start_module_demos();
  // Agents the critics see now (or no longer): an acting agent that
  // became one starts its critic rows with its latest observation.
  for (auto& running : episodes_) {
    Episode& episode = *running.second;
    episode.steady = false;
    for (auto& acting : episode.actors) {
      Actor& actor = *acting.second;
      const bool shared = critic_agents_.count(actor.id) != 0;
      if (shared && !actor.shared_latest && !actor.is_group) {
        episode.latest_obs[actor.id].assign(actor.latest_obs(), actor.latest_obs() + actor.latest_size());
      }
      actor.shared_latest = shared;
    }
  }
  apply_models(event);
}

// [1.6] Demonstration recording (ClientOptions::demo_path, §18): the file's
// header names the first connection's modules, with their spaces as the
// server sent them; a module that a later connection gives other spaces, or
// adds, is not written any more (its running episodes go unwritten).
void MultiAgentClient::start_module_demos() {
  if (options_.demo_path.empty()) return;
  if (connection_ == 1) {
    const nlohmann::json* described = detail::member(config_->server_config, "modules");
    std::map<std::string, DemoModuleSpaces> spaces;
    for (const auto& entry : config_->modules) {
      const nlohmann::json* module = described != nullptr ? detail::member(*described, entry.first) : nullptr;
      if (module == nullptr) continue;
      DemoModuleSpaces& out = spaces[entry.first];
      if (const nlohmann::json* obs = detail::member(*module, "observation_space")) out.observation_space = *obs;
      if (const nlohmann::json* act = detail::member(*module, "action_space")) out.action_space = *act;
      if (entry.second.action_mask) out.action_mask = entry.second.action_mask->leaf;
    }
    start_demo(spaces);
  }
  for (auto& entry : modules_) {
    Module& module = *entry.second;
    // (Once off, off for good: spaces that come back would resume its actors' lines mid-way.)
    module.demo = (connection_ == 1 || module.demo) && config_->modules.count(entry.first) != 0 &&
                  demo_fits(entry.first, module.spec.observation_space, module.spec.action_space,
                            module.spec.action_mask);
    if (demo_ && !module.demo) demo_->discard_module(entry.first);
  }
}

void MultiAgentClient::on_state(LinkEvent& event) {
  apply_models(event);
}

void MultiAgentClient::on_batch_done(LinkEvent& event) {
  reclaim(std::move(event.batch->record_source));  // (done: the I/O thread no longer touches it)
  if (event.batch->other_run) return;  // [1.8] acted with another run's weights: not sent, counted by the link (§6.5)
  if (!event.batch->error.ok()) {
    report(event.batch->error);
    // The rest of a refused batch's episodes is not sent either.
    forget_episodes(std::set<std::string>(event.batch->episode_ids.begin(), event.batch->episode_ids.end()));
  } else {
    env_steps_sent_ += event.batch->env_steps;
    agent_steps_sent_ += static_cast<std::int64_t>(event.batch->queue_steps());
  }
}

void MultiAgentClient::on_records_built(LinkEvent& event) {
  reclaim(std::move(event.record_source));
}

void MultiAgentClient::end_training() {
  // The server's run is done (§6.6): the steps recorded and not cut yet (and
  // ended episodes whose last record was not cut) are let go, counted as one
  // batch; every episode plays on unrecorded.
  bool unsent = pending_steps_ > 0;
  std::set<std::string> recorded;
  for (auto& entry : episodes_) {
    Episode& episode = *entry.second;
    if (episode.training) {
      recorded.insert(entry.first);
      unsent = unsent || episode.done;
    }
    episode.held_back = false;
  }
  forget_episodes(recorded);
  env_steps_since_cut_ = 0;
  held_steps_ = 0;
  if (unsent) link_->count_unsent_at_end();
}

void MultiAgentClient::forget_episodes(const std::set<std::string>& ids) {
  for (const std::string& id : ids) {
    auto it = episodes_.find(id);
    if (it == episodes_.end()) continue;
    Episode& episode = *it->second;
    episode.training = false;
    for (auto& entry : episode.actors) {
      Actor& actor = *entry.second;
      // (a single agent keeps its latest observation for end_episode)
      if (actor.rows > 0 && !actor.is_group) actor.latest.assign(actor.latest_obs(), actor.latest_obs() + actor.latest_size());
      actor.training = false;
      actor.rows = 0;
    }
    episode.finished.clear();
    release_blocks(episode);
    episode.actor_by_slot.clear();
    episode.steady = false;
    if (episode.done) episodes_.erase(it);
  }
  recount_pending();
}

void MultiAgentClient::recount_pending() {
  pending_steps_ = 0;
  latest_held_ = 0;
  for (const auto& entry : episodes_) {
    const Episode& episode = *entry.second;
    if (!episode.training) continue;
    for (const auto& actor : episode.actors) {
      const Actor& a = *actor.second;
      pending_steps_ += a.rows;
      if (a.training && a.rows > 0 && !a.has_final) ++latest_held_;
    }
    for (const auto& actor : episode.finished) pending_steps_ += actor->rows;
  }
}

// -- episodes --------------------------------------------------------------------------------

Result<std::string> MultiAgentClient::start_episode(const std::string& episode_id, bool training_enabled) {
  Result<std::string> named =
      new_episode_id(episode_id, [this](const std::string& id) { return episodes_.count(id) != 0; });
  if (!named.ok()) return named;
  std::string id = std::move(named).value();
  const Recording recording = new_episode_recording(training_enabled);
  auto episode = std::make_unique<Episode>();
  episode->id = id;
  episode->training = recording.recorded;
  episode->held_back = recording.held_back;
  // [1.7] Its values, drawn now from the set held (§19.1), for all its records.
  episode->env.drawn = draw_episode_params();
  episodes_.emplace(id, std::move(episode));
  return id;
}

MultiAgentClient::EpisodeEnv* MultiAgentClient::episode_env(const std::string& episode_id) {
  auto it = episodes_.find(episode_id);
  return it == episodes_.end() || it->second->done ? nullptr : &it->second->env;
}

const MultiAgentClient::EpisodeEnv* MultiAgentClient::episode_env(const std::string& episode_id) const {
  auto it = episodes_.find(episode_id);
  return it == episodes_.end() || it->second->done ? nullptr : &it->second->env;
}

Status MultiAgentClient::check_call(const std::string& episode_id, const char* call, Episode*& episode) {
  Status pending = catch_up();
  if (!pending.ok()) return pending;
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end() || it->second->done) {
    return Status(ErrorCode::kInvalidArgument, std::string(call) + ": no running episode '" + episode_id + "'");
  }
  episode = it->second.get();
  return Status::Ok();
}

Status MultiAgentClient::map_actors(const std::string& episode_id) {
  // new_actor_ids_ -> modules, written into the new slots' `module`.
  if (new_actor_ids_.empty()) return Status::Ok();
  if (config_->mapping) {
    for (std::size_t k = 0; k < new_slots_.size(); ++k) {
      Result<Module*> module = module_by_rules(new_actor_ids_[k], episode_id);
      if (!module.ok()) return module.status();
      slots_[new_slots_[k]].module = module.value();
    }
    return Status::Ok();
  }
  // The server's function: an answer holds for the rest of the episode
  // (§7.10), so only actors not asked about yet in this episode are asked.
  unmapped_ids_.clear();
  unmapped_slots_.clear();
  auto known = mapped_.find(episode_id);
  for (std::size_t k = 0; k < new_slots_.size(); ++k) {
    if (known != mapped_.end()) {
      auto it = known->second.find(new_actor_ids_[k]);
      if (it != known->second.end()) {
        slots_[new_slots_[k]].module = it->second;
        continue;
      }
    }
    unmapped_ids_.push_back(new_actor_ids_[k]);
    unmapped_slots_.push_back(new_slots_[k]);
  }
  if (unmapped_ids_.empty()) return Status::Ok();
  Status asked = ask_mapping(episode_id, unmapped_ids_);
  if (!asked.ok()) return asked;
  for (std::size_t k = 0; k < unmapped_slots_.size(); ++k) slots_[unmapped_slots_[k]].module = asked_modules_[k];
  return Status::Ok();
}

Result<MultiAgentClient::Module*> MultiAgentClient::module_by_rules(const std::string& actor_id,
                                                                      const std::string& episode_id) {
  Result<std::string> module = config_->mapping->module_for(actor_id, episode_id);
  if (!module.ok()) return module.status();
  Module* described = described_module(module.value());
  if (described == nullptr) {
    return Status(ErrorCode::kUnknownModule, "agent '" + actor_id + "' maps to module '" + module.value() +
                                                 "', which SET_CONFIG does not describe");
  }
  return described;
}

MultiAgentClient::Module* MultiAgentClient::described_module(const std::string& module_id) const {
  // modules_ keeps a module an earlier connection described (its steps and states were let go
  // at the new SET_CONFIG); only the current config's modules can be mapped to.
  auto it = modules_.find(module_id);
  return it == modules_.end() || config_->modules.count(module_id) == 0 ? nullptr : it->second.get();
}

// One MAP_AGENTS for `actor_ids`: every answer checked before any is kept (for the
// episode, remember_mapping) or given (asked_modules_, in the order asked).
Status MultiAgentClient::ask_mapping(const std::string& episode_id, const std::vector<std::string>& actor_ids) {
  ++map_requests_;
  Result<Message> answer = link_->request(make_map_agents(episode_id, actor_ids), options_.response_timeout_s);
  if (!answer.ok()) return answer.status();
  Status read = read_agent_modules(
      answer.value().body, actor_ids, [this](const std::string& id) { return described_module(id) != nullptr; },
      asked_module_ids_);
  if (!read.ok()) return read;
  asked_modules_.clear();
  for (const std::string& module_id : asked_module_ids_) asked_modules_.push_back(described_module(module_id));
  for (std::size_t k = 0; k < actor_ids.size(); ++k) remember_mapping(episode_id, actor_ids[k], asked_modules_[k]);
  return Status::Ok();
}

const std::string& MultiAgentClient::actor_of(const std::string& agent_id) const {
  auto member = group_of_.find(agent_id);
  return member == group_of_.end() ? agent_id : group_list_[member->second.first]->group_id;
}

Result<std::vector<std::string>> MultiAgentClient::map_agents(const std::string& episode_id,
                                                               const std::vector<std::string>& agent_ids) {
  Episode* episode = nullptr;
  Status ok = check_call(episode_id, "map_agents", episode);
  if (!ok.ok()) return ok;
  std::vector<std::string> result;
  result.reserve(agent_ids.size());
  if (config_->mapping) {
    for (const std::string& agent_id : agent_ids) {
      const std::string& actor_id = actor_of(agent_id);
      auto acting = episode->actors.find(actor_id);
      if (acting != episode->actors.end()) {
        result.push_back(acting->second->module->id);
        continue;
      }
      Result<Module*> module = module_by_rules(actor_id, episode_id);
      if (!module.ok()) return module.status();
      result.push_back(module.value()->id);
    }
    return result;
  }
  // Asked: the actors neither acting in the episode nor mapped in it yet, each once.
  std::vector<Module*> modules(agent_ids.size(), nullptr);
  std::vector<std::size_t> asked_as(agent_ids.size(), 0);  // an agent left to ask: its actor's place in `unknown`
  std::vector<std::string> unknown;
  std::unordered_map<std::string, std::size_t> asked_at;  // an unknown actor -> its place in `unknown`
  auto known = mapped_.find(episode_id);
  for (std::size_t k = 0; k < agent_ids.size(); ++k) {
    const std::string& actor_id = actor_of(agent_ids[k]);
    auto acting = episode->actors.find(actor_id);
    if (acting != episode->actors.end()) {
      modules[k] = acting->second->module;
      continue;
    }
    if (known != mapped_.end()) {
      auto mapped = known->second.find(actor_id);
      if (mapped != known->second.end()) {
        modules[k] = mapped->second;
        continue;
      }
    }
    auto place = asked_at.emplace(actor_id, unknown.size());
    if (place.second) unknown.push_back(actor_id);
    asked_as[k] = place.first->second;
  }
  if (!unknown.empty()) {
    Status asked = ask_mapping(episode_id, unknown);
    if (!asked.ok()) return asked;
    for (std::size_t k = 0; k < agent_ids.size(); ++k) {
      if (modules[k] == nullptr) modules[k] = asked_modules_[asked_as[k]];
    }
  }
  for (const Module* module : modules) result.push_back(module->id);
  return result;
}

void MultiAgentClient::remember_mapping(const std::string& episode_id, const std::string& actor_id, Module* module) {
  auto episode = mapped_.find(episode_id);
  if (episode == mapped_.end()) {
    episode = mapped_.emplace(episode_id, std::unordered_map<std::string, Module*>()).first;
    mapped_order_.push_back(episode_id);
  }
  if (episode->second.emplace(actor_id, module).second) ++mapped_count_;
  // Bounded: the oldest episodes' answers go first (asked for again if those agents act again).
  while (mapped_count_ > kMaxMappedActors && !mapped_order_.empty()) {
    const std::string oldest = mapped_order_.front();
    forget_mapping(oldest);
  }
}

void MultiAgentClient::forget_mapping(const std::string& episode_id) {
  auto episode = mapped_.find(episode_id);
  if (episode == mapped_.end()) return;
  mapped_count_ -= std::min(mapped_count_, episode->second.size());
  mapped_.erase(episode);
  auto order = std::find(mapped_order_.begin(), mapped_order_.end(), episode_id);
  if (order != mapped_order_.end()) mapped_order_.erase(order);
}

// Builds slots_ (one per actor: agent or group) from the frame, maps new
// actors and checks every size; records nothing. With an episode, existing
// actors keep their module; without one (compute_actions) every actor is mapped.
Status MultiAgentClient::gather(Episode* episode, const AgentFrame& frame, const std::string& mapping_episode_id,
                                bool ending) {
  ++frame_counter_;
  slots_.clear();
  new_slots_.clear();
  new_actor_ids_.clear();
  std::fill(group_slot_.begin(), group_slot_.end(), kNone);
  std::fill(member_index_.begin(), member_index_.end(), kNone);
  const std::size_t n = frame.size();
  Status finite = check_finite(frame);
  if (!finite.ok()) return finite;
  same_agents_ = episode != nullptr && !ending && same_agents_as_last_frame(*episode, frame);
  if (same_agents_) {
    slots_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      Slot& slot = slots_[i];
      slot.actor_id = &frame.agent_id(i);
      slot.actor = episode->actor_by_slot[i];
      slot.module = episode->module_by_slot[i];
#if defined(__GNUC__) || defined(__clang__)
      // Its step is noted in the actor after inference: fetched now, while the model runs.
      __builtin_prefetch(slot.actor, 1, 3);
#endif
      slot.frame_index = i;
      slot.group = kNone;
      if (frame.obs_size(i) != slot.module->obs_dim) return obs_size_error(slot, frame.obs_size(i));
    }
    return check_rows(frame, !ending);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::string& id = frame.agent_id(i);
    if (!ending && episode != nullptr && !episode->ended.empty() && episode->ended.count(id) != 0) {
      return Status(ErrorCode::kInvalidArgument, "agent '" + id + "' already left episode '" + episode->id +
                                                     "' (an ended agent, or a member of an ended group, cannot act again)");
    }
    // (Slots are built in place: a Slot copied in from the stack stalls on
    // store forwarding, which showed in profiles of 256-agent frames.)
    if (!group_of_.empty()) {
      auto member = group_of_.find(id);
      if (member != group_of_.end()) {
        const std::size_t g = member->second.first;
        std::size_t& index = member_index_[group_member_offset_[g] + member->second.second];
        if (index != kNone) return Status(ErrorCode::kInvalidArgument, "agent '" + id + "' is twice in the frame");
        index = i;
        if (group_slot_[g] != kNone) continue;  // the group has its slot already
        group_slot_[g] = slots_.size();
        Slot& slot = slots_.emplace_back();
        slot.group = g;
        slot.actor_id = &group_list_[g]->group_id;
        continue;
      }
    }
    Slot& slot = slots_.emplace_back();
    slot.frame_index = i;
    slot.actor_id = &id;
  }
  // Resolve actors and their modules.
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    Slot& slot = slots_[s];
    if (episode != nullptr) {
      Actor* actor = s < episode->actor_by_slot.size() ? episode->actor_by_slot[s] : nullptr;
      if (actor == nullptr || actor->id != *slot.actor_id) {
        auto it = episode->actors.find(*slot.actor_id);
        actor = it != episode->actors.end() ? it->second.get() : nullptr;
      }
      if (actor != nullptr) {
        if (actor->frame_mark == frame_counter_) {
          return Status(ErrorCode::kInvalidArgument, "agent '" + *slot.actor_id + "' is twice in the frame");
        }
        actor->frame_mark = frame_counter_;
        slot.actor = actor;
        slot.module = actor->module;
        continue;
      }
      if (ending) continue;  // never acted: leaves without a module
      if (std::find(new_actor_ids_.begin(), new_actor_ids_.end(), *slot.actor_id) != new_actor_ids_.end()) {
        return Status(ErrorCode::kInvalidArgument, "agent '" + *slot.actor_id + "' is twice in the frame");
      }
    }
    new_slots_.push_back(s);
    new_actor_ids_.push_back(*slot.actor_id);
  }
  // Groups act only when every member observes.
  for (std::size_t g = 0; g < group_list_.size(); ++g) {
    if (group_slot_[g] == kNone) continue;
    const GroupSpec& group = *group_list_[g];
    std::string missing;
    for (std::size_t k = 0; k < group.members.size(); ++k) {
      if (member_index_[group_member_offset_[g] + k] == kNone) missing += (missing.empty() ? "'" : ", '") + group.members[k] + "'";
    }
    if (!missing.empty()) {
      return Status(ErrorCode::kInvalidArgument, "group '" + group.group_id +
                                                     "' acts as one agent: observations of " + missing + " are missing");
    }
  }
  Status mapped = map_actors(mapping_episode_id);
  if (!mapped.ok()) return mapped;
  // Sizes against each actor's module.
  for (const Slot& slot : slots_) {
    if (slot.module == nullptr) continue;  // (ending without having acted)
    const Module& module = *slot.module;
    std::size_t obs_size = 0;
    if (slot.group == kNone) {
      obs_size = frame.obs_size(slot.frame_index);
    } else {
      const GroupSpec& group = *group_list_[slot.group];
      for (std::size_t k = 0; k < group.members.size(); ++k) {
        obs_size += frame.obs_size(member_index_[group_member_offset_[slot.group] + k]);
      }
      if (module.act_dim % group.members.size() != 0) {
        return Status(ErrorCode::kInvalidArgument, "group '" + group.group_id + "': module '" + module.id +
                                                       "' actions of " + std::to_string(module.act_dim) +
                                                       " values do not split evenly among " +
                                                       std::to_string(group.members.size()) + " members");
      }
    }
    if (obs_size != module.obs_dim) return obs_size_error(slot, obs_size);
  }
  return check_rows(frame, !ending);
}

// The slots' observations against what their modules' spaces allow beyond
// sizes and finiteness: a byte box's or byte leaf's values are integers
// 0-255 (OBS_DTYPE_MISMATCH, as the server would refuse the whole batch for
// it, §10.6 checks 11b, 4c), and when an action follows (`acting`: not a
// final observation) the action mask holds only 0 and 1 and allows an action
// (INVALID_ACTION_MASK, ACTION_MASK_EMPTY, §11.6), so no forbidden action is
// drawn. Refused before anything of the frame is recorded or sampled, as in
// the Python and C# SDKs. A group's members are each checked for bytes; a
// group of a composite or masked module has its joined observation (its
// members' in member order) checked as a row of that module, its mask read
// from it exactly as an agent's, the message naming the group.
Status MultiAgentClient::check_rows(const AgentFrame& frame, bool acting) {
  for (const Slot& slot : slots_) {
    if (slot.module == nullptr || !slot.module->checks_rows) continue;
    if (slot.group == kNone) {
      Status status = check_module_row(*slot.module, frame, slot.frame_index, acting);
      if (!status.ok()) return status;
      continue;
    }
    const ModuleSpec& spec = slot.module->spec;
    if (spec.observation_space.is_composite() || spec.action_mask) {
      const float* row = group_row(frame, slot);
      Status status = check_observation_bytes(spec.observation_space, row, group_row_.size(), "observation");
      if (status.ok() && acting && spec.action_mask) status = spec.action_mask->check_row(row, "observation");
      if (!status.ok()) return Status(status.code(), "group '" + *slot.actor_id + "': " + status.message());
    }
    if (!spec.observation_space.is_bytes()) continue;
    const GroupSpec& group = *group_list_[slot.group];
    for (std::size_t k = 0; k < group.members.size(); ++k) {
      const std::size_t i = member_index_[group_member_offset_[slot.group] + k];
      const std::size_t bad = first_non_byte(frame.obs(i), frame.obs_size(i));
      if (bad == frame.obs_size(i)) continue;
      return Status(ErrorCode::kObsDtypeMismatch, "agent '" + frame.agent_id(i) + "': observation[" +
                                                      std::to_string(bad) + "] is " + std::to_string(frame.obs(i)[bad]) +
                                                      ": module '" + slot.module->id +
                                                      "' observes a uint8 Box (integers 0-255)");
    }
  }
  return Status::Ok();
}

// A group's joined observation (its members' in member order, as its module's
// batch gets it), in a buffer reused frame after frame.
const float* MultiAgentClient::group_row(const AgentFrame& frame, const Slot& slot) {
  group_row_.clear();
  append_actor_obs(frame, slot, group_row_);
  return group_row_.data();
}

// One single agent's row (frame index `i`) against its module's byte boxes
// or leaves and, when `acting`, its action mask; the message names the agent.
Status MultiAgentClient::check_module_row(const Module& module, const AgentFrame& frame, std::size_t i,
                                          bool acting) const {
  const float* row = frame.obs(i);
  // Finiteness was checked for the whole frame (check_finite) before.
  Status status = check_observation_bytes(module.spec.observation_space, row, frame.obs_size(i), "observation");
  if (status.ok() && acting && module.spec.action_mask) status = module.spec.action_mask->check_row(row, "observation");
  if (status.ok()) return status;
  return Status(status.code(), "agent '" + frame.agent_id(i) + "': " + status.message());
}

// NON_FINITE_VALUE naming the first observation value that is a NaN or an infinity, else ok.
Status MultiAgentClient::check_finite(const AgentFrame& frame) const {
  if (all_finite(frame.obs_.data(), frame.obs_.size())) return Status::Ok();
  for (std::size_t i = 0; i < frame.size(); ++i) {
    const float* obs = frame.obs(i);
    for (std::size_t j = 0, size = frame.obs_size(i); j < size; ++j) {
      if (!std::isfinite(obs[j])) {
        return Status(ErrorCode::kNonFiniteValue,
                      "agent '" + frame.agent_id(i) + "': observation[" + std::to_string(j) + "] is not finite");
      }
    }
  }
  return Status::Ok();
}

// Keeps the frame's actors by slot (and, without groups, its agent ids) for the next frame.
void MultiAgentClient::remember_slots(Episode& episode, const AgentFrame& frame) {
  episode.steady = false;
  episode.actor_by_slot.resize(slots_.size());
  episode.module_by_slot.resize(slots_.size());
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    episode.actor_by_slot[s] = slots_[s].actor;
    episode.module_by_slot[s] = slots_[s].module;
  }
  if (!group_of_.empty()) {
    episode.slot_ids.clear();
    return;
  }
  episode.slot_ids.resize(frame.size());
  for (std::size_t i = 0; i < frame.size(); ++i) {
    if (episode.slot_ids[i] != frame.agent_id(i)) episode.slot_ids[i] = frame.agent_id(i);
  }
  episode.slot_fill = frame.fill_;
}

bool MultiAgentClient::same_agents_as_last_frame(const Episode& episode, const AgentFrame& frame) const {
  const std::size_t n = frame.size();
  if (!group_of_.empty() || episode.slot_ids.size() != n || episode.actor_by_slot.size() != n ||
      episode.module_by_slot.size() != n) {
    return false;
  }
  if (frame.same_ids_as(episode.slot_fill, n)) return true;  // (no id compared)
  for (std::size_t i = 0; i < n; ++i) {
    if (frame.agent_id(i) != episode.slot_ids[i]) return false;
  }
  return true;
}

Status MultiAgentClient::obs_size_error(const Slot& slot, std::size_t obs_size) const {
  return Status(ErrorCode::kInvalidArgument, "'" + *slot.actor_id + "': observation has " + std::to_string(obs_size) +
                                                 " values, module '" + slot.module->id + "' needs " +
                                                 std::to_string(slot.module->obs_dim));
}

// The module of every slot when each is a single agent of that module at its
// own index in the frame (no group member in the frame), else null: the
// frame's observations are then that module's batch, in order.
MultiAgentClient::Module* MultiAgentClient::one_module_frame() const {
  if (slots_.empty()) return nullptr;
  Module* module = slots_[0].module;
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    if (slot.module != module || slot.group != kNone || slot.frame_index != s) return nullptr;
  }
  return module;
}

// Assigns each slot its module row and writes the actors' observations (a
// group's members joined in member order) into their modules' batches.
void MultiAgentClient::fill_batches(const AgentFrame& frame, Module* one_module) {
  for (Module* module : frame_modules_) {
    module->in_frame = false;
    module->rows = 0;
  }
  frame_modules_.clear();
  if (one_module != nullptr) {
    // Row s is slot s: the frame's observations go in with one copy.
    take_frame(frame, *one_module);
    for (std::size_t s = 0; s < slots_.size(); ++s) slots_[s].row = s;
    return;
  }
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    Slot& slot = slots_[s];
    Module* module = slot.module;
    if (!module->in_frame) {
      module->in_frame = true;
      module->logs = false;
      module->batch_obs.clear();
      frame_modules_.push_back(module);
    }
    slot.row = module->rows++;
    append_actor_obs(frame, slot, module->batch_obs);
  }
}

// The frame's agents are the module's rows, in order: its batch is the frame's observations.
void MultiAgentClient::take_frame(const AgentFrame& frame, Module& module) {
  for (Module* other : frame_modules_) {
    other->in_frame = false;
    other->rows = 0;
  }
  frame_modules_.clear();
  module.in_frame = true;
  module.rows = frame.size();
  module.logs = false;
  frame_modules_.push_back(&module);
  module.batch_obs.assign(frame.obs_.begin(), frame.obs_.end());
}

// One inference run per module of the frame.
Status MultiAgentClient::run_modules() {
  for (Module* module : frame_modules_) {
    if (!module->policy) {
      return Status(ErrorCode::kNotReady, "module '" + module->id + "' has no model yet (the server sent none)");
    }
    const std::size_t rows = module->rows;
    module->dist.resize(rows * module->dist_dim);
    const std::size_t state_dim = module->policy->state_dim;
    Status ran;
    if (state_dim == 0) {
      ran = module->policy->backend->run(module->batch_obs.data(), rows, module->obs_dim, module->dist.data(),
                                         module->dist_dim);
    } else {
      // [1.5] The actors' states stacked row by row (§12.4), zeros for one's first step.
      module->batch_state.resize(rows * state_dim);
      module->state_out.resize(rows * state_dim);
      for (std::size_t r = 0; r < rows; ++r) {
        const std::vector<float>& state = *module->row_states[r];
        float* to = module->batch_state.data() + r * state_dim;
        if (state.size() == state_dim) {
          std::copy(state.begin(), state.end(), to);
        } else {
          std::fill(to, to + state_dim, 0.0f);
        }
      }
      ran = module->policy->backend->run_recurrent(module->batch_obs.data(), rows, module->obs_dim,
                                                   module->batch_state.data(), module->state_out.data(), state_dim,
                                                   module->dist.data(), module->dist_dim);
    }
    ++inference_runs_;
    if (!ran.ok()) return Status(ran.code(), "module '" + module->id + "': " + ran.message());
  }
  return Status::Ok();
}

// [1.5] Points each module-with-memory row of the frame at its actor's state:
// a running episode's actor's, or (`evaluation`, compute_actions) the state
// evaluation_state() gives.
void MultiAgentClient::point_row_states(bool evaluation, const std::string& episode_id) {
  for (Module* module : frame_modules_) {
    if (module->policy && module->policy->state_dim > 0) module->row_states.resize(module->rows);
  }
  for (const Slot& slot : slots_) {
    Module& module = *slot.module;
    if (!module.policy || module.policy->state_dim == 0) continue;
    module.row_states[slot.row] = evaluation ? &evaluation_state(episode_id, *slot.actor_id) : &slot.actor->state;
  }
}

// [1.5] The frame acted: each row's actor goes on from the state its step returned.
void MultiAgentClient::commit_states() {
  for (Module* module : frame_modules_) {
    if (!module->policy || module->policy->state_dim == 0) continue;
    const std::size_t state_dim = module->policy->state_dim;
    for (std::size_t r = 0; r < module->rows; ++r) {
      const float* from = module->state_out.data() + r * state_dim;
      module->row_states[r]->assign(from, from + state_dim);  // (sized after its first step: no allocation)
    }
  }
}

// compute_actions' state of an actor: its running episode's (`episode_id`
// names one it acts in, not recorded: compute_actions refuses a recorded one), else the evaluation episode's, from zeros for an
// actor new to it; a new evaluation episode id forgets the last one's states.
std::vector<float>& MultiAgentClient::evaluation_state(const std::string& episode_id, const std::string& actor_id) {
  auto running = episodes_.find(episode_id);
  if (running != episodes_.end()) {
    auto actor = running->second->actors.find(actor_id);
    if (actor != running->second->actors.end()) return actor->second->state;
  }
  if (!evaluating_ || evaluation_id_ != episode_id) {
    evaluating_ = true;
    evaluation_id_ = episode_id;
    evaluation_states_.clear();
  }
  return evaluation_states_[actor_id];
}

// [1.5] The states of a module's actors start again from zeros (its model's
// recurrent state changed, or the module is gone).
void MultiAgentClient::reset_states_of(const Module& module) {
  for (auto& entry : episodes_) {
    for (auto& actor : entry.second->actors) {
      if (actor.second->module == &module) actor.second->state.clear();
    }
  }
  evaluating_ = false;
  evaluation_states_.clear();
}

// Each frame agent's action size (a member's part of its group's), laid out in the frame.
void MultiAgentClient::lay_out_actions(AgentFrame& frame, const Module* one_module) const {
  const std::size_t n = frame.size();
  if (one_module != nullptr) {
    const std::size_t act_dim = one_module->act_dim;
    frame.action_offsets_.resize(n + 1);
    for (std::size_t i = 0; i <= n; ++i) frame.action_offsets_[i] = i * act_dim;
    frame.actions_.resize(n * act_dim);
    return;
  }
  frame.action_offsets_.assign(n + 1, 0);
  for (const Slot& slot : slots_) {
    if (slot.group == kNone) {
      frame.action_offsets_[slot.frame_index + 1] = slot.module->act_dim;
    } else {
      const GroupSpec& group = *group_list_[slot.group];
      const std::size_t part = slot.module->act_dim / group.members.size();
      for (std::size_t k = 0; k < group.members.size(); ++k) {
        frame.action_offsets_[member_index_[group_member_offset_[slot.group] + k] + 1] = part;
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) frame.action_offsets_[i + 1] += frame.action_offsets_[i];
  frame.actions_.resize(frame.action_offsets_[n]);
}

// Writes a slot's engine action into the frame (split among a group's members).
void MultiAgentClient::write_action(const Slot& slot, const double* env_action, AgentFrame& frame) const {
  const std::size_t act_dim = slot.module->act_dim;
  if (slot.group == kNone) {
    std::copy(env_action, env_action + act_dim, frame.actions_.begin() +
                                                    static_cast<std::ptrdiff_t>(frame.action_offsets_[slot.frame_index]));
    return;
  }
  const GroupSpec& group = *group_list_[slot.group];
  const std::size_t part = act_dim / group.members.size();
  for (std::size_t k = 0; k < group.members.size(); ++k) {
    const std::size_t i = member_index_[group_member_offset_[slot.group] + k];
    std::copy(env_action + k * part, env_action + (k + 1) * part,
              frame.actions_.begin() + static_cast<std::ptrdiff_t>(frame.action_offsets_[i]));
  }
}

void MultiAgentClient::write_value_obs(const Episode& episode, const Module& module, std::vector<float>& out) const {
  const std::size_t dim = module.obs_dim;
  for (const std::string& agent : module.spec.value_obs_agents) {
    const std::size_t at = out.size();
    out.resize(at + dim, 0.0f);  // zeros for an agent not observed yet (§9.7)
    auto it = episode.latest_obs.find(agent);
    if (it != episode.latest_obs.end()) {
      std::copy(it->second.begin(), it->second.begin() + static_cast<std::ptrdiff_t>(std::min(dim, it->second.size())),
                out.begin() + static_cast<std::ptrdiff_t>(at));
    }
  }
}

// Keeps an actor's latest observation: a single agent's in its Actor (and in
// the episode's map when a critic sees it), a group's members' in the map.
void MultiAgentClient::note_latest(Episode& episode, const Slot& slot, const AgentFrame& frame) {
  if (slot.group == kNone) {
    const float* obs = frame.obs(slot.frame_index);
    const std::size_t size = frame.obs_size(slot.frame_index);
    // (a training actor's is its last recorded row; a new one keeps a copy in
    // case its first frame fails and nothing is recorded)
    if (slot.actor != nullptr && (!slot.actor->training || slot.actor->rows == 0)) {
      slot.actor->latest.assign(obs, obs + size);
    }
    if (slot.actor == nullptr || slot.actor->shared_latest) episode.latest_obs[*slot.actor_id].assign(obs, obs + size);
    return;
  }
  const GroupSpec& group = *group_list_[slot.group];
  for (std::size_t k = 0; k < group.members.size(); ++k) {
    const std::size_t i = member_index_[group_member_offset_[slot.group] + k];
    episode.latest_obs[group.members[k]].assign(frame.obs(i), frame.obs(i) + frame.obs_size(i));
  }
}

Status MultiAgentClient::get_action(const std::string& episode_id, AgentFrame& frame) {
  // A batch this call cuts goes to the I/O thread once the frame is acted (or
  // the call fails): building and encoding its records then does not compete
  // with this frame for the cores.
  struct WakeLinkAtEnd {
    MultiAgentClient& client;
    ~WakeLinkAtEnd() { client.wake_link(); }
  } wake_link_at_end{*this};
  Episode* episode = nullptr;
  Status status = check_call(episode_id, "get_action", episode);
  if (!status.ok()) return status;
  const bool logging = frame.logged_count_ > 0;
  if (logging && !(status = check_logging_server("get_action")).ok()) return status;
  // The cut comes first, before anything of this frame is built: sending may
  // apply events (a new connection's config, new models; with
  // wait_for_weights it waits for them), and this frame then acts with them.
  // The actors about to act hold back their latest step until this frame's
  // observation (§10.7): it goes with the next batch.
  // A batch every steps_per_batch() agent steps played (§13.2): complete
  // recorded steps and steps of held-back episodes. A held-back episode makes
  // it due only once held-back steps were played since the last cut; with
  // none, every steps_per_batch() complete steps recorded
  // (env_steps_per_sample unless the server asks for fewer), as always.
  const std::size_t every = static_cast<std::size_t>(steps_per_batch());
  if ((episode->training || (episode->held_back && held_steps_ > 0)) && pending_steps_ + held_steps_ >= every &&
      sendable_steps() + held_steps_ >= every) {
    send_batch(/*even_empty=*/true);
    // An error that came in while the batch went (with wait_for_weights, maybe
    // its own answer) is this call's, as in the Python and C# SDKs: nothing of
    // the frame is acted or recorded, and the engine may call again.
    status = pending_status();
    if (!status.ok()) return status;
  }
  if (steady_frame(*episode, frame)) return act_steady(*episode, frame);
  status = gather(episode, frame, episode_id, false);
  if (!status.ok()) return status;
  // (A reconnect while the batch went may have brought an older server.)
  if (logging && (!(status = check_logging_server("get_action")).ok() || !(status = match_logged(frame)).ok())) {
    return status;
  }
  if (same_agents_) episode->slot_fill = frame.fill_;
  // New actors join at this env step.
  for (std::size_t k = 0; k < new_slots_.size(); ++k) {
    Slot& slot = slots_[new_slots_[k]];
    auto actor = std::make_unique<Actor>();
    actor->id = new_actor_ids_[k];
    actor->module = slot.module;
    actor->is_group = slot.group != kNone;
    actor->start_step = episode->t;
    actor->training = episode->training;
    actor->frame_mark = frame_counter_;
    actor->shared_latest = critic_agents_.count(actor->id) != 0;
    slot.actor = actor.get();
    episode->roster.push_back(actor.get());
    episode->actors.emplace(actor->id, std::move(actor));
  }
  Module* const one_module = one_module_frame();
  if (!same_agents_) {
    remember_slots(*episode, frame);
    episode->slot_module = one_module;
  }
  fill_batches(frame, one_module);
  // Latest observations first (a critic's value_obs rows need every agent's),
  // then the critic rows in the modules' row order.
  if (!(same_agents_ && episode->steady)) {
    for (const Slot& slot : slots_) note_latest(*episode, slot, frame);
  }
  for (Module* module : frame_modules_) {
    if (module->value_dim == 0) continue;
    module->batch_value_obs.clear();
    for (std::size_t k = 0; k < module->rows; ++k) write_value_obs(*episode, *module, module->batch_value_obs);
  }
  point_row_states(false, episode_id);
  status = run_modules();
  if (!status.ok()) return status;  // nothing of the frame is recorded
  status = sample_modules();
  if (!status.ok()) return status;
  if (logging) mark_logged_rows(frame);
  commit_states();
  lay_out_actions(frame, one_module);
  if (one_module != nullptr) {
    std::copy(one_module->env_actions.begin(), one_module->env_actions.end(), frame.actions_.begin());
  } else {
    for (const Slot& slot : slots_) {
      write_action(slot, slot.module->env_actions.data() + slot.row * slot.module->act_dim, frame);
    }
  }
  if (demo_) record_demo_frame(*episode);
  if (episode->training) record_frame(*episode);
  if (episode->training) ++env_steps_since_cut_;
  if (episode->held_back) held_steps_ += slots_.size();  // one agent step per actor (a group's once)
  ++episode->t;
  return Status::Ok();
}

// [1.6] Gives each slot its logged action (AgentFrame::log_action), checked
// against its module's space (and its mask, §11.6: a group's read from its
// joined observation) as the server checks a record's action; refuses an
// actor logged twice, a logged actor that does not act in the frame and a
// group member (a group acts as one: its joint action is logged under its id). Sorting the logged ids
// once keeps a frame of many agents from comparing every pair.
Status MultiAgentClient::match_logged(const AgentFrame& frame) {
  const std::size_t n = frame.logged_count_;
  const std::vector<std::string>& ids = frame.logged_ids_;
  logged_order_.resize(n);
  for (std::size_t k = 0; k < n; ++k) logged_order_[k] = k;
  std::sort(logged_order_.begin(), logged_order_.end(), [&](std::size_t a, std::size_t b) { return ids[a] < ids[b]; });
  for (std::size_t k = 1; k < n; ++k) {
    if (ids[logged_order_[k]] == ids[logged_order_[k - 1]]) {
      return Status(ErrorCode::kInvalidArgument,
                    "get_action: '" + ids[logged_order_[k]] + "' has two logged actions in the frame");
    }
  }
  logged_matched_.assign(n, 0);
  for (Slot& slot : slots_) {
    auto it = std::lower_bound(logged_order_.begin(), logged_order_.end(), *slot.actor_id,
                               [&](std::size_t k, const std::string& id) { return ids[k] < id; });
    if (it == logged_order_.end() || ids[*it] != *slot.actor_id) continue;
    const std::size_t k = *it;
    slot.logged = k;
    logged_matched_[k] = 1;
    const ModuleSpec& spec = slot.module->spec;
    const float* row = nullptr;
    if (spec.action_mask) row = slot.group == kNone ? frame.obs(slot.frame_index) : group_row(frame, slot);
    Status checked = check_logged_action(spec.action_space, frame.logged_action(k), frame.logged_action_size(k),
                                         spec.action_mask ? &*spec.action_mask : nullptr, row, "the logged action");
    if (!checked.ok()) return Status(checked.code(), "get_action: '" + *slot.actor_id + "': " + checked.message());
  }
  for (std::size_t k = 0; k < n; ++k) {
    if (logged_matched_[k] != 0) continue;
    auto member = group_of_.find(ids[k]);
    if (member != group_of_.end()) {
      const std::string& group = group_list_[member->second.first]->group_id;
      return Status(ErrorCode::kInvalidArgument, "get_action: '" + ids[k] + "' is a member of group '" + group +
                                                     "', which acts as one: log the group's joint action under '" +
                                                     group + "'");
    }
    return Status(ErrorCode::kInvalidArgument,
                  "get_action: '" + ids[k] + "' has a logged action but does not act in this frame");
  }
  return Status::Ok();
}

// [1.6] The logged actors' rows take their given actions (recorded as given,
// never clipped, and written back to the engine) with 0 as their logp; their
// modules note which rows were logged (the frame's block takes the flags).
void MultiAgentClient::mark_logged_rows(const AgentFrame& frame) {
  for (const Slot& slot : slots_) {
    if (slot.logged == kNone) continue;
    Module& module = *slot.module;
    if (!module.logs) {
      module.logged_rows.assign(module.rows, 0);
      module.logs = true;
    }
    module.logged_rows[slot.row] = 1;
    const double* action = frame.logged_action(slot.logged);
    const auto at = static_cast<std::ptrdiff_t>(slot.row * module.act_dim);
    std::copy(action, action + module.act_dim, module.record_actions.begin() + at);
    std::copy(action, action + module.act_dim, module.env_actions.begin() + at);
    module.logp[slot.row] = 0.0;  // (no behaviour logp: the server never uses it at a logged step, §13.7)
  }
}

// [1.6] The frame's steps into the demonstration file (§18), each actor's
// observation and the action its record carries; before record_frame moves
// the modules' rows into the episode's blocks.
void MultiAgentClient::record_demo_frame(const Episode& episode) {
  for (const Slot& slot : slots_) {
    const Module& module = *slot.module;
    if (!module.demo) continue;
    Status written = demo_->step(episode.id, *slot.actor_id, module.id,
                                 module.batch_obs.data() + slot.row * module.obs_dim, module.obs_dim,
                                 module.record_actions.data() + slot.row * module.act_dim, module.act_dim,
                                 slot.logged != kNone);
    if (!written.ok()) {
      demo_failed(written);
      return;
    }
  }
}

// Whether the frame is a steady-state one: the last frame's agents again, in
// the same order (AgentFrame::same_ids_as spares comparing their ids), all
// single agents of one module without critic rows, each recorded and seen
// by no critic (Episode::steady).
bool MultiAgentClient::steady_frame(const Episode& episode, const AgentFrame& frame) const {
  // (Logged actions, and a demonstration file's steps, take the general path.)
  return steady_path_ && episode.steady && episode.slot_module != nullptr && episode.slot_module->value_dim == 0 &&
         frame.logged_count_ == 0 && !demo_ && same_agents_as_last_frame(episode, frame);
}

// A steady-state frame: acted and recorded as the general path does it (the
// same checks, rows, draws and records), without building slots or reading
// an actor before the model runs (no lookup, no latest observation to keep).
Status MultiAgentClient::act_steady(Episode& episode, AgentFrame& frame) {
  ++frame_counter_;
  same_agents_ = true;
  Module& module = *episode.slot_module;
  Status status = check_finite(frame);
  if (!status.ok()) return status;
  const std::size_t n = frame.size();
  Actor* const* actors = episode.actor_by_slot.data();
  for (std::size_t i = 0; i < n; ++i) {
    if (frame.obs_size(i) != module.obs_dim) {
      return Status(ErrorCode::kInvalidArgument, "'" + frame.agent_id(i) + "': observation has " +
                                                     std::to_string(frame.obs_size(i)) + " values, module '" +
                                                     module.id + "' needs " + std::to_string(module.obs_dim));
    }
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(actors[i], 1, 3);  // (its step is noted after inference: fetched while the model runs)
#endif
  }
  if (module.checks_rows) {
    for (std::size_t i = 0; i < n; ++i) {
      status = check_module_row(module, frame, i, /*acting=*/true);
      if (!status.ok()) return status;
    }
  }
  take_frame(frame, module);
  if (module.policy && module.policy->state_dim > 0) {
    module.row_states.resize(n);
    for (std::size_t i = 0; i < n; ++i) module.row_states[i] = &actors[i]->state;
  }
  status = run_modules();
  if (!status.ok()) return status;  // nothing of the frame is recorded
  status = sample_modules();
  if (!status.ok()) return status;
  commit_states();
  lay_out_actions(frame, &module);
  std::copy(module.env_actions.begin(), module.env_actions.end(), frame.actions_.begin());
  open_blocks(episode);
  StepBlock& block = *module.block;
  block.actors.assign(actors, actors + n);  // (row i is slot i's)
  block.live = n;
  for (std::size_t i = 0; i < n; ++i) note_latest_row(*actors[i], block, i);
  close_blocks(episode, true);
  episode.slot_fill = frame.fill_;
  ++steady_frames_;
  ++env_steps_since_cut_;  // (a steady episode is a recorded training one)
  ++episode.t;
  return Status::Ok();
}

// One draw per row of each module's batch (each actor then takes its row).
Status MultiAgentClient::sample_modules() {
  for (Module* module : frame_modules_) {
    const std::size_t rows = module->rows;
    module->record_actions.resize(rows * module->act_dim);
    module->env_actions.resize(rows * module->act_dim);
    module->logp.resize(rows);
    Status sampled = sample_rows_for_record(module->spec.action_space, module->dist.data(), rows, rng_,
                                            raw_box_samples_, module->record_actions.data(),
                                            module->env_actions.data(), module->logp.data());
    if (!sampled.ok()) return sampled;
  }
  return Status::Ok();
}

// The frame's rows become one block per module (its batch, outputs and draws
// move in whole: nothing is copied per agent); each actor notes its latest row.
void MultiAgentClient::record_frame(Episode& episode) {
  open_blocks(episode);
  bool steady = true;
  for (const Slot& slot : slots_) {
    Actor& actor = *slot.actor;
    steady = steady && actor.training && !actor.shared_latest;
    if (!actor.training) continue;
    note_row(actor, *slot.module->block, slot.row);
  }
  close_blocks(episode, steady);
}

// A frame's row of a training actor (its latest step).
void MultiAgentClient::note_row(Actor& actor, StepBlock& b, std::size_t row) {
  b.actors[row] = &actor;
  ++b.live;
  note_latest_row(actor, b, row);
}

// ... as the actor notes it.
void MultiAgentClient::note_latest_row(Actor& actor, StepBlock& b, std::size_t row) {
  actor.last_block = &b;
  actor.last_row = static_cast<std::uint32_t>(row);
  if (actor.rows == 0) ++latest_held_;  // (an acting actor is in the episode's actors)
  ++actor.rows;
  ++pending_steps_;
}

// Each module of the frame gets a block that takes its rows.
void MultiAgentClient::open_blocks(Episode& episode) {
  for (Module* module : frame_modules_) {
    const std::size_t rows = module->rows;
    std::unique_ptr<StepBlock> block = take_spare_block(module, rows);
    StepBlock& b = *block;
    b.module = module;
    b.obs_dim = module->obs_dim;
    b.value_dim = module->value_dim;
    b.dist_dim = module->dist_dim;
    b.act_dim = module->act_dim;
    b.obs.swap(module->batch_obs);
    b.value_obs.swap(module->batch_value_obs);
    b.dist.swap(module->dist);
    b.actions.swap(module->record_actions);
    b.logp.swap(module->logp);
    // [1.5] The states the rows were fed with (a cut's state_in is an actor's first row's).
    b.state_dim = module->policy ? module->policy->state_dim : 0;
    if (b.state_dim > 0) {
      b.states.swap(module->batch_state);
    } else {
      b.states.clear();
    }
    if (module->logs) {  // [1.6] which rows were logged (none usually: no array then)
      b.logged.swap(module->logged_rows);
      module->logs = false;
    } else {
      b.logged.clear();
    }
    b.rewards.assign(rows, 0.0);
    b.actors.assign(rows, nullptr);
    b.stamp = module->seq ? Stamp(module->seq_connection, *module->seq) : Stamp(-1, -1);
    b.live = 0;
    module->block = &b;
    episode.blocks.push_back(std::move(block));
  }
}

void MultiAgentClient::close_blocks(Episode& episode, bool steady) {
  for (Module* module : frame_modules_) module->block = nullptr;
  episode.steady = steady;
  // (A block nobody trains on goes back at once.)
  while (!episode.blocks.empty() && episode.blocks.back()->live == 0) {
    spare_blocks_.push_back(std::move(episode.blocks.back()));
    episode.blocks.pop_back();
  }
}

// A block to fill: a spare one (its arrays keep their capacity), else a new
// one. With `module`, for `rows` of its rows: one with room for them if one
// of the last few has it, since a frame's block trades its arrays with the
// module's frame scratch (which would otherwise grow in the next frame).
std::unique_ptr<MultiAgentClient::StepBlock> MultiAgentClient::take_spare_block(const Module* module,
                                                                               std::size_t rows) {
  if (spare_blocks_.empty()) return std::make_unique<StepBlock>();
  std::size_t pick = spare_blocks_.size() - 1;
  if (module != nullptr) {
    auto fits = [&](const StepBlock& b) {
      return b.actors.capacity() >= rows && b.obs.capacity() >= rows * module->obs_dim &&
             b.value_obs.capacity() >= rows * module->value_dim && b.dist.capacity() >= rows * module->dist_dim &&
             b.actions.capacity() >= rows * module->act_dim && b.logp.capacity() >= rows &&
             b.rewards.capacity() >= rows &&
             b.states.capacity() >= rows * (module->policy ? module->policy->state_dim : 0);
    };
    constexpr std::size_t kLooks = 8;
    for (std::size_t k = 0; k < kLooks && k < spare_blocks_.size(); ++k) {
      const std::size_t i = spare_blocks_.size() - 1 - k;
      if (fits(*spare_blocks_[i])) {
        pick = i;
        break;
      }
    }
  }
  std::unique_ptr<StepBlock> block = std::move(spare_blocks_[pick]);
  if (pick + 1 != spare_blocks_.size()) spare_blocks_[pick] = std::move(spare_blocks_.back());
  spare_blocks_.pop_back();
  return block;
}

// Moves the episode's blocks that `gone` picks to the spare ones, keeping the others in order.
template <class Pick>
void MultiAgentClient::release_blocks_if(Episode& episode, Pick gone) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < episode.blocks.size(); ++i) {
    if (gone(*episode.blocks[i])) {
      spare_blocks_.push_back(std::move(episode.blocks[i]));
    } else {
      episode.blocks[kept++] = std::move(episode.blocks[i]);
    }
  }
  episode.blocks.resize(kept);
}

// The block of `episode` that takes the moved steps of blocks like `like`
// (same module and model version); a fresh one at the end if none is yet.
MultiAgentClient::StepBlock& MultiAgentClient::carry_block(Episode& episode, const StepBlock& like) {
  for (auto& block : episode.blocks) {
    if (block->module == like.module && block->stamp == like.stamp) return *block;
  }
  std::unique_ptr<StepBlock> block = take_spare_block();
  StepBlock& b = *block;
  b.shape_like(like);
  b.actors.clear();
  b.obs.clear();
  b.value_obs.clear();
  b.dist.clear();
  b.actions.clear();
  b.logp.clear();
  b.rewards.clear();
  b.states.clear();
  b.logged.clear();
  episode.blocks.push_back(std::move(block));
  return b;
}

// Gives an episode's blocks back for reuse (their rows are not sent).
void MultiAgentClient::release_blocks(Episode& episode) {
  for (auto& block : episode.blocks) {
    spare_blocks_.push_back(std::move(block));
  }
  episode.blocks.clear();
}

// Drops the uncut rows a module recorded (its spaces changed: a server that
// now describes other spaces cannot take them). Its actors keep their latest observation.
void MultiAgentClient::drop_rows_of(const Module& module) {
  for (auto& entry : episodes_) {
    Episode& episode = *entry.second;
    auto keep_latest = [&](Actor& actor) {
      if (actor.rows == 0 || actor.module != &module) return;
      if (!actor.is_group && !actor.has_final) {
        actor.latest.assign(actor.latest_obs(), actor.latest_obs() + actor.latest_size());
      }
      pending_steps_ -= std::min(pending_steps_, actor.rows);
      actor.rows = 0;
    };
    for (auto& actor : episode.actors) keep_latest(*actor.second);
    for (auto& actor : episode.finished) keep_latest(*actor);
    episode.steady = false;
    release_blocks_if(episode, [&](const StepBlock& block) { return block.module == &module; });
  }
  recount_pending();
}

Status MultiAgentClient::compute_actions(AgentFrame& frame, const std::string& episode_id) {
  Status pending = catch_up();
  if (!pending.ok()) return pending;
  if (frame.logged_count_ > 0) {
    return Status(ErrorCode::kInvalidArgument, "compute_actions records nothing: a frame with logged actions "
                                               "(AgentFrame::log_action) is played with get_action");
  }
  Status status = gather(nullptr, frame, episode_id.empty() ? std::string("eval") : episode_id, false);
  if (!status.ok()) return status;
  // [1.5] A recorded episode's states must follow from its recorded
  // observations (§12.4): a greedy step of a module with memory that it would
  // not record is refused, before anything runs.
  auto running = episodes_.find(episode_id);
  if (running != episodes_.end() && !running->second->done && running->second->training) {
    for (const Slot& slot : slots_) {
      if (!slot.module->policy || slot.module->policy->state_dim == 0) continue;
      return Status(ErrorCode::kInvalidArgument,
                    "compute_actions: episode '" + episode_id +
                        "' is running and recorded; its states cannot advance on a step that is not recorded: "
                        "use get_action, or another episode id for evaluation");
    }
  }
  Module* const one_module = one_module_frame();
  fill_batches(frame, one_module);
  point_row_states(true, episode_id);
  status = run_modules();
  if (!status.ok()) return status;
  lay_out_actions(frame, one_module);
  for (const Slot& slot : slots_) {
    const Module& module = *slot.module;
    Status greedy = deterministic(module.spec.action_space, module.dist.data() + slot.row * module.dist_dim,
                                  module.dist_dim, env_action_.data(), module.act_dim);
    if (!greedy.ok()) return greedy;
    write_action(slot, env_action_.data(), frame);
  }
  commit_states();
  return Status::Ok();
}

void MultiAgentClient::fold_return(Episode& episode, Actor& actor) {
  if (actor.rewarded) episode.returns[actor.id] += actor.reward_sum;
  actor.reward_sum = 0.0;
  actor.rewarded = false;
}

Status MultiAgentClient::log_returns(const std::string& episode_id, const std::string& agent_id, double reward) {
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end() || it->second->done) {
    return Status(ErrorCode::kInvalidArgument, "log_returns: no running episode '" + episode_id + "'");
  }
  if (!std::isfinite(reward)) {
    return Status(ErrorCode::kNonFiniteValue, "log_returns: reward of '" + agent_id + "' is not finite");
  }
  Episode& episode = *it->second;
  const std::string* actor_id = &agent_id;
  auto member = group_of_.find(agent_id);
  if (member != group_of_.end()) {
    const GroupSpec& group = *group_list_[member->second.first];
    actor_id = &group.group_id;
    if (group.reward == GroupReward::kMean) reward /= static_cast<double>(group.members.size());
  }
  auto found = episode.actors.find(*actor_id);
  if (found == episode.actors.end()) {
    episode.returns[*actor_id] += reward;  // not acting (yet, or any more): no step, not limited
    return Status::Ok();
  }
  Actor& actor = *found->second;
  // [1.6] A step's reward never goes beyond float32 (§10.5): a reward that
  // would take the actor's step (a group's: its members' shares combined)
  // there is refused, and nothing of it is added anywhere.
  double* step = actor.training && actor.rows > 0 ? &actor.last_block->rewards[actor.last_row] : nullptr;
  if (step != nullptr) {
    Status checked = check_step_reward(*step, reward, agent_id, actor.is_group ? std::string_view(actor.id) : std::string_view());
    if (!checked.ok()) return Status(checked.code(), "log_returns: " + checked.message());
    *step += reward;
  }
  actor.reward_sum += reward;
  actor.rewarded = true;
  // (The writer refuses only a sum beyond float32, §18, which a step the
  // episode records was refused above; one it does not record is left out of the file.)
  if (demo_ && actor.module->demo) demo_->add_reward(episode_id, actor.id, reward);
  return Status::Ok();
}

Status MultiAgentClient::end_actors(Episode& episode, const AgentFrame& final_observations, bool all_truncated) {
  // Group members not in the frame end with their latest observation.
  AgentFrame& final = end_frame_;
  final.clear();
  for (std::size_t i = 0; i < final_observations.size(); ++i) {
    final.add(final_observations.agent_id(i), final_observations.obs(i), final_observations.obs_size(i),
              final_observations.truncated(i) || all_truncated);
  }
  for (std::size_t i = 0, n = final_observations.size(); i < n; ++i) {
    auto member = group_of_.find(final_observations.agent_id(i));
    if (member == group_of_.end()) continue;
    for (const std::string& other : group_list_[member->second.first]->members) {
      bool named = false;
      for (std::size_t j = 0; j < final.size() && !named; ++j) named = final.agent_id(j) == other;
      if (named) continue;
      auto latest = episode.latest_obs.find(other);
      if (latest != episode.latest_obs.end()) {
        final.add(other, latest->second.data(), latest->second.size(), all_truncated);
      }
    }
  }
  Status status = gather(&episode, final, episode.id, true);  // sizes; maps nothing
  if (!status.ok()) return status;
  for (const Slot& slot : slots_) note_latest(episode, slot, final);
  for (const Slot& slot : slots_) {
    bool truncated = false;
    if (slot.group == kNone) {
      episode.ended[*slot.actor_id] = true;
      truncated = final.truncated(slot.frame_index);
    } else {
      const GroupSpec& group = *group_list_[slot.group];
      for (std::size_t k = 0; k < group.members.size(); ++k) {
        episode.ended[group.members[k]] = true;
        truncated = truncated || final.truncated(member_index_[group_member_offset_[slot.group] + k]);
      }
    }
    auto it = episode.actors.find(*slot.actor_id);
    if (it == episode.actors.end()) continue;  // observed its end without ever acting: nothing to train on
    std::unique_ptr<Actor> actor = std::move(it->second);
    episode.actors.erase(it);
    if (demo_ && actor->module->demo) {
      demo_obs_.clear();
      append_actor_obs(final, slot, demo_obs_);
      Status written = demo_->end(episode.id, actor->id, demo_obs_.data(), demo_obs_.size(), !truncated);
      if (!written.ok()) demo_failed(written);
    }
    auto listed = std::find(episode.roster.begin(), episode.roster.end(), actor.get());
    if (listed != episode.roster.end()) {
      *listed = episode.roster.back();
      episode.roster.pop_back();
    }
    episode.actor_by_slot.clear();
    episode.steady = false;
    fold_return(episode, *actor);
    const Module& module = *actor->module;
    actor->truncated = truncated;
    actor->terminated = !truncated;
    if (actor->training && actor->rows > 0) {
      // Its final observation ends its last chunk.
      actor->final_obs.clear();
      append_actor_obs(final, slot, actor->final_obs);
      actor->final_value_obs.clear();
      if (module.value_dim > 0) write_value_obs(episode, module, actor->final_value_obs);
      actor->has_final = true;
      episode.finished.push_back(std::move(actor));
    }
  }
  recount_pending();
  return Status::Ok();
}

Status MultiAgentClient::end_agents(const std::string& episode_id, const AgentFrame& final_observations) {
  Episode* episode = nullptr;
  Status status = check_call(episode_id, "end_agents", episode);
  if (!status.ok()) return status;
  return end_actors(*episode, final_observations, false);
}

Status MultiAgentClient::retire_agent(const std::string& episode_id, const std::string& agent_id,
                                      const float* final_obs, std::size_t obs_size, bool truncated) {
  AgentFrame frame;
  frame.add(agent_id, final_obs, obs_size, truncated);
  return end_agents(episode_id, frame);
}

Result<std::map<std::string, double>> MultiAgentClient::end_episode(const std::string& episode_id,
                                                                    const AgentFrame* final_observations,
                                                                    bool truncated) {
  if (link_->events_pending()) sync();
  // (With the link gone for good the episode still ends; the fatal status is returned below.)
  if (fatal_.ok() && !errors_.empty()) return pending_status();
  auto found = episodes_.find(episode_id);
  if (found == episodes_.end() || found->second->done) {
    return Status(ErrorCode::kInvalidArgument, "end_episode: no running episode '" + episode_id + "'");
  }
  Episode* episode = found->second.get();
  // Every agent still in the episode leaves: with the given observation, or its latest one.
  AgentFrame all;
  if (final_observations != nullptr) {
    for (std::size_t i = 0; i < final_observations->size(); ++i) {
      all.add(final_observations->agent_id(i), final_observations->obs(i), final_observations->obs_size(i),
              final_observations->truncated(i));
    }
  }
  for (const auto& entry : episode->actors) {
    const Actor& actor = *entry.second;
    auto group = std::find_if(group_list_.begin(), group_list_.end(),
                              [&](const GroupSpec* g) { return g->group_id == actor.id; });
    std::vector<std::string> members;
    if (actor.is_group && group != group_list_.end()) {
      members = (*group)->members;
    } else {
      members.push_back(actor.id);
    }
    if (actor.is_group && actor.rows == 0) {
      // (as a single agent's below: members' observations of the old size, nothing to send)
      std::size_t size = 0;
      for (const std::string& member : members) {
        auto latest = episode->latest_obs.find(member);
        if (latest != episode->latest_obs.end()) size += latest->second.size();
      }
      if (size != actor.module->obs_dim) continue;
    }
    for (const std::string& member : members) {
      bool named = false;
      for (std::size_t j = 0; j < all.size() && !named; ++j) named = all.agent_id(j) == member;
      if (named) continue;
      if (!actor.is_group) {
        // (An agent whose module's spaces changed on a reconnect has only an
        // observation of the old size and nothing left to send: it ends without one.)
        if (actor.rows == 0 && actor.latest_size() != actor.module->obs_dim) continue;
        all.add(member, actor.latest_obs(), actor.latest_size());
        continue;
      }
      auto latest = episode->latest_obs.find(member);
      if (latest != episode->latest_obs.end()) all.add(member, latest->second.data(), latest->second.size());
    }
  }
  Status status = end_actors(*episode, all, truncated);
  if (!status.ok()) return status;
  forget_mapping(episode_id);  // its MAP_AGENTS answers held for this episode only
  for (auto& entry : episode->actors) fold_return(*episode, *entry.second);  // (any that did not leave)
  episode->done = true;
  episode->truncated = truncated;
  std::map<std::string, double> returns = episode->returns;
  if (!episode->training) episodes_.erase(episode_id);  // a trained episode goes once its last record is cut
  if (!fatal_.ok()) return fatal_;
  return returns;
}

// -- cutting and sending ---------------------------------------------------------------------

std::size_t MultiAgentClient::sendable_steps() const {
  // Every actor's latest action is held back until its next observation
  // (§10.7); RLlib's server waits for a full env_steps_per_sample batch.
  return pending_steps_ >= latest_held_ ? pending_steps_ - latest_held_ : 0;
}

// Hands the episode's complete steps to `record`: every actor's steps but its
// latest, held back until its next observation (§10.7), or all of them with
// its final observation once it left. No row is copied here: a block whose
// rows all go moves to the record whole; one that also holds steps that stay
// (held-back ones) goes as a copy and keeps only those. The I/O thread takes
// each actor's rows out of the record's blocks (CutSteps::build). Returns the
// agent steps handed over.
std::int64_t MultiAgentClient::cut(Episode& episode, CutRecord& record, CutSteps& steps) {
  std::int64_t taken = 0;
  auto plan = [&](Actor& actor) {
    if (!actor.training || actor.rows == 0) return;
    const std::size_t take = actor.has_final ? actor.rows : actor.rows - 1;
    if (take > 0) {
      const Module& module = *actor.module;
      CutEntry& entry = steps.next_entry(record);
      entry.key = &actor;
      entry.actor_id.assign(actor.id);
      entry.module_id.assign(module.id);
      entry.start_step = actor.start_step;
      entry.take = take;
      entry.obs_dim = module.obs_dim;
      entry.value_dim = module.value_dim;
      entry.act_dim = module.act_dim;
      entry.dist_dim = module.dist_dim;
      entry.state_dim = module.spec.state_dim();
      entry.has_final = actor.has_final;
      entry.terminated = actor.terminated;
      entry.truncated = actor.truncated;
      entry.final_obs.clear();
      entry.final_value_obs.clear();
      if (actor.has_final) {
        entry.final_obs.swap(actor.final_obs);  // (the actor goes with the cut)
        entry.final_value_obs.swap(actor.final_value_obs);
      }
      actor.rows -= take;
      taken += static_cast<std::int64_t>(take);
    }
    if (actor.rows > 0) {  // its held-back step stays (and its observation ends the steps cut)
      ++actor.last_block->kept;
      if (take > 0) actor.last_block->ends_chunk = true;
    }
  };
  record.entry_pool.reserve(episode.finished.size() + episode.roster.size());
  for (auto& actor : episode.finished) plan(*actor);
  Actor* const* roster = episode.roster.data();
  for (std::size_t i = 0, n = episode.roster.size(); i < n; ++i) {
#if defined(__GNUC__) || defined(__clang__)
    if (i + 8 < n) __builtin_prefetch(roster[i + 8], 1, 3);  // (each actor's line is far from the last one's)
#endif
    plan(*roster[i]);
  }
  if (taken == 0) {
    for (auto& block : episode.blocks) block->kept = 0;
    for (auto& block : episode.blocks) block->ends_chunk = false;
    return 0;
  }
  std::size_t stay = 0;
  for (std::size_t i = 0; i < episode.blocks.size(); ++i) {
    std::unique_ptr<StepBlock>& block = episode.blocks[i];
    StepBlock& b = *block;
    const std::size_t kept = b.kept;
    const bool ends_chunk = b.ends_chunk;
    b.kept = 0;
    b.ends_chunk = false;
    if (b.live > kept) note_oldest(b);
    if (b.live == kept && !ends_chunk) {  // nothing of it goes
      if (kept > 0) {
        episode.blocks[stay++] = std::move(block);
      } else {
        spare_blocks_.push_back(std::move(block));
      }
      continue;
    }
    if (kept == 0) {  // all of it goes
      record.blocks.push_back(std::move(block));
      continue;
    }
    record.blocks.push_back(copy_block(b));
    if (b.live > kept) {
      // The rows that stay are the held-back steps: each the last row of an actor that keeps one.
      for (std::size_t r = 0; r < b.actors.size(); ++r) {
        const Actor* actor = b.actors[r];
        if (actor != nullptr && !(actor->rows > 0 && actor->last_block == &b && actor->last_row == r)) {
          b.actors[r] = nullptr;
        }
      }
      b.live = kept;
    }
    episode.blocks[stay++] = std::move(block);
  }
  episode.blocks.resize(stay);
  compact_blocks(episode);
  return taken;
}

// Keeps the oldest (connection, version) a cut's steps of the block's module used.
void MultiAgentClient::note_oldest(const StepBlock& block) {
  if (block.stamp.first < 0) return;
  for (auto& entry : oldest_) {
    if (entry.first != block.module) continue;
    if (block.stamp < entry.second) entry.second = block.stamp;
    return;
  }
  oldest_.emplace_back(block.module, block.stamp);
}

// A copy of a block (a spare one's arrays keep their capacity).
std::unique_ptr<MultiAgentClient::StepBlock> MultiAgentClient::copy_block(const StepBlock& from) {
  std::unique_ptr<StepBlock> block = take_spare_block();
  StepBlock& b = *block;
  b.shape_like(from);
  b.actors.assign(from.actors.begin(), from.actors.end());
  b.obs.assign(from.obs.begin(), from.obs.end());
  b.value_obs.assign(from.value_obs.begin(), from.value_obs.end());
  b.dist.assign(from.dist.begin(), from.dist.end());
  b.actions.assign(from.actions.begin(), from.actions.end());
  b.logp.assign(from.logp.begin(), from.logp.end());
  b.rewards.assign(from.rewards.begin(), from.rewards.end());
  b.states.assign(from.states.begin(), from.states.end());
  b.logged.assign(from.logged.begin(), from.logged.end());
  b.kept = 0;
  b.ends_chunk = false;
  return block;
}

// After a cut every actor has at most one uncut step left (its held-back
// one). Blocks without any go back for reuse; when the blocks left are
// mostly cut (agents that stopped acting without leaving hold their steps in
// old frames' blocks), those steps move into as few blocks as they need, so
// that an idle agent keeps one row, not its whole frame's block.
void MultiAgentClient::compact_blocks(Episode& episode) {
  std::size_t live = 0, rows = 0;
  for (const auto& block : episode.blocks) {
    live += block->live;
    if (block->live > 0) rows += block->actors.size();
  }
  if (live > 0 && rows > 2 * live) {
    std::vector<std::unique_ptr<StepBlock>> old;
    old.swap(episode.blocks);
    for (auto& block : old) {
      const StepBlock& from = *block;
      for (std::size_t r = 0; r < from.actors.size(); ++r) {
        Actor* actor = from.actors[r];
        if (actor == nullptr) continue;
        StepBlock& to = carry_block(episode, from);
        const std::size_t row = to.actors.size();
        to.actors.push_back(actor);
        to.obs.insert(to.obs.end(), from.obs_row(r), from.obs_row(r) + from.obs_dim);
        to.value_obs.insert(to.value_obs.end(), from.value_obs_row(r), from.value_obs_row(r) + from.value_dim);
        const float* dist = from.dist.data() + r * from.dist_dim;
        to.dist.insert(to.dist.end(), dist, dist + from.dist_dim);
        const double* action = from.actions.data() + r * from.act_dim;
        to.actions.insert(to.actions.end(), action, action + from.act_dim);
        to.logp.push_back(from.logp[r]);
        to.rewards.push_back(from.rewards[r]);
        const float* state = from.states.data() + r * from.state_dim;
        to.states.insert(to.states.end(), state, state + from.state_dim);
        const bool logged = !from.logged.empty() && from.logged[r] != 0;
        if (logged || !to.logged.empty()) {  // (a block without logged rows keeps no flags)
          to.logged.resize(row, 0);
          to.logged.push_back(logged ? 1 : 0);
        }
        ++to.live;
        actor->last_block = &to;
        actor->last_row = static_cast<std::uint32_t>(row);
      }
      block->live = 0;
      spare_blocks_.push_back(std::move(block));
    }
    return;
  }
  release_blocks_if(episode, [](const StepBlock& block) { return block.live == 0; });
}

void MultiAgentClient::send_batch(bool even_empty) {
  if (ended_) return;  // training is done: nothing is recorded, nobody takes a batch
  auto batch = std::make_shared<Batch>();
  batch->multi_agent = true;
  std::shared_ptr<CutSteps> steps;
  if (spare_cuts_.empty()) {
    steps = std::make_shared<CutSteps>();
  } else {
    steps = std::move(spare_cuts_.back());
    spare_cuts_.pop_back();
  }
  steps->connection = connection_;
  steps->server_takes_runs = config_->announces_version;  // (a plain v1 server is never sent runs)
  oldest_.clear();
  for (auto it = episodes_.begin(); it != episodes_.end();) {
    Episode& episode = *it->second;
    if (!episode.training) {
      ++it;
      continue;
    }
    CutRecord& record = steps->next_record();
    record.episode_id.assign(episode.id);
    const std::int64_t taken = cut(episode, record, *steps);
    episode.finished.clear();
    if (record.entries > 0 || episode.done) {
      record.terminated = episode.done && !episode.truncated;
      record.truncated = episode.done && episode.truncated;
      // [1.7] Every record of an episode with values carries them; the one
      // that ends it, the measure reported (§19.3).
      record.env_params.drawn = episode.env.drawn;
      if (episode.done && episode.env.drawn) record.env_params.measure = episode.env.measure;
      batch->pending_records.push_back(PendingRecord{episode.id, taken});
      batch->agent_steps += taken;
    } else {
      --steps->used;  // (no entry: no block went to it)
    }
    if (episode.done) {
      release_blocks(episode);
      it = episodes_.erase(it);
    } else {
      ++it;
    }
  }
  recount_pending();
  const std::int64_t env_steps = env_steps_since_cut_;
  env_steps_since_cut_ = 0;
  // Held-back steps were played: the batch goes even without records, as its
  // answer brings the weights and record_share (§13.2).
  batch->even_empty = even_empty && held_steps_ > 0;
  held_steps_ = 0;
  // The blocks handed over come back once the I/O thread has built the
  // records (at once while it waits for an answer or idles, else once it is
  // free): the frames until then take spare ones, made now if there are too
  // few, each with room for the largest handed over (a block's arrays pass to
  // a module's frame scratch and back, whichever module takes it), so that
  // frames allocate nothing.
  std::size_t handed = 0;
  std::size_t room[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // the largest capacity of each array
  for (std::size_t i = 0; i < steps->used; ++i) {
    for (const auto& block : steps->records[i].blocks) {
      ++handed;
      const std::size_t capacities[8] = {block->actors.capacity(),  block->obs.capacity(),
                                         block->value_obs.capacity(), block->dist.capacity(),
                                         block->actions.capacity(), block->logp.capacity(),
                                         block->rewards.capacity(), block->logged.capacity()};
      for (std::size_t k = 0; k < 8; ++k) room[k] = std::max(room[k], capacities[k]);
    }
  }
  while (spare_blocks_.size() < handed) {
    auto spare = std::make_unique<StepBlock>();
    spare->actors.reserve(room[0]);
    spare->obs.reserve(room[1]);
    spare->value_obs.reserve(room[2]);
    spare->dist.reserve(room[3]);
    spare->actions.reserve(room[4]);
    spare->logp.reserve(room[5]);
    spare->rewards.reserve(room[6]);
    spare->logged.reserve(room[7]);
    spare_blocks_.push_back(std::move(spare));
  }
  if (batch->pending_records.empty()) {
    recycle(std::move(steps));
    if (!batch->even_empty) return;
  } else {
    batch->record_source = std::move(steps);
  }
  batch->env_steps = env_steps;
  batch->connection = connection_;  // [1.8] its steps' versions were learned on it (§6.5)
  // The claims (§7.6): per module, the oldest version its steps used; a
  // module without steps here reports the version it holds.
  std::map<std::string, std::int64_t> claims;
  for (const auto& entry : modules_) {
    if (entry.second->seq) claims[entry.first] = *entry.second->seq;
  }
  for (const auto& entry : oldest_) claims[entry.first->id] = entry.second.second;
  batch->weights_seq_nos = std::move(claims);
  const bool strict = waits_for_weights();
  // (Unless it waits, the I/O thread is woken once the frame is acted: wake_link().)
  std::set<std::string> gone = link_->hand_over(batch, batch->queue_steps(),
                                                options_.when_queue_full == QueueFullPolicy::kWait, strict,
                                                &dropped_batches_, /*wake=*/false);
  link_to_wake_ = !strict;
  // Batches dropped unsent are no one else's: their steps' arrays are reused.
  for (const auto& dropped : dropped_batches_) reclaim(std::move(dropped->record_source));
  dropped_batches_.clear();
  if (!gone.empty()) forget_episodes(gone);
  if (strict || link_->events_pending()) sync();
}

// Wakes the I/O thread for a batch handed over without waking it.
void MultiAgentClient::wake_link() {
  if (!link_to_wake_) return;
  link_to_wake_ = false;
  link_->wake();
}

// Takes back a cut's steps once the I/O thread is done with them (their blocks and entries are reused).
void MultiAgentClient::reclaim(std::shared_ptr<RecordSource> source) {
  if (!source) return;
  // (A batch's record source is always this client's CutSteps.)
  recycle(std::static_pointer_cast<CutSteps>(std::move(source)));
}

void MultiAgentClient::recycle(std::shared_ptr<CutSteps> steps) {
  for (std::size_t i = 0; i < steps->used; ++i) {
    CutRecord& record = steps->records[i];
    for (auto& block : record.blocks) spare_blocks_.push_back(std::move(block));
    record.blocks.clear();
    record.entries = 0;
  }
  steps->used = 0;
  spare_cuts_.push_back(std::move(steps));
}

Status MultiAgentClient::flush() {
  Status pending = catch_up();
  if (!pending.ok()) return pending;
  if (ended_) return Status::Ok();  // training is done: nothing to send, nobody to wait for
  send_batch();
  wake_link();
  link_->wait_for_idle();
  sync();
  return pending_status();  // (a refusal that came while it waited, once)
}

}  // namespace tether
