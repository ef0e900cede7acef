// Action latency of the C# SDK against its ONNX Runtime backend alone, on the
// same model (run by bench/act_latency.py, which starts the server and exports the model).
//
//   mono act_latency.exe --model policy.onnx --port P [--calls N] [--warmup N] [--blocks N] [--seed N]
//
// * ort_csharp_us_p50 / _p99: OnnxRuntimeBackend.Run on one observation: the
//   P/Invoke into ONNX Runtime's C API (a run through a binding made once) and
//   two small copies: what any C# caller of ONNX Runtime pays.
// * sdk_csharp_us_p50 / _p99: TetherClient.GetAction on one ongoing episode
//   against the server on --port (which never asks for a batch): inference,
//   sampling and recording. A reward is logged between calls (untimed), as a
//   game loop would. Bare and SDK calls alternate in blocks so background load
//   affects both alike.
// * sdk_csharp_allocated_bytes_per_call: bytes the game's thread allocated per
//   GetAction (GC.GetAllocatedBytesForCurrentThread) in steady state: against
//   the server on --sending-port, which asks for a batch every 4000 steps, after
//   --alloc-warmup calls (the episode's arrays and the reused batches have their
//   size), over --alloc-calls calls that cut batches as a long run does, one
//   call every --alloc-interval-us (a game the server keeps up with: 20,000
//   steps/s by default);
//   sdk_csharp_allocating_calls counts the calls that allocated at all.
// * sdk_csharp_batch256_us_p50 / _p99: MultiAgentClient.GetActions for one
//   frame of 256 agents of one module (the server maps every agent to its one
//   module) against the server on --sending-port, in steady state (a batch cut
//   every 4000 agent steps), frames paced every --frame-interval-us; a bare
//   batch-256 OnnxRuntimeBackend.Run goes beside each frame (before it, then
//   after it, in turn): ort_csharp_batch256_paced_us_p50, and
//   sdk_csharp_batch256_ratio is the frame against it.
//   sdk_csharp_batch256_allocated_bytes_per_frame: what the frames allocated.
// Prints one JSON object on stdout.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using Tether.Client;
using Tether.Inference;
using Tether.Sampling;

namespace Tether.Bench
{
    static class ActLatency
    {
        static double Percentile(List<long> ticks, double q)
        {
            ticks.Sort();
            int index = (int)Math.Round(q / 100.0 * (ticks.Count - 1));
            return Math.Round(ticks[Math.Min(index, ticks.Count - 1)] * 1e6 / Stopwatch.Frequency, 2);
        }

        static int Main(string[] argv)
        {
            string model = null;
            int port = 0, sendingPort = 0, calls = 20000, warmup = 2000, blocks = 10, allocWarmup = 20000, allocCalls = 100000, allocIntervalUs = 50, batchCalls = 2000, frameIntervalUs = 1000;
            ulong seed = 0;
            for (int i = 0; i + 1 < argv.Length; i += 2)
            {
                string value = argv[i + 1];
                switch (argv[i])
                {
                    case "--model": model = value; break;
                    case "--port": port = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--sending-port": sendingPort = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--alloc-warmup": allocWarmup = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--alloc-calls": allocCalls = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--alloc-interval-us": allocIntervalUs = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--batch-calls": batchCalls = Math.Max(1, int.Parse(value, CultureInfo.InvariantCulture)); break;
                    case "--frame-interval-us": frameIntervalUs = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--calls": calls = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--warmup": warmup = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--blocks": blocks = Math.Max(1, int.Parse(value, CultureInfo.InvariantCulture)); break;
                    case "--seed": seed = ulong.Parse(value, CultureInfo.InvariantCulture); break;
                    default:
                        Console.Error.WriteLine("act_latency: unknown flag " + argv[i]);
                        return 2;
                }
            }
            if (model == null || port == 0 || sendingPort == 0)
            {
                Console.Error.WriteLine("usage: act_latency.exe --model FILE --port P --sending-port P [--calls N] [--warmup N] [--blocks N] [--alloc-warmup N] [--alloc-calls N] [--seed N]");
                return 2;
            }
            var rng = new Rng(seed);
            const int nObs = 1024;
            var pool = new float[nObs][];
            for (int i = 0; i < nObs; ++i) pool[i] = new[] { (float)(0.5 * rng.Normal()), (float)(0.5 * rng.Normal()), (float)(0.5 * rng.Normal()), (float)(0.5 * rng.Normal()) };

            using (var bare = new OnnxRuntimeBackend())
            using (TetherClient client = TetherClient.Connect(new ClientOptions { Port = port, Seed = seed, ClientName = "bench-act-latency-csharp" }))
            {
                bare.Load(File.ReadAllBytes(model), "onnx::Gemm_0", "action_dist_inputs");
                var output = new float[2];
                var action = new double[1];
                string episode = client.StartEpisode();
                var bareTicks = new List<long>(calls);
                var sdkTicks = new List<long>(calls);
                Action<int, int, bool> bareBlock = (start, n, keep) =>
                {
                    for (int i = start; i < start + n; ++i)
                    {
                        float[] obs = pool[i % nObs];
                        long t0 = Stopwatch.GetTimestamp();
                        bare.Run(obs, 1, 4, output, 2);
                        long t = Stopwatch.GetTimestamp() - t0;
                        if (keep) bareTicks.Add(t);
                    }
                };
                Action<int, int, bool> sdkBlock = (start, n, keep) =>
                {
                    for (int i = start; i < start + n; ++i)
                    {
                        float[] obs = pool[i % nObs];
                        long t0 = Stopwatch.GetTimestamp();
                        client.GetAction(episode, obs, action);
                        long t = Stopwatch.GetTimestamp() - t0;
                        client.LogReturns(episode, 1.0);
                        if (keep) sdkTicks.Add(t);
                    }
                };
                bareBlock(0, warmup, false);
                sdkBlock(0, warmup, false);
                int perBlock = Math.Max(1, calls / blocks);
                for (int b = 0; b < blocks; ++b)
                {
                    bareBlock(b * perBlock, perBlock, true);
                    sdkBlock(b * perBlock, perBlock, true);
                }
                long allocated = 0, allocating = 0, sentBefore = 0, sentAfter = 0;
                using (TetherClient sending = TetherClient.Connect(new ClientOptions { Port = sendingPort, Seed = seed, ClientName = "bench-act-latency-csharp-sending" }))
                {
                    string ongoing = sending.StartEpisode();
                    long interval = allocIntervalUs * Stopwatch.Frequency / 1000000, next = Stopwatch.GetTimestamp();
                    for (int i = 0; i < allocWarmup + allocCalls; ++i)
                    {
                        while (Stopwatch.GetTimestamp() < next) { }
                        next += interval;
                        bool keep = i >= allocWarmup;
                        if (i == allocWarmup) sentBefore = sending.EnvStepsSent;
                        long bytes = GC.GetAllocatedBytesForCurrentThread();
                        sending.GetAction(ongoing, pool[i % nObs], action);
                        sending.LogReturns(ongoing, 1.0);
                        long spent = GC.GetAllocatedBytesForCurrentThread() - bytes;
                        if (!keep) continue;
                        allocated += spent;
                        if (spent > 0) ++allocating;
                    }
                    sentAfter = sending.EnvStepsSent;
                }
                // 256 agents in one frame through the multi-agent client.
                const int agents = 256;
                var frameTicks = new List<long>(batchCalls);
                var frameBareTicks = new List<long>(batchCalls);
                long frameBytes = 0, frameDropped = 0, frameSent = 0;
                var batchObs = new float[agents * 4];
                var batchOut = new float[agents * 2];
                using (MultiAgentClient multi = MultiAgentClient.Connect(new ClientOptions { Port = sendingPort, Seed = seed, ClientName = "bench-act-latency-csharp-multi" }))
                {
                    string frameEpisode = multi.StartEpisode();
                    var frame = new AgentFrame();
                    var ids = new string[agents];
                    for (int a = 0; a < agents; ++a) ids[a] = "agent_" + a;
                    long interval = frameIntervalUs * Stopwatch.Frequency / 1000000, next = Stopwatch.GetTimestamp();
                    int warm = Math.Min(200, batchCalls);
                    for (int i = -warm; i < batchCalls; ++i)
                    {
                        frame.Clear();
                        for (int a = 0; a < agents; ++a)
                        {
                            float[] obs = pool[((i + warm) * agents + a) % nObs];
                            frame.Add(ids[a], obs);
                            Array.Copy(obs, 0, batchObs, a * 4, 4);
                        }
                        next += interval;
                        while (Stopwatch.GetTimestamp() < next) { }
                        // Whichever runs first after the pause pays for waking up: they take turns.
                        long bareTime = 0;
                        if (i % 2 == 0)
                        {
                            long b0 = Stopwatch.GetTimestamp();
                            bare.Run(batchObs, agents, 4, batchOut, 2);
                            bareTime = Stopwatch.GetTimestamp() - b0;
                        }
                        long bytes = GC.GetAllocatedBytesForCurrentThread();
                        long t0 = Stopwatch.GetTimestamp();
                        multi.GetActions(frameEpisode, frame);
                        long t = Stopwatch.GetTimestamp() - t0;
                        long spent = GC.GetAllocatedBytesForCurrentThread() - bytes;
                        if (i % 2 != 0)
                        {
                            long b0 = Stopwatch.GetTimestamp();
                            bare.Run(batchObs, agents, 4, batchOut, 2);
                            bareTime = Stopwatch.GetTimestamp() - b0;
                        }
                        for (int a = 0; a < agents; ++a) multi.LogReturns(frameEpisode, ids[a], 1.0);
                        if (i < 0) continue;
                        frameTicks.Add(t);
                        frameBareTicks.Add(bareTime);
                        frameBytes += spent;
                    }
                    frameDropped = multi.BatchesDropped;
                    frameSent = multi.AgentStepsSent;
                }
                double frameP50 = Percentile(frameTicks, 50), frameP99 = Percentile(frameTicks, 99), framedBare = Percentile(frameBareTicks, 50);
                Console.WriteLine(string.Format(CultureInfo.InvariantCulture,
                    "{{\"sdk_csharp_batch256_us_p50\": {0}, \"sdk_csharp_batch256_us_p99\": {1}, \"ort_csharp_batch256_paced_us_p50\": {2}, " +
                    "\"sdk_csharp_batch256_ratio\": {3}, \"sdk_csharp_batch256_allocated_bytes_per_frame\": {4}, \"sdk_csharp_batch256_frames\": {5}, " +
                    "\"sdk_csharp_batch256_batches_dropped\": {6}, \"sdk_csharp_batch256_agent_steps_sent\": {7}}}",
                    frameP50, frameP99, framedBare, Math.Round(frameP50 / framedBare, 2), Math.Round((double)frameBytes / Math.Max(1, frameTicks.Count), 3), frameTicks.Count, frameDropped, frameSent));
                Console.WriteLine(string.Format(CultureInfo.InvariantCulture,
                    "{{\"ort_csharp_us_p50\": {0}, \"ort_csharp_us_p99\": {1}, \"sdk_csharp_us_p50\": {2}, \"sdk_csharp_us_p99\": {3}, " +
                    "\"sdk_csharp_allocated_bytes_per_call\": {4}, \"sdk_csharp_allocating_calls\": {5}, \"sdk_csharp_alloc_calls\": {6}, " +
                    "\"sdk_csharp_alloc_env_steps_sent\": {7}, \"sdk_csharp_calls\": {8}, \"onnxruntime_version_csharp\": \"{9}\"}}",
                    Percentile(bareTicks, 50), Percentile(bareTicks, 99), Percentile(sdkTicks, 50), Percentile(sdkTicks, 99),
                    Math.Round((double)allocated / Math.Max(1, allocCalls), 3), allocating, allocCalls, sentAfter - sentBefore,
                    sdkTicks.Count, OnnxRuntimeBackend.RuntimeVersion));
            }
            return 0;
        }
    }
}
