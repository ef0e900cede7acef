// One per scene: gathers every deciding agent's observation each fixed step,
// acts for all of them with one inference run per module, and hands out the actions.
#if UNITY_5_3_OR_NEWER
using System;
using System.Collections.Generic;
using System.Threading.Tasks;
using Tether.Client;
using Tether.Inference;
using Tether.Protocol;
using UnityEngine;

namespace Tether.Unity
{
    /// <summary>
    /// Put one on a GameObject of the scene and give it a <see cref="TetherSettings"/>
    /// asset. It connects in the background (the scene starts at once; agents act
    /// once the server's models are in), and in each FixedUpdate collects the
    /// observations of the agents whose decision period has come, calls
    /// <see cref="MultiAgentClient.GetActions"/> once (one inference run per
    /// module), and calls each agent's OnActionReceived. The network lives on the
    /// client's I/O thread: no frame waits on it. Errors the server reports are
    /// logged and the scene goes on; if the server is gone for good the agents
    /// stop deciding and <see cref="Failure"/> says why. When the server's run is
    /// done (ERROR TRAINING_DONE, §6.6) that is no failure: the agents go on deciding
    /// with the last models, nothing is sent, and Client.TrainingDone holds the run's summary.
    /// </summary>
    [DefaultExecutionOrder(-100)]
    public sealed class TetherManager : MonoBehaviour
    {
        /// <summary>Where the server is and how to reach it.</summary>
        public TetherSettings settings;

        /// <summary>The scene's manager (null when there is none).</summary>
        public static TetherManager Instance { get; private set; }

        /// <summary>The connected client (null until connected).</summary>
        public MultiAgentClient Client { get; private set; }

        /// <summary>Why the manager stopped deciding (null while it works).</summary>
        public TetherException Failure { get; private set; }

        /// <summary>The episode the scene's agents are in (null until connected).</summary>
        public string EpisodeId { get; private set; }

        /// <summary>
        /// The environment parameters the scene's current episode (<see cref="EpisodeId"/>) plays with
        /// (protocol 1.7, §19), by name: each fixed number, and what each sampler gave, of the set the
        /// server's curriculum asked for when the episode started. They stay the same to the episode's end
        /// (<see cref="EndEpisode"/> starts the next one, which draws anew), so the game reads them when it
        /// resets a scene (a ball's speed, gravity...). Empty before the client is connected, while no episode
        /// runs, and for an episode started while the client held no set (a server older than 1.7, or one
        /// without parameters). <c>Client.EnvParams</c> is the set itself, <c>Client.EnvParamsChanged</c>
        /// says when it changes.
        /// </summary>
        public IReadOnlyDictionary<string, double> EpisodeParams
        {
            get
            {
                if (Client == null || EpisodeId == null) return EpisodeEnvParams.NoValues;
                try
                {
                    return Client.EpisodeParams(EpisodeId);
                }
                catch (TetherException)
                {
                    return EpisodeEnvParams.NoValues;  // (an episode the client no longer knows)
                }
            }
        }

        /// <summary>
        /// Reports the scene's current episode's measure (protocol 1.7, §19.3): a score the server's curriculum
        /// may advance its lessons on (how well the agents did at this episode's parameters), sent with the
        /// record that ends the episode. Call it before <see cref="EndEpisode"/> (which ends the episode and
        /// starts the next); a later report replaces an earlier one. An episode without parameters
        /// (<see cref="EpisodeParams"/> empty) sends none. Does nothing before the client is connected or once
        /// the manager stopped deciding (<see cref="Failure"/>); a value that is not finite, or whose magnitude
        /// is beyond 1e300, is refused: the refusal is logged and the scene goes on.
        /// </summary>
        public void ReportMeasure(double value)
        {
            if (Client == null || EpisodeId == null || Failure != null) return;
            try
            {
                Client.ReportMeasure(EpisodeId, value);
            }
            catch (TetherException e)
            {
                Report(e);
            }
        }

        readonly List<TetherAgent> agents = new List<TetherAgent>();
        readonly List<TetherAgent> deciding = new List<TetherAgent>();
        readonly AgentFrame frame = new AgentFrame();
        bool warnedHeuristicRefused;
        readonly AgentFrame leaving = new AgentFrame();
        Task<MultiAgentClient> connecting;
        long fixedStep;
        int endedInEpisode;

        /// <summary>
        /// The scene's episode is ended (truncated) and a new one started once this
        /// many agents have left it, so that an endless scene does not make the
        /// client remember every agent that ever ended (each comes back as a new id).
        /// </summary>
        public int maxEndedAgentsPerEpisode = 4096;

        void Awake()
        {
            if (Instance != null && Instance != this)
            {
                Debug.LogError("Tether: a scene has one TetherManager; this one is disabled", this);
                enabled = false;
                return;
            }
            Instance = this;
        }

        // Start, not Awake: a manager added from code (AddComponent) gets its settings
        // assigned after Awake has run, before Start.
        void Start()
        {
            if (settings == null)
            {
                Debug.LogError("Tether: the TetherManager has no TetherSettings asset", this);
                enabled = false;
                return;
            }
            ClientOptions options = settings.ToClientOptions(BackendFactory());
            // Connecting waits on the network: off the main thread.
            connecting = Task.Run(() => MultiAgentClient.Connect(options));
            foreach (TetherAgent agent in FindObjectsOfType<TetherAgent>()) Register(agent);
        }

        Func<IInferenceBackend> BackendFactory()
        {
            switch (settings.backend)
            {
                case InferenceBackendKind.OnnxRuntime:
                    return () => new OnnxRuntimeBackend();
                case InferenceBackendKind.InferenceEngine:
#if TETHER_INFERENCE_ENGINE
                    InferenceEngineBackend.BindMainThread();
                    return () => new InferenceEngineBackend();
#else
                    Debug.LogWarning("Tether: the Inference Engine package (com.unity.ai.inference) is not installed; using the managed backend");
                    return () => new ManagedPolicyBackend();
#endif
                default:
                    return () => new ManagedPolicyBackend();
            }
        }

        internal void Register(TetherAgent agent)
        {
            if (agents.Contains(agent)) return;
            agent.AgentId = Incarnation(agent);
            if (IdTaken(agent.AgentId, agent))
            {
                // Two agents of one id would make every frame fail (an id twice in
                // the frame): the second is renamed, once, and told so.
                string taken = agent.AgentId;
                agent.agentId = UniqueBaseId(string.IsNullOrEmpty(agent.agentId) ? agent.gameObject.name : agent.agentId);
                agent.AgentId = Incarnation(agent);
                Debug.LogWarning("Tether: agent id '" + taken + "' is used by another agent of the scene; this one acts as '" + agent.AgentId + "' (set agentId to choose)", agent);
            }
            agents.Add(agent);
        }

        bool IdTaken(string id, TetherAgent except)
        {
            for (int a = 0; a < agents.Count; ++a)
            {
                if (agents[a] != except && agents[a].AgentId == id) return true;
            }
            return false;
        }

        // "name~2", "name~3"...: the first base id whose every incarnation is free.
        string UniqueBaseId(string id)
        {
            for (int k = 2; ; ++k)
            {
                string candidate = id + "~" + k;
                bool used = false;
                for (int a = 0; a < agents.Count && !used; ++a)
                {
                    string other = agents[a].AgentId;
                    used = other == candidate || other.StartsWith(candidate + "#", StringComparison.Ordinal);
                }
                if (!used) return candidate;
            }
        }

        internal void Unregister(TetherAgent agent)
        {
            if (!agents.Remove(agent)) return;
            End(agent, true);
        }

        static string Incarnation(TetherAgent agent)
        {
            string id = string.IsNullOrEmpty(agent.agentId) ? agent.gameObject.name : agent.agentId;
            return agent.incarnation == 0 ? id : id + "#" + agent.incarnation;
        }

        internal void Reward(TetherAgent agent, float reward)
        {
            if (Client == null || EpisodeId == null || Failure != null) return;
            try
            {
                Client.LogReturns(EpisodeId, agent.AgentId, reward);
            }
            catch (TetherException e)
            {
                Report(e);
            }
        }

        internal void End(TetherAgent agent, bool truncated)
        {
            if (Client == null || EpisodeId == null || Failure != null || agent.observation == null) return;
            if (InGroup(agent.AgentId))
            {
                EndGroupOf(agent, truncated);
                return;
            }
            SendEnd(agent, truncated);
            ++agent.incarnation;  // an agent that left comes back as a new one
            agent.AgentId = Incarnation(agent);
            agent.warnedNonFinite = agent.warnedHeuristic = false;
            ++endedInEpisode;
        }

        bool InGroup(string agentId)
        {
            IList<GroupSpec> groups = Client.Groups;
            for (int g = 0; g < groups.Count; ++g)
            {
                if (groups[g].Members.Contains(agentId)) return true;
            }
            return false;
        }

        // A group acts as one agent (all its members or none) and cannot come back to an episode
        // it left: a member that ends takes its group out (with the member's flag), and the scene's
        // episode ends for the others (truncated), so that the group starts whole in the next one.
        // (Renaming the members, as a single agent is renamed, would take them out of the group.)
        void EndGroupOf(TetherAgent agent, bool truncated)
        {
            SendEnd(agent, truncated);
            EndEpisode(true);
        }

        // Tells the server that the agent left, with its current observation (a failure is reported).
        void SendEnd(TetherAgent agent, bool truncated)
        {
            leaving.Clear();
            agent.CollectObservations(agent.observation);
            leaving.Add(agent.AgentId, agent.observation, truncated);
            try
            {
                Client.EndAgents(EpisodeId, leaving);
            }
            catch (TetherException e)
            {
                Report(e);
            }
        }

        /// <summary>
        /// Ends the scene's episode (every agent leaves with its current
        /// observation, truncated by a time limit or terminated) and starts the
        /// next one; call it when the game resets.
        /// </summary>
        public void EndEpisode(bool truncated = false)
        {
            if (Client == null || EpisodeId == null || Failure != null) return;
            frame.Clear();
            foreach (TetherAgent agent in agents.ToArray())
            {
                if (agent.observation == null) continue;
                agent.CollectObservations(agent.observation);
                frame.Add(agent.AgentId, agent.observation);
            }
            try
            {
                Client.EndEpisode(EpisodeId, frame, truncated);
                EpisodeId = Client.StartEpisode(null, settings.training);
                endedInEpisode = 0;
            }
            catch (TetherException e)
            {
                Report(e);
            }
        }

        void FixedUpdate()
        {
            if (Client == null && !Connected()) return;
            if (Failure != null) return;
            if (EpisodeId == null && !StartSceneEpisode()) return;
            if (endedInEpisode >= Math.Max(1, maxEndedAgentsPerEpisode)) EndEpisode(true);
            ++fixedStep;
            deciding.Clear();
            frame.Clear();
            for (int a = 0; a < agents.Count; ++a)  // (an agent's callbacks may register another)
            {
                TetherAgent agent = agents[a];
                if (!agent.isActiveAndEnabled || fixedStep % Math.Max(1, agent.decisionPeriod) != 0) continue;
                if (agent.observation == null || agent.observation.Length != agent.ObservationSize) agent.observation = new float[agent.ObservationSize];
                agent.CollectObservations(agent.observation);
                if (!Finite(agent.observation))
                {
                    // One agent's NaN must not stop the others: it skips this decision.
                    if (!agent.warnedNonFinite) Debug.LogWarning("Tether: agent '" + agent.AgentId + "' observed a value that is not finite; it does not act until it observes finite values", agent);
                    agent.warnedNonFinite = true;
                    continue;
                }
                if (agent.decider == TetherAgent.Decider.Heuristic)
                {
                    if (!InGroup(agent.AgentId))
                    {
                        if (!LogHeuristic(agent)) continue;
                    }
                    else if (!agent.warnedHeuristic)
                    {
                        Debug.LogWarning("Tether: agent '" + agent.AgentId + "' is a member of a group, which acts as one by the policy; its Heuristic is not used", agent);
                        agent.warnedHeuristic = true;
                    }
                }
                frame.Add(agent.AgentId, agent.observation);
                deciding.Add(agent);
            }
            if (deciding.Count == 0) return;
            try
            {
                Client.GetActions(EpisodeId, frame);
                if (frame.LoggedCount > 0) warnedHeuristicRefused = false;
            }
            catch (TetherException e)
            {
                // Nothing of the frame was recorded: the agents decide again next time. A refused heuristic
                // action (a wrong size, outside the space, masked; a server older than 1.6) must not stop
                // the agents that act by the policy: they act without the heuristic ones.
                if (frame.LoggedCount == 0)
                {
                    Report(e);
                    return;
                }
                if (!ActWithoutHeuristics(e)) return;
            }
            for (int i = 0; i < deciding.Count; ++i)
            {
                TetherAgent agent = deciding[i];
                int size = frame.ActionSize(i);
                if (agent.action == null || agent.action.Length != size) agent.action = new double[size];
                frame.CopyAction(i, agent.action);
                agent.OnActionReceived(agent.action);
            }
        }

        // The frame again without the agents deciding by Heuristic, after `refused` (which is reported, once
        // until a frame with heuristic actions is taken again); false when it fails too (reported).
        bool ActWithoutHeuristics(TetherException refused)
        {
            if (!warnedHeuristicRefused) Debug.LogWarning("Tether: " + refused.Message + " (the agents deciding by Heuristic skip their decisions until their actions are taken; the others act)", this);
            warnedHeuristicRefused = true;
            frame.Clear();
            int kept = 0;
            for (int i = 0; i < deciding.Count; ++i)
            {
                TetherAgent agent = deciding[i];
                if (agent.decider == TetherAgent.Decider.Heuristic && !InGroup(agent.AgentId)) continue;
                frame.Add(agent.AgentId, agent.observation);
                deciding[kept++] = agent;
            }
            deciding.RemoveRange(kept, deciding.Count - kept);
            if (kept == 0) return false;
            try
            {
                Client.GetActions(EpisodeId, frame);
                return true;
            }
            catch (TetherException e)
            {
                Report(e);
                return false;
            }
        }

        // The heuristic's action of an agent, logged in this step's frame (protocol 1.6); false (the agent
        // skips this decision, as for a non-finite observation) when a value is not finite.
        bool LogHeuristic(TetherAgent agent)
        {
            int size = Math.Max(1, agent.HeuristicActionSize);
            if (agent.heuristicAction == null || agent.heuristicAction.Length != size) agent.heuristicAction = new double[size];
            Array.Clear(agent.heuristicAction, 0, size);
            agent.Heuristic(agent.heuristicAction);
            for (int j = 0; j < size; ++j)
            {
                if (double.IsNaN(agent.heuristicAction[j]) || double.IsInfinity(agent.heuristicAction[j]))
                {
                    if (!agent.warnedHeuristic) Debug.LogWarning("Tether: agent '" + agent.AgentId + "''s heuristic gave a value that is not finite; it does not act until it gives finite values", agent);
                    agent.warnedHeuristic = true;
                    return false;
                }
            }
            frame.LogAction(agent.AgentId, agent.heuristicAction);
            return true;
        }

        static bool Finite(float[] values)
        {
            for (int i = 0; i < values.Length; ++i)
            {
                if (float.IsNaN(values[i]) || float.IsInfinity(values[i])) return false;
            }
            return true;
        }

        bool Connected()
        {
            if (connecting == null || !connecting.IsCompleted) return false;
            if (connecting.IsFaulted)
            {
                Exception cause = connecting.Exception.GetBaseException();
                Failure = cause as TetherException ?? new TetherException(ErrorCode.ConnectionFailed, cause.Message, cause);
                Debug.LogError("Tether: " + Failure.Message, this);
                connecting = null;
                return false;
            }
            Client = connecting.Result;
            connecting = null;
            StartSceneEpisode();
            return true;
        }

        bool StartSceneEpisode()
        {
            try
            {
                EpisodeId = Client.StartEpisode(null, settings.training);
                return true;
            }
            catch (TetherException e)
            {
                Report(e);
                return false;
            }
        }

        // A refusal or a bad frame is logged and the scene goes on; a fatal error stops deciding.
        void Report(TetherException e)
        {
            if (Client != null && Client.FatalError != null)
            {
                Failure = Client.FatalError;
                Debug.LogError("Tether: the server is gone for good: " + Failure.Message, this);
            }
            else
            {
                Debug.LogWarning("Tether: " + e.Message, this);
            }
        }

        void OnDestroy()
        {
            if (Instance == this) Instance = null;
            if (connecting != null)
            {
                // Destroyed while connecting: the client that connects later is closed at once.
                connecting.ContinueWith(t => { if (t.Status == TaskStatus.RanToCompletion) t.Result.Dispose(); });
                connecting = null;
            }
            if (Client != null)
            {
                try
                {
                    Client.Flush(1.0);  // what the last second made, if the server takes it
                }
                catch (TetherException e)
                {
                    Debug.LogWarning("Tether: " + e.Message, this);
                }
                Client.Dispose();
                Client = null;
            }
        }
    }
}
#endif
