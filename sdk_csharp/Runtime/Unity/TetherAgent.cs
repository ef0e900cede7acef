// An agent in a Unity scene: it observes, receives actions and earns rewards;
// the scene's TetherManager does the rest.
#if UNITY_5_3_OR_NEWER
using UnityEngine;

namespace Tether.Unity
{
    /// <summary>
    /// Derive from this for each kind of agent. Every <see cref="decisionPeriod"/>
    /// fixed steps the scene's <see cref="TetherManager"/> asks it for an
    /// observation (<see cref="CollectObservations"/>), computes the actions of
    /// every agent deciding in that step together (one inference per module),
    /// and hands it its action (<see cref="OnActionReceived"/>). Rewards go in
    /// with <see cref="AddReward"/> whenever they happen. The server's policy
    /// mapping turns <see cref="AgentId"/> into a module; agents of a group
    /// (SET_CONFIG groups) act as one agent.
    /// </summary>
    public abstract class TetherAgent : MonoBehaviour
    {
        /// <summary>Who chooses an agent's actions.</summary>
        public enum Decider
        {
            /// <summary>The server's policy (the model the client runs).</summary>
            Policy,
            /// <summary>
            /// <see cref="Heuristic"/>: a player's input, a scripted bot. Its actions are logged (protocol 1.6,
            /// log_action): the server learns from them by behavioural cloning without taking them for its
            /// policy's samples, and a demonstration file (TetherSettings.demoPath) records them.
            /// </summary>
            Heuristic,
        }

        /// <summary>Who chooses this agent's actions (switchable while playing: a designer takes over an agent).</summary>
        [Tooltip("Who chooses this agent's actions: the policy, or Heuristic (a player's input, a scripted bot), whose actions are logged for the server to learn from")]
        public Decider decider = Decider.Policy;

        /// <summary>The id the server maps to a module; empty: the GameObject's name.</summary>
        [Tooltip("The id the server's policy mapping sees; empty: the GameObject's name")]
        public string agentId = "";

        /// <summary>Fixed steps between two decisions of this agent (its own rate).</summary>
        [Min(1)]
        public int decisionPeriod = 5;

        internal float[] observation;
        internal double[] action;
        internal int incarnation;
        internal bool warnedNonFinite;

        /// <summary>The id this agent has in the current episode (a re-enabled agent comes back as a new one).</summary>
        public string AgentId { get; internal set; }

        /// <summary>Numbers in this agent's observation (its module's observation space, flattened).</summary>
        public abstract int ObservationSize { get; }

        /// <summary>Writes the agent's current observation into <paramref name="observation"/> (ObservationSize values; reused, never keep it).</summary>
        public abstract void CollectObservations(float[] observation);

        /// <summary>
        /// Carries out the action the policy chose (a Discrete action as its index
        /// plus start, a MultiDiscrete's indices, a Box action clipped into its
        /// box; a group member's part of its group's action). The array is reused.
        /// </summary>
        public abstract void OnActionReceived(double[] action);

        /// <summary>
        /// Numbers in this agent's action as <see cref="Heuristic"/> writes it (its module's action space,
        /// flattened: 1 for a Discrete action). Read only while <see cref="decider"/> is Heuristic.
        /// </summary>
        public virtual int HeuristicActionSize { get { return 1; } }

        /// <summary>
        /// Writes the action this agent takes now without the policy (<see cref="decider"/> Heuristic) into
        /// <paramref name="action"/> (<see cref="HeuristicActionSize"/> values, zeros on entry; reused, never
        /// keep it): a Discrete action as its value, a MultiDiscrete's indices, a Box action as the game
        /// carries it out. The manager logs it for the server and hands it back through
        /// <see cref="OnActionReceived"/>, as it does the policy's. A refused action (a wrong size, outside
        /// the action space or forbidden by the observation's mask; a server older than protocol 1.6) is
        /// reported once, and the agents deciding by Heuristic skip that decision while the others act. A
        /// member of a group acts by the policy (with a warning).
        /// </summary>
        public virtual void Heuristic(double[] action) { }

        internal double[] heuristicAction;
        internal bool warnedHeuristic;

        /// <summary>
        /// Adds a reward for this agent's last action (rewards add up until it acts again). One that would take
        /// that step's sum beyond float32 (protocol §10.5) is refused and dropped with a warning.
        /// </summary>
        public void AddReward(float reward)
        {
            if (TetherManager.Instance != null) TetherManager.Instance.Reward(this, reward);
        }

        /// <summary>
        /// This agent leaves the episode now, with its current observation as its
        /// last (terminated, or <paramref name="truncated"/> by a time limit). It
        /// acts again, as a new agent, from its next decision.
        /// </summary>
        public void EndAgent(bool truncated = false)
        {
            if (TetherManager.Instance != null) TetherManager.Instance.End(this, truncated);
        }

        /// <summary>Joins the scene's manager.</summary>
        protected virtual void OnEnable()
        {
            if (TetherManager.Instance != null) TetherManager.Instance.Register(this);
        }

        /// <summary>Leaves the scene's manager (and the episode: truncated).</summary>
        protected virtual void OnDisable()
        {
            if (TetherManager.Instance != null) TetherManager.Instance.Unregister(this);
        }
    }
}
#endif
