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
    /// allocate nothing. Belongs to the thread that fills it.
    /// </summary>
    public sealed class AgentFrame
    {
        readonly List<string> ids = new List<string>();
        readonly List<float> obs = new List<float>();
        readonly List<int> obsOffsets = new List<int> { 0 };
        readonly List<bool> truncated = new List<bool>();
        double[] actions = new double[0];
        int[] actionOffsets = new int[1];
        bool hasActions;

        /// <summary>Number of agents in the frame.</summary>
        public int Count { get { return ids.Count; } }

        /// <summary>Forgets the agents (keeps the capacity).</summary>
        public void Clear()
        {
            ids.Clear();
            obs.Clear();
            obsOffsets.Clear();
            obsOffsets.Add(0);
            truncated.Clear();
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
            if (agentId == null) throw new TetherException(ErrorCode.InvalidArgument, "an agent id is null");
            if (observation == null || offset < 0 || length < 0 || offset + length > observation.Length)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "agent '" + agentId + "': the observation range is outside the array");
            }
            ids.Add(agentId);
            for (int j = 0; j < length; ++j) obs.Add(observation[offset + j]);
            obsOffsets.Add(obs.Count);
            truncated.Add(isTruncated);
            hasActions = false;
            return ids.Count - 1;
        }

        /// <summary>Agent <paramref name="i"/>'s id.</summary>
        public string AgentId(int i) { return ids[i]; }

        /// <summary>Agent <paramref name="i"/>'s observation size.</summary>
        public int ObsSize(int i) { return obsOffsets[i + 1] - obsOffsets[i]; }

        /// <summary>Value <paramref name="j"/> of agent <paramref name="i"/>'s observation.</summary>
        public float Obs(int i, int j) { return obs[obsOffsets[i] + j]; }

        /// <summary>Whether agent <paramref name="i"/> was added as truncated.</summary>
        public bool Truncated(int i) { return truncated[i]; }

        /// <summary>Agent <paramref name="i"/>'s action size (0 before an action was computed).</summary>
        public int ActionSize(int i) { return hasActions ? actionOffsets[i + 1] - actionOffsets[i] : 0; }

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

        // ---- for MultiAgentClient -------------------------------------------------------------

        internal void CopyObs(int i, List<float> into)
        {
            for (int k = obsOffsets[i], end = obsOffsets[i + 1]; k < end; ++k) into.Add(obs[k]);
        }

        internal void CopyObs(int i, float[] into, int at)
        {
            for (int k = obsOffsets[i], end = obsOffsets[i + 1]; k < end; ++k) into[at++] = obs[k];
        }

        internal bool AllFinite(int i, out int bad)
        {
            for (int k = obsOffsets[i], end = obsOffsets[i + 1]; k < end; ++k)
            {
                if (float.IsNaN(obs[k]) || float.IsInfinity(obs[k]))
                {
                    bad = k - obsOffsets[i];
                    return false;
                }
            }
            bad = -1;
            return true;
        }

        /// <summary>Lays out the actions: <paramref name="sizes"/>[i] numbers for agent i.</summary>
        internal void LayOutActions(int[] sizes)
        {
            int n = ids.Count;
            if (actionOffsets.Length < n + 1) actionOffsets = new int[Math.Max(n + 1, 2 * actionOffsets.Length)];
            actionOffsets[0] = 0;
            for (int i = 0; i < n; ++i) actionOffsets[i + 1] = actionOffsets[i] + sizes[i];
            if (actions.Length < actionOffsets[n]) actions = new double[Math.Max(actionOffsets[n], 2 * actions.Length)];
            hasActions = true;
        }

        internal void SetAction(int i, double[] from, int offset, int count)
        {
            Array.Copy(from, offset, actions, actionOffsets[i], count);
        }
    }
}
