// What a single-agent game's steady-state GetAction calls allocate on its thread.
using System;
using System.Threading;
using Tether.Client;

namespace Tether.Tests
{
    /// <summary>
    /// A game the server keeps up with: episodes of 250 steps, each a GetAction and a reward; after each
    /// step and each episode the game goes on only once the link is idle (as frames spaced in time would),
    /// so the batches cut earlier are back for reuse before the next cut, however loaded the machine. Counts what the steps of the episodes
    /// after the warm-up allocated on this thread, and the steps the server acknowledged meanwhile.
    /// </summary>
    internal sealed class GetActionAllocations
    {
        public int Calls, Allocating;
        public long Bytes, Sent;

        /// <summary>
        /// Plays <paramref name="episodes"/> episodes, each step's GetAction made by <paramref name="act"/>
        /// (episode id, episode number, step) and each episode ended by <paramref name="end"/>; counts from
        /// episode <paramref name="warmUp"/> on, when the arrays and the reused batches have their size.
        /// </summary>
        public static GetActionAllocations Measure(TetherClient client, int episodes, int warmUp, Action<string, int, int> act, Action<string, int> end)
        {
            var run = new GetActionAllocations();
            long sentBefore = 0;
            for (int e = 0; e < episodes; ++e)
            {
                bool measure = e >= warmUp;
                if (e == warmUp) sentBefore = client.EnvStepsSent;
                string episode = client.StartEpisode();
                for (int t = 0; t < 250; ++t)
                {
                    long before = GC.GetAllocatedBytesForCurrentThread();
                    act(episode, e, t);
                    client.LogReturns(episode, 1.0);
                    long allocated = GC.GetAllocatedBytesForCurrentThread() - before;
                    WaitWhileSending(client);  // (the server keeps up: a batch cut is back before the next cut)
                    if (!measure) continue;
                    ++run.Calls;
                    run.Bytes += allocated;
                    if (allocated > 0) ++run.Allocating;
                }
                end(episode, e);
                WaitWhileSending(client);
            }
            run.Sent = client.EnvStepsSent - sentBefore;
            return run;
        }

        // Until the link is idle (outside the count), at most 5 s: the game is spaced in time as a server that
        // keeps up lets it be; a loaded machine then delays the game, not the batches' return.
        static void WaitWhileSending(TetherClient client)
        {
            DateTime deadline = DateTime.UtcNow.AddSeconds(5);
            while (client.Sending && DateTime.UtcNow < deadline) Thread.Sleep(1);
        }
    }
}
