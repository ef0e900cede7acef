// What a multi-agent game's steady-state frames allocate on its thread.
using System;
using System.Threading;
using Tether.Client;

namespace Tether.Tests
{
    /// <summary>
    /// A multi-agent game the server keeps up with: episodes of 25 frames, each made as an engine makes
    /// it (the frame filled with every agent's observation, GetActions, a reward per agent); after each
    /// frame the game goes on only once the link is idle (frames spaced in time), so batches cut earlier
    /// are back for reuse. Counts what the frames of the episodes after the warm-up allocated on this
    /// thread, and the agent steps the server acknowledged meanwhile.
    /// </summary>
    internal sealed class FrameAllocations
    {
        public int Frames;
        public long Bytes, Sent;

        /// <summary>
        /// Plays <paramref name="episodes"/> episodes of agents <paramref name="ids"/> observing
        /// <paramref name="observations"/>; counts from episode <paramref name="warmUp"/> on, when the
        /// arrays, reused batches and actors have their size. <paramref name="check"/> sees each acted
        /// frame (outside the count). <paramref name="fill"/>, when given, adds to each frame once its
        /// observations are in (inside the count: a logged action, AgentFrame.LogAction).
        /// </summary>
        public static FrameAllocations Measure(MultiAgentClient client, string[] ids, float[][] observations, int episodes, int warmUp,
                                               Action<AgentFrame> check = null, Action<AgentFrame> fill = null)
        {
            var run = new FrameAllocations();
            var frame = new AgentFrame();
            long sentBefore = 0;
            for (int e = 0; e < episodes; ++e)
            {
                if (e == warmUp) sentBefore = client.AgentStepsSent;
                string episode = client.StartEpisode();
                for (int t = 0; t < 25; ++t)
                {
                    long before = GC.GetAllocatedBytesForCurrentThread();
                    frame.Clear();
                    for (int i = 0; i < ids.Length; ++i) frame.Add(ids[i], observations[i]);
                    if (fill != null) fill(frame);
                    client.GetActions(episode, frame);
                    for (int i = 0; i < ids.Length; ++i) client.LogReturns(episode, ids[i], 1.0);
                    long spent = GC.GetAllocatedBytesForCurrentThread() - before;
                    if (check != null) check(frame);
                    if (e >= warmUp)
                    {
                        run.Bytes += spent;
                        ++run.Frames;
                    }
                    DateTime deadline = DateTime.UtcNow.AddSeconds(5);
                    while (client.Sending && DateTime.UtcNow < deadline) Thread.Sleep(1);
                }
                client.EndEpisode(episode);
            }
            run.Sent = client.AgentStepsSent - sentBefore;
            return run;
        }
    }
}
