// Demonstration files (docs/protocol.md §18, protocol 1.6): whole recorded episodes as JSON Lines,
// one line per agent episode written as it ends, so that a crash loses only the episodes still running.
using System;
using System.Collections.Generic;
using System.IO;
using System.Text;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>
    /// Writes a demonstration file (§18): a header line naming every module's spaces, then one line per
    /// agent episode — its observations, actions, rewards, flags and <c>logged_runs</c> — appended and
    /// flushed as the episode ends. Give it each step of each actor (agent or group) of each episode
    /// with <see cref="Step"/>, its rewards with <see cref="AddReward"/>, its end with <see cref="End"/>;
    /// <see cref="Dispose"/> writes the episodes still running as truncated and closes the file. A
    /// server trains from such a file (behavioural cloning, §13.7). The clients write one while they
    /// play when <c>ClientOptions.DemoPath</c> is set. Not thread-safe.
    /// </summary>
    public sealed class DemoWriter : IDisposable
    {
        /// <summary>The header's <c>format</c>.</summary>
        public const string Format = "tether-demonstrations";
        /// <summary>The header's <c>version</c>.</summary>
        public const int Version = 1;
        /// <summary>The module id of a single-agent client's episodes.</summary>
        public const string DefaultModule = "default_policy";
        /// <summary>The agent id of a single-agent client's episodes.</summary>
        public const string DefaultAgent = "default_agent";

        // One actor's episode so far: its steps' observations (T rows while it runs), actions, rewards and flags.
        sealed class Running
        {
            public string EpisodeId, AgentId, ModuleId;
            public ModuleSpec Module;
            public readonly EpisodeChunk Steps = new EpisodeChunk();
        }

        struct ActorKey : IEquatable<ActorKey>
        {
            readonly string episodeId, agentId;

            public ActorKey(string episodeId, string agentId)
            {
                this.episodeId = episodeId;
                this.agentId = agentId;
            }

            public bool Equals(ActorKey other) { return episodeId == other.episodeId && agentId == other.agentId; }

            public override bool Equals(object other) { return other is ActorKey && Equals((ActorKey)other); }

            public override int GetHashCode() { return episodeId.GetHashCode() * 31 + agentId.GetHashCode(); }
        }

        readonly TextWriter output;
        readonly Dictionary<string, ModuleSpec> modules;
        readonly Dictionary<ActorKey, Running> running = new Dictionary<ActorKey, Running>();
        readonly List<Running> started = new List<Running>();  // the running episodes in the order they started
        readonly Stack<Running> spare = new Stack<Running>();
        readonly RecordWriter writer = new RecordWriter();
        bool closed;

        /// <summary>
        /// Creates (or overwrites) the file at <paramref name="path"/> and writes its header, naming
        /// <paramref name="modules"/> (module id → its observation space, action space and, if it has
        /// one, action mask). INVALID_ARGUMENT for no module or a module without both spaces; the
        /// file system's exception when the file cannot be created.
        /// </summary>
        public DemoWriter(string path, IDictionary<string, ModuleSpec> modules) : this(Checked(modules), path) { }

        /// <summary>
        /// A file of one module, <see cref="DefaultModule"/> (a single-agent game's): its episodes are
        /// those of agent <see cref="DefaultAgent"/> unless named otherwise.
        /// </summary>
        public DemoWriter(string path, Space observationSpace, Space actionSpace, ActionMask actionMask = null)
            : this(path, SingleModule(observationSpace, actionSpace, actionMask)) { }

        /// <summary>
        /// Writes the file to <paramref name="output"/> (which it closes when disposed), its header first.
        /// </summary>
        public DemoWriter(TextWriter output, IDictionary<string, ModuleSpec> modules)
        {
            this.modules = Checked(modules);
            this.output = output ?? throw new TetherException(ErrorCode.InvalidArgument, "DemoWriter: no output given");
            WriteLine(Header(this.modules).ToString(Newtonsoft.Json.Formatting.None));
        }

        DemoWriter(Dictionary<string, ModuleSpec> modules, string path)
        {
            this.modules = modules;
            if (string.IsNullOrEmpty(path)) throw new TetherException(ErrorCode.InvalidArgument, "DemoWriter: no file path given");
            output = new StreamWriter(new FileStream(path, FileMode.Create, FileAccess.Write, FileShare.Read), new UTF8Encoding(false));
            try
            {
                WriteLine(Header(modules).ToString(Newtonsoft.Json.Formatting.None));
            }
            catch
            {
                output.Dispose();
                throw;
            }
        }

        /// <summary>Agent episodes written so far.</summary>
        public int EpisodesWritten { get; private set; }

        /// <summary>Agent episodes with steps that have not ended yet.</summary>
        public int EpisodesRunning { get { return started.Count; } }

        /// <summary>
        /// The header of a file of <paramref name="modules"/> (§18): its format, version and each module's
        /// spaces in their JSON form (§8), with its action mask's leaf path when it has one.
        /// </summary>
        public static JObject Header(IDictionary<string, ModuleSpec> modules)
        {
            var entries = new JObject();
            foreach (KeyValuePair<string, ModuleSpec> module in modules)
            {
                var entry = new JObject { { "observation_space", module.Value.ObservationSpace.ToJson() }, { "action_space", module.Value.ActionSpace.ToJson() } };
                if (module.Value.ActionMask != null) entry["action_mask"] = module.Value.ActionMask.Leaf;
                entries[module.Key] = entry;
            }
            return new JObject { { "format", Format }, { "version", Version }, { "modules", entries } };
        }

        /// <summary>
        /// One step of actor <paramref name="agentId"/> (an agent, or a group with its joined observation
        /// and joint action) in episode <paramref name="episodeId"/>: its observation (the module's flat
        /// row: a Dict or Tuple space's leaves concatenated in leaf order, a byte box's values the
        /// integers 0-255) and the action taken on it (a Discrete's value, a Box's as taken: the raw
        /// sample, not clipped); <paramref name="logged"/>: the policy did not choose it (§10.1). The
        /// actor's first step starts its episode, in module <paramref name="module"/>. Refused, with
        /// nothing kept: an unknown module, another module than the actor's episode started in, or
        /// a wrong number of values (INVALID_ARGUMENT); an observation or action the server's reader
        /// would refuse (NON_FINITE_VALUE, OBS_DTYPE_MISMATCH, INVALID_ACTION_MASK, ACTION_MASK_EMPTY,
        /// ACTION_OUT_OF_SPACE, ACTION_MASKED).
        /// </summary>
        public void Step(string episodeId, string agentId, string module, float[] observation, double[] action, bool logged = false)
        {
            ModuleSpec spec = ModuleOf(module);
            if (observation == null || observation.Length != spec.ObsDim)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "DemoWriter.Step: the observation has " + (observation == null ? 0 : observation.Length) +
                                          " values, module '" + module + "' needs " + spec.ObsDim);
            }
            ObservationRows.Check(spec.ObservationSpace, spec.ActionMask, observation, 0, "DemoWriter.Step: the observation", true);
            LoggedActions.Check(spec.ActionSpace, spec.ActionMask, observation, 0, action, 0, action == null ? 0 : action.Length, "DemoWriter.Step: the action");
            StepRow(episodeId, agentId, module, observation, 0, action, 0, logged);
        }

        /// <summary>
        /// Adds <paramref name="reward"/> to the last step of the actor's running episode (rewards add up
        /// until its next step, in double as a record's do); ignored when it has taken no step (as in a
        /// record). NON_FINITE_VALUE, nothing added, for a reward that is not finite, or one that would take
        /// the step's reward to a magnitude of <see cref="EpisodeRecords.Float32Overflow"/> or more, not
        /// finite as float32 (§10.5, §18: the reader would refuse the line).
        /// </summary>
        public void AddReward(string episodeId, string agentId, double reward)
        {
            ThrowIfClosed();
            if (double.IsNaN(reward) || double.IsInfinity(reward)) throw new TetherException(ErrorCode.NonFiniteValue, "DemoWriter.AddReward: the reward is not finite");
            double sum;
            if (!AddRewardIfFits(episodeId, agentId, reward, out sum))
            {
                throw EpisodeRecords.StepRewardBeyondFloat32("DemoWriter.AddReward", "of '" + agentId + "' in episode '" + episodeId + "'", reward, sum);
            }
        }

        // AddReward for the clients (the reward finite): false, nothing added, for one that would take the
        // step's reward beyond float32 (the clients leave it out of the file, as every SDK does).
        internal bool AddRewardIfFits(string episodeId, string agentId, double reward)
        {
            double sum;
            return AddRewardIfFits(episodeId, agentId, reward, out sum);
        }

        bool AddRewardIfFits(string episodeId, string agentId, double reward, out double sum)
        {
            ThrowIfClosed();
            sum = reward;
            Running episode;
            if (episodeId == null || agentId == null || !running.TryGetValue(new ActorKey(episodeId, agentId), out episode)) return true;
            List<double> rewards = episode.Steps.Rewards;
            sum = rewards[rewards.Count - 1] + reward;
            if (!EpisodeRecords.StepRewardFits(sum)) return false;
            rewards[rewards.Count - 1] = sum;
            return true;
        }

        /// <summary>
        /// Ends the actor's episode with its final observation: <paramref name="terminated"/>, it reached
        /// a terminal state, else it was cut off (is_truncated). Writes its line and flushes the file;
        /// returns whether it did (false: the actor took no step, nothing is written). The observation is
        /// refused as in <see cref="Step"/> (its mask is not checked: no action follows it), the episode
        /// going on; the file system's exception when the line cannot be written.
        /// </summary>
        public bool End(string episodeId, string agentId, float[] finalObservation, bool terminated)
        {
            ThrowIfClosed();
            Running episode;
            if (episodeId == null || agentId == null || !running.TryGetValue(new ActorKey(episodeId, agentId), out episode)) return false;
            ModuleSpec spec = episode.Module;
            if (finalObservation == null || finalObservation.Length != spec.ObsDim)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "DemoWriter.End: the final observation has " + (finalObservation == null ? 0 : finalObservation.Length) +
                                          " values, module '" + episode.ModuleId + "' needs " + spec.ObsDim);
            }
            ObservationRows.Check(spec.ObservationSpace, null, finalObservation, 0, "DemoWriter.End: the final observation", false);
            return EndRow(episodeId, agentId, finalObservation, 0, terminated);
        }

        /// <summary>Writes the episodes still running, each as truncated, and closes the file (see <see cref="Close"/>).</summary>
        public void Dispose() { Close(); }

        /// <summary>
        /// Writes the episodes still running, in the order they started, each as truncated (§18) at its
        /// last complete step: the observation its last action was taken on closes it and that action is
        /// left out, since no observation followed it (an episode of one step is then not written); then
        /// closes the file. Later calls do nothing.
        /// </summary>
        public void Close()
        {
            if (closed) return;
            closed = true;
            try
            {
                foreach (Running episode in started)
                {
                    EpisodeChunk steps = episode.Steps;
                    int t = steps.Steps;
                    if (t < 2) continue;
                    int actDim = episode.Module.ActionSpace.FlatDim;
                    steps.Actions.RemoveRange((t - 1) * actDim, actDim);
                    steps.Rewards.RemoveAt(t - 1);
                    steps.Logged.RemoveAt(t - 1);
                    steps.IsTerminated = false;
                    steps.IsTruncated = true;
                    WriteEpisode(episode);
                }
            }
            finally
            {
                running.Clear();
                started.Clear();
                output.Dispose();
            }
        }

        // ---- for the clients (their values already checked) ---------------------------------------

        // Step with the observation at obs[obsAt...] and the action at action[actionAt...] (the module's sizes).
        internal void StepRow(string episodeId, string agentId, string module, float[] obs, int obsAt, double[] action, int actionAt, bool logged)
        {
            ThrowIfClosed();
            if (episodeId == null || agentId == null) throw new TetherException(ErrorCode.InvalidArgument, "DemoWriter.Step: an episode or agent id is null");
            ModuleSpec spec = ModuleOf(module);
            var key = new ActorKey(episodeId, agentId);
            Running episode;
            if (!running.TryGetValue(key, out episode))
            {
                episode = spare.Count > 0 ? spare.Pop() : new Running();
                episode.EpisodeId = episodeId;
                episode.AgentId = agentId;
                episode.ModuleId = module;
                episode.Module = spec;
                episode.Steps.Clear();
                running.Add(key, episode);
                started.Add(episode);
            }
            else if (episode.ModuleId != module)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "DemoWriter.Step: '" + agentId + "' acts with module '" + episode.ModuleId +
                                          "' in episode '" + episodeId + "', not '" + module + "'");
            }
            EpisodeChunk steps = episode.Steps;
            int obsDim = spec.ObsDim, actDim = spec.ActionSpace.FlatDim;
            for (int j = 0; j < obsDim; ++j) steps.Obs.Add(obs[obsAt + j]);
            for (int j = 0; j < actDim; ++j) steps.Actions.Add(action[actionAt + j]);
            steps.Rewards.Add(0);
            steps.Logged.Add(logged);
        }

        // End with the final observation at obs[obsAt...].
        internal bool EndRow(string episodeId, string agentId, float[] obs, int obsAt, bool terminated)
        {
            ThrowIfClosed();
            Running episode;
            var key = new ActorKey(episodeId, agentId);
            if (episodeId == null || agentId == null || !running.TryGetValue(key, out episode)) return false;
            running.Remove(key);
            started.Remove(episode);
            EpisodeChunk steps = episode.Steps;
            for (int j = 0, n = episode.Module.ObsDim; j < n; ++j) steps.Obs.Add(obs[obsAt + j]);
            steps.IsTerminated = terminated;
            steps.IsTruncated = !terminated;
            try
            {
                WriteEpisode(episode);
            }
            finally
            {
                spare.Push(episode);
            }
            return true;
        }

        // ---- writing ---------------------------------------------------------------------------------

        void WriteEpisode(Running episode)
        {
            ModuleSpec spec = episode.Module;
            EpisodeChunk steps = episode.Steps;
            if (!LoggedRuns.Any(steps.Logged, steps.Logged.Count)) steps.Logged.Clear();  // (no logged_runs: every step sampled)
            WriteLine(writer.DemoLine(episode.ModuleId, episode.AgentId, episode.EpisodeId, steps, spec.ObservationSpace, spec.ActionSpace));
            ++EpisodesWritten;
        }

        void WriteLine(string line)
        {
            output.Write(line);
            output.Write('\n');
            output.Flush();
        }

        ModuleSpec ModuleOf(string module)
        {
            ThrowIfClosed();
            ModuleSpec spec;
            if (module == null || !modules.TryGetValue(module, out spec))
            {
                throw new TetherException(ErrorCode.InvalidArgument, "DemoWriter: module '" + module + "' is not one of the file's (" +
                                          string.Join(", ", new List<string>(modules.Keys).ToArray()) + ")");
            }
            return spec;
        }

        void ThrowIfClosed()
        {
            if (closed) throw new TetherException(ErrorCode.Closed, "the DemoWriter was closed");
        }

        static Dictionary<string, ModuleSpec> Checked(IDictionary<string, ModuleSpec> modules)
        {
            if (modules == null || modules.Count == 0) throw new TetherException(ErrorCode.InvalidArgument, "DemoWriter: a demonstration file needs at least one module");
            var copy = new Dictionary<string, ModuleSpec>();
            foreach (KeyValuePair<string, ModuleSpec> module in modules)
            {
                ModuleSpec spec = module.Value;
                if (module.Key == null || spec == null || spec.ObservationSpace == null || spec.ActionSpace == null || spec.ActionSpace.IsComposite)
                {
                    throw new TetherException(ErrorCode.InvalidArgument, "DemoWriter: module '" + module.Key + "' needs an observation space and a Box, Discrete or MultiDiscrete action space");
                }
                copy[module.Key] = spec;
            }
            return copy;
        }

        static Dictionary<string, ModuleSpec> SingleModule(Space observationSpace, Space actionSpace, ActionMask actionMask)
        {
            return new Dictionary<string, ModuleSpec>
            {
                { DefaultModule, new ModuleSpec { ModuleId = DefaultModule, ObservationSpace = observationSpace, ActionSpace = actionSpace, ActionMask = actionMask } },
            };
        }
    }
}
