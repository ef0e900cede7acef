// The single-agent client: a game calls GetAction every step of each episode;
// inference is local, experience goes to the server in batches off the game's thread.
using System;
using System.Collections.Generic;
using Newtonsoft.Json.Linq;
using Tether.Inference;
using Tether.Protocol;
using Tether.Sampling;

namespace Tether.Client
{
    /// <summary>
    /// Connects to a Tether server, acts with the server's latest model (ONNX
    /// Runtime, on the calling thread) and sends the steps it records in batches
    /// from a background I/O thread. GetAction never waits on the network
    /// (unless <see cref="ClientOptions.WaitForWeights"/> asks for strict
    /// on-policy waiting) and, once episodes have run, allocates nothing: ended
    /// episodes' arrays are reused. A new model is swapped in between two calls.
    /// When the server's run is done (ERROR TRAINING_DONE, §6.6) <see cref="ClientBase.TrainingDone"/>
    /// holds its summary: no error is raised, nothing is reconnected, recorded or sent any
    /// more, and every call goes on acting with the last model.
    /// Not thread-safe: call it from one thread (the game's).
    /// </summary>
    public sealed class TetherClient : ClientBase
    {
        // An episode's observation rows not cut yet, written in place. A byte box's rows (protocol 1.4,
        // §8.1: a camera image) are kept as the bytes they are, a quarter of the memory, copied without
        // widening; they become floats only when a cut copies them into its chunk. Other rows are floats.
        sealed class ObsBuffer
        {
            public float[] Items = new float[0];
            public byte[] ByteItems = new byte[0];
            public int Count;
            bool bytes;  // rows are in ByteItems

            public void Clear() { Count = 0; }

            /// <summary>Adds n values: `values`, or else `source`'s bytes; kept as bytes when `asBytes`
            /// (a byte box's row, whose float values were checked to be integers 0-255).</summary>
            public void Add(float[] values, byte[] source, int n, bool asBytes)
            {
                if (asBytes != bytes)
                {
                    // Rows change form only with the spaces, and new spaces drop the kept rows first (DropForNewSpaces).
                    if (Count != 0) throw new InvalidOperationException("observation rows of the other form are kept");
                    bytes = asBytes;
                }
                int at = Count;
                if (bytes)
                {
                    if (ByteItems.Length < at + n) Array.Resize(ref ByteItems, Math.Max(at + n, 2 * ByteItems.Length));
                    if (source != null) Buffer.BlockCopy(source, 0, ByteItems, at, n);
                    else for (int i = 0; i < n; ++i) ByteItems[at + i] = (byte)values[i];
                }
                else
                {
                    if (Items.Length < at + n) Array.Resize(ref Items, Math.Max(at + n, 2 * Items.Length));
                    float[] items = Items;
                    if (values != null) Array.Copy(values, 0, items, at, n);
                    else for (int i = 0; i < n; ++i) items[at + i] = source[i];
                }
                Count = at + n;
            }

            public void RemoveLast(int n) { Count -= n; }

            public void RemoveFirst(int n)
            {
                if (bytes) Buffer.BlockCopy(ByteItems, n, ByteItems, 0, Count - n);
                else Array.Copy(Items, n, Items, 0, Count - n);
                Count -= n;
            }

            public void CopyPrefix(int n, List<float> to)
            {
                if (to.Capacity < to.Count + n) to.Capacity = Math.Max(to.Count + n, 2 * to.Capacity);
                if (bytes)
                {
                    byte[] kept = ByteItems;
                    for (int i = 0; i < n; ++i) to.Add(kept[i]);
                    return;
                }
                float[] items = Items;
                for (int i = 0; i < n; ++i) to.Add(items[i]);
            }
        }

        sealed class Episode
        {
            public string Id;
            public bool Training;  // recorded and sent
            public bool HeldBack;  // a training episode not recorded (record_share, §13.2): played, never sent
            public readonly ObsBuffer Obs = new ObsBuffer();
            public readonly List<double> Actions = new List<double>();
            public readonly List<double> Rewards = new List<double>();  // per action: the rewards logged for it, summed (§10.5: within float32)
            public readonly List<double> Logp = new List<double>();
            public readonly List<float> Dist = new List<float>();
            public readonly List<long> Versions = new List<long>();  // per action: weights_seq_no, -1 unknown
            public readonly List<int> Connections = new List<int>(); // per action: the connection that version was learned on
            public readonly List<bool> Logged = new List<bool>();    // per action (1.6): chosen outside the policy (LogAction)
            // Protocol 1.5, a model with memory (§12.4): the state the next step starts from (zeros while
            // StateFresh), and per action row the state its observation was fed with (a chunk's state_in).
            public float[] State = new float[0];
            public bool StateFresh = true;
            public readonly List<float> States = new List<float>();
            public int ObsRows;
            public int ActionRows;
            public double Return;
            public bool Done;
            public bool Truncated;
            public EpisodeEnvParams EnvParams;  // (1.7, §19.1) the values drawn as it started, or null
            public double? Measure;             // (1.7, §19.3) the measure reported, for the record that ends it

            // Adds a reward to the last recorded step and to the return; NON_FINITE_VALUE, nothing added, for one
            // that would take the step's reward beyond float32 (§10.5). Only a recorded step is limited: one
            // before the first action, or in an episode not recorded, goes to the return alone.
            public void AddReward(double reward)
            {
                int last = Rewards.Count - 1;
                if (Training && last >= 0)
                {
                    double sum = Rewards[last] + reward;
                    if (!EpisodeRecords.StepRewardFits(sum)) throw EpisodeRecords.StepRewardBeyondFloat32("LogReturns", "of '" + DemoWriter.DefaultAgent + "' in episode '" + Id + "'", reward, sum);
                    Rewards[last] = sum;
                }
                Return += reward;
            }

            // Stops recording (the end of training): the steps kept go, the return stays.
            public void StopRecording()
            {
                Training = HeldBack = false;
                DropSteps();
            }

            // Lets go of the steps not cut yet, the held-back one included: recording goes on, the next
            // chunk starting from the next observation (a new connection's server has other spaces).
            public void DropSteps()
            {
                Obs.Clear(); Actions.Clear(); Rewards.Clear(); Logp.Clear(); Dist.Clear(); Versions.Clear(); Connections.Clear(); States.Clear(); Logged.Clear();
                ObsRows = ActionRows = 0;
            }

            // The state the next step starts from, of `width` values: zeros at the actor's first step (§12.4).
            public float[] StateOf(int width)
            {
                if (State.Length != width) State = new float[width];  // (only when a reconnect changed the state's size)
                else if (StateFresh) Array.Clear(State, 0, width);
                StateFresh = false;
                return State;
            }

            // The state is carried from a new episode's first step (a reused Episode's memory is let go).
            public void Reset(string id, bool training, bool heldBack = false)
            {
                Id = id;
                Training = training;
                HeldBack = heldBack;
                Obs.Clear(); Actions.Clear(); Rewards.Clear(); Logp.Clear(); Dist.Clear(); Versions.Clear(); Connections.Clear(); States.Clear(); Logged.Clear();
                ObsRows = ActionRows = 0;
                Return = 0;
                Done = Truncated = false;
                EnvParams = null;
                Measure = null;
            }
        }

        readonly Dictionary<string, Episode> episodes = new Dictionary<string, Episode>();
        readonly List<Episode> finished = new List<Episode>();
        readonly Stack<Episode> spare = new Stack<Episode>();
        // Batches and chunks come back once their event is taken and are reused: cutting a batch allocates nothing.
        readonly Stack<Batch> spareBatches = new Stack<Batch>();
        readonly Stack<EpisodeChunk> spareChunks = new Stack<EpisodeChunk>();
        IInferenceBackend backend;
        long? weightsSeqNo;
        int versionConnection;  // the connection weightsSeqNo was learned on
        int pendingSteps;       // recorded steps not cut yet
        int heldSteps;          // steps of held-back episodes played since the last cut
        bool rawBoxSamples = true;
        bool logsActions;       // the server's PONG announced 1.6 or later: LogAction may record (§15)
        string serverVersion;   // the PONG's protocol_version, for LogAction's refusal
        bool strict;
        float[] dist = new float[0];
        float[] byteValues = new float[0];  // a byte observation's values, for a backend that takes only floats
        double[] record = new double[0];
        double[] logp = new double[1];
        long envStepsSent;
        float[] nextState = new float[0];  // a model with memory: the state after the step being taken, until it is committed
        Episode evaluation;                // ComputeAction's evaluation episode (its state), one at a time

        /// <summary>What the server's agents observe (from SET_CONFIG).</summary>
        public Space ObservationSpace { get; private set; }

        /// <summary>What they do (from SET_CONFIG).</summary>
        public Space ActionSpace { get; private set; }

        /// <summary>
        /// The observation leaf that masks the actions (protocol 1.4, SET_CONFIG's action_mask, §11.6), or
        /// null. Each observation acted on must allow an action: GetAction refuses, before anything is
        /// recorded, a mask value other than 0 and 1 (INVALID_ACTION_MASK) or a mask allowing nothing
        /// (ACTION_MASK_EMPTY); a final observation's mask is not checked.
        /// </summary>
        public ActionMask ActionMask { get; private set; }

        /// <summary>
        /// The model's recurrent state (protocol 1.5, SET_CONFIG's recurrent_state, §7.4, §12.1), or null for a
        /// model without memory. The client carries it (§12.4): one state per episode, zeros at its first
        /// step, fed with each observation and replaced by the state the model returns, recorded with each
        /// record as state_in. The game does nothing for it.
        /// </summary>
        public RecurrentState RecurrentState { get; private set; }

        /// <summary>The version of the model acting now (null before the server sent one).</summary>
        public long? WeightsSeqNo { get { return weightsSeqNo; } }

        /// <summary>Env steps the server has acknowledged.</summary>
        public long EnvStepsSent { get { return envStepsSent; } }

        TetherClient(ClientOptions options) : base(options, false) { }

        /// <summary>
        /// Connects, handshakes and loads the server's model. Throws
        /// TetherException: CONNECTION_FAILED (naming the server and the wait),
        /// AUTH_FAILED, VERSION_MISMATCH, INFERENCE_FAILED.
        /// </summary>
        public static TetherClient Connect(ClientOptions options)
        {
            var client = new TetherClient(options ?? new ClientOptions());
            client.Open();
            return client;
        }

        /// <summary>
        /// Begins an episode; returns its id (a new random one when none is given). Episodes may overlap.
        /// A training episode is recorded with the probability <see cref="ClientBase.RecordShare"/>, drawn now
        /// with the client's generator; one that is not is played alike but never sent (<see cref="ClientBase.EpisodesHeldBack"/>).
        /// Once training is done (<see cref="ClientBase.TrainingDone"/>) no episode is recorded.
        /// Protocol 1.7: when the client holds environment parameters (<see cref="ClientBase.EnvParams"/>), the
        /// episode's values are drawn from them now with the same generator, in the order of the names' UTF-8 bytes
        /// (<see cref="ClientBase.EpisodeParams"/>), and every record of the episode says them; an episode started
        /// while the client holds none (none sent yet, or dropped: the server has none) has no values.
        /// </summary>
        public string StartEpisode(string episodeId = null, bool trainingEnabled = true)
        {
            Poll();
            episodeId = episodeId ?? Guid.NewGuid().ToString("N");
            if (episodes.ContainsKey(episodeId)) throw new TetherException(ErrorCode.InvalidArgument, "episode '" + episodeId + "' is already running");
            trainingEnabled = trainingEnabled && !ended && !Offline;  // (§6.6, §20: nothing is sent, so nothing is recorded)
            bool recorded = trainingEnabled && Records();
            Episode episode = spare.Count > 0 ? spare.Pop() : new Episode();
            episode.Reset(episodeId, recorded, trainingEnabled && !recorded);
            episode.EnvParams = DrawEpisodeParams();  // (1.7, §19.1: from the set held now, after the record_share draw)
            episode.StateFresh = true;
            episodes.Add(episodeId, episode);
            return episodeId;
        }

        /// <summary>
        /// Records <paramref name="observation"/> and writes the policy's sampled
        /// action for it into <paramref name="action"/> (ActionSpace.FlatDim values:
        /// a Discrete's index plus start, a Box's sample clipped into the box).
        /// Raises, once, an error the server sent for an earlier batch. For a byte box
        /// (<see cref="Space.IsBytes"/>, protocol 1.4) every value must be an integer from 0 to
        /// 255: any other is refused here with OBS_DTYPE_MISMATCH naming it, nothing recorded.
        /// </summary>
        public void GetAction(string episodeId, float[] observation, double[] action)
        {
            Act(episodeId, observation, null, action, false);
        }

        /// <summary>
        /// <see cref="GetAction(string, float[], double[])"/> for an observation given as bytes, row-major
        /// (ObservationSpace.FlatDim of them): a byte box's (protocol 1.4, §8.1), such as a camera image
        /// of shape [height, width, channels] as the engine holds it. Its model is fed the bytes as
        /// they are (the ONNX Runtime backend), and a server of 1.4 or later is sent them as a uint8
        /// tensor (§10.9). Allocates nothing in steady state.
        /// </summary>
        public void GetAction(string episodeId, byte[] observation, double[] action)
        {
            Act(episodeId, null, observation, action, false);
        }

        /// <summary>
        /// Records a step whose action the policy did not choose (protocol 1.6, §10.1: a human player, a
        /// scripted bot, another controller; RLlib's log_action): <paramref name="observation"/>, checked as
        /// GetAction checks it, and <paramref name="action"/> (ActionSpace.FlatDim values: a Discrete's
        /// value, index plus start; a Box's as the engine executed it, recorded as given, not clipped).
        /// Mixes freely with GetAction in one episode: the step counts and goes in batches as GetAction's
        /// do, and LogReturns after it adds to it. The server learns from it without taking it for a
        /// sample of its policy (§13.7): the record marks it in logged_runs and carries the model's dist
        /// inputs for it (the model is evaluated on the observation; a model with memory advances its
        /// state, §12.4) and a log-probability of 0. Refused, with nothing recorded and no state advanced:
        /// an action of another size or outside the action space (ACTION_OUT_OF_SPACE), not finite
        /// (NON_FINITE_VALUE) or forbidden by the observation's action mask (ACTION_MASKED); no model yet
        /// (NOT_READY, as GetAction); and any logged action while the server is older than 1.6 (NOT_READY:
        /// it would train on the step as a sample of its policy, §15). Allocates nothing in steady state.
        /// </summary>
        public void LogAction(string episodeId, float[] observation, double[] action)
        {
            Act(episodeId, observation, null, action, true);
        }

        /// <summary>
        /// <see cref="LogAction(string, float[], double[])"/> for an observation given as bytes, row-major (a
        /// byte box's, protocol 1.4: ObservationSpace.FlatDim of them).
        /// </summary>
        public void LogAction(string episodeId, byte[] observation, double[] action)
        {
            Act(episodeId, null, observation, action, true);
        }

        /// <summary>
        /// <see cref="LogAction(string, float[], double[])"/> for a Dict or Tuple observation space given leaf by
        /// leaf (protocol 1.4): checked as <see cref="GetAction(string, ObservationLeaves, double[])"/> checks it,
        /// and the action against the mask leaf, if the server named one.
        /// </summary>
        public void LogAction(string episodeId, ObservationLeaves observation, double[] action)
        {
            Act(episodeId, RowOf(observation), null, action, true);
        }

        // The state episode `episodeId` (a running one, or else the evaluation episode) starts its next step
        // from: a copy (zeros before its first step); null when there is no such episode or no memory (tests).
        internal float[] StateOf(string episodeId)
        {
            Episode holder;
            if (RecurrentState == null) return null;
            if (!episodes.TryGetValue(episodeId, out holder)) holder = evaluation != null && evaluation.Id == episodeId ? evaluation : null;
            if (holder == null) return null;
            return holder.StateFresh || holder.State.Length != RecurrentState.Width ? new float[RecurrentState.Width] : (float[])holder.State.Clone();
        }

        // A NaN or an infinity, a byte box's (or byte leaf's) value that is not an integer 0-255, and
        // (acting) a mask that cannot be acted on are refused before anything is recorded.
        void CheckObservation(float[] values, string what, bool acting)
        {
            ObservationRows.Check(ObservationSpace, ActionMask, values, 0, what, acting);
        }

        // A composite space's observations are floats: its leaves of several element types share one row.
        void RefuseBytesForComposite()
        {
            if (ObservationSpace.IsComposite)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "the observation space is a " + ObservationSpace.Kind +
                                          ": give an ObservationLeaves (byte leaves by Set(leaf, byte[])) or its flat row of floats");
            }
        }

        // The flat row of `leaves`, which must be of the observation space; OBS_LEAF_MISMATCH for a leaf not set.
        float[] RowOf(ObservationLeaves leaves)
        {
            if (leaves == null) throw new TetherException(ErrorCode.InvalidArgument, "no observation given");
            if (!ReferenceEquals(leaves.Space, ObservationSpace) && !MultiAgentClient.SameSpace(leaves.Space, ObservationSpace))
            {
                throw new TetherException(ErrorCode.ObsLeafMismatch, "the ObservationLeaves are of another space than the server's observation space " +
                                          ObservationSpace.ToJson().ToString(Newtonsoft.Json.Formatting.None));
            }
            leaves.CheckComplete();
            return leaves.Row;
        }

        static void CheckLength(float[] values, byte[] bytes, int obsDim, string what)
        {
            int length = values != null ? values.Length : bytes != null ? bytes.Length : 0;
            if ((values == null && bytes == null) || length != obsDim)
            {
                throw new TetherException(ErrorCode.InvalidArgument, what + " has " + length + " values, the space needs " + obsDim);
            }
        }

        // The model's dist inputs for one observation: bytes go as they are to a backend that takes them.
        // A model with memory (1.5) is fed `holder`'s state; the state after the step waits in nextState
        // until CommitState (a call that fails after the run leaves the state as it was).
        void Infer(float[] values, byte[] bytes, int obsDim, int distDim, Episode holder)
        {
            var recurrent = RecurrentState == null ? null : backend as IRecurrentInferenceBackend;
            if (recurrent != null && recurrent.State != null)
            {
                int width = recurrent.State.Width;
                float[] state = holder.StateOf(width);
                if (nextState.Length != width) nextState = new float[width];
                if (bytes != null && backend is IByteInferenceBackend) recurrent.Run(bytes, 1, obsDim, dist, distDim, state, nextState);
                else recurrent.Run(bytes == null ? values : ByteValues(bytes, obsDim), 1, obsDim, dist, distDim, state, nextState);
                return;
            }
            if (bytes == null)
            {
                backend.Run(values, 1, obsDim, dist, distDim);
                return;
            }
            var byteBackend = backend as IByteInferenceBackend;
            if (byteBackend != null)
            {
                byteBackend.Run(bytes, 1, obsDim, dist, distDim);
                return;
            }
            backend.Run(ByteValues(bytes, obsDim), 1, obsDim, dist, distDim);
        }

        // A byte observation's values as floats, for a backend that takes only floats.
        float[] ByteValues(byte[] bytes, int obsDim)
        {
            if (byteValues.Length != obsDim) byteValues = new float[obsDim];
            for (int i = 0; i < obsDim; ++i) byteValues[i] = bytes[i];
            return byteValues;
        }

        // The step was taken: `holder`'s state becomes the one the model returned (1.5, §12.4), and a recorded
        // step keeps the state its observation was fed with (a chunk's state_in). No copy: the arrays swap.
        void CommitState(Episode holder, bool record)
        {
            if (holder.StateFresh || holder.State.Length != nextState.Length) return;  // (no state was fed)
            float[] before = holder.State;
            if (record)
            {
                List<float> states = holder.States;
                if (states.Capacity < states.Count + before.Length) states.Capacity = Math.Max(states.Count + before.Length, 2 * states.Capacity);
                for (int i = 0; i < before.Length; ++i) states.Add(before[i]);
            }
            holder.State = nextState;
            nextState = before;
        }

        /// <summary>
        /// <see cref="GetAction(string, float[], double[])"/> for a Dict or Tuple observation space (protocol
        /// 1.4, §8.6) given leaf by leaf: every leaf must have been set (else OBS_LEAF_MISMATCH). Each leaf
        /// is checked as its space says (finite; a byte leaf's values integers 0-255, OBS_DTYPE_MISMATCH),
        /// and the mask leaf, if the server named one (<see cref="ActionMask"/>), must allow an action
        /// (INVALID_ACTION_MASK, ACTION_MASK_EMPTY); nothing is recorded when one is refused. The model is
        /// fed one input per leaf. Allocates nothing in steady state.
        /// </summary>
        public void GetAction(string episodeId, ObservationLeaves observation, double[] action)
        {
            Act(episodeId, RowOf(observation), null, action, false);
        }

        /// <summary>
        /// <see cref="EndEpisode(string, float[], bool)"/> with the last observation of a Dict or Tuple space
        /// given leaf by leaf (its mask is not checked: no action follows it).
        /// </summary>
        public double EndEpisode(string episodeId, ObservationLeaves observation, bool truncated = false)
        {
            return End(episodeId, RowOf(observation), null, truncated);
        }

        /// <summary>The greedy action for a Dict or Tuple observation given leaf by leaf; records nothing.</summary>
        public void ComputeAction(ObservationLeaves observation, double[] action)
        {
            ComputeAction("", RowOf(observation), action);
        }

        /// <summary>
        /// The greedy action for a Dict or Tuple observation given leaf by leaf; records nothing.
        /// <paramref name="episodeId"/>: whose memory a model with memory uses (see <see cref="ComputeAction(string, float[], double[])"/>).
        /// </summary>
        public void ComputeAction(string episodeId, ObservationLeaves observation, double[] action)
        {
            ComputeAction(episodeId, RowOf(observation), action);
        }

        // GetAction on `values` or (1.4) `bytes`; `logged` (1.6): LogAction, `action` the action taken.
        void Act(string episodeId, float[] values, byte[] bytes, double[] action, bool logged)
        {
            Poll();
            Episode episode = Running(episodeId, logged ? "LogAction" : "GetAction");
            if (logged) RefuseLoggingToOlderServer();
            int obsDim = ObservationSpace.FlatDim, actDim = ActionSpace.FlatDim;
            CheckLength(values, bytes, obsDim, "the observation");
            if (!logged && (action == null || action.Length != actDim))
            {
                throw new TetherException(ErrorCode.InvalidArgument, "the action buffer has " + (action == null ? 0 : action.Length) + " values, the space needs " + actDim);
            }
            if (values != null) CheckObservation(values, "observation", true);
            else RefuseBytesForComposite();
            if (backend == null) throw new TetherException(ErrorCode.NotReady, "the server has sent no model yet");
            if (logged) CheckLoggedAction(values, action);
            Space checkedSpace = ObservationSpace;
            // A batch goes every BatchSteps() steps played in training episodes (§13.2). With held-back
            // steps played since the last cut it is due when they plus the recorded steps waiting, and
            // plus those sendable, reach it; it then goes even without records. The sendable count
            // walks the open episodes: it is taken only when the cheap tests pass.
            int every = BatchSteps();
            bool due = false, send = false;
            if (episode.Training || episode.HeldBack)
            {
                if (heldSteps > 0)
                {
                    int need = every - heldSteps;
                    due = pendingSteps >= need && (need <= 0 || SendableSteps(episode) >= need);
                }
                send = episode.Training && (due || (pendingSteps >= every && SendableSteps(episode) >= every));
            }
            if (send)
            {
                // The observation now closes this episode's last step: it goes with the batch.
                episode.Obs.Add(values, bytes, obsDim, ObservationSpace.IsBytes);
                ++episode.ObsRows;
                try
                {
                    SendBatch(due);
                }
                finally
                {
                    // Also when SendBatch raised (a refusal, a strict-mode timeout): this
                    // call then did not act, and the caller may make it again. (Not when the
                    // steps were dropped meanwhile: a new connection's other spaces, §6.5.)
                    if (episode.Training && episode.ObsRows > episode.ActionRows)
                    {
                        episode.Obs.RemoveLast(obsDim);
                        --episode.ObsRows;
                    }
                }
            }
            else if (due)  // (a held-back episode)
            {
                SendBatch(true);
            }
            if (obsDim != ObservationSpace.FlatDim || actDim != ActionSpace.FlatDim || backend == null)
            {
                // Sending applied a new connection whose server has other spaces: this call did not act.
                if (backend == null) throw new TetherException(ErrorCode.NotReady, "the server has sent no model for its new spaces yet");
                throw new TetherException(ErrorCode.InvalidArgument, "the server's spaces changed on a reconnect: the observation has " + obsDim +
                                          " values and the action " + actDim + ", the spaces need " + ObservationSpace.FlatDim + " and " + ActionSpace.FlatDim);
            }
            if (!ReferenceEquals(ObservationSpace, checkedSpace))
            {
                // A new connection's space of the same size may be a byte box (or have a mask) where the old
                // one was not, and its server may be older: checked again before anything is recorded.
                if (values != null) CheckObservation(values, "observation", true);
                else RefuseBytesForComposite();
                if (logged)
                {
                    RefuseLoggingToOlderServer();
                    CheckLoggedAction(values, action);
                }
            }
            int distDim = ActionSpace.DistInputsSize;
            Infer(values, bytes, obsDim, distDim, episode);
            Distributions.CheckFinite(dist, distDim);
            if (logged)
            {
                // (no behaviour log-probability: the server does not use one at a logged step, §13.7)
                Array.Copy(action, record, actDim);
                logp[0] = 0;
            }
            else
            {
                Distributions.SampleRows(ActionSpace, dist, 1, rng, rawBoxSamples, record, action, logp);
            }
            CommitState(episode, episode.Training);  // (every step advances the state, recorded or not)
            if (demos != null) demos.StepRow(episode.Id, DemoWriter.DefaultAgent, demoModule, values ?? ByteValues(bytes, obsDim), 0, record, 0, logged);
            if (!episode.Training)
            {
                if (episode.HeldBack) ++heldSteps;
                return;
            }
            episode.Obs.Add(values, bytes, obsDim, ObservationSpace.IsBytes);
            ++episode.ObsRows;
            for (int j = 0; j < actDim; ++j) episode.Actions.Add(record[j]);
            episode.Rewards.Add(0);
            episode.Logp.Add(logp[0]);
            for (int j = 0; j < distDim; ++j) episode.Dist.Add(dist[j]);
            episode.Versions.Add(weightsSeqNo ?? -1);
            episode.Connections.Add(versionConnection);
            episode.Logged.Add(logged);
            ++episode.ActionRows;
            ++pendingSteps;
        }

        // Logged steps go only to a server of 1.6 or later (§15): an older one would train on them as its policy's samples.
        void RefuseLoggingToOlderServer()
        {
            if (logsActions) return;
            throw new TetherException(ErrorCode.NotReady, "LogAction: the server at " + options.Address + " speaks protocol " + serverVersion +
                                      ": logged actions need 1.6 or later (an older server would train on them as the policy's own samples)");
        }

        // A logged action is checked as the server checks actions (§10.6 checks 12-14d) before anything is recorded.
        void CheckLoggedAction(float[] values, double[] action)
        {
            LoggedActions.Check(ActionSpace, ActionMask, values, 0, action, 0, action == null ? 0 : action.Length, "LogAction: the logged action");
        }

        /// <summary>
        /// The greedy action for an observation (the distribution's mode); records nothing. A model with memory
        /// (protocol 1.5) remembers in the evaluation episode "" (see <see cref="ComputeAction(string, float[], double[])"/>).
        /// </summary>
        public void ComputeAction(float[] observation, double[] action)
        {
            ComputeAction("", observation, action);
        }

        /// <summary>
        /// The greedy action for an observation (the distribution's mode); records nothing. A model with memory
        /// (protocol 1.5, §12.4) remembers per episode: <paramref name="episodeId"/> names a running episode
        /// that is not recorded (started with trainingEnabled false, or held back by record_share: this call
        /// advances its state, as GetAction does) or an evaluation episode of the caller's (its state starts
        /// from zeros at its first call; one evaluation episode is remembered at a time, so give each its own
        /// id). A running episode that is recorded is refused with a <see cref="TetherException"/>
        /// (INVALID_ARGUMENT; nothing changes): its next record's state_in must follow from its recorded
        /// observations, so play it with GetAction, or give the greedy play another episode id. A model
        /// without memory ignores the id.
        /// </summary>
        public void ComputeAction(string episodeId, float[] observation, double[] action)
        {
            Poll();
            if (backend == null) throw new TetherException(ErrorCode.NotReady, "the server has sent no model yet");
            CheckLength(observation, null, ObservationSpace.FlatDim, "the observation");
            CheckObservation(observation, "observation", true);
            Greedy(episodeId, observation, null, action);
        }

        /// <summary>The greedy action for an observation given as bytes (a byte box's, protocol 1.4); records nothing.</summary>
        public void ComputeAction(byte[] observation, double[] action)
        {
            ComputeAction("", observation, action);
        }

        /// <summary>
        /// The greedy action for an observation given as bytes (a byte box's, protocol 1.4); records nothing.
        /// <paramref name="episodeId"/>: whose memory a model with memory uses (see <see cref="ComputeAction(string, float[], double[])"/>).
        /// </summary>
        public void ComputeAction(string episodeId, byte[] observation, double[] action)
        {
            Poll();
            if (backend == null) throw new TetherException(ErrorCode.NotReady, "the server has sent no model yet");
            CheckLength(null, observation, ObservationSpace.FlatDim, "the observation");
            RefuseBytesForComposite();
            Greedy(episodeId, null, observation, action);
        }

        void Greedy(string episodeId, float[] values, byte[] bytes, double[] action)
        {
            Episode holder = null;
            if (RecurrentState != null)
            {
                // A running episode's state, or else the evaluation episode's (a new id starts from zeros).
                episodeId = episodeId ?? "";
                if (episodes.TryGetValue(episodeId, out holder) && holder.Training)
                {
                    // Its next record's state_in must follow from its recorded observations (§12.4).
                    throw new TetherException(ErrorCode.InvalidArgument, "episode '" + episodeId +
                        "' is running and recorded; its state cannot advance on a step that is not recorded: " +
                        "use GetAction, or another episode id for evaluation");
                }
                if (holder == null)
                {
                    if (evaluation == null || evaluation.Id != episodeId)
                    {
                        evaluation = evaluation ?? new Episode();
                        evaluation.Reset(episodeId, false);
                        evaluation.StateFresh = true;
                    }
                    holder = evaluation;
                }
            }
            Infer(values, bytes, ObservationSpace.FlatDim, ActionSpace.DistInputsSize, holder);
            Distributions.CheckFinite(dist, ActionSpace.DistInputsSize);
            Distributions.Deterministic(ActionSpace, dist, 0, action, 0);
            if (holder != null) CommitState(holder, false);
        }

        /// <summary>
        /// Adds a reward to the episode's last action (rewards add up until the next action) and to its return.
        /// Refused with a <see cref="TetherException"/> (NON_FINITE_VALUE), adding nothing (to the step, the
        /// return or a demonstration file): a reward that is not finite, or one that would take its recorded
        /// step's reward (the rewards logged for it, summed) to a magnitude of
        /// <see cref="EpisodeRecords.Float32Overflow"/> or more, beyond float32 (protocol 1.6, §10.5: the server
        /// would refuse the whole batch). A reward before the episode's first action goes to no step and is not limited.
        /// </summary>
        public void LogReturns(string episodeId, double reward)
        {
            Episode episode = Running(episodeId, "LogReturns");
            if (double.IsNaN(reward) || double.IsInfinity(reward)) throw new TetherException(ErrorCode.NonFiniteValue, "LogReturns: the reward is not finite");
            episode.AddReward(reward);
            // (a demonstration file's step beyond float32 is refused by its writer: the reward is left out of the
            // file, whose reader would refuse the line, as every SDK does)
            if (demos != null) demos.AddRewardIfFits(episodeId, DemoWriter.DefaultAgent, reward);
        }

        /// <summary>
        /// Ends an episode with its last observation; returns its total reward.
        /// <paramref name="truncated"/>: ended by a time limit (the value is bootstrapped), else it terminated.
        /// A final observation that is not finite, or not bytes for a byte box, is refused (NON_FINITE_VALUE,
        /// OBS_DTYPE_MISMATCH) and the episode goes on.
        /// </summary>
        public double EndEpisode(string episodeId, float[] observation, bool truncated = false)
        {
            return End(episodeId, observation, null, truncated);
        }

        /// <summary>
        /// <see cref="EndEpisode(string, float[], bool)"/> with the last observation given as bytes
        /// (a byte box's, protocol 1.4: ObservationSpace.FlatDim of them, row-major).
        /// </summary>
        public double EndEpisode(string episodeId, byte[] observation, bool truncated = false)
        {
            return End(episodeId, null, observation, truncated);
        }

        double End(string episodeId, float[] values, byte[] bytes, bool truncated)
        {
            Poll();
            Episode episode = Running(episodeId, "EndEpisode");
            int obsDim = ObservationSpace.FlatDim;
            if ((values == null && bytes == null) || (values != null ? values.Length : bytes.Length) != obsDim)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "the final observation needs " + obsDim + " values");
            }
            if (values != null) CheckObservation(values, "the final observation", false);
            else RefuseBytesForComposite();
            episodes.Remove(episodeId);
            episode.Done = true;
            episode.Truncated = truncated;
            double total = episode.Return;
            if (episode.Training && episode.ActionRows > 0)
            {
                episode.Obs.Add(values, bytes, obsDim, ObservationSpace.IsBytes);
                ++episode.ObsRows;
                finished.Add(episode);
            }
            else
            {
                spare.Push(episode);
            }
            if (demos != null) EndDemonstration(episodeId, DemoWriter.DefaultAgent, values ?? ByteValues(bytes, obsDim), 0, !truncated);
            return total;
        }

        // The end of training: the ended episodes not cut yet are let go too.
        internal override bool StopRecording()
        {
            bool unsent = pendingSteps > 0 || finished.Count > 0;
            foreach (Episode episode in finished) spare.Push(episode);
            finished.Clear();
            foreach (Episode episode in episodes.Values) episode.StopRecording();
            pendingSteps = heldSteps = 0;
            return unsent;
        }

        internal override EpisodeEnvParams DrawnParams(string episodeId, string call)
        {
            return Running(episodeId, call).EnvParams;
        }

        internal override void SetMeasure(string episodeId, double measure, string call)
        {
            Running(episodeId, call).Measure = measure;
        }

        Episode Running(string episodeId, string call)
        {
            Episode episode;
            if (episodeId == null || !episodes.TryGetValue(episodeId, out episode))
            {
                throw new TetherException(ErrorCode.InvalidArgument, call + ": no running episode '" + episodeId + "'");
            }
            return episode;
        }

        // Steps a cut would carry now, `current`'s last one included (its observation goes with the
        // cut): every other open training episode holds back its last action until its next observation.
        int SendableSteps(Episode current)
        {
            int held = 0;
            foreach (Episode episode in episodes.Values)
            {
                if (episode != current && episode.Training && episode.ActionRows > 0 && episode.ObsRows == episode.ActionRows) ++held;
            }
            return pendingSteps - held;
        }

        // Cuts every complete step (an ongoing episode's last one waits for the observation that closes it).
        // sendEmpty: sent even without records (held-back episodes made it due), for its answer.
        internal override void SendBatch(bool sendEmpty = false)
        {
            Batch batch = spareBatches.Count > 0 ? spareBatches.Pop() : new Batch();
            long oldest = long.MaxValue;
            int oldestConnection = int.MaxValue;
            foreach (Episode episode in finished) Cut(episode, batch, ref oldest, ref oldestConnection);
            foreach (Episode episode in finished) spare.Push(episode);
            finished.Clear();
            foreach (Episode episode in episodes.Values)
            {
                if (episode.Training) Cut(episode, batch, ref oldest, ref oldestConnection);
            }
            pendingSteps = 0;
            foreach (Episode episode in episodes.Values) pendingSteps += episode.Training ? episode.ActionRows : 0;
            heldSteps = 0;  // at every cut, whether a batch goes or not (§13.2)
            if (batch.Chunks.Count == 0 && !sendEmpty)
            {
                Recycle(batch);
                return;
            }
            // The oldest version of the steps (§7.6), of the earliest connection (a later one's
            // server may count anew); the version held when none is known.
            batch.Claim = oldest != long.MaxValue ? oldest : weightsSeqNo;
            if (Submit(batch, sendEmpty, strict) && (strict || link.EventsPending)) Sync();
        }

        void Cut(Episode episode, Batch batch, ref long oldest, ref int oldestConnection)
        {
            int actions = episode.ActionRows;
            int k = episode.ObsRows == actions + 1 ? actions : Math.Max(0, actions - 1);
            if (k == 0) return;
            int obsDim = ObservationSpace.FlatDim, actDim = ActionSpace.FlatDim, distDim = ActionSpace.DistInputsSize;
            EpisodeChunk chunk = spareChunks.Count > 0 ? spareChunks.Pop() : new EpisodeChunk();
            chunk.EpisodeId = episode.Id;
            episode.Obs.CopyPrefix((k + 1) * obsDim, chunk.Obs);
            CopyPrefix(episode.Actions, k * actDim, chunk.Actions);
            CopyPrefix(episode.Rewards, k, chunk.Rewards);
            CopyPrefix(episode.Logp, k, chunk.ActionLogp);
            CopyPrefix(episode.Dist, k * distDim, chunk.ActionDistInputs);
            bool done = episode.Done && k == actions;
            chunk.IsTerminated = done && !episode.Truncated;
            chunk.IsTruncated = done && episode.Truncated;
            chunk.EnvParams = episode.EnvParams;  // (1.7, §19.3: every record of the episode; the measure on its last)
            chunk.Measure = done && episode.EnvParams != null ? episode.Measure : null;
            for (int i = 0; i < k; ++i)
            {
                long v = episode.Versions[i];
                if (v < 0) continue;
                // A later connection's server may count versions anew: steps are compared within their connection.
                if (episode.Connections[i] < oldestConnection || (episode.Connections[i] == oldestConnection && v < oldest))
                {
                    oldest = v;
                    oldestConnection = episode.Connections[i];
                }
            }
            if (StepVersionsKnown(episode.Versions, episode.Connections, k, connection) && VersionRuns.Mixed(episode.Versions, 0, k))
            {
                CopyPrefix(episode.Versions, k, chunk.StepVersions);  // (into a reused list: cutting allocates nothing)
            }
            if (LoggedRuns.Any(episode.Logged, k)) CopyPrefix(episode.Logged, k, chunk.Logged);  // (1.6, §10.1: as logged_runs)
            RecurrentState state = RecurrentState;
            if (state != null && episode.States.Count >= k * state.Width)
            {
                // (1.5, §10.1) the state the chunk's first observation was fed with
                chunk.State = state;
                CopyPrefix(episode.States, state.Width, chunk.StateIn);
                episode.States.RemoveRange(0, k * state.Width);
            }
            episode.Obs.RemoveFirst(k * obsDim);
            episode.Actions.RemoveRange(0, k * actDim);
            episode.Rewards.RemoveRange(0, k);
            episode.Logp.RemoveRange(0, k);
            episode.Dist.RemoveRange(0, k * distDim);
            episode.Versions.RemoveRange(0, k);
            episode.Connections.RemoveRange(0, k);
            episode.Logged.RemoveRange(0, k);
            episode.ObsRows -= k;
            episode.ActionRows -= k;
            batch.Chunks.Add(chunk);
            batch.EnvSteps += k;
        }

        // Whether each of the first k steps has a known version learned on the connection
        // `current`: only then are the versions sent per step (§10.1), and the link sends them
        // only while that connection lasts (a later one's server may be another run). A version
        // beyond what a run may name leaves the record to the claim rather than refuse the batch.
        internal static bool StepVersionsKnown(List<long> versions, List<int> connections, int k, int current)
        {
            for (int i = 0; i < k; ++i)
            {
                if (versions[i] < 0 || versions[i] > VersionRuns.MaxVersion || connections[i] != current) return false;
            }
            return true;
        }

        // AddRange(GetRange) would allocate a list; a loop into a list with capacity does not.
        static void CopyPrefix<T>(List<T> from, int count, List<T> to)
        {
            if (to.Capacity < count) to.Capacity = Math.Max(count, 2 * to.Capacity);
            for (int i = 0; i < count; ++i) to.Add(from[i]);
        }

        internal override void Recycle(Batch batch)
        {
            foreach (EpisodeChunk chunk in batch.Chunks)
            {
                chunk.Clear();
                spareChunks.Push(chunk);
            }
            batch.Reset();
            spareBatches.Push(batch);
        }

        // [1.6] The module a demonstration file names this client's episodes by.
        private string demoModule = DemoWriter.DefaultModule;

        internal override bool Configured { get { return ObservationSpace != null; } }

        internal override void Connected(LinkEvent e)
        {
            Space observationSpace = Space.FromJson(e.Config["observation_space"]);
            Space actionSpace = Space.ActionFromJson(e.Config["action_space"]);
            ActionMask = ModuleSpec.ReadActionMask(e.Config["action_mask"], observationSpace, actionSpace);
            RecurrentState recurrent = RecurrentState.FromJson(e.Config["recurrent_state"]);
            // (1.5, §12.4) a model with another recurrent state cannot continue the states kept: as for other spaces
            if (ObservationSpace != null && (!MultiAgentClient.SameSpace(ObservationSpace, observationSpace) ||
                                             !MultiAgentClient.SameSpace(ActionSpace, actionSpace) || !RecurrentState.Same(RecurrentState, recurrent)))
            {
                int dropped = DropForNewSpaces();
                if (runChanged) otherRunUnsentDropped += dropped;  // (1.8: another run as well, §6.5)
            }
            else if (runChanged)
            {
                // (1.8, §6.5) Another server run: the steps not cut yet were acted with weights whose versions name
                // other weights in this run. They are dropped and counted; the model stays until this connection's
                // replaces it (it comes with the connection: Apply below).
                otherRunUnsentDropped += DropUnsentSteps();
                evaluation = null;  // (its state came from another run's model: the next evaluation starts from zeros)
            }
            RecurrentState = recurrent;
            ObservationSpace = observationSpace;
            ActionSpace = actionSpace;
            JToken perSample = e.Config["env_steps_per_sample"];
            stepsPerSample = (int)Messages.IntegerOr(perSample, 500, 1, int.MaxValue);
            JToken version = e.Info["protocol_version"];
            int[] parsed = version != null && version.Type == JTokenType.String ? Messages.ParseVersion((string)version) : null;
            rawBoxSamples = parsed == null || parsed[0] > 1 || (parsed[0] == 1 && parsed[1] >= 3);
            logsActions = parsed != null && (parsed[0] > 1 || (parsed[0] == 1 && parsed[1] >= 6));
            serverVersion = version == null ? "none (a plain RLlink v1 server)" : version.ToString(Newtonsoft.Json.Formatting.None);
            strict = !Offline && (options.WaitForWeights ?? version == null);  // a plain RLlink v1 server
            dist = new float[ActionSpace.DistInputsSize];
            record = new double[ActionSpace.FlatDim];
            connection = e.Connection;
            if (options.DemoPath != null)
            {
                // The module the server serves "default_agent" (its mapping's, as in every SDK), else the default's name.
                JToken rules = e.Config["policy_mapping"];
                demoModule = rules is JArray && ((JArray)rules).Count > 0
                    ? PolicyMapping.FromJson(rules).ModuleFor(DemoWriter.DefaultAgent, "")
                    : DemoWriter.DefaultModule;
                StartDemonstrations(new Dictionary<string, ModuleSpec>
                {
                    { demoModule, new ModuleSpec { ModuleId = demoModule, ObservationSpace = observationSpace, ActionSpace = actionSpace, ActionMask = ActionMask } },
                });
            }
            Apply(e.State);
        }

        internal override void ForgetEpisodes(ICollection<string> episodeIds)
        {
            foreach (string id in episodeIds) Forget(id);
        }

        internal override void Answered(Batch batch)
        {
            envStepsSent += batch.EnvSteps;
        }

        internal override void Apply(PreparedState state)
        {
            if (state == null) return;
            if (state.Backend != null)
            {
                link.Retire(backend);
                backend = state.Backend;
            }
            if (state.Seq.HasValue)
            {
                weightsSeqNo = state.Seq;
                versionConnection = connection;
            }
        }

        // A new connection's server describes other spaces (§6.5): the model cannot serve them
        // (NOT_READY until this connection's arrives) and the steps not cut yet do not fit them.
        // They are dropped, as every SDK does: the open episodes go on, each one's next chunk
        // starting from its next observation; the ended ones not cut yet send nothing.
        int DropForNewSpaces()
        {
            StopDemonstrations();  // (the file's header names the old spaces)
            link.Retire(backend);
            backend = null;
            weightsSeqNo = null;
            evaluation = null;
            return DropUnsentSteps();
        }

        // Lets go of every training episode's steps not cut yet (the open episodes go on, each one's next chunk
        // starting from its next observation; the ended ones send nothing) and starts recurrent states from
        // zeros. Returns how many steps went.
        int DropUnsentSteps()
        {
            int dropped = 0;
            foreach (Episode episode in finished)
            {
                dropped += episode.ActionRows;
                spare.Push(episode);
            }
            finished.Clear();
            foreach (Episode episode in episodes.Values)
            {
                if (episode.Training)
                {
                    dropped += episode.ActionRows;
                    episode.DropSteps();
                }
                episode.StateFresh = true;  // (a state of another model: the next step starts from zeros, §12.4)
            }
            pendingSteps = 0;
            return dropped;
        }

        void Forget(string episodeId)
        {
            Episode episode;
            if (episodes.TryGetValue(episodeId, out episode) && episode.Training)
            {
                pendingSteps -= episode.ActionRows;
                EpisodeEnvParams drawn = episode.EnvParams;
                episode.Reset(episode.Id, false);
                episode.EnvParams = drawn;  // (the game plays on with its values, unrecorded)
            }
            finished.RemoveAll(f => f.Id == episodeId);
        }

        internal override void ReleaseModels()
        {
            if (backend != null) backend.Dispose();
            backend = null;
        }
    }
}
