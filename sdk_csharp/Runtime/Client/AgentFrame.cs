// The agents acting at one moment of one multi-agent episode: ids and
// observations in, actions out. Reused frame after frame, it allocates nothing.
using System;
using System.Collections.Generic;
using Tether.Protocol;

namespace Tether.Client
{
    /// <summary>
    /// The agents acting at one moment of one episode: their ids and flat
    /// observations in, their actions out (in the same order). Reuse one frame:
    /// <see cref="Clear"/> keeps every buffer's capacity, so steady-state frames
    /// allocate nothing. An observation of a byte box (protocol 1.4, §8.1: an image)
    /// may be added as bytes, or as floats holding the integers 0 to 255. Belongs to
    /// the thread that fills it.
    /// </summary>
    public sealed class AgentFrame
    {
        // Plain arrays with counts (not lists): the client reads them agent by agent every frame.
        string[] ids = new string[8];
        float[] obs = new float[32];
        int[] obsOffsets = new int[9];  // count + 1 entries in use, obsOffsets[0] == 0
        bool[] truncated = new bool[8];
        int[] nonByteAt = new int[8];  // per agent: its first value that is not an integer 0-255, or -1
        int count;
        // The first agent (in order) whose observation holds a NaN or an infinity, and where: checked as
        // the values are copied in, so that GetActions does not walk them again.
        int firstNonFinite = -1, firstNonFiniteAt = -1;
        int firstNonByte = -1;  // the first agent with a value a byte box does not take, or -1
        double[] actions = new double[0];
        int[] actionOffsets = new int[1];
        bool hasActions;
        int uniformSize = -1, uniformCount;  // actionOffsets[0..uniformCount] hold i * uniformSize (-1: not laid out so)
        // Protocol 1.6: the frame's logged actions, by actor id, their values at loggedOffsets[k]...loggedOffsets[k + 1].
        string[] loggedIds = new string[2];
        double[] loggedValues = new double[8];
        int[] loggedOffsets = new int[3];
        int loggedCount;

        /// <summary>Number of agents in the frame.</summary>
        public int Count { get { return count; } }

        /// <summary>Forgets the agents and the logged actions (keeps the capacity).</summary>
        public void Clear()
        {
            for (int i = 0; i < count; ++i) ids[i] = null;  // (no id outlives its frame)
            for (int k = 0; k < loggedCount; ++k) loggedIds[k] = null;
            loggedCount = 0;
            count = 0;
            firstNonFinite = firstNonFiniteAt = -1;
            firstNonByte = -1;
            hasActions = false;
        }

        /// <summary>
        /// Adds an agent (or a group member) with its flat observation (copied);
        /// returns its index. For EndAgents, <paramref name="isTruncated"/> marks an
        /// end by time limit (otherwise the agent terminated).
        /// </summary>
        public int Add(string agentId, float[] observation, bool isTruncated = false)
        {
            if (observation == null) throw new TetherException(ErrorCode.InvalidArgument, "agent '" + agentId + "': the observation is null");
            return Add(agentId, observation, 0, observation.Length, isTruncated);
        }

        /// <summary>Adds an agent with <paramref name="length"/> observation values of <paramref name="observation"/> from <paramref name="offset"/>.</summary>
        public int Add(string agentId, float[] observation, int offset, int length, bool isTruncated = false)
        {
            int n = count, at = Reserve(agentId, observation, offset, length);
            float[] into = obs;
            int notByte = -1;
            for (int j = 0; j < length; ++j)
            {
                float v = observation[offset + j];
                into[at + j] = v;
                if (!(v - v == 0f) && firstNonFinite < 0)  // (NaN or infinite: v - v is NaN)
                {
                    firstNonFinite = n;
                    firstNonFiniteAt = j;
                }
                if (notByte < 0 && !(v >= 0f && v <= 255f && (float)(int)v == v)) notByte = j;  // (for a byte box's module)
            }
            return Complete(agentId, at + length, notByte, isTruncated);
        }

        /// <summary>
        /// Adds an agent with its observation given as bytes, row-major (copied): a byte box's
        /// (protocol 1.4, §8.1), such as a camera image of shape [height, width, channels] as the
        /// engine holds it. Returns its index. Allocates nothing once the frame has its size.
        /// </summary>
        public int Add(string agentId, byte[] observation, bool isTruncated = false)
        {
            if (observation == null) throw new TetherException(ErrorCode.InvalidArgument, "agent '" + agentId + "': the observation is null");
            return Add(agentId, observation, 0, observation.Length, isTruncated);
        }

        /// <summary>Adds an agent with <paramref name="length"/> observation bytes of <paramref name="observation"/> from <paramref name="offset"/>.</summary>
        public int Add(string agentId, byte[] observation, int offset, int length, bool isTruncated = false)
        {
            int at = Reserve(agentId, observation, offset, length);
            float[] into = obs;
            for (int j = 0; j < length; ++j) into[at + j] = observation[offset + j];  // (bytes are finite values of a byte box)
            return Complete(agentId, at + length, -1, isTruncated);
        }

        // Checks the next agent's id and observation range (of a float[] or a byte[]) and makes room
        // for its values; returns where they go in obs.
        int Reserve(string agentId, Array observation, int offset, int length)
        {
            if (agentId == null) throw new TetherException(ErrorCode.InvalidArgument, "an agent id is null");
            if (observation == null || offset < 0 || length < 0 || offset + length > observation.Length)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "agent '" + agentId + "': the observation range is outside the array");
            }
            int n = count;
            if (n == ids.Length) GrowAgents();
            int at = obsOffsets[n], end = at + length;
            if (end > obs.Length) GrowObs(end);
            return at;
        }

        // Makes the next agent, whose values Reserve placed up to `end`, part of the frame; returns its index.
        // `notByte`: its first value a byte box does not take, or -1.
        int Complete(string agentId, int end, int notByte, bool isTruncated)
        {
            int n = count;
            nonByteAt[n] = notByte;
            if (notByte >= 0 && firstNonByte < 0) firstNonByte = n;
            ids[n] = agentId;
            truncated[n] = isTruncated;
            obsOffsets[n + 1] = end;
            count = n + 1;
            hasActions = false;
            return n;
        }

        /// <summary>
        /// Protocol 1.6 (§10.1): gives actor <paramref name="actorId"/> of this frame the action it takes
        /// (copied), chosen outside the policy — a human player, a scripted bot, another controller. The
        /// actor is an agent added to the frame, or a group (its id, with the group's joint action: its
        /// members' parts in member order) whose members are; a member of a group cannot be logged alone.
        /// <see cref="MultiAgentClient.GetActions"/> then records the actor's step as logged (logged_runs;
        /// its model still evaluated on the observation, a model with memory advancing its state; a
        /// log-probability of 0) and gives the actor its own action back, while the frame's other agents
        /// act by the policy. Its values are checked there against the actor's module (see GetActions).
        /// INVALID_ARGUMENT here for a null id or action, or an actor given twice. Allocates nothing once
        /// the frame has its size.
        /// </summary>
        public void LogAction(string actorId, double[] action)
        {
            if (actorId == null) throw new TetherException(ErrorCode.InvalidArgument, "LogAction: the actor id is null");
            if (action == null) throw new TetherException(ErrorCode.InvalidArgument, "LogAction: the action of '" + actorId + "' is null");
            int n = loggedCount;
            for (int k = 0; k < n; ++k)
            {
                if (loggedIds[k] == actorId) throw new TetherException(ErrorCode.InvalidArgument, "LogAction: '" + actorId + "' has a logged action in this frame already");
            }
            if (n == loggedIds.Length)
            {
                Array.Resize(ref loggedIds, 2 * n);
                Array.Resize(ref loggedOffsets, 2 * n + 1);
            }
            int at = loggedOffsets[n], end = at + action.Length;
            if (end > loggedValues.Length) Array.Resize(ref loggedValues, Math.Max(end, 2 * loggedValues.Length));
            Array.Copy(action, 0, loggedValues, at, action.Length);
            loggedIds[n] = actorId;
            loggedOffsets[n + 1] = end;
            loggedCount = n + 1;
        }

        /// <summary>Number of logged actions in the frame (<see cref="LogAction"/>).</summary>
        public int LoggedCount { get { return loggedCount; } }

        /// <summary>The actor of logged action <paramref name="k"/> (in the order they were given).</summary>
        public string LoggedActorId(int k)
        {
            if ((uint)k >= (uint)loggedCount) throw new ArgumentOutOfRangeException("k", "logged action " + k + " is not in the frame of " + loggedCount);
            return loggedIds[k];
        }

        void GrowAgents()
        {
            int size = 2 * ids.Length;
            Array.Resize(ref ids, size);
            Array.Resize(ref truncated, size);
            Array.Resize(ref nonByteAt, size);
            Array.Resize(ref obsOffsets, size + 1);
        }

        void GrowObs(int needed)
        {
            Array.Resize(ref obs, Math.Max(needed, 2 * obs.Length));
        }

        void Check(int i)
        {
            if ((uint)i >= (uint)count) throw new ArgumentOutOfRangeException("i", "agent " + i + " is not in the frame of " + count);
        }

        /// <summary>Agent <paramref name="i"/>'s id.</summary>
        public string AgentId(int i)
        {
            Check(i);
            return ids[i];
        }

        /// <summary>Agent <paramref name="i"/>'s observation size.</summary>
        public int ObsSize(int i)
        {
            Check(i);
            return obsOffsets[i + 1] - obsOffsets[i];
        }

        /// <summary>Value <paramref name="j"/> of agent <paramref name="i"/>'s observation.</summary>
        public float Obs(int i, int j)
        {
            Check(i);
            if ((uint)j >= (uint)(obsOffsets[i + 1] - obsOffsets[i])) throw new ArgumentOutOfRangeException("j", "agent " + i + " has no observation value " + j);
            return obs[obsOffsets[i] + j];
        }

        /// <summary>Whether agent <paramref name="i"/> was added as truncated.</summary>
        public bool Truncated(int i)
        {
            Check(i);
            return truncated[i];
        }

        /// <summary>Agent <paramref name="i"/>'s action size (0 before an action was computed).</summary>
        public int ActionSize(int i)
        {
            Check(i);
            return hasActions ? actionOffsets[i + 1] - actionOffsets[i] : 0;
        }

        /// <summary>
        /// Number <paramref name="j"/> of agent <paramref name="i"/>'s action after
        /// GetActions/ComputeActions: a discrete action as its integer value, a Box
        /// action clipped into its box; a group member's equal part of the group's action.
        /// </summary>
        public double Action(int i, int j = 0)
        {
            if (!hasActions || j < 0 || j >= ActionSize(i)) throw new TetherException(ErrorCode.InvalidArgument, "agent " + i + " has no action number " + j);
            return actions[actionOffsets[i] + j];
        }

        /// <summary>Agent <paramref name="i"/>'s first action number as an integer (a Discrete action).</summary>
        public long DiscreteAction(int i) { return (long)Math.Round(Action(i, 0)); }

        /// <summary>Copies agent <paramref name="i"/>'s action into <paramref name="into"/> (ActionSize(i) values).</summary>
        public void CopyAction(int i, double[] into)
        {
            int size = ActionSize(i);
            if (into == null || into.Length < size) throw new TetherException(ErrorCode.InvalidArgument, "the action buffer needs " + size + " values");
            Array.Copy(actions, actionOffsets[i], into, 0, size);
        }

        // ---- for MultiAgentClient (indices are in range: no checks) -----------------------------

        internal string[] Ids { get { return ids; } }
        internal float[] ObsValues { get { return obs; } }
        internal int[] ObsOffsets { get { return obsOffsets; } }
        internal bool[] TruncatedFlags { get { return truncated; } }

        internal void CopyObs(int i, List<float> into)
        {
            for (int k = obsOffsets[i], end = obsOffsets[i + 1]; k < end; ++k) into.Add(obs[k]);
        }

        internal void CopyObs(int i, float[] into, int at)
        {
            for (int k = obsOffsets[i], end = obsOffsets[i + 1]; k < end; ++k) into[at++] = obs[k];
        }

        // Whether agent i's observation is finite; else `bad` is the first value that is not. Only the
        // first such agent is known: callers check the agents in order and stop at the first one.
        internal bool AllFinite(int i, out int bad)
        {
            if (i != firstNonFinite)
            {
                bad = -1;
                return true;
            }
            bad = firstNonFiniteAt;
            return false;
        }

        /// <summary>The first agent whose observation is not finite, or -1.</summary>
        internal int FirstNonFinite { get { return firstNonFinite; } }

        /// <summary>The first agent with an observation value a byte box does not take (not an integer 0-255), or -1.</summary>
        internal int FirstNonByte { get { return firstNonByte; } }

        /// <summary>Agent <paramref name="i"/>'s first observation value that is not an integer 0-255, or -1.</summary>
        internal int NonByteAt(int i) { return nonByteAt[i]; }

        /// <summary>Lays out the actions: <paramref name="sizes"/>[i] numbers for agent i.</summary>
        internal void LayOutActions(int[] sizes)
        {
            int n = count;
            uniformSize = -1;
            if (actionOffsets.Length < n + 1) actionOffsets = new int[Math.Max(n + 1, 2 * actionOffsets.Length)];
            int[] offsets = actionOffsets;
            int total = 0;
            offsets[0] = 0;
            for (int i = 0; i < n; ++i)
            {
                total += sizes[i];
                offsets[i + 1] = total;
            }
            if (actions.Length < total) actions = new double[Math.Max(total, 2 * actions.Length)];
            hasActions = true;
        }

        /// <summary>Lays out <paramref name="size"/> action numbers for every agent.</summary>
        internal void LayOutUniformActions(int size)
        {
            int n = count;
            if (size != uniformSize || n > uniformCount)
            {
                // (a frame of as many agents or fewer with the same action size reuses the offsets)
                if (actionOffsets.Length < n + 1) actionOffsets = new int[Math.Max(n + 1, 2 * actionOffsets.Length)];
                int[] offsets = actionOffsets;
                for (int i = 0, total = 0; i <= n; ++i, total += size) offsets[i] = total;
                uniformSize = size;
                uniformCount = n;
            }
            int needed = n * size;
            if (actions.Length < needed) actions = new double[Math.Max(needed, 2 * actions.Length)];
            hasActions = true;
        }

        internal double[] ActionValues { get { return actions; } }

        internal double[] LoggedValues { get { return loggedValues; } }
        internal int LoggedOffset(int k) { return loggedOffsets[k]; }
        internal int LoggedLength(int k) { return loggedOffsets[k + 1] - loggedOffsets[k]; }
        internal int[] ActionOffsets { get { return actionOffsets; } }

        internal void SetAction(int i, double[] from, int offset, int count)
        {
            double[] into = actions;
            int at = actionOffsets[i];
            for (int j = 0; j < count; ++j) into[at + j] = from[offset + j];
        }
    }
}
