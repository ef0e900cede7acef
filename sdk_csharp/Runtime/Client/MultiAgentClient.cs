// The multi-agent client: many agents, several modules, one connection (the C#
// counterpart of sdk_python's MultiAgentClient and sdk_cpp's MultiAgentClient).
using System;
using System.Collections.Generic;
using Newtonsoft.Json.Linq;
using Tether.Inference;
using Tether.Protocol;
using Tether.Sampling;

namespace Tether.Client
{
    /// <summary>
    /// Acts for every agent of a multi-agent game with one inference run per
    /// module per frame, on the calling thread, and sends what they did in
    /// multi-agent records (§10.7) from a background I/O thread.
    /// <code>
    /// var client = MultiAgentClient.Connect(new ClientOptions { Port = 5555 });
    /// string episode = client.StartEpisode();
    /// var frame = new AgentFrame();                // reuse it, frame after frame
    /// frame.Clear();
    /// frame.Add("red_0", obs0);                    // the agents acting now (group members included)
    /// frame.Add("blue_0", obs1);
    /// client.GetActions(episode, frame);           // one inference run per module
    /// double a0 = frame.Action(0);
    /// client.LogReturns(episode, "red_0", 1.0);
    /// var returns = client.EndEpisode(episode);    // per actor (agent or group)
    /// </code>
    /// Mapping: a new agent (or group) is mapped to its module when it first acts,
    /// locally with SET_CONFIG's policy_mapping rules (§9.3), or, when the server
    /// maps with a function ("policy_mapping": null), with one MAP_AGENTS per frame
    /// in which new agents appear: the only network wait of GetActions besides
    /// strict on-policy waiting, bounded by ResponseTimeoutSeconds.
    /// Groups (§9.6) are hidden from the game: it puts the members in the frame;
    /// the client joins their observations in member order, acts once for the
    /// group and gives each member its equal part of the group's action. A
    /// member's reward goes to the group (divided by the member count for
    /// "mean"). A group leaves as a whole.
    /// Agents join at any frame and act at their own rates; hierarchical
    /// sub-agents are agents too (RetireAgent ends one). An agent that left cannot
    /// act again in that episode.
    /// Errors: a refusal of an earlier batch, a failed model load or a lost
    /// connection's timeout is raised once, at the start of a later call, which
    /// then did nothing; once the link gave up for good every call throws
    /// <see cref="ClientBase.FatalError"/>.
    /// When the server's run is done (ERROR TRAINING_DONE, §6.6) <see cref="ClientBase.TrainingDone"/>
    /// holds its summary: no error is raised, nothing is reconnected, recorded or sent any
    /// more, and the agents go on acting with the last models.
    /// Not thread-safe: call it from one thread (the game's).
    /// </summary>
    public sealed class MultiAgentClient : ClientBase
    {
        sealed class Module
        {
            public string Id;
            public ModuleSpec Spec;
            public IInferenceBackend Backend;
            public long? Seq;
            public int SeqConnection;  // the connection Seq was learned on
            public bool Gone;          // the last SET_CONFIG does not describe it (its actors keep it, without a model)
            public int ObsDim, ActDim, DistDim, ValueDim;
            public int StateDim;  // protocol 1.5: its recurrent state's width (0: a model without memory)
            // Frame scratch: the rows of the actors acting with this module now.
            public float[] BatchObs = new float[0];
            public float[] StateIn = new float[0];   // (1.5) the acting actors' states, stacked row by row
            public float[] StateOut = new float[0];  // ... and the states the model returned
            public float[] Dist = new float[0];
            public double[] RecordActions = new double[0];
            public double[] EnvActions = new double[0];
            public double[] Logp = new double[0];
            public bool[] LoggedRows = new bool[0];  // (1.6) the frame's rows whose actions are logged, when AnyLogged
            public bool AnyLogged;
            public int Rows;
            public bool InFrame;
            // The cut: the oldest version (of the earliest connection) the batch's steps used (§7.6).
            public bool HasOldest;
            public long OldestSeq;
            public int OldestConnection;
            // The steps recorded since the last cut (its actors' rows), and during a cut the table
            // going with the batch (CutUsed: an entry reads it).
            public StepTable Table;
            public StepTable CutTable;
            public bool CutUsed;
            public int FrameBase;  // the frame's first row in Table, -1 before it has one

            public void SetSpec(ModuleSpec spec)
            {
                Spec = spec;
                ObsDim = spec.ObsDim;
                ActDim = spec.ActionSpace.FlatDim;
                DistDim = spec.ActionSpace.DistInputsSize;
                ValueDim = spec.ValueObsDim;
                StateDim = spec.RecurrentState == null ? 0 : spec.RecurrentState.Width;
            }

            public void EnsureRows(int rows)
            {
                if (BatchObs.Length >= rows * ObsDim && Logp.Length >= rows && StateIn.Length >= rows * StateDim) return;
                int capacity = Math.Max(rows, 2 * Logp.Length);
                BatchObs = new float[capacity * ObsDim];
                StateIn = new float[capacity * StateDim];
                StateOut = new float[capacity * StateDim];
                Dist = new float[capacity * DistDim];
                RecordActions = new double[capacity * ActDim];
                EnvActions = new double[capacity * ActDim];
                Logp = new double[capacity];
                LoggedRows = new bool[capacity];
            }
        }

        sealed class Actor
        {
            public string Id;
            public Module Module;
            public bool IsGroup;
            public long StartStep;
            public bool Training;
            public long FrameMark;
            public bool SharedLatest;                 // a centralized critic sees it
            public float[] Latest = new float[0];     // latest observation when not training: LatestCount values
            public int LatestCount;
            // Its steps not cut yet: Rows[i] is observation i's row in Module.Table, whose action
            // (for i < ActionRows) is in the same row; the last action waits for the next
            // observation (§10.7), and the final observation has no action.
            public int[] Rows = new int[0];
            public int ObsRows, ActionRows;
            public int Slot;  // its slot in the episode's ActorBySlot (when ActorBySlot[Slot] is this actor)
            public double RewardSum;
            public bool Rewarded, Terminated, Truncated;
            // Protocol 1.5, a module with memory (§12.4): the state its next step starts from (zeros while StateFresh).
            public float[] State = new float[0];
            public bool StateFresh = true;

            // The state the next step starts from, of `width` values: zeros at the actor's first step.
            public float[] StateOf(int width)
            {
                if (State.Length != width) State = new float[width];  // (a new actor object, or a state of another size)
                else if (StateFresh) Array.Clear(State, 0, width);
                StateFresh = false;
                return State;
            }

            public void Reset(string id, Module module, bool isGroup, long startStep, bool training)
            {
                StateFresh = true;  // (a reused actor's memory is let go)
                Id = id;
                Module = module;
                IsGroup = isGroup;
                StartStep = startStep;
                Training = training;
                FrameMark = 0;
                SharedLatest = false;
                LatestCount = 0;
                Slot = -1;
                ClearSteps();
                RewardSum = 0;
                Rewarded = Terminated = Truncated = false;
            }

            public void ClearSteps()
            {
                ObsRows = ActionRows = 0;
            }

            public void AddRow(int row)
            {
                if (ObsRows == Rows.Length) Array.Resize(ref Rows, Math.Max(16, 2 * Rows.Length));
                Rows[ObsRows++] = row;
            }

            public void SetLatest(float[] values, int from, int count)
            {
                if (Latest.Length < count) Latest = new float[Math.Max(count, 2 * Latest.Length)];
                float[] into = Latest;
                for (int j = 0; j < count; ++j) into[j] = values[from + j];
                LatestCount = count;
            }

            // A single agent's latest observation: its last recorded row while training, else Latest.
            public void CopyLatest(List<float> into)
            {
                if (Training && ObsRows > 0)
                {
                    StepTable table = Module.Table;
                    for (int i = Rows[ObsRows - 1] * table.ObsDim, end = i + table.ObsDim; i < end; ++i) into.Add(table.Obs[i]);
                }
                else
                {
                    for (int i = 0; i < LatestCount; ++i) into.Add(Latest[i]);
                }
            }

            public void StopTraining()
            {
                DropSteps();
                Training = false;
            }

            // Lets go of the steps not cut yet (the held-back one included); a single agent keeps its
            // latest observation. Recording goes on: the next chunk starts from its next observation.
            public void DropSteps()
            {
                if (Training && ObsRows > 0 && !IsGroup)
                {
                    StepTable table = Module.Table;
                    SetLatest(table.Obs, Rows[ObsRows - 1] * table.ObsDim, table.ObsDim);
                }
                ClearSteps();
            }
        }

        sealed class Episode
        {
            public string Id;
            public bool Training;  // recorded and sent
            public bool HeldBack;  // a training episode not recorded (record_share, §13.2): played, never sent
            public long T;
            public readonly Dictionary<string, Actor> Actors = new Dictionary<string, Actor>();
            public Actor[] ActorBySlot = new Actor[0];  // the last frame's actors by slot: ActorsBySlot of them
            public int ActorsBySlot;
            public int RewardCursor;  // the slot LogReturns tries first
            public string[] SlotIds = new string[0];    // their ids, as the frame named them
            public Module SlotModule;                   // their one module when each is a single agent of it, else null
            // Steady-state frames whose rows the slots' actors have not noted yet (Settle notes them):
            // slot i's row of frame f is LazyFirst[f] + i in SlotModule's table.
            public int[] LazyFirst = new int[0];
            public int Lazy;
            public readonly List<Actor> Finished = new List<Actor>();     // left, steps not cut yet
            public readonly Dictionary<string, List<float>> LatestObs = new Dictionary<string, List<float>>();  // members' and critic-seen agents'
            public readonly Dictionary<string, double> Returns = new Dictionary<string, double>();
            public readonly HashSet<string> Ended = new HashSet<string>();
            public readonly Dictionary<string, Module> Mapped = new Dictionary<string, Module>();  // MAP_AGENTS answers of MapAgents, for actors not acting yet
            public bool Done, Truncated;
            public EpisodeEnvParams EnvParams;  // (1.7, §19.1) the values drawn as it started, or null
            public double? Measure;             // (1.7, §19.3) the measure reported, for the record that ends it

            // Empties it for reuse: the collections keep their capacity, the latest-observation rows go to `spare`.
            public void Reset(string id, bool training, bool heldBack, Stack<List<float>> spare)
            {
                Id = id;
                Training = training;
                HeldBack = heldBack;
                T = 0;
                Actors.Clear();
                Array.Clear(ActorBySlot, 0, ActorBySlot.Length);
                Array.Clear(SlotIds, 0, SlotIds.Length);
                ActorsBySlot = 0;
                RewardCursor = 0;
                SlotModule = null;
                Lazy = 0;
                Finished.Clear();
                foreach (List<float> row in LatestObs.Values)
                {
                    row.Clear();
                    spare.Push(row);
                }
                LatestObs.Clear();
                Returns.Clear();
                Ended.Clear();
                Mapped.Clear();
                Done = Truncated = false;
                EnvParams = null;
                Measure = null;
            }
        }

        sealed class Slot
        {
            public string ActorId;
            public Actor Actor;
            public Module Module;
            public int FrameIndex = -1;  // a single agent's index in the frame
            public int Group = -1;       // a group's index in groups
            public int Row;              // its row in the module's batch
            public int Logged = -1;      // (1.6) its logged action's index in the frame, or -1: the policy acts
        }

        struct MemberOf
        {
            public int Group;
            public int Position;
        }

        readonly Dictionary<string, Module> modules = new Dictionary<string, Module>();
        readonly List<GroupSpec> groups = new List<GroupSpec>();
        readonly Dictionary<string, GroupSpec> groupsById = new Dictionary<string, GroupSpec>();
        readonly Dictionary<string, MemberOf> groupOf = new Dictionary<string, MemberOf>();
        readonly List<int> groupMemberOffset = new List<int>();
        readonly HashSet<string> criticAgents = new HashSet<string>();
        readonly Dictionary<string, Episode> episodes = new Dictionary<string, Episode>();
        readonly List<string> episodeOrder = new List<string>();
        // Reused: actors, batches, records, entries come back once done with.
        readonly Stack<Actor> spareActors = new Stack<Actor>();
        readonly Stack<Episode> spareEpisodes = new Stack<Episode>();
        readonly Stack<List<float>> spareRows = new Stack<List<float>>();
        readonly Stack<Batch> spareBatches = new Stack<Batch>();
        readonly Stack<MultiAgentRecord> spareRecords = new Stack<MultiAgentRecord>();
        readonly Stack<AgentEntry> spareEntries = new Stack<AgentEntry>();
        readonly Stack<StepTable> spareTables = new Stack<StepTable>();
        // Per-frame scratch.
        Slot[] slots = new Slot[0];
        int slotCount;
        Episode lastRunning;  // the episode Running found last (most calls name the same one)
        readonly List<Module> frameModules = new List<Module>();
        int[] memberIndex = new int[0];
        int[] groupSlot = new int[0];
        int[] actionSizes = new int[0];
        readonly List<int> newSlots = new List<int>();
        readonly List<string> newActorIds = new List<string>();
        readonly List<string> unmappedIds = new List<string>();   // new actors MAP_AGENTS is asked about
        readonly List<int> unmappedSlots = new List<int>();       // their slots
        readonly List<Module> askedModules = new List<Module>();  // MAP_AGENTS' answers, in the order asked
        readonly List<string> askedModuleIds = new List<string>();  // the answer read, before askedModules
        Func<string, bool> isDescribed;  // IsDescribed, made once
        double[] envAction = new double[0];
        readonly AgentFrame endFrame = new AgentFrame();
        readonly List<float> scratchObs = new List<float>();
        float[] groupRow = new float[0];  // a group's joined observation, checked as its module's row (reused)
        PolicyMapping mapping;
        const int MaxRememberedMappings = 65536;
        readonly Dictionary<string, Module> mappedByRule = new Dictionary<string, Module>();
        readonly Dictionary<string, Module> evaluationMapped = new Dictionary<string, Module>();  // ComputeActions' MAP_AGENTS answers
        string evaluationMappingEpisode;
        // ComputeActions' evaluation episode (1.5): each actor's state, for one evaluation episode id at a time.
        readonly Dictionary<string, Actor> evaluationActors = new Dictionary<string, Actor>();
        string evaluationStateEpisode;
        JObject serverConfig;
        bool rawBoxSamples = true;
        bool announcesVersion;
        bool logsActions;      // the server's PONG announced 1.6 or later: logged actions may be recorded (§15)
        string serverVersion;  // the PONG's protocol_version, for the refusal of logged actions
        float[] demoObs = new float[0];  // (1.6) an actor's final observation for the demonstration file
        bool forceOnPolicy = true;
        long frameCounter;
        int pendingSteps;  // recorded agent steps not cut yet
        int heldSteps;     // agent steps of held-back episodes played since the last cut
        int envStepsSinceCut;

        /// <summary>The modules of SET_CONFIG, by id.</summary>
        public IDictionary<string, ModuleSpec> Modules
        {
            get
            {
                var specs = new Dictionary<string, ModuleSpec>();
                foreach (Module module in modules.Values)
                {
                    if (!module.Gone) specs[module.Id] = module.Spec;
                }
                return specs;
            }
        }

        /// <summary>The groups of SET_CONFIG.</summary>
        public IList<GroupSpec> Groups { get { return groups.AsReadOnly(); } }

        /// <summary>Whether the server maps with rules (false: with a function, through MAP_AGENTS).</summary>
        public bool HasMappingRules { get { return mapping != null; } }

        /// <summary>Agent steps per batch (SET_CONFIG env_steps_per_sample, §7.4).</summary>
        public int EnvStepsPerSample { get { return stepsPerSample; } }

        /// <summary>Env steps (GetActions calls of training episodes) the server has acknowledged.</summary>
        public long EnvStepsSent { get; private set; }

        /// <summary>Agent steps the server has acknowledged.</summary>
        public long AgentStepsSent { get; private set; }

        /// <summary>Models swapped in so far, all modules (the first ones included).</summary>
        public long ModelsLoaded { get; private set; }

        /// <summary>Inference runs so far (one per module per frame).</summary>
        public long InferenceRuns { get; private set; }

        /// <summary>MAP_AGENTS requests sent so far.</summary>
        public long MapRequests { get; private set; }

        /// <summary>Whether a batch makes the game wait for the weights answering it (strict on-policy).</summary>
        public bool WaitsForWeights { get { return !Offline && forceOnPolicy && (options.WaitForWeights ?? !announcesVersion); } }

        MultiAgentClient(ClientOptions options) : base(options, true) { }

        /// <summary>
        /// Connects, handshakes and loads every module's model. Throws
        /// TetherException: CONNECTION_FAILED (naming the server and the wait),
        /// AUTH_FAILED, VERSION_MISMATCH, INVALID_FIELD (a SET_CONFIG without
        /// modules, or with rules or groups this client cannot read), INFERENCE_FAILED.
        /// </summary>
        public static MultiAgentClient Connect(ClientOptions options)
        {
            options = options ?? new ClientOptions();
            if (options.ClientName == "tether-csharp") options.ClientName = "tether-csharp-multiagent";
            var client = new MultiAgentClient(options);
            client.Open();
            return client;
        }

        /// <summary>The module an actor (agent or group id) acts with in a running episode. INVALID_ARGUMENT if it has not acted.</summary>
        public string ModuleOf(string episodeId, string actorId)
        {
            Episode episode;
            if (episodeId != null && actorId != null && episodes.TryGetValue(episodeId, out episode))
            {
                Actor actor;
                if (episode.Actors.TryGetValue(actorId, out actor)) return actor.Module.Id;
                foreach (Actor left in episode.Finished)
                {
                    if (left.Id == actorId) return left.Module.Id;
                }
            }
            throw new TetherException(ErrorCode.InvalidArgument, "ModuleOf: '" + actorId + "' has not acted in episode '" + episodeId + "'");
        }

        /// <summary>The weights version of a module's model in use (null if unknown).</summary>
        public long? WeightsSeqNo(string moduleId)
        {
            Module module;
            return moduleId != null && modules.TryGetValue(moduleId, out module) ? module.Seq : null;
        }

        // The state an actor (agent or group) starts its next step from, of the running episode `episodeId`,
        // or else of the evaluation episode of that id: a copy (zeros before its first step); null when there
        // is no such actor or its module has no memory (tests).
        internal float[] StateOf(string episodeId, string actorId)
        {
            Episode episode;
            Actor actor = null;
            if (episodeId != null && episodes.TryGetValue(episodeId, out episode)) episode.Actors.TryGetValue(actorId, out actor);
            if (actor == null && evaluationStateEpisode == episodeId) evaluationActors.TryGetValue(actorId, out actor);
            if (actor == null || actor.Module.StateDim == 0) return null;
            int width = actor.Module.StateDim;
            return actor.StateFresh || actor.State.Length != width ? new float[width] : (float[])actor.State.Clone();
        }

        // ---- episodes --------------------------------------------------------------------------

        /// <summary>
        /// Begins an episode and returns its id (<paramref name="episodeId"/>, or a new
        /// random one). With <paramref name="trainingEnabled"/> false its steps are never sent.
        /// A training episode is recorded with the probability <see cref="ClientBase.RecordShare"/>, one
        /// draw of the client's generator for all its agents; one that is not is played alike
        /// but never sent (<see cref="ClientBase.EpisodesHeldBack"/>). Once training is done
        /// (<see cref="ClientBase.TrainingDone"/>) no episode is recorded.
        /// Protocol 1.7: when the client holds environment parameters (<see cref="ClientBase.EnvParams"/>), the
        /// episode's values are drawn from them now with the same generator (<see cref="ClientBase.EpisodeParams"/>),
        /// and every record of the episode says them at its top level.
        /// </summary>
        public string StartEpisode(string episodeId = null, bool trainingEnabled = true)
        {
            Poll();
            trainingEnabled = trainingEnabled && !ended;
            episodeId = episodeId ?? Guid.NewGuid().ToString("N");
            Episode existing;
            if (episodes.TryGetValue(episodeId, out existing))
            {
                if (!existing.Done) throw new TetherException(ErrorCode.InvalidArgument, "episode '" + episodeId + "' is already running");
                // Its last steps wait for the next batch: they go now, under the old episode.
                SendBatch();
                if (episodes.ContainsKey(episodeId)) throw new TetherException(ErrorCode.InvalidArgument, "episode '" + episodeId + "' has just ended and is still being sent");
            }
            trainingEnabled = trainingEnabled && !Offline;  // (§20: nothing is sent, so nothing is recorded)
            bool recorded = trainingEnabled && Records();
            Episode episode = spareEpisodes.Count > 0 ? spareEpisodes.Pop() : new Episode();
            episode.Reset(episodeId, recorded, trainingEnabled && !recorded, spareRows);
            episode.EnvParams = DrawEpisodeParams();  // (1.7, §19.1: from the set held now, after the record_share draw)
            episodes.Add(episodeId, episode);
            episodeOrder.Add(episodeId);
            return episodeId;
        }

        /// <summary>
        /// Actions for the agents in <paramref name="frame"/> (group members
        /// included), written back into the frame in the same order. Maps new
        /// agents (rules, or one MAP_AGENTS), records each actor's observation
        /// (and centralized-critic row), runs ONE inference per module for all
        /// its actors in the frame and samples (raw Box sample recorded, clipped
        /// action to the game). On an error nothing of the frame is recorded.
        /// Throws INVALID_ARGUMENT (unknown episode, an agent twice, an agent that
        /// left, a group with members missing, a wrong observation size),
        /// NON_FINITE_VALUE, OBS_DTYPE_MISMATCH (a value that is not an integer 0-255
        /// for a module whose observation space is a byte box, protocol 1.4: add
        /// images with AgentFrame.Add(id, byte[]), or for a byte leaf of a Dict or Tuple module),
        /// INVALID_ACTION_MASK / ACTION_MASK_EMPTY (a module with an action mask, protocol 1.4 §11.6:
        /// a mask value other than 0 and 1, or a mask allowing no action; checked per agent, and for a group
        /// on its joined observation (its members' in member order, the message naming the group), before
        /// anything is recorded or sampled), UNMAPPED_AGENT / UNKNOWN_MODULE, TIMEOUT (MAP_AGENTS),
        /// NOT_READY (a module without a model), INFERENCE_FAILED, or an error
        /// the server sent for an earlier batch (once).
        /// Protocol 1.6: the actors given an action with <see cref="AgentFrame.LogAction"/> take it
        /// (logged steps, §10.1: recorded in logged_runs with a log-probability of 0 and the model's dist
        /// inputs, the model still run for them, a model with memory advancing their states) and get it
        /// back in the frame, the others act by the policy. Refused, with nothing of the frame recorded:
        /// a logged actor that does not act in the frame or is a group's member (INVALID_ARGUMENT), an
        /// action of another size or outside its module's action space (ACTION_OUT_OF_SPACE), not finite
        /// (NON_FINITE_VALUE) or forbidden by its observation's action mask (ACTION_MASKED: a group's joint
        /// action by the mask of its joined observation), and any
        /// logged action while the server is older than 1.6 (NOT_READY: it would train on the step as a
        /// sample of its policy, §15).
        /// </summary>
        public void GetActions(string episodeId, AgentFrame frame)
        {
            Poll();
            Episode episode = Running(episodeId, "GetActions");
            if (frame == null) throw new TetherException(ErrorCode.InvalidArgument, "GetActions: the frame is null");
            if (frame.LoggedCount > 0) RefuseLoggingToOlderServer();
            // The cut comes first: sending may apply new models (or, strict, wait for
            // them), and this frame acts with them. The actors about to act hold back
            // their latest step until this frame's observation (§10.7). A batch goes every
            // BatchSteps() agent steps played in training episodes (§13.2). With held-back steps
            // played since the last cut it is due when they plus the recorded steps waiting, and
            // plus those sendable, reach it; it then goes even without records. The sendable count
            // walks every actor: it is taken only when the cheap tests pass.
            int every = BatchSteps();
            bool due = false;
            if ((episode.Training || episode.HeldBack) && heldSteps > 0)
            {
                int need = every - heldSteps;
                due = pendingSteps >= need && (need <= 0 || Sendable(need));
            }
            if (due)
            {
                SendBatch(true);
                if (fatal != null) throw fatal;
            }
            else if (episode.Training && pendingSteps >= every && Sendable(every))
            {
                SendBatch();
                if (fatal != null) throw fatal;  // (a new connection's configuration this client cannot use)
            }
            if (frame.LoggedCount > 0) RefuseLoggingToOlderServer();  // (sending may have applied a new connection)
            if (!(SteadyStateFrames && ActKnown(episode, frame)))
            {
                Settle(episode);
                Gather(episode, frame, episodeId, false);
                if (frame.LoggedCount > 0) MatchLoggedActions(frame);
                for (int k = 0; k < newSlots.Count; ++k)
                {
                    Slot slot = slots[newSlots[k]];
                    Actor actor = spareActors.Count > 0 ? spareActors.Pop() : new Actor();
                    actor.Reset(newActorIds[k], slot.Module, slot.Group >= 0, episode.T, episode.Training);
                    actor.FrameMark = frameCounter;
                    actor.SharedLatest = criticAgents.Contains(actor.Id);
                    slot.Actor = actor;
                    episode.Actors.Add(actor.Id, actor);
                }
                if (episode.ActorBySlot.Length < slotCount)
                {
                    episode.ActorBySlot = new Actor[Math.Max(slotCount, 2 * episode.ActorBySlot.Length)];
                    episode.SlotIds = new string[episode.ActorBySlot.Length];
                }
                Actor[] bySlot = episode.ActorBySlot;
                Module slotModule = slotCount > 0 ? slots[0].Module : null;
                for (int s = 0; s < slotCount; ++s)
                {
                    Slot slot = slots[s];
                    bySlot[s] = slot.Actor;
                    episode.SlotIds[s] = slot.ActorId;
                    slot.Actor.Slot = s;
                    if (slot.Group >= 0 || slot.Module != slotModule) slotModule = null;
                }
                for (int s = slotCount; s < episode.ActorsBySlot; ++s)
                {
                    bySlot[s] = null;
                    episode.SlotIds[s] = null;
                }
                episode.ActorsBySlot = slotCount;
                episode.SlotModule = slotModule;
                episode.RewardCursor = 0;
                FillBatches(frame);
                MarkLoggedRows(frame);
                FillStates();
                // Without groups and critics the latest observations are kept as the frame is recorded;
                // else first (a critic row needs every agent's). Either way before an error leaves.
                bool simple = groups.Count == 0 && criticAgents.Count == 0;
                if (!simple) NoteLatestAll(episode, frame);
                try
                {
                    RunModules();
                    foreach (Module module in frameModules)
                    {
                        Sample(module);
                        module.FrameBase = -1;
                    }
                    if (frame.LoggedCount > 0) TakeLoggedActions(frame);
                    CommitStates();  // (every actor's state advances, recorded or not)
                }
                catch
                {
                    if (simple) NoteLatestAll(episode, frame);
                    throw;
                }
                // Nothing failed: the actions go to the frame, and the frame's steps are recorded (its
                // rows go to each module's table in a few block copies; each actor notes its row).
                LayOutActions(frame);
                double[] frameActions = frame.ActionValues;
                int[] actionAt = frame.ActionOffsets;
                float[] frameObs = frame.ObsValues;
                int[] offsets = frame.ObsOffsets;
                bool heldBack = episode.HeldBack;
                if (simple && frameModules.Count == 1)
                {
                    // One module, single agents: the module's rows are the frame's agents, in order.
                    Module module = frameModules[0];
                    int actDim = module.ActDim, n = slotCount;
                    double[] env = module.EnvActions;
                    if (actionAt[n] == n * actDim) Array.Copy(env, 0, frameActions, 0, n * actDim);
                    else for (int s = 0; s < n; ++s) for (int j = 0; j < actDim; ++j) frameActions[actionAt[s] + j] = env[s * actDim + j];
                    int first = -1;
                    for (int s = 0; s < n; ++s)
                    {
                        Actor actor = bySlot[s];
                        int rows = actor.ObsRows;
                        if (!actor.Training || rows == 0) actor.SetLatest(frameObs, offsets[s], offsets[s + 1] - offsets[s]);
                        if (!actor.Training)
                        {
                            if (heldBack) ++heldSteps;
                            continue;
                        }
                        if (first < 0) first = RecordFrameRows(module);
                        if (rows == actor.Rows.Length) Array.Resize(ref actor.Rows, Math.Max(16, 2 * rows));
                        actor.Rows[rows] = first + s;
                        actor.ObsRows = rows + 1;
                        ++actor.ActionRows;
                        ++pendingSteps;
                    }
                }
                else
                {
                    for (int s = 0; s < slotCount; ++s)
                    {
                        Slot slot = slots[s];
                        Module module = slot.Module;
                        int actDim = module.ActDim;
                        Actor actor = slot.Actor;
                        if (slot.Group < 0)
                        {
                            double[] env = module.EnvActions;
                            int i = slot.FrameIndex;
                            for (int j = 0, into = actionAt[i], from = slot.Row * actDim; j < actDim; ++j) frameActions[into + j] = env[from + j];
                            if (simple && (!actor.Training || actor.ObsRows == 0)) actor.SetLatest(frameObs, offsets[i], offsets[i + 1] - offsets[i]);
                        }
                        else
                        {
                            WriteAction(slot, module.EnvActions, slot.Row * actDim, frame);
                        }
                        if (!actor.Training)
                        {
                            if (heldBack) ++heldSteps;
                            continue;
                        }
                        int first = module.FrameBase;
                        if (first < 0) first = module.FrameBase = RecordFrameRows(module);
                        int row = first + slot.Row;
                        if (module.ValueDim > 0) WriteValueObs(episode, module, row);
                        actor.AddRow(row);
                        ++actor.ActionRows;
                        ++pendingSteps;
                    }
                }
                if (demos != null) DemonstrationSteps(episode);
            }
            if (episode.Training) ++envStepsSinceCut;
            ++episode.T;
        }

        // Whether the steady-state frames take ActKnown (tests compare it with the general path), and how many did.
        internal bool SteadyStateFrames = true;
        internal long SteadyStateFramesActed;

        // The steady-state frame: the last frame's agents again, named in the same order, all single
        // agents of one module, without groups or critics. Acts and records as the general path does
        // (the same rows, draws, records and errors) without building slots or touching the actors:
        // in a training episode the frame's rows are noted for them later (Settle); false, having
        // changed nothing, for any other frame (which the general path then takes, errors included).
        bool ActKnown(Episode episode, AgentFrame frame)
        {
            int n = frame.Count;
            Module module = episode.SlotModule;
            if (n == 0 || n != episode.ActorsBySlot || module == null || groups.Count > 0 || criticAgents.Count > 0 || frame.FirstNonFinite >= 0) return false;
            if (frame.LoggedCount > 0 || demos != null) return false;  // (1.6: logged actions and demonstrations take the general path)
            if (frame.FirstNonByte >= 0 && module.Spec.ObservationSpace.IsBytes) return false;  // (the general path refuses it)
            if (module.Spec.ObservationSpace.IsComposite) return false;  // (the general path checks its byte leaves)
            string[] ids = frame.Ids, known = episode.SlotIds;
            int[] offsets = frame.ObsOffsets;
            int obsDim = module.ObsDim;
            for (int i = 0; i < n; ++i)
            {
                // (the same ids in the same order: the same actors, each once, none of them gone)
                if (((object)known[i] != (object)ids[i] && known[i] != ids[i]) || offsets[i + 1] - offsets[i] != obsDim) return false;
            }
            Actor[] bySlot = episode.ActorBySlot;
            bool training = episode.Training;  // (then every actor trains)
            ++frameCounter;
            // (what Gather and FillBatches give such a frame: no slots are needed)
            slotCount = 0;
            foreach (Module other in frameModules)
            {
                other.InFrame = false;
                other.Rows = 0;
            }
            frameModules.Clear();
            frameModules.Add(module);
            module.InFrame = true;
            module.Rows = n;
            module.EnsureRows(n);
            float[] frameObs = frame.ObsValues;
            episode.RewardCursor = 0;
            int width = module.StateDim;
            if (width > 0)
            {
                // (1.5) the actors' states stacked in slot order, as the rows
                float[] states = module.StateIn;
                for (int i = 0; i < n; ++i) Array.Copy(bySlot[i].StateOf(width), 0, states, i * width, width);
            }
            try
            {
                RunModule(module, frameObs);  // (the frame's observations are the batch)
            }
            catch
            {
                if (!training || episode.Lazy == 0)
                {
                    for (int i = 0; i < n; ++i)
                    {
                        Actor actor = bySlot[i];
                        if (!actor.Training || actor.ObsRows == 0) actor.SetLatest(frameObs, offsets[i], obsDim);
                    }
                }
                throw;
            }
            if (width > 0)
            {
                float[] states = module.StateOut;
                for (int i = 0; i < n; ++i) Array.Copy(states, i * width, bySlot[i].State, 0, width);
            }
            // The actions are drawn straight into the frame and, in a training episode, the recorded
            // ones into the module's table, rows first.. of this frame.
            int actDim = module.ActDim;
            frame.LayOutUniformActions(actDim);
            Space actionSpace = module.Spec.ActionSpace;
            ++SteadyStateFramesActed;
            if (!training)
            {
                // (nothing is recorded: a Discrete row's logp is not taken at all)
                Distributions.SampleRows(actionSpace, module.Dist, n, rng, rawBoxSamples, module.RecordActions, 0, frame.ActionValues, 0, module.Logp, 0, true);
                for (int i = 0; i < n; ++i) bySlot[i].SetLatest(frameObs, offsets[i], obsDim);
                if (episode.HeldBack) heldSteps += n;
                return true;
            }
            StepTable table = TableOf(module);
            int first = table.Rows;
            table.Reserve(first + n);
            // (a Discrete row's logp is taken as the row is written, on the sending thread)
            Distributions.SampleRows(actionSpace, module.Dist, n, rng, rawBoxSamples, table.Actions, first * actDim, frame.ActionValues, 0, table.Logp, first, true);
            Array.Copy(frameObs, 0, table.Obs, first * obsDim, n * obsDim);
            Array.Copy(module.Dist, 0, table.Dist, first * module.DistDim, n * module.DistDim);
            if (width > 0) Array.Copy(module.StateIn, 0, table.State, first * width, n * width);
            Array.Clear(table.Rewards, first, n);
            Array.Clear(table.Logged, first, n);
            table.NoteVersion(first, module.Seq ?? -1, module.SeqConnection);
            table.Rows = first + n;
            pendingSteps += n;
            if (episode.Lazy == 0)
            {
                // An actor without recorded rows keeps its latest observation (only the first such frame can have one).
                for (int i = 0; i < n; ++i)
                {
                    Actor actor = bySlot[i];
                    if (actor.ObsRows == 0) actor.SetLatest(frameObs, offsets[i], obsDim);
                }
            }
            if (episode.Lazy == episode.LazyFirst.Length) Array.Resize(ref episode.LazyFirst, Math.Max(16, 2 * episode.Lazy));
            episode.LazyFirst[episode.Lazy++] = first;
            return true;
        }

        // The actors of the episode's slots note the rows of its steady-state frames.
        static void Settle(Episode episode)
        {
            int lazy = episode.Lazy;
            if (lazy == 0) return;
            episode.Lazy = 0;
            Actor[] bySlot = episode.ActorBySlot;
            int[] firsts = episode.LazyFirst;
            for (int s = 0, n = episode.ActorsBySlot; s < n; ++s)
            {
                Actor actor = bySlot[s];
                int rows = actor.ObsRows;
                if (rows + lazy > actor.Rows.Length) Array.Resize(ref actor.Rows, Math.Max(rows + lazy, Math.Max(16, 2 * actor.Rows.Length)));
                int[] into = actor.Rows;
                for (int f = 0; f < lazy; ++f) into[rows + f] = firsts[f] + s;
                actor.ObsRows = rows + lazy;
                actor.ActionRows += lazy;
            }
        }

        void SettleAll()
        {
            foreach (Episode episode in episodes.Values) Settle(episode);
        }

        /// <summary>
        /// Greedy actions (the distributions' modes) for evaluation, written into
        /// <paramref name="frame"/>; records nothing. Maps with the rules (or
        /// MAP_AGENTS with <paramref name="episodeId"/>, "eval" when null, asked
        /// once per agent: the answers are kept until another id is evaluated).
        /// A module with memory (protocol 1.5, §12.4) remembers per episode:
        /// <paramref name="episodeId"/> names a running episode that is not recorded (started
        /// with trainingEnabled false, or held back by record_share: this call advances its
        /// actors' states, as GetActions does) or an evaluation episode of the caller's (each
        /// actor's state starts from zeros at its first call; one evaluation episode is
        /// remembered at a time, so give each its own id). A running episode that is recorded
        /// is refused when a module with memory acts in the frame (a <see cref="TetherException"/>,
        /// INVALID_ARGUMENT; no state advances): its next record's state_in must follow from its
        /// recorded observations, so play it with GetActions, or give the greedy play another id.
        /// </summary>
        public void ComputeActions(AgentFrame frame, string episodeId = null)
        {
            Poll();
            if (frame == null) throw new TetherException(ErrorCode.InvalidArgument, "ComputeActions: the frame is null");
            if (frame.LoggedCount > 0)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "ComputeActions records nothing: a frame with logged actions (AgentFrame.LogAction) goes to GetActions");
            }
            Gather(null, frame, episodeId ?? "eval", false);
            RefuseRecordedEpisode(episodeId ?? "eval");
            FillBatches(frame);
            EvaluationHolders(episodeId ?? "eval");
            FillStates();
            RunModules();
            CommitStates();
            LayOutActions(frame);
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                Module module = slot.Module;
                Distributions.Deterministic(module.Spec.ActionSpace, module.Dist, slot.Row * module.DistDim, envAction, 0);
                WriteAction(slot, envAction, 0, frame);
            }
        }

        /// <summary>
        /// Adds <paramref name="reward"/> to the agent's last action (a group
        /// member's to its group's, divided by the member count for "mean").
        /// Rewards accumulate until the agent acts again; one before its first
        /// action only counts in the returns. Refused with a <see cref="TetherException"/>
        /// (NON_FINITE_VALUE), adding nothing to any agent (no step's reward, return or
        /// demonstration file changes): a reward that is not finite, or one that would take
        /// its actor's recorded step's reward (the rewards logged for it, a group's combined,
        /// summed) to a magnitude of <see cref="EpisodeRecords.Float32Overflow"/> or more, beyond
        /// float32 (protocol 1.6, §10.5: the server would refuse the whole batch).
        /// </summary>
        public void LogReturns(string episodeId, string agentId, double reward)
        {
            Episode episode = Running(episodeId, "LogReturns");
            if (double.IsNaN(reward) || double.IsInfinity(reward)) throw new TetherException(ErrorCode.NonFiniteValue, "LogReturns: the reward of '" + agentId + "' is not finite");
            if (agentId == null) throw new TetherException(ErrorCode.InvalidArgument, "LogReturns: the agent id is null");
            string actorId = agentId;
            MemberOf member;
            if (groupOf.TryGetValue(agentId, out member))
            {
                GroupSpec group = groups[member.Group];
                actorId = group.GroupId;
                if (group.Reward == GroupReward.Mean) reward /= group.Members.Count;
            }
            // The game usually rewards its agents in the order they acted: the next one of the last
            // frame is tried before the lookup.
            Actor actor = null;
            int next = episode.RewardCursor;
            if (next < episode.ActorsBySlot)
            {
                actor = episode.ActorBySlot[next];
                if ((object)actor.Id != (object)actorId) actor = null;
                else episode.RewardCursor = next + 1;
            }
            if (actor == null && !episode.Actors.TryGetValue(actorId, out actor))
            {
                AddReturn(episode, actorId, reward);  // not acting (yet, or any more)
                return;
            }
            // Its last action's row: of the last steady-state frame if one has not been noted yet.
            int row = -1;
            if (actor.Training)
            {
                int slot = actor.Slot;
                if (episode.Lazy > 0 && slot >= 0 && slot < episode.ActorsBySlot && episode.ActorBySlot[slot] == actor) row = episode.LazyFirst[episode.Lazy - 1] + slot;
                else if (actor.ActionRows > 0) row = actor.Rows[actor.ActionRows - 1];
            }
            if (row >= 0)
            {
                // (checked before anything changes: a refused reward adds nothing, §10.5)
                double[] rewards = actor.Module.Table.Rewards;
                double sum = rewards[row] + reward;
                if (!EpisodeRecords.StepRewardFits(sum))
                {
                    throw EpisodeRecords.StepRewardBeyondFloat32("LogReturns", "of '" + agentId + "'" + (actorId != agentId ? " (to its group '" + actorId + "')" : "") +
                                                                 " in episode '" + episode.Id + "'", reward, sum);
                }
                rewards[row] = sum;
            }
            // (a demonstration file's step beyond float32 is refused by its writer: the reward is left out of the
            // file, whose reader would refuse the line, as every SDK does)
            if (demos != null) demos.AddRewardIfFits(episode.Id, actorId, reward);
            actor.RewardSum += reward;
            actor.Rewarded = true;
        }

        /// <summary>
        /// Agents that leave the episode, with their final observations (each agent's
        /// frame entry; Add(..., isTruncated: true) marks an end by time limit,
        /// otherwise it terminated). A group leaves as a whole: its members not in
        /// the frame end with their latest observation.
        /// </summary>
        public void EndAgents(string episodeId, AgentFrame finalObservations)
        {
            Poll();
            Episode episode = Running(episodeId, "EndAgents");
            if (finalObservations == null) throw new TetherException(ErrorCode.InvalidArgument, "EndAgents: the frame is null");
            EndActors(episode, finalObservations, false);
        }

        /// <summary>Ends one (sub-)agent with its final observation. Spawning needs no call: a new id in GetActions joins.</summary>
        public void RetireAgent(string episodeId, string agentId, float[] finalObs, bool truncated = false)
        {
            var frame = new AgentFrame();
            frame.Add(agentId, finalObs, truncated);
            EndAgents(episodeId, frame);
        }

        /// <summary>Ends one (sub-)agent with its final observation given as bytes (a byte box's, protocol 1.4).</summary>
        public void RetireAgent(string episodeId, string agentId, byte[] finalObs, bool truncated = false)
        {
            var frame = new AgentFrame();
            frame.Add(agentId, finalObs, truncated);
            EndAgents(episodeId, frame);
        }

        /// <summary>
        /// Ends the episode: every agent still in it leaves with its observation in
        /// <paramref name="finalObservations"/> (may be null) or else its latest
        /// one, truncated if <paramref name="truncated"/>. Returns each actor's
        /// (agent's or group's) total reward.
        /// </summary>
        public Dictionary<string, double> EndEpisode(string episodeId, AgentFrame finalObservations = null, bool truncated = false)
        {
            Poll();
            Episode episode = Running(episodeId, "EndEpisode");
            Settle(episode);
            var all = new AgentFrame();
            var named = new HashSet<string>();
            if (finalObservations != null)
            {
                for (int i = 0; i < finalObservations.Count; ++i)
                {
                    scratchObs.Clear();
                    finalObservations.CopyObs(i, scratchObs);
                    all.Add(finalObservations.AgentId(i), scratchObs.ToArray(), finalObservations.Truncated(i));
                    named.Add(finalObservations.AgentId(i));
                }
            }
            foreach (Actor actor in episode.Actors.Values)
            {
                GroupSpec group;
                if (actor.IsGroup && groupsById.TryGetValue(actor.Id, out group))
                {
                    if (actor.ObsRows == 0)
                    {
                        // (as a single agent's below: members' observations of the old size, nothing to send)
                        int size = 0;
                        foreach (string member in group.Members)
                        {
                            List<float> latest;
                            if (episode.LatestObs.TryGetValue(member, out latest)) size += latest.Count;
                        }
                        if (size != actor.Module.ObsDim) continue;
                    }
                    foreach (string member in group.Members)
                    {
                        List<float> latest;
                        if (named.Contains(member) || !episode.LatestObs.TryGetValue(member, out latest)) continue;
                        all.Add(member, latest.ToArray());
                    }
                }
                else if (!named.Contains(actor.Id))
                {
                    scratchObs.Clear();
                    actor.CopyLatest(scratchObs);
                    // An agent whose module's spaces changed on a reconnect has only an observation of
                    // the old size and nothing left to send: it ends without one.
                    if (actor.ObsRows == 0 && scratchObs.Count != actor.Module.ObsDim) continue;
                    all.Add(actor.Id, scratchObs.ToArray());
                }
            }
            EndActors(episode, all, truncated);
            foreach (Actor actor in episode.Actors.Values) FoldReturn(episode, actor);  // (any that did not leave)
            episode.Done = true;
            episode.Truncated = truncated;
            var returns = new Dictionary<string, double>(episode.Returns);
            if (!episode.Training) RemoveEpisode(episode);  // a trained episode goes once its last record is cut
            return returns;
        }

        internal override void ReleaseModels()
        {
            foreach (Module module in modules.Values)
            {
                if (module.Backend != null) module.Backend.Dispose();
                module.Backend = null;
            }
        }

        // ---- frames ----------------------------------------------------------------------------

        Episode Running(string episodeId, string call)
        {
            // (an episode in use has its id; a spare one has none, and one that ended is Done)
            Episode episode = lastRunning;
            if (episode != null && episodeId != null && (object)episode.Id == (object)episodeId && !episode.Done) return episode;
            if (episodeId == null || !episodes.TryGetValue(episodeId, out episode) || episode.Done)
            {
                throw new TetherException(ErrorCode.InvalidArgument, call + ": no running episode '" + episodeId + "'");
            }
            lastRunning = episode;
            return episode;
        }

        Slot NewSlot()
        {
            Slot slot = slots[slotCount++];
            slot.ActorId = null;
            slot.Actor = null;
            slot.Module = null;
            slot.FrameIndex = -1;
            slot.Group = -1;
            slot.Row = 0;
            slot.Logged = -1;
            return slot;
        }

        // Builds the slots (one per actor: agent or group) from the frame, maps new
        // actors and checks every size; records nothing. With an episode, existing
        // actors keep their module; without one (ComputeActions) every actor is mapped.
        void Gather(Episode episode, AgentFrame frame, string mappingEpisodeId, bool ending)
        {
            ++frameCounter;
            slotCount = 0;
            newSlots.Clear();
            newActorIds.Clear();
            bool grouped = groupOf.Count > 0;
            if (grouped)
            {
                for (int g = 0; g < groupSlot.Length; ++g) groupSlot[g] = -1;
                for (int m = 0; m < memberIndex.Length; ++m) memberIndex[m] = -1;
            }
            int n = frame.Count;
            if (slots.Length < n)
            {
                int had = slots.Length;
                Array.Resize(ref slots, Math.Max(n, 2 * had));
                for (int s = had; s < slots.Length; ++s) slots[s] = new Slot();
            }
            string[] ids = frame.Ids;
            int nonFinite = frame.FirstNonFinite;
            HashSet<string> ended = !ending && episode != null && episode.Ended.Count > 0 ? episode.Ended : null;
            for (int i = 0; i < n; ++i)
            {
                string id = ids[i];
                int bad;
                if (i == nonFinite && !frame.AllFinite(i, out bad)) throw new TetherException(ErrorCode.NonFiniteValue, "agent '" + id + "': observation[" + bad + "] is not finite");
                if (ended != null && ended.Contains(id))
                {
                    throw new TetherException(ErrorCode.InvalidArgument, "agent '" + id + "' already left episode '" + episode.Id +
                                              "' (an ended agent, or a member of an ended group, cannot act again)");
                }
                MemberOf member;
                if (grouped && groupOf.TryGetValue(id, out member))
                {
                    int at = groupMemberOffset[member.Group] + member.Position;
                    if (memberIndex[at] >= 0) throw new TetherException(ErrorCode.InvalidArgument, "agent '" + id + "' is twice in the frame");
                    memberIndex[at] = i;
                    if (groupSlot[member.Group] >= 0) continue;  // the group has its slot already
                    groupSlot[member.Group] = slotCount;
                    Slot groupSlotEntry = NewSlot();
                    groupSlotEntry.Group = member.Group;
                    groupSlotEntry.ActorId = groups[member.Group].GroupId;
                    continue;
                }
                Slot slot = slots[slotCount++];  // (its actor and module are set below)
                slot.ActorId = id;
                slot.FrameIndex = i;
                slot.Group = -1;
                slot.Logged = -1;
            }
            // Actors and their modules.
            if (episode != null)
            {
                Actor[] bySlot = episode.ActorBySlot;
                int known = episode.ActorsBySlot;
                long mark = frameCounter;
                for (int s = 0; s < slotCount; ++s)
                {
                    Slot slot = slots[s];
                    string id = slot.ActorId;
                    // (most frames name the last frame's actors in the same order, with the same strings)
                    Actor actor = s < known ? bySlot[s] : null;
                    if (actor == null || ((object)actor.Id != (object)id && actor.Id != id))
                    {
                        if (!episode.Actors.TryGetValue(id, out actor)) actor = null;
                    }
                    if (actor != null)
                    {
                        if (actor.FrameMark == mark) throw new TetherException(ErrorCode.InvalidArgument, "agent '" + id + "' is twice in the frame");
                        actor.FrameMark = mark;
                        slot.Actor = actor;
                        slot.Module = actor.Module;
                        continue;
                    }
                    slot.Actor = null;
                    slot.Module = null;
                    if (ending) continue;  // never acted: leaves without a module
                    if (newActorIds.Contains(slot.ActorId)) throw new TetherException(ErrorCode.InvalidArgument, "agent '" + slot.ActorId + "' is twice in the frame");
                    newSlots.Add(s);
                    newActorIds.Add(slot.ActorId);
                }
            }
            else
            {
                for (int s = 0; s < slotCount; ++s)
                {
                    slots[s].Actor = null;
                    slots[s].Module = null;
                    newSlots.Add(s);
                    newActorIds.Add(slots[s].ActorId);
                }
            }
            // Groups act only when every member observes.
            for (int g = 0; g < groups.Count; ++g)
            {
                if (groupSlot[g] < 0) continue;
                GroupSpec group = groups[g];
                string missing = null;
                for (int k = 0; k < group.Members.Count; ++k)
                {
                    if (memberIndex[groupMemberOffset[g] + k] < 0) missing = (missing == null ? "'" : missing + ", '") + group.Members[k] + "'";
                }
                if (missing != null)
                {
                    throw new TetherException(ErrorCode.InvalidArgument, "group '" + group.GroupId + "' acts as one agent: observations of " + missing + " are missing");
                }
            }
            MapActors(mappingEpisodeId, episode);
            // Sizes against each actor's module.
            int[] offsets = frame.ObsOffsets;
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                if (slot.Module == null) continue;  // (ending without having acted)
                Module module = slot.Module;
                int obsSize = 0;
                if (slot.Group < 0)
                {
                    obsSize = offsets[slot.FrameIndex + 1] - offsets[slot.FrameIndex];
                    if (obsSize == module.ObsDim) continue;
                }
                else
                {
                    GroupSpec group = groups[slot.Group];
                    for (int k = 0; k < group.Members.Count; ++k) obsSize += frame.ObsSize(memberIndex[groupMemberOffset[slot.Group] + k]);
                    if (module.ActDim % group.Members.Count != 0)
                    {
                        throw new TetherException(ErrorCode.InvalidArgument, "group '" + group.GroupId + "': module '" + module.Id + "' actions of " + module.ActDim +
                                                  " values do not split evenly among " + group.Members.Count + " members");
                    }
                }
                if (obsSize != module.ObsDim)
                {
                    throw new TetherException(ErrorCode.InvalidArgument, "'" + slot.ActorId + "': the observation has " + obsSize + " values, module '" + module.Id + "' needs " + module.ObsDim);
                }
            }
            if (frame.FirstNonByte >= 0) CheckByteBoxes(frame);
            CheckCompositeRows(frame, !ending);
        }

        // A Dict or Tuple module's flat rows (1.4, §8.6): its byte leaves take the integers 0-255 only,
        // and (acting: not a final observation) its action mask (§11.6) must hold only 0 and 1
        // (INVALID_ACTION_MASK) and allow an action (ACTION_MASK_EMPTY); refused before anything of the
        // frame is recorded or sampled. A group of such a module (a mask needs a composite space) has its
        // joined observation (its members' in member order, as the module's batch gets it) checked as a
        // row of the module, its mask read from it exactly as an agent's, the message naming the group.
        // The message is built only for a refusal (no allocation per frame).
        void CheckCompositeRows(AgentFrame frame, bool acting)
        {
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                if (slot.Module == null) continue;
                ModuleSpec spec = slot.Module.Spec;
                Space space = spec.ObservationSpace;
                if (!space.IsComposite && spec.ActionMask == null) continue;
                float[] values;
                int offset;
                if (slot.Group < 0)
                {
                    values = frame.ObsValues;
                    offset = frame.ObsOffsets[slot.FrameIndex];
                }
                else
                {
                    values = GroupRow(frame, slot);
                    offset = 0;
                }
                if (ObservationRows.Accepts(space, spec.ActionMask, values, offset, acting)) continue;
                string what = slot.Group < 0 ? "agent '" + frame.AgentId(slot.FrameIndex) + "': observation" : "group '" + slot.ActorId + "': observation";
                ObservationRows.Check(space, spec.ActionMask, values, offset, what, acting);
            }
        }

        // A group's joined observation (its members' in member order, as its module's batch gets it; their
        // sizes already checked against the module's), in a buffer reused frame after frame.
        float[] GroupRow(AgentFrame frame, Slot slot)
        {
            if (groupRow.Length < slot.Module.ObsDim) groupRow = new float[Math.Max(slot.Module.ObsDim, 2 * groupRow.Length)];
            GroupSpec group = groups[slot.Group];
            int at = 0;
            for (int k = 0; k < group.Members.Count; ++k)
            {
                int i = memberIndex[groupMemberOffset[slot.Group] + k];
                frame.CopyObs(i, groupRow, at);
                at += frame.ObsSize(i);
            }
            return groupRow;
        }

        // A byte box (1.4, §8.1) takes the integers 0-255 only: anything else is refused before anything of
        // the frame is recorded, as the server would refuse the whole batch for it (OBS_DTYPE_MISMATCH).
        void CheckByteBoxes(AgentFrame frame)
        {
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                if (slot.Module == null || !slot.Module.Spec.ObservationSpace.IsBytes) continue;
                int members = slot.Group < 0 ? 1 : groups[slot.Group].Members.Count;
                for (int k = 0; k < members; ++k)
                {
                    int i = slot.Group < 0 ? slot.FrameIndex : memberIndex[groupMemberOffset[slot.Group] + k];
                    int bad = frame.NonByteAt(i);
                    if (bad < 0) continue;
                    throw new TetherException(ErrorCode.ObsDtypeMismatch, "agent '" + frame.AgentId(i) + "': observation[" + bad + "] is " +
                                              frame.Obs(i, bad).ToString("R", System.Globalization.CultureInfo.InvariantCulture) +
                                              ": module '" + slot.Module.Id + "' observes a uint8 Box (integers 0-255)");
                }
            }
        }

        // episode null (ComputeActions, no episode kept): the server's answers are kept per
        // evaluation episode id instead, so that every call does not ask again. A running episode's
        // actors mapped ahead (MapAgents) take the answers it keeps.
        void MapActors(string episodeId, Episode episode)
        {
            if (newActorIds.Count == 0) return;
            if (mapping != null)
            {
                for (int k = 0; k < newSlots.Count; ++k) slots[newSlots[k]].Module = MapByRules(newActorIds[k], episodeId);
                return;
            }
            bool evaluating = episode == null;
            if (evaluating && (evaluationMappingEpisode != episodeId || evaluationMapped.Count >= MaxRememberedMappings))
            {
                evaluationMapped.Clear();
                evaluationMappingEpisode = episodeId;
            }
            // The new slots stay new (a running episode makes their actors next): only the ids
            // nobody answered yet are asked about.
            Dictionary<string, Module> known = evaluating ? evaluationMapped : episode.Mapped;
            unmappedIds.Clear();
            unmappedSlots.Clear();
            for (int k = 0; k < newSlots.Count; ++k)
            {
                Module module;
                if (known.Count > 0 && known.TryGetValue(newActorIds[k], out module))
                {
                    slots[newSlots[k]].Module = module;
                    continue;
                }
                unmappedIds.Add(newActorIds[k]);
                unmappedSlots.Add(newSlots[k]);
            }
            if (unmappedIds.Count == 0) return;
            AskMapping(episodeId, unmappedIds);
            for (int k = 0; k < unmappedSlots.Count; ++k) slots[unmappedSlots[k]].Module = askedModules[k];
            if (evaluating)
            {
                for (int k = 0; k < unmappedIds.Count; ++k) evaluationMapped[unmappedIds[k]] = askedModules[k];
            }
        }

        // One MAP_AGENTS for actorIds: every answer is checked before any is used; the modules go
        // into askedModules, in the order asked.
        void AskMapping(string episodeId, List<string> actorIds)
        {
            ++MapRequests;
            var ids = new JArray();
            foreach (string id in actorIds) ids.Add(id);
            JObject answer = link.Request(new JObject { { "type", "MAP_AGENTS" }, { "episode_id", episodeId }, { "agent_ids", ids } }, options.ResponseTimeoutSeconds);
            PolicyMapping.ReadAgentModules(answer, actorIds, isDescribed ?? (isDescribed = IsDescribed), askedModuleIds);
            askedModules.Clear();
            foreach (string moduleId in askedModuleIds) askedModules.Add(modules[moduleId]);
        }

        // Whether the last SET_CONFIG describes the module (modules keeps the ones it dropped, Gone).
        bool IsDescribed(string moduleId)
        {
            Module module;
            return modules.TryGetValue(moduleId, out module) && !module.Gone;
        }

        /// <summary>
        /// The module each of <paramref name="agentIds"/> plays in the running episode
        /// <paramref name="episodeId"/>, in the same order. With SET_CONFIG's rules this is local; with
        /// the server's function ("policy_mapping": null: self-play draws opponents per episode) the
        /// agents not mapped yet in this episode are asked about in one MAP_AGENTS, whose answers the
        /// episode keeps: their first frames then ask nothing. A game that knows an episode's agents (a
        /// turn-based game's seats) calls this once after <see cref="StartEpisode"/> and saves a round
        /// trip, a frame that waits on the network, per agent that acts later. A group member stands for
        /// its group. Throws INVALID_ARGUMENT (an episode not running, a null id), UNMAPPED_AGENT,
        /// TIMEOUT, TRAINING_DONE, NOT_READY (offline), and a <see cref="ProtocolException"/> for an answer
        /// that maps not every agent (INVALID_FIELD) or a rule or answer naming a module SET_CONFIG does not
        /// describe (UNKNOWN_MODULE), as a frame's mapping does; nothing is kept of a request that failed.
        /// </summary>
        public string[] MapAgents(string episodeId, IList<string> agentIds)
        {
            Poll();
            Episode episode = Running(episodeId, "MapAgents");
            if (agentIds == null) throw new TetherException(ErrorCode.InvalidArgument, "MapAgents: the agent ids are null");
            var found = new Module[agentIds.Count];
            var actorIds = new string[agentIds.Count];
            var unknown = new List<string>();
            var asking = new HashSet<string>();  // (each actor asked about once)
            for (int k = 0; k < agentIds.Count; ++k)
            {
                string agentId = agentIds[k];
                if (agentId == null) throw new TetherException(ErrorCode.InvalidArgument, "MapAgents: agent id " + k + " is null");
                MemberOf member;
                string actorId = groupOf.TryGetValue(agentId, out member) ? groups[member.Group].GroupId : agentId;
                actorIds[k] = actorId;
                Actor actor;
                if (episode.Actors.TryGetValue(actorId, out actor)) found[k] = actor.Module;
                else if (mapping != null) found[k] = MapByRules(actorId, episodeId);
                else if (!episode.Mapped.TryGetValue(actorId, out found[k]) && asking.Add(actorId)) unknown.Add(actorId);
            }
            if (unknown.Count > 0)
            {
                AskMapping(episodeId, unknown);
                for (int k = 0; k < unknown.Count; ++k) episode.Mapped[unknown[k]] = askedModules[k];
                for (int k = 0; k < found.Length; ++k)
                {
                    if (found[k] == null) found[k] = episode.Mapped[actorIds[k]];
                }
            }
            var result = new string[found.Length];
            for (int k = 0; k < found.Length; ++k) result[k] = found[k].Id;
            return result;
        }

        // The first matching rule's module. An id whose rule names one module maps the
        // same way in every episode: remembered, so a new episode's agents map without allocating.
        Module MapByRules(string actorId, string episodeId)
        {
            Module module;
            if (mappedByRule.TryGetValue(actorId, out module)) return module;
            foreach (MappingRule rule in mapping.Rules)
            {
                if (!rule.Matches(actorId)) continue;
                module = ModuleNamed(rule.ModuleFor(actorId, episodeId), actorId);
                if (rule.Module != null)
                {
                    if (mappedByRule.Count >= MaxRememberedMappings) mappedByRule.Clear();  // ids that keep changing: bounded
                    mappedByRule.Add(actorId, module);
                }
                return module;
            }
            throw new TetherException(ErrorCode.UnmappedAgent, "no policy-mapping rule matches agent id '" + actorId + "'");
        }

        Module ModuleNamed(string moduleId, string actorId)
        {
            if (moduleId == null || !IsDescribed(moduleId))
            {
                throw new ProtocolException(ErrorCode.UnknownModule, "agent '" + actorId + "' maps to module '" + moduleId + "', which SET_CONFIG does not describe");
            }
            return modules[moduleId];
        }

        // Gives each slot its module row and writes the actors' observations (a group's members joined in member order).
        void FillBatches(AgentFrame frame)
        {
            foreach (Module module in frameModules)
            {
                module.InFrame = false;
                module.Rows = 0;
            }
            frameModules.Clear();
            for (int s = 0; s < slotCount; ++s)
            {
                Module module = slots[s].Module;
                if (!module.InFrame)
                {
                    module.InFrame = true;
                    frameModules.Add(module);
                }
                slots[s].Row = module.Rows++;
            }
            foreach (Module module in frameModules) module.EnsureRows(module.Rows);
            float[] frameObs = frame.ObsValues;
            int[] offsets = frame.ObsOffsets;
            if (frameModules.Count == 1 && slotCount == frame.Count)
            {
                // One module, no group: the rows are the frame's agents in order, of the module's size (checked).
                Array.Copy(frameObs, 0, frameModules[0].BatchObs, 0, offsets[slotCount]);
                return;
            }
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                Module module = slot.Module;
                int at = slot.Row * module.ObsDim;
                if (slot.Group < 0)
                {
                    float[] into = module.BatchObs;
                    for (int k = offsets[slot.FrameIndex], end = offsets[slot.FrameIndex + 1]; k < end; ++k) into[at++] = frameObs[k];
                    continue;
                }
                GroupSpec group = groups[slot.Group];
                for (int k = 0; k < group.Members.Count; ++k)
                {
                    int i = memberIndex[groupMemberOffset[slot.Group] + k];
                    frame.CopyObs(i, module.BatchObs, at);
                    at += frame.ObsSize(i);
                }
            }
        }

        // ---- logged actions (1.6, §10.1) ---------------------------------------------------------

        // Logged steps go only to a server of 1.6 or later (§15): an older one would train on them as its policy's samples.
        void RefuseLoggingToOlderServer()
        {
            if (logsActions) return;
            throw new TetherException(ErrorCode.NotReady, "GetActions: the server at " + options.Address + " speaks protocol " + serverVersion +
                                      ": logged actions need 1.6 or later (an older server would train on them as the policy's own samples)");
        }

        // Gives each logged action of the frame to its actor's slot (an agent's, or a group's joint action),
        // checked against the actor's module as the server checks actions, before anything is recorded.
        void MatchLoggedActions(AgentFrame frame)
        {
            float[] obs = frame.ObsValues;
            int[] offsets = frame.ObsOffsets;
            double[] values = frame.LoggedValues;
            for (int k = 0, n = frame.LoggedCount; k < n; ++k)
            {
                string id = frame.LoggedActorId(k);
                Slot slot = null;
                for (int s = 0; s < slotCount && slot == null; ++s)
                {
                    if (slots[s].ActorId == id) slot = slots[s];
                }
                if (slot == null)
                {
                    MemberOf member;
                    if (groupOf.TryGetValue(id, out member))
                    {
                        string group = groups[member.Group].GroupId;
                        throw new TetherException(ErrorCode.InvalidArgument, "GetActions: '" + id + "' is a member of group '" + group +
                                                  "': log the group's joint action under '" + group + "'");
                    }
                    throw new TetherException(ErrorCode.InvalidArgument, "GetActions: '" + id + "' has a logged action but no observation in this frame");
                }
                ModuleSpec spec = slot.Module.Spec;
                ActionMask mask = spec.ActionMask;
                // (the mask is read from the actor's row: an agent's, or a group's joined observation)
                float[] rows = obs;
                int row = 0;
                if (slot.Group < 0) row = offsets[slot.FrameIndex];
                else if (mask != null) rows = GroupRow(frame, slot);
                int at = frame.LoggedOffset(k), length = frame.LoggedLength(k);
                if (!LoggedActions.Accepts(spec.ActionSpace, mask, rows, row, values, at, length))
                {
                    LoggedActions.Check(spec.ActionSpace, mask, rows, row, values, at, length, "GetActions: the logged action of '" + id + "' (module '" + spec.ModuleId + "')");
                }
                slot.Logged = k;
            }
        }

        // Which rows of each module of the frame take logged actions.
        void MarkLoggedRows(AgentFrame frame)
        {
            foreach (Module module in frameModules) module.AnyLogged = false;
            if (frame.LoggedCount == 0) return;
            foreach (Module module in frameModules) Array.Clear(module.LoggedRows, 0, module.Rows);
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                if (slot.Logged < 0) continue;
                slot.Module.LoggedRows[slot.Row] = true;
                slot.Module.AnyLogged = true;
            }
        }

        // Draws the actions of the module's rows, but those of its logged ones (their draws are not taken).
        void Sample(Module module)
        {
            Space space = module.Spec.ActionSpace;
            if (!module.AnyLogged)
            {
                Distributions.SampleRows(space, module.Dist, module.Rows, rng, rawBoxSamples, module.RecordActions, module.EnvActions, module.Logp);
                return;
            }
            int actDim = module.ActDim;
            bool[] logged = module.LoggedRows;
            for (int r = 0; r < module.Rows; ++r)
            {
                if (logged[r]) continue;
                Distributions.SampleRows(space, module.Dist, r, 1, rng, rawBoxSamples, module.RecordActions, r * actDim, module.EnvActions, r * actDim, module.Logp, r);
            }
        }

        // The logged actors' actions are those given: recorded as given (a Box's not clipped) and given back,
        // with a log-probability of 0 (the server does not use one at a logged step, §13.7).
        void TakeLoggedActions(AgentFrame frame)
        {
            double[] values = frame.LoggedValues;
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                if (slot.Logged < 0) continue;
                Module module = slot.Module;
                int actDim = module.ActDim, at = frame.LoggedOffset(slot.Logged);
                Array.Copy(values, at, module.RecordActions, slot.Row * actDim, actDim);
                Array.Copy(values, at, module.EnvActions, slot.Row * actDim, actDim);
                module.Logp[slot.Row] = 0;
            }
        }

        // ---- demonstrations (1.6, §18) -----------------------------------------------------------

        // Every actor's step of the frame that acted, into the demonstration file: its (joined) observation and
        // the action recorded (a Box's raw sample, or the logged action).
        void DemonstrationSteps(Episode episode)
        {
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                Module module = slot.Module;
                bool logged = module.AnyLogged && module.LoggedRows[slot.Row];
                demos.StepRow(episode.Id, slot.ActorId, module.Id, module.BatchObs, slot.Row * module.ObsDim, module.RecordActions, slot.Row * module.ActDim, logged);
            }
        }

        // An actor that leaves ends its demonstration episode with its final observation (a group's members' joined).
        void EndDemonstration(Episode episode, Slot slot, AgentFrame final, Module module, bool truncated)
        {
            if (demoObs.Length < module.ObsDim) demoObs = new float[module.ObsDim];
            if (slot.Group < 0)
            {
                if (final.ObsSize(slot.FrameIndex) != module.ObsDim) return;  // (of other spaces: the file was ended with them)
                final.CopyObs(slot.FrameIndex, demoObs, 0);
            }
            else
            {
                GroupSpec group = groups[slot.Group];
                int at = 0;
                for (int k = 0; k < group.Members.Count; ++k)
                {
                    int member = memberIndex[groupMemberOffset[slot.Group] + k];
                    if (at + final.ObsSize(member) > demoObs.Length) return;
                    final.CopyObs(member, demoObs, at);
                    at += final.ObsSize(member);
                }
                if (at != module.ObsDim) return;
            }
            EndDemonstration(episode.Id, slot.ActorId, demoObs, 0, !truncated);
        }

        // One inference run per module of the frame.
        void RunModules()
        {
            foreach (Module module in frameModules) RunModule(module, module.BatchObs);
        }

        // The module's inference run on its frame rows, observations `obs`: dist inputs in module.Dist.
        void RunModule(Module module, float[] obs)
        {
            if (module.Backend == null) throw new TetherException(ErrorCode.NotReady, "module '" + module.Id + "' has no model yet (the server sent none)");
            try
            {
                if (module.StateDim > 0)
                {
                    // (1.5) the actors' states fed and the states after the step read, by name (§12.1)
                    var recurrent = module.Backend as IRecurrentInferenceBackend;
                    if (recurrent == null || recurrent.State == null || recurrent.State.Width != module.StateDim)
                    {
                        throw new TetherException(ErrorCode.NotReady, "the model has no recurrent state of width " + module.StateDim + " bound");
                    }
                    recurrent.Run(obs, module.Rows, module.ObsDim, module.Dist, module.DistDim, module.StateIn, module.StateOut);
                }
                else
                {
                    module.Backend.Run(obs, module.Rows, module.ObsDim, module.Dist, module.DistDim);
                }
                Distributions.CheckFinite(module.Dist, module.Rows * module.DistDim);
            }
            catch (TetherException e)
            {
                throw new TetherException(e.Code, "module '" + module.Id + "': " + e.Detail, e);
            }
            ++InferenceRuns;
        }

        // (1.5, §12.4) Each slot's actor's state into its module's rows (a module with memory).
        void FillStates()
        {
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                int width = slot.Module.StateDim;
                if (width > 0) Array.Copy(slot.Actor.StateOf(width), 0, slot.Module.StateIn, slot.Row * width, width);
            }
        }

        // ... and the states the model returned back to the actors, once the frame acted.
        void CommitStates()
        {
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                int width = slot.Module.StateDim;
                if (width > 0) Array.Copy(slot.Module.StateOut, slot.Row * width, slot.Actor.State, 0, width);
            }
        }

        // ComputeActions refuses a running episode that is recorded when a module with memory acts in the frame
        // (1.5, §12.4): its next record's state_in must follow from its recorded observations.
        void RefuseRecordedEpisode(string episodeId)
        {
            Episode running;
            if (!episodes.TryGetValue(episodeId, out running) || running.Done || !running.Training) return;
            for (int s = 0; s < slotCount; ++s)
            {
                if (slots[s].Module.StateDim == 0) continue;
                throw new TetherException(ErrorCode.InvalidArgument, "ComputeActions: episode '" + episodeId +
                    "' is running and recorded; its states cannot advance on a step that is not recorded: " +
                    "use GetActions, or another episode id for evaluation");
            }
        }

        // ComputeActions' state keepers (1.5, §12.4): for each slot of a module with memory, the actor of the
        // running episode `episodeId` (of the same module), or else the evaluation episode's own actor.
        void EvaluationHolders(string episodeId)
        {
            if (evaluationStateEpisode != episodeId) ForgetEvaluationStates();
            evaluationStateEpisode = episodeId;
            Episode running;
            if (!episodes.TryGetValue(episodeId, out running) || running.Done) running = null;
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                if (slot.Module.StateDim == 0) continue;
                Actor holder = null;
                if (running != null && (!running.Actors.TryGetValue(slot.ActorId, out holder) || holder.Module != slot.Module)) holder = null;
                if (holder == null && (!evaluationActors.TryGetValue(slot.ActorId, out holder) || holder.Module != slot.Module))
                {
                    if (holder != null) spareActors.Push(holder);
                    holder = spareActors.Count > 0 ? spareActors.Pop() : new Actor();
                    holder.Reset(slot.ActorId, slot.Module, slot.Group >= 0, 0, false);
                    evaluationActors[slot.ActorId] = holder;
                }
                slot.Actor = holder;
            }
        }

        void ForgetEvaluationStates()
        {
            foreach (Actor actor in evaluationActors.Values) spareActors.Push(actor);
            evaluationActors.Clear();
            evaluationStateEpisode = null;
        }

        void LayOutActions(AgentFrame frame)
        {
            int n = frame.Count;
            if (slotCount == n && n > 0)
            {
                // No group: one action per agent; of one size when the frame's modules agree.
                int size = frameModules[0].ActDim;
                bool uniform = true;
                foreach (Module module in frameModules) uniform = uniform && module.ActDim == size;
                if (uniform)
                {
                    frame.LayOutUniformActions(size);
                    return;
                }
            }
            if (actionSizes.Length < n) actionSizes = new int[Math.Max(n, 2 * actionSizes.Length)];
            for (int i = 0; i < n; ++i) actionSizes[i] = 0;
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                if (slot.Group < 0)
                {
                    actionSizes[slot.FrameIndex] = slot.Module.ActDim;
                    continue;
                }
                GroupSpec group = groups[slot.Group];
                int part = slot.Module.ActDim / group.Members.Count;
                for (int k = 0; k < group.Members.Count; ++k) actionSizes[memberIndex[groupMemberOffset[slot.Group] + k]] = part;
            }
            frame.LayOutActions(actionSizes);
        }

        void WriteAction(Slot slot, double[] actions, int offset, AgentFrame frame)
        {
            int actDim = slot.Module.ActDim;
            if (slot.Group < 0)
            {
                frame.SetAction(slot.FrameIndex, actions, offset, actDim);
                return;
            }
            GroupSpec group = groups[slot.Group];
            int part = actDim / group.Members.Count;
            for (int k = 0; k < group.Members.Count; ++k) frame.SetAction(memberIndex[groupMemberOffset[slot.Group] + k], actions, offset + k * part, part);
        }

        // The module's table, of its sizes (a new connection may have changed them: no actor has rows then).
        StepTable TableOf(Module module)
        {
            StepTable table = module.Table;
            if (table == null) table = module.Table = NewTable(module, 0);
            else if (table.ObsDim != module.ObsDim || table.ValueDim != module.ValueDim || table.ActDim != module.ActDim || table.DistDim != module.DistDim ||
                     table.StateDim != module.StateDim)
            {
                table.Reset(module.ObsDim, module.ValueDim, module.ActDim, module.DistDim, module.StateDim);
            }
            return table;
        }

        StepTable NewTable(Module module, int rows)
        {
            StepTable table = spareTables.Count > 0 ? spareTables.Pop() : new StepTable();
            table.Reset(module.ObsDim, module.ValueDim, module.ActDim, module.DistDim, module.StateDim);
            table.Reserve(rows);
            return table;
        }

        // Appends the frame's rows of the module (observations, actions, logp, dist inputs; rewards
        // 0; the version acted with) to its table; returns the first.
        int RecordFrameRows(Module module)
        {
            StepTable table = TableOf(module);
            int first = table.Rows, n = module.Rows;
            table.Reserve(first + n);
            Array.Copy(module.BatchObs, 0, table.Obs, first * module.ObsDim, n * module.ObsDim);
            Array.Copy(module.RecordActions, 0, table.Actions, first * module.ActDim, n * module.ActDim);
            Array.Copy(module.Dist, 0, table.Dist, first * module.DistDim, n * module.DistDim);
            Array.Copy(module.Logp, 0, table.Logp, first, n);
            if (module.StateDim > 0) Array.Copy(module.StateIn, 0, table.State, first * module.StateDim, n * module.StateDim);  // (each row's state_in, 1.5)
            if (module.AnyLogged) Array.Copy(module.LoggedRows, 0, table.Logged, first, n);  // (1.6: logged_runs)
            else Array.Clear(table.Logged, first, n);
            Array.Clear(table.Rewards, first, n);
            table.NoteVersion(first, module.Seq ?? -1, module.SeqConnection);
            table.Rows = first + n;
            return first;
        }

        // A new row of the module's table with only an observation (a final one); returns it.
        int NewObsRow(Module module)
        {
            StepTable table = TableOf(module);
            table.Reserve(table.Rows + 1);
            return table.Rows++;
        }

        // The critic row of table row `row` of the module (§9.7).
        void WriteValueObs(Episode episode, Module module, int row)
        {
            int dim = module.ObsDim;
            float[] into = module.Table.ValueObs;
            int at = row * module.ValueDim;
            foreach (string agent in module.Spec.ValueObsAgents)
            {
                List<float> latest;
                int have = episode.LatestObs.TryGetValue(agent, out latest) ? Math.Min(dim, latest.Count) : 0;
                for (int j = 0; j < have; ++j) into[at++] = latest[j];
                for (int j = have; j < dim; ++j) into[at++] = 0f;  // zeros for an agent not observed yet (§9.7)
            }
        }

        List<float> LatestOf(Episode episode, string agentId)
        {
            List<float> latest;
            if (!episode.LatestObs.TryGetValue(agentId, out latest))
            {
                latest = spareRows.Count > 0 ? spareRows.Pop() : new List<float>();
                episode.LatestObs.Add(agentId, latest);
            }
            latest.Clear();
            return latest;
        }

        // Every slot's NoteLatest, with a single agent's in its Actor copied inline.
        void NoteLatestAll(Episode episode, AgentFrame frame)
        {
            float[] frameObs = frame.ObsValues;
            int[] offsets = frame.ObsOffsets;
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                Actor actor = slot.Actor;
                if (slot.Group >= 0 || actor.SharedLatest)
                {
                    NoteLatest(episode, slot, frame);
                }
                else if (!actor.Training || actor.ObsRows == 0)
                {
                    int i = slot.FrameIndex;
                    actor.SetLatest(frameObs, offsets[i], offsets[i + 1] - offsets[i]);
                }
            }
        }

        // Keeps an actor's latest observation: a single agent's in its Actor (and in the
        // episode's map when a critic sees it), a group's members' in the map.
        void NoteLatest(Episode episode, Slot slot, AgentFrame frame)
        {
            if (slot.Group < 0)
            {
                if (slot.Actor != null && (!slot.Actor.Training || slot.Actor.ObsRows == 0))
                {
                    int[] offsets = frame.ObsOffsets;
                    slot.Actor.SetLatest(frame.ObsValues, offsets[slot.FrameIndex], offsets[slot.FrameIndex + 1] - offsets[slot.FrameIndex]);
                }
                // (an actor knows whether a critic sees it: no set lookup per agent per frame)
                bool criticSees = slot.Actor != null ? slot.Actor.SharedLatest : criticAgents.Contains(slot.ActorId);
                if (criticSees) frame.CopyObs(slot.FrameIndex, LatestOf(episode, slot.ActorId));
                return;
            }
            GroupSpec group = groups[slot.Group];
            for (int k = 0; k < group.Members.Count; ++k) frame.CopyObs(memberIndex[groupMemberOffset[slot.Group] + k], LatestOf(episode, group.Members[k]));
        }

        void EndActors(Episode episode, AgentFrame finalObservations, bool allTruncated)
        {
            Settle(episode);
            // Group members not in the frame end with their latest observation.
            AgentFrame final = endFrame;
            final.Clear();
            for (int i = 0; i < finalObservations.Count; ++i)
            {
                scratchObs.Clear();
                finalObservations.CopyObs(i, scratchObs);
                final.Add(finalObservations.AgentId(i), scratchObs.ToArray(), finalObservations.Truncated(i) || allTruncated);
            }
            for (int i = 0, n = finalObservations.Count; i < n; ++i)
            {
                MemberOf member;
                if (!groupOf.TryGetValue(finalObservations.AgentId(i), out member)) continue;
                foreach (string other in groups[member.Group].Members)
                {
                    bool named = false;
                    for (int j = 0; j < final.Count && !named; ++j) named = final.AgentId(j) == other;
                    List<float> latest;
                    if (named || !episode.LatestObs.TryGetValue(other, out latest)) continue;
                    final.Add(other, latest.ToArray(), allTruncated);
                }
            }
            Gather(episode, final, episode.Id, true);  // sizes; maps nothing
            for (int s = 0; s < slotCount; ++s) NoteLatest(episode, slots[s], final);
            for (int s = 0; s < slotCount; ++s)
            {
                Slot slot = slots[s];
                bool truncated = false;
                if (slot.Group < 0)
                {
                    episode.Ended.Add(slot.ActorId);
                    truncated = final.Truncated(slot.FrameIndex);
                }
                else
                {
                    GroupSpec group = groups[slot.Group];
                    for (int k = 0; k < group.Members.Count; ++k)
                    {
                        episode.Ended.Add(group.Members[k]);
                        truncated = truncated || final.Truncated(memberIndex[groupMemberOffset[slot.Group] + k]);
                    }
                }
                Actor actor;
                if (!episode.Actors.TryGetValue(slot.ActorId, out actor)) continue;  // observed its end without acting: nothing to train on
                episode.Actors.Remove(slot.ActorId);
                Array.Clear(episode.ActorBySlot, 0, episode.ActorsBySlot);
                Array.Clear(episode.SlotIds, 0, episode.ActorsBySlot);
                episode.ActorsBySlot = 0;
                episode.SlotModule = null;
                FoldReturn(episode, actor);
                Module module = actor.Module;
                if (demos != null) EndDemonstration(episode, slot, final, module, truncated);
                if (actor.Training)
                {
                    int row = NewObsRow(module);
                    float[] into = module.Table.Obs;
                    int at = row * module.ObsDim;
                    if (slot.Group < 0)
                    {
                        final.CopyObs(slot.FrameIndex, into, at);
                    }
                    else
                    {
                        GroupSpec group = groups[slot.Group];
                        for (int k = 0; k < group.Members.Count; ++k)
                        {
                            int member = memberIndex[groupMemberOffset[slot.Group] + k];
                            final.CopyObs(member, into, at);
                            at += final.ObsSize(member);
                        }
                    }
                    if (module.ValueDim > 0) WriteValueObs(episode, module, row);
                    actor.AddRow(row);
                }
                actor.Truncated = truncated;
                actor.Terminated = !truncated;
                if (actor.Training && actor.ActionRows > 0) episode.Finished.Add(actor);
                else spareActors.Push(actor);
            }
            RecountPending();
        }

        static void AddReturn(Episode episode, string actorId, double reward)
        {
            double sum;
            episode.Returns.TryGetValue(actorId, out sum);
            episode.Returns[actorId] = sum + reward;
        }

        static void FoldReturn(Episode episode, Actor actor)
        {
            if (actor.Rewarded) AddReturn(episode, actor.Id, actor.RewardSum);
            actor.RewardSum = 0;
            actor.Rewarded = false;
        }

        void RemoveEpisode(Episode episode)
        {
            episodes.Remove(episode.Id);
            episodeOrder.Remove(episode.Id);
            foreach (Actor actor in episode.Actors.Values) spareActors.Push(actor);
            foreach (Actor actor in episode.Finished) spareActors.Push(actor);
            episode.Actors.Clear();
            episode.Finished.Clear();
            episode.Reset(null, false, false, spareRows);
            spareEpisodes.Push(episode);
        }

        // ---- cutting and sending ---------------------------------------------------------------

        // Whether SendableSteps() >= need. At most one step per actor is held back: when the recorded
        // steps less one per actor of the training episodes reach it, no actor is walked.
        bool Sendable(int need)
        {
            int actors = 0;
            foreach (Episode episode in episodes.Values)
            {
                if (episode.Training) actors += episode.Actors.Count;
            }
            if (pendingSteps - actors >= need) return true;
            SettleAll();
            return SendableSteps() >= need;
        }

        int SendableSteps()
        {
            // Every actor's latest action is held back until its next observation (§10.7).
            int held = 0;
            foreach (Episode episode in episodes.Values)
            {
                if (!episode.Training) continue;
                foreach (Actor actor in episode.Actors.Values)
                {
                    if (actor.Training && actor.ActionRows > 0 && actor.ObsRows == actor.ActionRows) ++held;
                }
            }
            return Math.Max(0, pendingSteps - held);
        }

        void RecountPending()
        {
            pendingSteps = 0;
            foreach (Episode episode in episodes.Values)
            {
                if (!episode.Training) continue;
                foreach (Actor actor in episode.Actors.Values) pendingSteps += actor.ActionRows;
                foreach (Actor actor in episode.Finished) pendingSteps += actor.ActionRows;
            }
        }

        // Hands the actor's complete steps to an entry of `record` (the rows stay in the module's cut
        // table, which goes with the batch: only their numbers are copied) and, unless it leaves
        // (keep false), moves the rows it keeps (its latest observation, and the action held back
        // until the next one, §10.7) to the module's new table. Whether an entry was made.
        bool Cut(Actor actor, MultiAgentRecord record, Batch batch, bool keep)
        {
            int actions = actor.ActionRows, observations = actor.ObsRows;
            if (observations == 0) return false;
            Module module = actor.Module;
            StepTable from = module.CutTable;
            int[] rows = actor.Rows;
            int k = observations == actions + 1 ? actions : Math.Max(0, actions - 1);
            if (k > 0)
            {
                bool done = (actor.Terminated || actor.Truncated) && k == actions;
                AgentEntry entry = spareEntries.Count > 0 ? spareEntries.Pop() : new AgentEntry();
                entry.AgentId = actor.Id;
                entry.Module = module.Spec;
                entry.StartStep = actor.StartStep;
                entry.IsTerminated = done && actor.Terminated;
                entry.IsTruncated = done && actor.Truncated;
                entry.Table = from;
                module.CutUsed = true;
                if (batch.RowIndex.Length < batch.RowIndexCount + k + 1)
                {
                    Array.Resize(ref batch.RowIndex, Math.Max(batch.RowIndexCount + k + 1, 2 * batch.RowIndex.Length));
                }
                entry.First = batch.RowIndexCount;
                entry.Steps = k;
                Array.Copy(rows, 0, batch.RowIndex, batch.RowIndexCount, k + 1);
                batch.RowIndexCount += k + 1;
                // Per module, the oldest version the steps used (a later connection's server may count
                // versions anew: steps are compared within their connection); and whether the steps'
                // versions go with them: each known, learned on this connection, and not all one (§10.1).
                if (from.OneVersion)
                {
                    NoteOldest(module, from.Version, from.Connection);
                    entry.WithVersions = false;  // (one version: the message's claim)
                }
                else
                {
                    long first = from.VersionOf(rows[0]);
                    bool known = true, mixed = false;
                    for (int i = 0; i < k; ++i)
                    {
                        long v = from.VersionOf(rows[i]);
                        int c = from.ConnectionOf(rows[i]);
                        NoteOldest(module, v, c);
                        if (v < 0 || v > VersionRuns.MaxVersion || c != connection) known = false;
                        if (v != first) mixed = true;
                    }
                    entry.WithVersions = known && mixed;  // (a group's too: its entry is one actor)
                }
                bool logged = false;
                bool[] flags = from.Logged;
                for (int i = 0; i < k && !logged; ++i) logged = flags[rows[i]];
                entry.WithLogged = logged;  // (1.6: written as logged_runs, §10.1)
                record.Agents.Add(entry);
            }
            if (keep)
            {
                StepTable to = module.Table;
                for (int i = k; i < observations; ++i) rows[i - k] = to.CopyRow(from, rows[i], i < actions);
                actor.ObsRows = observations - k;
                actor.ActionRows = actions - k;
            }
            return k > 0;
        }

        static void NoteOldest(Module module, long version, int learnedOn)
        {
            if (version < 0) return;
            if (!module.HasOldest || learnedOn < module.OldestConnection || (learnedOn == module.OldestConnection && version < module.OldestSeq))
            {
                module.HasOldest = true;
                module.OldestSeq = version;
                module.OldestConnection = learnedOn;
            }
        }

        // sendEmpty: sent even without records (held-back episodes made it due), for its answer.
        internal override void SendBatch(bool sendEmpty = false)
        {
            SettleAll();
            Batch batch = spareBatches.Count > 0 ? spareBatches.Pop() : new Batch();
            // Each module's recorded rows go with the batch; a new table takes the rows the actors keep.
            foreach (Module module in modules.Values)
            {
                module.HasOldest = false;
                module.CutUsed = false;
                module.CutTable = null;
                if (module.Table == null || module.Table.Rows == 0) continue;
                module.CutTable = module.Table;
                module.Table = NewTable(module, module.CutTable.Rows);
            }

            for (int e = 0; e < episodeOrder.Count; ++e)
            {
                Episode episode = episodes[episodeOrder[e]];
                if (!episode.Training) continue;
                MultiAgentRecord record = spareRecords.Count > 0 ? spareRecords.Pop() : new MultiAgentRecord();
                record.EpisodeId = episode.Id;
                foreach (Actor actor in episode.Finished)
                {
                    Cut(actor, record, batch, false);
                    spareActors.Push(actor);
                }
                episode.Finished.Clear();
                foreach (Actor actor in episode.Actors.Values)
                {
                    if (actor.Training) Cut(actor, record, batch, true);
                }
                if (record.Agents.Count > 0 || episode.Done)
                {
                    record.IsTerminated = episode.Done && !episode.Truncated;
                    record.IsTruncated = episode.Done && episode.Truncated;
                    record.EnvParams = episode.EnvParams;  // (1.7, §19.3: every record of the episode; the measure on its last)
                    record.Measure = episode.Done && episode.EnvParams != null ? episode.Measure : null;
                    batch.Records.Add(record);
                }
                else
                {
                    spareRecords.Push(record);
                }
                if (episode.Done)
                {
                    RemoveEpisode(episode);
                    --e;
                }
            }
            foreach (Module module in modules.Values)
            {
                if (module.CutTable == null) continue;
                if (module.CutUsed) batch.Tables.Add(module.CutTable);
                else spareTables.Push(module.CutTable);
                module.CutTable = null;
            }
            RecountPending();
            int envSteps = envStepsSinceCut;
            envStepsSinceCut = 0;
            heldSteps = 0;  // at every cut, whether a batch goes or not (§13.2)
            if (batch.Records.Count == 0 && !sendEmpty)
            {
                Recycle(batch);
                return;
            }
            foreach (MultiAgentRecord record in batch.Records) batch.AgentSteps += record.AgentSteps;
            batch.EnvSteps = envSteps;
            // The claims (§7.6): per module, the oldest version its steps used (of the earliest
            // connection); a module without steps here reports the version it holds.
            foreach (Module module in modules.Values)
            {
                if (module.HasOldest) batch.ModuleClaims[module.Id] = module.OldestSeq;
                else if (module.Seq.HasValue) batch.ModuleClaims[module.Id] = module.Seq.Value;
            }
            if (Submit(batch, sendEmpty, WaitsForWeights) && (WaitsForWeights || link.EventsPending)) TakeEvents();
        }

        internal override void Recycle(Batch batch)
        {
            foreach (MultiAgentRecord record in batch.Records)
            {
                foreach (AgentEntry entry in record.Agents)
                {
                    entry.Clear();
                    spareEntries.Push(entry);
                }
                record.Agents.Clear();
                record.EpisodeId = null;
                record.IsTerminated = record.IsTruncated = false;
                record.EnvParams = null;
                record.Measure = null;
                spareRecords.Push(record);
            }
            foreach (StepTable table in batch.Tables) spareTables.Push(table);
            batch.Reset();
            spareBatches.Push(batch);
        }

        internal override void ForgetEpisodes(ICollection<string> ids)
        {
            SettleAll();
            foreach (string id in ids)
            {
                Episode episode;
                if (!episodes.TryGetValue(id, out episode)) continue;
                episode.Training = false;
                foreach (Actor actor in episode.Finished) spareActors.Push(actor);
                episode.Finished.Clear();
                foreach (Actor actor in episode.Actors.Values) actor.StopTraining();
                if (episode.Done) RemoveEpisode(episode);
            }
            RecountPending();
        }

        // ---- events from the I/O thread --------------------------------------------------------

        internal override EpisodeEnvParams DrawnParams(string episodeId, string call)
        {
            return Known(episodeId, call).EnvParams;
        }

        // 1.7 (§19.3): the measure is reported while the episode runs, as every SDK requires.
        internal override void SetMeasure(string episodeId, double measure, string call)
        {
            Episode episode = Known(episodeId, call);
            if (episode.Done)
            {
                throw new TetherException(ErrorCode.InvalidArgument,
                                          call + ": episode '" + episodeId + "' has ended: report its measure before EndEpisode");
            }
            episode.Measure = measure;
        }

        // A running episode, or one ended whose last steps are not cut yet; INVALID_ARGUMENT naming `call` otherwise.
        Episode Known(string episodeId, string call)
        {
            Episode episode;
            if (episodeId == null || !episodes.TryGetValue(episodeId, out episode))
            {
                throw new TetherException(ErrorCode.InvalidArgument, call + ": no episode '" + episodeId + "' (unknown, or ended and sent)");
            }
            return episode;
        }

        // The end of training: every episode's steps not cut yet are let go, held-back ones stop counting.
        internal override bool StopRecording()
        {
            bool unsent = pendingSteps > 0;
            ForgetEpisodes(new List<string>(episodeOrder));
            foreach (Episode episode in episodes.Values) episode.HeldBack = false;
            heldSteps = 0;
            envStepsSinceCut = 0;
            return unsent;
        }

        internal override bool Configured { get { return serverConfig != null; } }

        // What reaches the actors' steps (a new configuration, the end of training, a refusal): they note
        // their rows first.
        internal override void Taking(List<LinkEvent> events)
        {
            foreach (LinkEvent e in events)
            {
                if (e.Kind == LinkEventKind.Connected || e.Kind == LinkEventKind.TrainingDone || (e.Kind == LinkEventKind.Batch && e.Batch.Error != null))
                {
                    SettleAll();
                    return;
                }
            }
        }

        // A configuration this client cannot use ends the link for good.
        internal override void Connected(LinkEvent e)
        {
            try
            {
                Configure(e.Config, e.Info);
            }
            catch (TetherException error)
            {
                if (e.State != null) e.State.Dispose();
                fatal = error;
                return;
            }
            connection = e.Connection;
            Apply(e.State);
        }

        internal override void Answered(Batch batch)
        {
            EnvStepsSent += batch.EnvSteps;
            AgentStepsSent += batch.AgentSteps;
        }

        void Configure(JObject config, JObject info)
        {
            var moduleSpecs = config["modules"] as JObject;
            if (moduleSpecs == null || moduleSpecs.Count == 0)
            {
                throw new TetherException(ErrorCode.InvalidField, "SET_CONFIG describes no \"modules\" (the server speaks RLlink < 1.2 or has one module: use TetherClient)");
            }
            var specs = new Dictionary<string, ModuleSpec>();
            foreach (JProperty item in moduleSpecs.Properties()) specs[item.Name] = ModuleSpec.FromJson(item.Name, item.Value);
            PolicyMapping rules = null;
            JToken ruleList = config["policy_mapping"];
            if (ruleList != null && ruleList.Type != JTokenType.Null)
            {
                rules = PolicyMapping.FromJson(ruleList);
                foreach (string module in rules.Modules())  // (the first missing one in code point order is named)
                {
                    if (!specs.ContainsKey(module)) throw new TetherException(ErrorCode.InvalidField, "SET_CONFIG policy_mapping names module '" + module + "', which is not in \"modules\"");
                }
            }
            var groupSpecs = new List<GroupSpec>();
            JToken groupList = config["groups"];
            if (groupList != null && groupList.Type != JTokenType.Null)
            {
                var groupObject = groupList as JObject;
                if (groupObject == null) throw new TetherException(ErrorCode.InvalidField, "SET_CONFIG groups is not an object");
                var seen = new HashSet<string>();
                foreach (JProperty item in groupObject.Properties())
                {
                    GroupSpec group = GroupSpec.FromJson(item.Name, item.Value);
                    foreach (string member in group.Members)
                    {
                        if (!seen.Add(member) || groupObject[member] != null)
                        {
                            throw new TetherException(ErrorCode.InvalidField, "SET_CONFIG groups: agent '" + member + "' is in two groups, or is a group itself");
                        }
                    }
                    groupSpecs.Add(group);
                }
            }
            // Modules are kept (actors point at them). Each acts with its model until the new
            // connection sends another (as TetherClient does), unless its spaces changed (that model
            // cannot serve them) or the server no longer describes it: then it has none (NOT_READY)
            // until one comes. Its steps recorded under the old spaces, or with critic rows laid out
            // for other agents, and not cut yet no longer fit: they are dropped (§6.5), so that the
            // other modules' steps still go, as in every SDK.
            if (runChanged)
            {
                // (1.8, §6.5) Another server run: every module's steps not cut yet were acted with weights whose
                // versions name other weights in this run; they go (counted), and recurrent states start from
                // zeros. Each model stays until this connection's replaces it.
                otherRunUnsentDropped += DropUnsentOfEveryModule();
                evaluationActors.Clear();  // (states of another run's models: the next evaluation starts from zeros)
                evaluationStateEpisode = null;
            }
            int widest = 0;
            bool modulesChanged = false;  // another set of modules, or other spaces of one
            foreach (KeyValuePair<string, ModuleSpec> spec in specs)
            {
                Module module;
                if (!modules.TryGetValue(spec.Key, out module))
                {
                    module = new Module { Id = spec.Key };
                    modules.Add(spec.Key, module);
                    modulesChanged = true;
                }
                else
                {
                    // (1.5, §12.4: a model with another recurrent state cannot continue the states kept)
                    bool spacesChanged = module.Gone || !SameSpace(module.Spec.ObservationSpace, spec.Value.ObservationSpace) ||
                                         !SameSpace(module.Spec.ActionSpace, spec.Value.ActionSpace) ||
                                         !RecurrentState.Same(module.Spec.RecurrentState, spec.Value.RecurrentState);
                    if (spacesChanged || !SameAgents(module.Spec.ValueObsAgents, spec.Value.ValueObsAgents)) DropStepsOf(module);
                    if (spacesChanged) ResetModel(module);
                    modulesChanged = modulesChanged || spacesChanged;
                }
                module.Gone = false;
                module.SetSpec(spec.Value);
                widest = Math.Max(widest, module.ActDim);
            }
            foreach (Module module in modules.Values)
            {
                if (specs.ContainsKey(module.Id) || module.Gone) continue;
                DropStepsOf(module);  // the server would refuse them (UNKNOWN_MODULE), with their batch
                ResetModel(module);
                module.Gone = true;
                modulesChanged = true;
            }
            envAction = new double[Math.Max(1, widest)];
            mapping = rules;
            mappedByRule.Clear();
            evaluationMapped.Clear();
            evaluationMappingEpisode = null;
            foreach (Episode running in episodes.Values) running.Mapped.Clear();  // (this server may map otherwise: asked again)
            groups.Clear();
            groupsById.Clear();
            groupOf.Clear();
            groupMemberOffset.Clear();
            int members = 0;
            foreach (GroupSpec group in groupSpecs)
            {
                groupMemberOffset.Add(members);
                for (int k = 0; k < group.Members.Count; ++k) groupOf[group.Members[k]] = new MemberOf { Group = groups.Count, Position = k };
                members += group.Members.Count;
                groups.Add(group);
                groupsById[group.GroupId] = group;
            }
            memberIndex = new int[members];
            groupSlot = new int[groups.Count];
            criticAgents.Clear();
            foreach (ModuleSpec spec in specs.Values) criticAgents.UnionWith(spec.ValueObsAgents);
            // Agents the critics see now (or no longer): an acting agent that became one starts its
            // critic rows with its latest observation.
            foreach (Episode episode in episodes.Values)
            {
                foreach (Actor actor in episode.Actors.Values)
                {
                    bool shared = criticAgents.Contains(actor.Id);
                    if (shared && !actor.SharedLatest && !actor.IsGroup)
                    {
                        List<float> latest = LatestOf(episode, actor.Id);
                        actor.CopyLatest(latest);
                        if (latest.Count != actor.Module.ObsDim) latest.Clear();  // (of the old size: zeros until it acts)
                    }
                    actor.SharedLatest = shared;
                }
            }
            stepsPerSample = (int)Messages.IntegerOr(config["env_steps_per_sample"], 500, 1, int.MaxValue);
            JToken onPolicy = config["force_on_policy"];
            forceOnPolicy = onPolicy == null || onPolicy.Type != JTokenType.Boolean || (bool)onPolicy;
            JToken version = info == null ? null : info["protocol_version"];
            announcesVersion = version != null && version.Type == JTokenType.String;
            int[] parsed = announcesVersion ? Messages.ParseVersion((string)version) : null;
            rawBoxSamples = parsed == null || parsed[0] > 1 || (parsed[0] == 1 && parsed[1] >= 3);
            logsActions = parsed != null && (parsed[0] > 1 || (parsed[0] == 1 && parsed[1] >= 6));
            serverVersion = version == null ? "none (a plain RLlink v1 server)" : version.ToString(Newtonsoft.Json.Formatting.None);
            serverConfig = config;
            // (1.6, §18) a demonstration file names the first configuration's modules: other ones end it
            if (modulesChanged) StopDemonstrations();
            StartDemonstrations(specs);
        }

        // The uncut steps of the module's actors are let go (a reconnect's SET_CONFIG gave the module
        // other spaces or another critic layout, or does not describe it): the episodes go on, each
        // actor's next chunk starting from its next observation, with the same start_step; actors
        // that left with steps not cut yet leave nothing to send.
        void DropStepsOf(Module module)
        {
            SettleAll();
            foreach (Episode episode in episodes.Values)
            {
                foreach (Actor actor in episode.Actors.Values)
                {
                    if (actor.Module == module && actor.Training) actor.DropSteps();
                }
                for (int i = episode.Finished.Count - 1; i >= 0; --i)
                {
                    Actor actor = episode.Finished[i];
                    if (actor.Module != module) continue;
                    episode.Finished.RemoveAt(i);
                    spareActors.Push(actor);
                }
            }
            RecountPending();
        }

        // (1.8, §6.5) The uncut steps of every module's actors are let go, as DropStepsOf lets a module's go, and
        // every actor's state starts again from zeros (the steps were acted under another server run). Returns
        // how many agent steps of training episodes went (those of actors that left included).
        int DropUnsentOfEveryModule()
        {
            SettleAll();
            RecountPending();
            int dropped = pendingSteps;
            foreach (Episode episode in episodes.Values)
            {
                foreach (Actor actor in episode.Actors.Values)
                {
                    if (actor.Training) actor.DropSteps();
                    actor.StateFresh = true;
                }
                foreach (Actor actor in episode.Finished) spareActors.Push(actor);
                episode.Finished.Clear();
            }
            RecountPending();
            return dropped;
        }

        // The module's model is let go (other spaces or recurrent state, or the module is gone): so are its
        // actors' states (1.5, §12.4), which start again from zeros.
        void ResetModel(Module module)
        {
            link.Retire(module.Backend);
            module.Backend = null;
            module.Seq = null;
            foreach (Episode episode in episodes.Values)
            {
                foreach (Actor actor in episode.Actors.Values)
                {
                    if (actor.Module == module) actor.StateFresh = true;
                }
            }
            ForgetEvaluationStates();
        }

        // Whether steps recorded under space a fit space b: the same kind, shape and bounds (of a Box's
        // dtype only whether it is uint8, §8.1), as the C++ SDK's Space::operator== and Python's same_space.
        internal static bool SameSpace(Space a, Space b)
        {
            if (a == null || b == null) return a == b;
            if (a.Kind != b.Kind) return false;
            switch (a.Kind)
            {
                case SpaceKind.Box: return a.IsBytes == b.IsBytes && Same(a.Shape, b.Shape) && Same(a.Low, b.Low) && Same(a.High, b.High);
                case SpaceKind.Discrete: return a.N == b.N && a.Start == b.Start;
                case SpaceKind.MultiDiscrete: return Same(a.Nvec, b.Nvec);
                default:
                    if (a.Children.Count != b.Children.Count) return false;
                    for (int i = 0; i < a.Children.Count; ++i)
                    {
                        if (a.Children[i].Key != b.Children[i].Key || !SameSpace(a.Children[i].Value, b.Children[i].Value)) return false;
                    }
                    return true;
            }
        }

        static bool Same<T>(T[] a, T[] b)
        {
            if (a == null || b == null) return a == b;
            if (a.Length != b.Length) return false;
            var equal = EqualityComparer<T>.Default;
            for (int i = 0; i < a.Length; ++i)
            {
                if (!equal.Equals(a[i], b[i])) return false;
            }
            return true;
        }

        static bool SameAgents(List<string> a, List<string> b)
        {
            if (a.Count != b.Count) return false;
            for (int i = 0; i < a.Count; ++i)
            {
                if (a[i] != b[i]) return false;
            }
            return true;
        }

        internal override void Apply(PreparedState state)
        {
            if (state == null) return;
            if (state.ModuleBackends != null)
            {
                foreach (KeyValuePair<string, IInferenceBackend> loaded in state.ModuleBackends)
                {
                    Module module;
                    if (!modules.TryGetValue(loaded.Key, out module) || module.Gone)
                    {
                        link.Retire(loaded.Value);
                        continue;
                    }
                    link.Retire(module.Backend);
                    module.Backend = loaded.Value;  // the swap: the next frame uses the new model
                    ++ModelsLoaded;
                }
            }
            if (state.ModuleSeqs != null)
            {
                foreach (KeyValuePair<string, long> seq in state.ModuleSeqs)
                {
                    Module module;
                    if (!modules.TryGetValue(seq.Key, out module) || module.Gone) continue;
                    module.Seq = seq.Value;
                    module.SeqConnection = connection;
                }
            }
        }
    }
}
