// Episode records (docs/protocol.md §10): writing them, and checking them as a server does.
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Linq;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>
    /// One chunk of one agent's episode: T steps, with T + 1 observations (the
    /// observation after the last action closes it), flat row-major arrays.
    /// </summary>
    public sealed class EpisodeChunk
    {
        /// <summary>(T + 1) rows of the observation space's FlatDim (a byte box's values are the integers 0 to 255).</summary>
        public readonly List<float> Obs = new List<float>();
        /// <summary>T rows of the action space's FlatDim (a Box's raw samples).</summary>
        public readonly List<double> Actions = new List<double>();
        /// <summary>
        /// T rewards, each the sum of the rewards logged for its step, kept and written as doubles (the
        /// server reads them as float32; a sum of magnitude <see cref="EpisodeRecords.Float32Overflow"/>
        /// or more is never sent, §10.5).
        /// </summary>
        public readonly List<double> Rewards = new List<double>();
        /// <summary>T log-probabilities, or empty to leave them out.</summary>
        public readonly List<double> ActionLogp = new List<double>();
        /// <summary>T rows of DistInputsSize, or empty to leave them out.</summary>
        public readonly List<float> ActionDistInputs = new List<float>();
        /// <summary>Ended in a terminal state after the last action.</summary>
        public bool IsTerminated;
        /// <summary>Ended by a time limit after the last action.</summary>
        public bool IsTruncated;
        /// <summary>Its episode's id, or null.</summary>
        public string EpisodeId;
        /// <summary>
        /// T weights versions, the one each step was acted with, written as
        /// weights_seq_no_runs (§10.1, 1.3); or empty to leave the field out (every
        /// step then has the message's claim).
        /// </summary>
        public readonly List<long> StepVersions = new List<long>();
        /// <summary>
        /// The recurrent state its first observation was fed with (protocol 1.5, §10.1), written as
        /// <c>state_in</c> when <see cref="State"/> is set: <see cref="RecurrentState.Width"/> values,
        /// tensor k's at k × size.
        /// </summary>
        public readonly List<float> StateIn = new List<float>();
        /// <summary>The module's recurrent state (protocol 1.5) whose <see cref="StateIn"/> the record carries; null: none.</summary>
        public RecurrentState State;
        /// <summary>
        /// T flags, whether each step's action was logged (protocol 1.6, §10.1: chosen outside the policy),
        /// written as <c>logged_runs</c> (adjacent logged steps as one run); or empty, or no flag set, to
        /// leave the field out (every step was sampled).
        /// </summary>
        public readonly List<bool> Logged = new List<bool>();
        /// <summary>
        /// The values its episode plays with (protocol 1.7, §19.3), written as the record's <c>env_params</c>;
        /// null: the episode has none (the member is left out).
        /// </summary>
        public EpisodeEnvParams EnvParams;
        /// <summary>
        /// The episode's measure (protocol 1.7, §19.3), written in <c>env_params</c> with <see cref="EnvParams"/>:
        /// set only on the chunk that ends the episode, when the engine reported one.
        /// </summary>
        public double? Measure;

        /// <summary>T, the steps (rewards) it holds.</summary>
        public int Steps { get { return Rewards.Count; } }

        /// <summary>Empties it for reuse (the arrays keep their capacity).</summary>
        public void Clear()
        {
            Obs.Clear(); Actions.Clear(); Rewards.Clear(); ActionLogp.Clear(); ActionDistInputs.Clear(); StepVersions.Clear(); StateIn.Clear(); Logged.Clear();
            State = null;
            IsTerminated = IsTruncated = false;
            EpisodeId = null;
            EnvParams = null;
            Measure = null;
        }
    }

    /// <summary>A module as SET_CONFIG describes it (§9.1).</summary>
    public sealed class ModuleSpec
    {
        /// <summary>The module's id.</summary>
        public string ModuleId;
        /// <summary>What its agents observe.</summary>
        public Space ObservationSpace;
        /// <summary>What its agents do.</summary>
        public Space ActionSpace;
        /// <summary>The ONNX model's input name.</summary>
        public string OnnxInputName = "obs";
        /// <summary>The ONNX model's output name.</summary>
        public string OnnxOutputName = "action_dist_inputs";
        /// <summary>Whether the server trains it.</summary>
        public bool Trainable = true;
        /// <summary>The agents a centralized critic sees (§9.7), or empty.</summary>
        public List<string> ValueObsAgents = new List<string>();
        /// <summary>The observation leaf that masks its actions (protocol 1.4, §9.1, §11.6), or null.</summary>
        public ActionMask ActionMask;
        /// <summary>Its model's recurrent state (protocol 1.5, §9.1, §12.1), or null for a model without memory.</summary>
        public RecurrentState RecurrentState;

        /// <summary>Numbers in one observation.</summary>
        public int ObsDim { get { return ObservationSpace.FlatDim; } }

        /// <summary>Numbers in one centralized-critic row (0 without a critic).</summary>
        public int ValueObsDim { get { return ObsDim * ValueObsAgents.Count; } }

        /// <summary>The module <paramref name="moduleId"/> of a SET_CONFIG. Throws INVALID_FIELD.</summary>
        public static ModuleSpec FromJson(string moduleId, JToken data)
        {
            var obj = data as JObject;
            if (obj == null) throw new TetherException(ErrorCode.InvalidField, "module '" + moduleId + "' must be a JSON object");
            var spec = new ModuleSpec { ModuleId = moduleId };
            try
            {
                spec.ObservationSpace = Space.FromJson(obj["observation_space"] ?? JValue.CreateNull());
                spec.ActionSpace = Space.ActionFromJson(obj["action_space"] ?? JValue.CreateNull());
                spec.ActionMask = ReadActionMask(obj["action_mask"], spec.ObservationSpace, spec.ActionSpace);
                spec.RecurrentState = RecurrentState.FromJson(obj["recurrent_state"]);
            }
            catch (TetherException e)
            {
                throw new TetherException(e.Code, "module '" + moduleId + "': " + e.Detail);
            }
            spec.OnnxInputName = FirstName(obj["onnx_input_names"]) ?? spec.OnnxInputName;
            spec.OnnxOutputName = FirstName(obj["onnx_output_names"]) ?? spec.OnnxOutputName;
            JToken trainable = obj["trainable"];
            if (trainable != null && trainable.Type == JTokenType.Boolean) spec.Trainable = (bool)trainable;
            // value_obs_agents (§9.1): an array of agent ids, or absent or null (none); anything else refused.
            JToken agents = obj["value_obs_agents"];
            if (agents != null && agents.Type != JTokenType.Null)
            {
                var list = agents as JArray;
                if (list == null || list.Any(a => a.Type != JTokenType.String))
                {
                    throw new TetherException(ErrorCode.InvalidField, "module '" + moduleId + "': value_obs_agents must be an array of agent ids (strings)");
                }
                foreach (JToken a in list) spec.ValueObsAgents.Add((string)a);
            }
            return spec;
        }

        /// <summary>
        /// The <c>action_mask</c> of a module object or a single-module SET_CONFIG (protocol 1.4, §9.1):
        /// null when absent (or JSON null), else the resolved mask. INVALID_FIELD for one that is not a
        /// string, names no leaf of a Dict or Tuple observation space, goes with an action space that is
        /// not Discrete or MultiDiscrete, or names a leaf that is not a Box of exactly K values.
        /// </summary>
        public static ActionMask ReadActionMask(JToken value, Space observationSpace, Space actionSpace)
        {
            if (value == null || value.Type == JTokenType.Null) return null;
            if (value.Type != JTokenType.String) throw new TetherException(ErrorCode.InvalidField, "action_mask must be a leaf path (a string), got " + Messages.Describe(value));
            return ActionMask.Resolve(observationSpace, actionSpace, (string)value);
        }

        static string FirstName(JToken names)
        {
            var array = names as JArray;
            if (array == null || array.Count == 0) return null;
            return array[0].Type == JTokenType.String ? (string)array[0] : array[0].ToString(Newtonsoft.Json.Formatting.None);
        }
    }

    /// <summary>How a group adds up its members' rewards.</summary>
    public enum GroupReward
    {
        /// <summary>The members' rewards added.</summary>
        Sum,
        /// <summary>The members' rewards averaged.</summary>
        Mean,
    }

    /// <summary>A group of agents acting as one (§9.6): observations joined in member order, the action split evenly.</summary>
    public sealed class GroupSpec
    {
        /// <summary>The group's id (the agent id its records use).</summary>
        public string GroupId;
        /// <summary>Its members, in order.</summary>
        public List<string> Members = new List<string>();
        /// <summary>How rewards combine.</summary>
        public GroupReward Reward = GroupReward.Sum;

        /// <summary>The group <paramref name="groupId"/> of a SET_CONFIG. Throws INVALID_FIELD.</summary>
        public static GroupSpec FromJson(string groupId, JToken data)
        {
            string where = "group '" + groupId + "': ";
            var members = data is JObject ? data["members"] as JArray : null;
            if (members == null) throw new TetherException(ErrorCode.InvalidField, where + "\"members\" must be a list of agent ids");
            var group = new GroupSpec { GroupId = groupId };
            var seen = new HashSet<string>();
            foreach (JToken m in members)
            {
                string id = m.Type == JTokenType.String ? (string)m : m.ToString(Newtonsoft.Json.Formatting.None);
                if (!seen.Add(id)) break;
                group.Members.Add(id);
            }
            if (group.Members.Count == 0 || group.Members.Count != members.Count) throw new TetherException(ErrorCode.InvalidField, where + "needs distinct members");
            JToken reward = data["reward"];
            if (reward != null)
            {
                string name = reward.Type == JTokenType.String ? (string)reward : null;
                if (name == "sum") group.Reward = GroupReward.Sum;
                else if (name == "mean") group.Reward = GroupReward.Mean;
                else throw new TetherException(ErrorCode.InvalidField, where + "reward must be 'sum' or 'mean'");
            }
            return group;
        }

        /// <summary>The group's reward for its members' rewards of one step.</summary>
        public double CombineRewards(IList<double> rewards)
        {
            double total = 0;
            foreach (double r in rewards) total += r;
            return Reward == GroupReward.Mean ? total / Members.Count : total;
        }

        /// <summary>The members' observations joined in member order. INVALID_ARGUMENT naming the missing members.</summary>
        public float[] JoinObservations(IDictionary<string, float[]> memberObs)
        {
            var missing = Members.Where(m => !memberObs.ContainsKey(m)).ToList();
            if (missing.Count > 0)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "group '" + GroupId + "' acts as one agent: observations of '" +
                                          string.Join("', '", missing.ToArray()) + "' are missing");
            }
            return Members.SelectMany(m => memberObs[m]).ToArray();
        }

        /// <summary>The group's action split evenly among its members, in order.</summary>
        public double[][] SplitAction(double[] action)
        {
            if (Members.Count == 0 || action.Length % Members.Count != 0)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "group '" + GroupId + "': an action of " + action.Length +
                                          " elements does not split into " + Members.Count + " equal parts");
            }
            int share = action.Length / Members.Count;
            return Enumerable.Range(0, Members.Count).Select(i => action.Skip(i * share).Take(share).ToArray()).ToArray();
        }

        /// <summary>
        /// A group's spaces from its members' (§9.6): observations joined into one
        /// Box; Discrete and MultiDiscrete actions into one MultiDiscrete, Box
        /// actions into one Box. INVALID_ARGUMENT for members that cannot group.
        /// </summary>
        public static Space[] Spaces(IList<Space> memberObs, IList<Space> memberActions)
        {
            var low = new List<double>();
            var high = new List<double>();
            foreach (Space s in memberObs)
            {
                if (s.Kind != SpaceKind.Box) throw new TetherException(ErrorCode.InvalidArgument, "group members need Box observation spaces");
                low.AddRange(s.Low);
                high.AddRange(s.High);
            }
            Space obs = Space.Box(new long[] { low.Count }, low.ToArray(), high.ToArray());
            if (memberActions.All(a => a.Kind != SpaceKind.Box))
            {
                var nvec = new List<long>();
                foreach (Space a in memberActions)
                {
                    if (a.Kind == SpaceKind.Discrete)
                    {
                        if (a.Start != 0) throw new TetherException(ErrorCode.InvalidArgument, "grouped Discrete actions must start at 0");
                        nvec.Add(a.N);
                    }
                    else
                    {
                        nvec.AddRange(a.Nvec);
                    }
                }
                return new[] { obs, Space.MultiDiscrete(nvec.ToArray()) };
            }
            if (memberActions.All(a => a.Kind == SpaceKind.Box))
            {
                var alow = memberActions.SelectMany(a => a.Low).ToArray();
                var ahigh = memberActions.SelectMany(a => a.High).ToArray();
                return new[] { obs, Space.Box(new long[] { alow.Length }, alow, ahigh) };
            }
            throw new TetherException(ErrorCode.InvalidArgument, "group members' action spaces must be all discrete or all Box");
        }
    }

    /// <summary>Writing episode records, and checking them as a server does (the validation order of §10.8).</summary>
    public static class EpisodeRecords
    {
        /// <summary>
        /// 2^128 − 2^103: a step's reward of this magnitude or more rounds to an infinite float32, so it is never
        /// sent (protocol 1.6, §10.5; the server would refuse the whole batch). The clients refuse, at the call,
        /// a reward that would take its step's sum there (NON_FINITE_VALUE), and the call adds nothing.
        /// </summary>
        public const double Float32Overflow = 3.4028235677973366e38;

        /// <summary>Whether a step's reward of <paramref name="sum"/> can go in a record (finite as float32, §10.5).</summary>
        public static bool StepRewardFits(double sum)
        {
            return Math.Abs(sum) < Float32Overflow;  // (false for NaN too)
        }

        // NON_FINITE_VALUE for a reward that would take its step's reward to `sum`, beyond float32 (§10.5).
        // `who`: whose reward ("of 'a'"), or null.
        internal static TetherException StepRewardBeyondFloat32(string call, string who, double reward, double sum)
        {
            return new TetherException(ErrorCode.NonFiniteValue, call + ": the reward " + reward.ToString("R", CultureInfo.InvariantCulture) +
                                       (who != null ? " " + who : "") + " would make its step's reward " +
                                       sum.ToString("R", CultureInfo.InvariantCulture) + ", beyond float32 (§10.5); nothing was added");
        }

        /// <summary>A single-agent record (§10.1). INVALID_ARGUMENT when the chunk's arrays do not fit the spaces.</summary>
        public static JObject Encode(EpisodeChunk chunk, Space observationSpace, Space actionSpace)
        {
            JObject record = EncodeFields(chunk, observationSpace, actionSpace);
            if (chunk.EpisodeId != null) record["episode_id"] = chunk.EpisodeId;
            if (chunk.EnvParams != null) record[Tether.Protocol.EnvParams.Field] = chunk.EnvParams.ToRecordJson(chunk.Measure);
            return record;
        }

        /// <summary>
        /// A multi-agent record's agent entry (§10.7): the chunk's fields in its
        /// module's spaces, the module, the agent's start step and, for a module
        /// with a centralized critic, <paramref name="valueObs"/>: T + 1 rows of
        /// the module's ValueObsDim (null or empty otherwise). INVALID_ARGUMENT
        /// when an array does not fit.
        /// </summary>
        public static JObject EncodeAgentEntry(EpisodeChunk chunk, ModuleSpec module, long startStep, IList<float> valueObs)
        {
            JObject entry = EncodeFields(chunk, module.ObservationSpace, module.ActionSpace);
            entry["module"] = module.ModuleId;
            entry["start_step"] = startStep;
            int v = module.ValueObsDim;
            if (v > 0)
            {
                int rows = chunk.Steps + 1;
                CheckSize("value_obs", valueObs == null ? 0 : valueObs.Count, rows * v);
                var flat = new List<double>(rows * v);
                foreach (float x in valueObs) flat.Add(x);
                entry["value_obs"] = Rows(flat, rows, new long[] { v }, false, true);
            }
            return entry;
        }

        internal static JObject EncodeFields(EpisodeChunk chunk, Space observationSpace, Space actionSpace)
        {
            CheckChunk(chunk, observationSpace, actionSpace);
            int steps = chunk.Steps, k = actionSpace.DistInputsSize;
            bool discrete = actionSpace.Kind != SpaceKind.Box;
            var record = new JObject();
            // A byte box's observations are integers (§8.1): written as such, "7" rather than "7.0".
            if (observationSpace.IsComposite) record["obs"] = LeafRows(chunk.Obs, steps + 1, observationSpace);
            else record["obs"] = Rows(chunk.Obs.Select(v => (double)v).ToList(), steps + 1, observationSpace.Shape, observationSpace.IsBytes, true);
            record["actions"] = Rows(chunk.Actions, steps, actionSpace.Shape, discrete, !discrete);
            record["rewards"] = new JArray(chunk.Rewards.Select(r => new JValue(r)));
            if (chunk.ActionLogp.Count != 0) record["action_logp"] = new JArray(chunk.ActionLogp.Select(v => new JValue(v)));
            if (chunk.ActionDistInputs.Count != 0)
            {
                record["action_dist_inputs"] = Rows(chunk.ActionDistInputs.Select(v => (double)v).ToList(), steps, new long[] { k }, false, true);
            }
            if (chunk.StepVersions.Count != 0) record[VersionRuns.Field] = VersionRuns.ToJson(chunk.StepVersions);
            if (chunk.State != null) record["state_in"] = StateInJson(chunk.State, chunk.StateIn, 0);
            JArray loggedRuns = LoggedRuns.ToJson(chunk.Logged);
            if (loggedRuns != null) record[LoggedRuns.Field] = loggedRuns;
            record["is_terminated"] = chunk.IsTerminated;
            record["is_truncated"] = chunk.IsTruncated;
            return record;
        }

        // INVALID_ARGUMENT when the chunk's arrays do not fit the spaces.
        internal static void CheckChunk(EpisodeChunk chunk, Space observationSpace, Space actionSpace)
        {
            int steps = chunk.Steps;
            CheckSize("obs", chunk.Obs.Count, (steps + 1) * observationSpace.FlatDim);
            if (observationSpace.IsBytes) CheckByteValues(chunk.Obs, observationSpace.FlatDim);
            CheckSize("actions", chunk.Actions.Count, steps * actionSpace.FlatDim);
            if (chunk.ActionLogp.Count != 0) CheckSize("action_logp", chunk.ActionLogp.Count, steps);
            if (chunk.ActionDistInputs.Count != 0) CheckSize("action_dist_inputs", chunk.ActionDistInputs.Count, steps * actionSpace.DistInputsSize);
            VersionRuns.CheckVersions(chunk.StepVersions, steps);
            if (chunk.State != null) CheckSize("state_in", chunk.StateIn.Count, chunk.State.Width);
            if (chunk.Logged.Count != 0) CheckSize("logged", chunk.Logged.Count, steps);
        }

        /// <summary>
        /// A record's <c>state_in</c> (protocol 1.5, §10.1): one member per state tensor, named by its input,
        /// its <c>size</c> float32 values from <paramref name="values"/>[<paramref name="offset"/> + k × size].
        /// </summary>
        public static JObject StateInJson(RecurrentState state, IList<float> values, int offset)
        {
            var json = new JObject();
            int size = state.Size;
            for (int k = 0; k < state.Tensors.Count; ++k)
            {
                var row = new JArray();
                for (int j = 0; j < size; ++j) row.Add(FloatJson(values[offset + k * size + j]));
                json[state.Tensors[k].Input] = row;
            }
            return json;
        }

        /// <summary>
        /// Whether <paramref name="value"/> is a value of a byte box (§8.1): an integer from 0 to 255.
        /// </summary>
        public static bool IsByteValue(float value) { return value >= 0f && value <= 255f && (float)(int)value == value; }

        // OBS_DTYPE_MISMATCH naming the row of the first value of a byte box that is not an integer 0-255.
        static void CheckByteValues(List<float> obs, int width)
        {
            for (int i = 0; i < obs.Count; ++i)
            {
                if (!IsByteValue(obs[i]))
                {
                    throw new TetherException(ErrorCode.ObsDtypeMismatch, "\"obs\"[" + (width > 0 ? i / width : 0) + "] holds " +
                                              obs[i].ToString("R", CultureInfo.InvariantCulture) + ", not an integer in [0, 255] (the space is a uint8 Box)");
                }
            }
        }

        internal static void CheckSize(string field, int got, int expected)
        {
            if (got != expected) throw new TetherException(ErrorCode.InvalidArgument, "\"" + field + "\" has " + got + " numbers, expected " + expected);
        }

        // The shortest decimal that reads back as the same float32 ("0.1", not "0.10000000149011612").
        internal static JToken FloatJson(float value)
        {
            if (float.IsNaN(value) || float.IsInfinity(value)) return new JValue((double)value);
            return new JValue(double.Parse(Float32Text.Of(value), CultureInfo.InvariantCulture));  // (the record writer's text)
        }

        static JToken Number(double value, bool integer, bool asFloat32)
        {
            if (integer) return new JValue((long)Math.Round(value));
            return asFloat32 ? FloatJson((float)value) : new JValue(value);
        }

        static JToken Nest(IList<double> data, int at, long[] shape, int dim, bool integer, bool asFloat32)
        {
            if (dim == shape.Length) return Number(data[at], integer, asFloat32);
            int stride = 1;
            for (int d = dim + 1; d < shape.Length; ++d) stride *= (int)shape[d];
            var array = new JArray();
            for (int i = 0; i < shape[dim]; ++i) array.Add(Nest(data, at + i * stride, shape, dim + 1, integer, asFloat32));
            return array;
        }

        // A Dict or Tuple's observations (1.4, §10.1): an object of leaf path -> that leaf's rows.
        static JObject LeafRows(List<float> flat, int rows, Space space)
        {
            var members = new JObject();
            int width = space.FlatDim;
            foreach (SpaceLeaf leaf in space.Leaves)
            {
                var values = new List<double>(rows * leaf.Size);
                for (int r = 0; r < rows; ++r)
                {
                    for (int i = 0; i < leaf.Size; ++i) values.Add(flat[r * width + leaf.Offset + i]);
                }
                members[leaf.Path] = Rows(values, rows, leaf.Space.Shape, leaf.IsBytes, true);
            }
            return members;
        }

        static JArray Rows(IList<double> flat, int rows, long[] shape, bool integer, bool asFloat32)
        {
            int width = 1;
            foreach (long d in shape) width *= (int)d;
            var array = new JArray();
            for (int r = 0; r < rows; ++r) array.Add(Nest(flat, r * width, shape, 0, integer, asFloat32));
            return array;
        }

        /// <summary>
        /// Checks an EPISODES message's records as a server does; the env steps
        /// they hold. Throws the refusal's code (INVALID_FIELD, EPISODE_LENGTH_MISMATCH,
        /// OBS_SHAPE_MISMATCH, NON_FINITE_VALUE, ACTION_OUT_OF_SPACE, MISSING_ACTION_LOGP;
        /// protocol 1.4: INVALID_TENSOR and OBS_DTYPE_MISMATCH). A record's obs may be one tensor
        /// object (§10.9) whose offset refers to <paramref name="attachment"/>, the message's
        /// binary attachment (<see cref="Message.Attachment"/>; null when it had none). For a Dict or Tuple
        /// observation space (protocol 1.4) obs holds one member per leaf (check 4c: INVALID_FIELD,
        /// OBS_LEAF_MISMATCH, EPISODE_LENGTH_MISMATCH and the codes of checks 4, 10, 11, 11b), and with
        /// <paramref name="actionMask"/> the masks are checked (14b-14d: INVALID_ACTION_MASK,
        /// ACTION_MASK_EMPTY, ACTION_MASKED). Protocol 1.6: a record's logged_runs (checks 20a, 20b:
        /// INVALID_FIELD, EPISODE_LENGTH_MISMATCH).
        /// </summary>
        public static int ValidateEpisodes(JObject message, Space observationSpace, Space actionSpace, bool requireLogp, byte[] attachment = null,
                                           ActionMask actionMask = null)
        {
            var records = message["episodes"] as JArray;
            if (records == null) throw new TetherException(ErrorCode.InvalidField, "\"episodes\" must be a list of episode records");
            int total = 0;
            for (int i = 0; i < records.Count; ++i)
            {
                int rows;
                total += ValidateChunk(records[i], "episodes[" + i + "]", observationSpace, actionSpace, requireLogp, attachment, actionMask, out rows);
            }
            return total;
        }

        /// <summary>
        /// Checks one multi-agent record (§10.8, pass 1) against the modules; the agent steps it holds.
        /// An entry's obs may be one tensor object (§10.9) whose offset refers to <paramref name="attachment"/>,
        /// the message's binary attachment (null when it had none).
        /// </summary>
        public static int ValidateMultiAgentRecord(JToken record, int index, IDictionary<string, ModuleSpec> modules, bool requireLogp, byte[] attachment = null)
        {
            string where = "episodes[" + index + "]";
            var agents = record is JObject ? record["agents"] as JObject : null;
            if (agents == null) throw Fail(ErrorCode.InvalidField, where, "\"agents\" must be an object keyed by agent id");
            foreach (string key in new[] { "is_terminated", "is_truncated" })
            {
                JToken value = record[key];
                if (value != null && value.Type != JTokenType.Boolean) throw Fail(ErrorCode.InvalidField, where, "\"" + key + "\" must be true or false");
            }
            int agentSteps = 0;
            foreach (JProperty item in agents.Properties())
            {
                string agentWhere = where + ".agents['" + item.Name + "']";
                var entry = item.Value as JObject;
                if (entry == null) throw Fail(ErrorCode.InvalidField, agentWhere, "must be an object");
                JToken module = entry["module"];
                ModuleSpec spec = null;
                if (module == null || module.Type != JTokenType.String || !modules.TryGetValue((string)module, out spec))
                {
                    throw Fail(ErrorCode.UnknownModule, agentWhere, "module " + (module == null ? "None" : module.ToString(Newtonsoft.Json.Formatting.None)) + " does not exist");
                }
                int obsRows;
                int steps = ValidateChunk(entry, agentWhere, spec.ObservationSpace, spec.ActionSpace, requireLogp, attachment, spec.ActionMask, out obsRows);
                int v = spec.ValueObsDim;
                if (v > 0)
                {
                    NdArray rows = null;
                    JToken valueObs = entry["value_obs"];
                    bool rectangular = valueObs is JArray && ToArray(valueObs, true, out rows) == ArrayError.None;
                    if (!rectangular || rows.Shape.Count != 2 || rows.Shape[0] != obsRows || rows.Shape[1] != v)
                    {
                        throw Fail(ErrorCode.ObsShapeMismatch, agentWhere, "module '" + spec.ModuleId + "' has a centralized critic: \"value_obs\" must be " +
                                   obsRows + " rows of " + v + " numbers");
                    }
                    if (rows.Data.Any(x => double.IsNaN(x) || double.IsInfinity(x))) throw Fail(ErrorCode.NonFiniteValue, agentWhere, "value_obs is not finite");
                }
                JToken start = entry["start_step"];
                if (start != null && (start.Type != JTokenType.Integer || Space.AsInt64(start) < 0))
                {
                    throw Fail(ErrorCode.InvalidField, agentWhere, "start_step must be an integer >= 0");
                }
                agentSteps += steps;
            }
            return agentSteps;
        }

        /// <summary>
        /// A centralized critic's row (§9.7): the latest observation of each of
        /// <paramref name="agents"/>, in order, zeros for one not observed yet.
        /// </summary>
        public static void ValueObsRow(IList<string> agents, IDictionary<string, float[]> latestObs, int obsDim, float[] output, int offset)
        {
            for (int i = 0; i < agents.Count; ++i)
            {
                float[] obs;
                int at = offset + i * obsDim;
                if (!latestObs.TryGetValue(agents[i], out obs))
                {
                    Array.Clear(output, at, obsDim);
                    continue;
                }
                if (obs.Length != obsDim)
                {
                    throw new TetherException(ErrorCode.InvalidArgument, "agent '" + agents[i] + "' has an observation of " + obs.Length + " numbers, expected " + obsDim);
                }
                Array.Copy(obs, 0, output, at, obsDim);
            }
        }

        // ---- validation, as numpy reads the arrays ------------------------------------------

        sealed class NdArray
        {
            public List<int> Shape = new List<int>();
            public List<double> Data = new List<double>();
        }

        enum ArrayError { None, Ragged, NotNumber }

        const int MaxDims = 32;

        static bool ShapeOf(JToken value, int depth, List<int> shape)
        {
            shape.Clear();
            var array = value as JArray;
            if (array == null) return true;
            if (depth >= MaxDims) return false;
            shape.Add(array.Count);
            if (array.Count == 0) return true;
            var first = new List<int>();
            var other = new List<int>();
            if (!ShapeOf(array[0], depth + 1, first)) return false;
            for (int i = 1; i < array.Count; ++i)
            {
                if (!ShapeOf(array[i], depth + 1, other) || !other.SequenceEqual(first)) return false;
            }
            shape.AddRange(first);
            return true;
        }

        static bool Flatten(JToken value, List<double> output)
        {
            switch (value.Type)
            {
                case JTokenType.Array:
                    foreach (JToken item in (JArray)value)
                    {
                        if (!Flatten(item, output)) return false;
                    }
                    return true;
                case JTokenType.Integer:
                case JTokenType.Float:
                    output.Add((double)value);
                    return true;
                case JTokenType.Null:  // NaN: refused later as non-finite (booleans and strings are no numbers, §10.5)
                    output.Add(double.NaN);
                    return true;
                default:
                    return false;
            }
        }

        static ArrayError ToArray(JToken value, bool asFloat32, out NdArray array)
        {
            array = new NdArray();
            if (!ShapeOf(value, 0, array.Shape)) return ArrayError.Ragged;
            if (!Flatten(value, array.Data)) return ArrayError.NotNumber;
            if (asFloat32)
            {
                for (int i = 0; i < array.Data.Count; ++i) array.Data[i] = (float)array.Data[i];
            }
            return ArrayError.None;
        }

        static TetherException Fail(ErrorCode code, string where, string text) { return new TetherException(code, where + ": " + text); }

        static NdArray Numeric(JToken value, bool asFloat32, string where, string key)
        {
            if (!(value is JArray)) throw Fail(ErrorCode.InvalidField, where, "\"" + key + "\" must be a list, got " + Messages.Describe(value));
            NdArray array;
            switch (ToArray(value, asFloat32, out array))
            {
                case ArrayError.Ragged:
                    throw Fail(key.StartsWith("obs", StringComparison.Ordinal) ? ErrorCode.ObsShapeMismatch : ErrorCode.InvalidField, where, "\"" + key + "\" items do not all have the same shape");
                case ArrayError.NotNumber:
                    throw Fail(ErrorCode.InvalidField, where, "\"" + key + "\" must hold only numbers");
            }
            return array;
        }

        static void CheckFinite(NdArray array, string where, string key)
        {
            int rows = array.Shape.Count == 0 ? 1 : array.Shape[0];
            int width = rows == 0 ? 1 : array.Data.Count / rows;
            for (int i = 0; i < array.Data.Count; ++i)
            {
                double x = array.Data[i];
                if (double.IsNaN(x) || double.IsInfinity(x))
                {
                    throw Fail(ErrorCode.NonFiniteValue, where, "\"" + key + "\"[" + (width != 0 ? i / width : 0) + "] is NaN or infinite");
                }
            }
        }

        static string ShapeText(List<int> shape, int from)
        {
            return "[" + string.Join(", ", shape.Skip(from).Select(d => d.ToString(CultureInfo.InvariantCulture)).ToArray()) + "]";
        }

        static bool TailMatches(List<int> shape, long[] spaceShape)
        {
            if (shape.Count != spaceShape.Length + 1) return false;
            for (int i = 0; i < spaceShape.Length; ++i)
            {
                if (shape[i + 1] != spaceShape[i]) return false;
            }
            return true;
        }

        // A record's obs (check 4 of §10.6): nested lists of numbers, or (1.4) one tensor object of the
        // space's element type, uint8 for a byte box and float32 for every other space.
        static NdArray Observations(JToken value, Space observationSpace, byte[] attachment, string where, out bool fromTensor, string key = "obs")
        {
            fromTensor = Tensors.IsTensor(value);
            if (!fromTensor) return Numeric(value, true, where, key);
            Tensor tensor;
            try
            {
                tensor = Tensors.Decode(value, attachment);
            }
            catch (TetherException e)
            {
                throw Fail(e.Code, where, "\"" + key + "\": " + e.Detail);
            }
            string wanted = observationSpace.IsBytes ? Tensors.Uint8 : Tensors.Float32;
            if (tensor.Dtype != wanted)
            {
                throw Fail(ErrorCode.ObsDtypeMismatch, where, "\"" + key + "\" is a " + tensor.Dtype + " tensor; the observation space takes " + wanted);
            }
            var array = new NdArray();
            foreach (long d in tensor.Shape) array.Shape.Add((int)d);
            array.Data.Capacity = tensor.Count;
            for (int i = 0; i < tensor.Count; ++i) array.Data.Add(tensor[i]);
            return array;
        }

        // Check 11b of §10.6: a byte box's observations written as JSON numbers are integers 0-255 (7.0 is 7).
        static void CheckBytes(NdArray obs, string where, string key = "obs")
        {
            int rows = obs.Shape[0];
            int width = rows == 0 ? 1 : obs.Data.Count / rows;
            for (int i = 0; i < obs.Data.Count; ++i)
            {
                double x = obs.Data[i];
                if (x < 0 || x > 255 || x != Math.Floor(x))
                {
                    throw Fail(ErrorCode.ObsDtypeMismatch, where, "\"" + key + "\"[" + (width != 0 ? i / width : 0) +
                               "] holds a value that is not an integer in [0, 255] (the space is a uint8 Box)");
                }
            }
        }

        // Check 4c of §10.6 (1.4): a Dict or Tuple's obs, one member per leaf path, checked leaf by leaf in
        // leaf order (checks 4, 10, 11, 11b for each); the observations as flat rows [rows, flat_dim].
        static NdArray CompositeObservations(JToken value, Space space, byte[] attachment, string where)
        {
            var members = value as JObject;
            if (members == null) throw Fail(ErrorCode.InvalidField, where, "\"obs\" of a " + space.Kind + " space must be an object of leaf path -> observations, got " + Messages.Describe(value));
            foreach (SpaceLeaf leaf in space.Leaves)
            {
                if (members[leaf.Path] == null) throw Fail(ErrorCode.ObsLeafMismatch, where, "\"obs\" has no member for the leaf '" + leaf.Path + "'");
            }
            foreach (JProperty member in members.Properties())
            {
                if (space.LeafIndex(member.Name) < 0) throw Fail(ErrorCode.ObsLeafMismatch, where, "\"obs\" has a member '" + member.Name + "' that is no leaf's path");
            }
            int width = space.FlatDim, rows = -1;
            var flat = new NdArray();
            foreach (SpaceLeaf leaf in space.Leaves)
            {
                string key = "obs." + leaf.Path;
                bool fromTensor;
                NdArray part = Observations(members[leaf.Path], leaf.Space, attachment, where, out fromTensor, key);
                int count = part.Shape.Count == 0 ? 0 : part.Shape[0];
                if (rows < 0)
                {
                    rows = count;
                    flat.Shape.Add(rows);
                    flat.Shape.Add(width);
                    for (int i = 0; i < rows * width; ++i) flat.Data.Add(0);
                }
                else if (count != rows)
                {
                    throw Fail(ErrorCode.EpisodeLengthMismatch, where, "\"" + key + "\" holds " + count + " observations, \"obs." + space.Leaves[0].Path + "\" " + rows);
                }
                if (!TailMatches(part.Shape, leaf.Space.Shape))
                {
                    throw Fail(ErrorCode.ObsShapeMismatch, where, "\"" + key + "\" has observations of shape " + ShapeText(part.Shape, 1) + ", the leaf's is [" +
                               string.Join(", ", leaf.Space.Shape.Select(d => d.ToString(CultureInfo.InvariantCulture)).ToArray()) + "]");
                }
                CheckFinite(part, where, key);
                if (leaf.IsBytes && !fromTensor) CheckBytes(part, where, key);
                for (int r = 0; r < rows; ++r)
                {
                    for (int i = 0; i < leaf.Size; ++i) flat.Data[r * width + leaf.Offset + i] = part.Data[r * leaf.Size + i];
                }
            }
            return flat;
        }

        // Checks 14b-14d of §10.6 (1.4): every mask holds only 0 and 1, each observation acted on allows an
        // action, and each action is allowed by its observation's mask.
        static void CheckMasks(ActionMask mask, NdArray obs, NdArray actions, int steps, int obsWidth, int actWidth, string where)
        {
            for (int t = 0; t <= steps; ++t) mask.CheckValues(obs.Data, t * obsWidth + mask.Offset, where + ": obs[" + t + "]");
            for (int t = 0; t < steps; ++t) mask.Check(obs.Data, t * obsWidth + mask.Offset, where + ": obs[" + t + "]");
            for (int t = 0; t < steps; ++t)
            {
                if (!mask.Allows(obs.Data, t * obsWidth + mask.Offset, actions.Data, t * actWidth))
                {
                    throw Fail(ErrorCode.ActionMasked, where, "actions[" + t + "] is forbidden by the action mask '" + mask.Leaf + "' of obs[" + t + "]");
                }
            }
        }

        static int ValidateChunk(JToken recordToken, string where, Space observationSpace, Space actionSpace, bool requireLogp, byte[] attachment,
                                 ActionMask actionMask, out int obsRows)
        {
            var record = recordToken as JObject;
            if (record == null) throw Fail(ErrorCode.InvalidField, where, "an episode must be a JSON object");
            foreach (string key in new[] { "obs", "actions", "rewards" })
            {
                if (record[key] == null) throw Fail(ErrorCode.InvalidField, where, "missing \"" + key + "\"");
            }
            foreach (string key in new[] { "is_terminated", "is_truncated" })
            {
                JToken value = record[key];
                if (value == null || value.Type != JTokenType.Boolean)
                {
                    throw Fail(ErrorCode.InvalidField, where, "\"" + key + "\" must be true or false, got " + (value == null ? "None" : value.ToString(Newtonsoft.Json.Formatting.None)));
                }
            }
            bool boxActions = actionSpace.Kind == SpaceKind.Box;
            bool obsTensor = false;
            NdArray obs = observationSpace.IsComposite ? CompositeObservations(record["obs"], observationSpace, attachment, where)
                                                       : Observations(record["obs"], observationSpace, attachment, where, out obsTensor);
            NdArray actions = Numeric(record["actions"], boxActions, where, "actions");
            NdArray rewards = Numeric(record["rewards"], true, where, "rewards");
            int steps = rewards.Shape[0];
            if (steps < 1) throw Fail(ErrorCode.EpisodeLengthMismatch, where, "an episode chunk needs at least one step");
            if (obs.Shape[0] != steps + 1 || actions.Shape[0] != steps)
            {
                throw Fail(ErrorCode.EpisodeLengthMismatch, where, "needs len(obs) == len(actions) + 1 == len(rewards) + 1, got obs=" + obs.Shape[0] +
                           ", actions=" + actions.Shape[0] + ", rewards=" + steps);
            }
            if (rewards.Shape.Count != 1) throw Fail(ErrorCode.InvalidField, where, "\"rewards\" must be a flat list of numbers");
            if (!TailMatches(obs.Shape, observationSpace.Shape))
            {
                throw Fail(ErrorCode.ObsShapeMismatch, where, "observation shape " + ShapeText(obs.Shape, 1) + " does not match the space's [" +
                           string.Join(", ", observationSpace.Shape.Select(d => d.ToString(CultureInfo.InvariantCulture)).ToArray()) + "]");
            }
            CheckFinite(obs, where, "obs");
            CheckFinite(rewards, where, "rewards");
            if (observationSpace.IsBytes && !obsTensor) CheckBytes(obs, where);
            if (!TailMatches(actions.Shape, actionSpace.Shape))
            {
                throw Fail(ErrorCode.ActionOutOfSpace, where, "action shape " + ShapeText(actions.Shape, 1) + " does not match the action space");
            }
            CheckFinite(actions, where, "actions");
            // A Box action is the raw Gaussian sample (1.3, §11.4): any finite value is
            // valid, the engine executed it clipped. Discrete values must be in the space.
            if (!boxActions)
            {
                int width = actionSpace.FlatDim;
                double[] data = actions.Data.ToArray();
                for (int t = 0; t < steps; ++t)
                {
                    if (!actionSpace.Contains(data, t * width, width))
                    {
                        throw Fail(ErrorCode.ActionOutOfSpace, where, "actions[" + t + "] is outside the action space " + actionSpace.ToJson().ToString(Newtonsoft.Json.Formatting.None));
                    }
                }
            }
            if (actionMask != null) CheckMasks(actionMask, obs, actions, steps, observationSpace.FlatDim, actionSpace.FlatDim, where);
            if (record["action_logp"] != null)
            {
                NdArray logp = Numeric(record["action_logp"], true, where, "action_logp");
                if (logp.Shape.Count != 1 || logp.Shape[0] != steps)
                {
                    throw Fail(ErrorCode.EpisodeLengthMismatch, where, "action_logp has " + logp.Shape[0] + " items, expected " + steps);
                }
                CheckFinite(logp, where, "action_logp");
            }
            else if (requireLogp)
            {
                throw Fail(ErrorCode.MissingActionLogp, where, "on-policy training needs \"action_logp\" for every step");
            }
            if (record["action_dist_inputs"] != null)
            {
                NdArray inputs = Numeric(record["action_dist_inputs"], true, where, "action_dist_inputs");
                if (inputs.Shape.Count != 2 || inputs.Shape[0] != steps || inputs.Shape[1] != actionSpace.DistInputsSize)
                {
                    throw Fail(ErrorCode.EpisodeLengthMismatch, where, "action_dist_inputs has shape " + ShapeText(inputs.Shape, 0) + ", expected [" +
                               steps + ", " + actionSpace.DistInputsSize + "]");
                }
                CheckFinite(inputs, where, "action_dist_inputs");
            }
            JToken episodeId = record["episode_id"];
            if (episodeId != null && episodeId.Type != JTokenType.Null && episodeId.Type != JTokenType.String && episodeId.Type != JTokenType.Integer)
            {
                throw Fail(ErrorCode.InvalidField, where, "\"episode_id\" must be a string");
            }
            // 1.3: checks 18a and 18b; 1.6: 20a and 20b, after every other check of the chunk.
            VersionRuns.Validate(record[VersionRuns.Field], steps, where);
            LoggedRuns.Validate(record[LoggedRuns.Field], steps, where);
            obsRows = obs.Shape[0];
            return steps;
        }
    }
}
