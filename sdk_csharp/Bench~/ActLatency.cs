// Action latency of the C# SDK against its ONNX Runtime backend alone, on the
// same model (run by bench/act_latency.py, which starts the server and exports the model).
//
//   mono act_latency.exe --model policy.onnx --port P --sending-port P [--calls N] [--warmup N] [--blocks N]
//                        [--batch-calls N] [--frame-interval-us N] [--sustained-frame-interval-us N] [--seed N]
//   mono act_latency.exe --cnn-model cnn.onnx --cnn-port P [--cnn-calls N] [--seed N]
//   mono act_latency.exe --lstm-model lstm.onnx --lstm-port P [--lstm-calls N] [--seed N]
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
//   every 4000 agent steps), frames paced every --frame-interval-us (the game
//   sleeps until 1.5 ms before a frame, then spins); a bare batch-256
//   OnnxRuntimeBackend.Run goes beside each frame (before it, then after it, in
//   turn): ort_csharp_batch256_paced_us_p50, and sdk_csharp_batch256_ratio is the
//   frame against it; sdk_csharp_batch256_p99_vs_p50. The bare run's own tail at the
//   same pace is the baseline for the frame's: ort_csharp_batch256_paced_us_p99,
//   ort_csharp_batch256_paced_p99_vs_p50 and sdk_csharp_batch256_p99_vs_bare_p99.
//   sdk_csharp_batch256_allocated_bytes_per_frame: what the frames allocated (at
//   1 ms the server does not keep up: batches wait and are dropped, new ones are
//   made). sdk_csharp_batch256_server_agent_steps_per_s: what the server took.
// * sdk_csharp_batch256_sustained_*: the same frames, with a new client, at a
//   pace the sending server keeps up with (--sustained-frame-interval-us; 0, the
//   default: twice the time the server took per frame's agent steps in the first
//   series, whole milliseconds, 2 to 50 ms), so that batches come back for reuse:
//   _us_p50, _us_p99, _ratio (against ort_csharp_batch256_sustained_paced_us_p50),
//   _p99_vs_p50, _p99_vs_bare_p99 (against ort_csharp_batch256_sustained_paced_us_p99,
//   with ort_csharp_batch256_sustained_paced_p99_vs_p50), _allocated_bytes_per_frame (cuts included), _batches_dropped,
//   _agent_steps_sent (the whole series, warm-up frames included, as for C++), _frame_interval_us and _server_kept_up (nothing dropped,
//   at least 80 % of the timed agent steps answered).
// * With --cnn-model FILE --cnn-port P [--cnn-calls N] [--cnn-input-name NAME] (and no --model):
//   ort_csharp_cnn_us_p50 / _p99: OnnxRuntimeBackend.Run on one 84x84x4 uint8 image (the input
//   bound once, the image's bytes copied into it) against sdk_csharp_cnn_us_p50 / _p99:
//   TetherClient.GetAction on the same images given as byte[], against the server on P that serves
//   the model; alternating in blocks of 10, the episode's steps sent between blocks (Flush,
//   untimed), as in a long run. sdk_csharp_cnn_ratio: sdk / ort at p50;
//   sdk_csharp_cnn_allocated_bytes_per_call: what the timed GetAction calls allocated.
// * With --lstm-model FILE --lstm-port P [--lstm-calls N] [--lstm-input-name NAME] (and no --model):
//   memory (protocol 1.5): ort_csharp_lstm_us_p50 / _p99: OnnxRuntimeBackend.Run on one observation
//   with the recurrent state fed back (every input and output, state tensors included, bound once)
//   against sdk_csharp_lstm_us_p50 / _p99: TetherClient.GetAction against the server on P that serves
//   that model (the client carries the episode's state), in blocks of 10 as for the CNN;
//   sdk_csharp_lstm_ratio: sdk / ort at p50; sdk_csharp_lstm_allocated_bytes_per_call.
// Prints one JSON object on stdout (two without --cnn-model or --lstm-model: the multi-agent and the
// single-agent figures).
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

        // Waits until `deadline` (Stopwatch ticks) as a game waits for its next frame: asleep while
        // more than 1.5 ms are left (the server and the I/O thread get the cores), then spinning.
        static void WaitUntil(long deadline)
        {
            long margin = 1500 * Stopwatch.Frequency / 1000000;
            while (deadline - Stopwatch.GetTimestamp() > margin) System.Threading.Thread.Sleep(1);
            while (Stopwatch.GetTimestamp() < deadline) { }
        }

        /// One paced series of multi-agent frames and its figures.
        sealed class FrameRun
        {
            public const int Agents = 256;
            public readonly int IntervalUs;
            public readonly List<long> Ticks = new List<long>();
            public readonly List<long> BareTicks = new List<long>();
            public long Bytes, Dropped, Sent, TotalSent;
            public double ServerAgentStepsPerSecond;  // agent steps the server answered per second of the timed frames
            public double P50, P99, BareP50, BareP99, Ratio, P99VsP50, BytesPerFrame;
            public int Frames;

            public FrameRun(int intervalUs) { IntervalUs = intervalUs; }

            public void Finish()
            {
                Frames = Ticks.Count;
                P50 = Percentile(Ticks, 50);
                P99 = Percentile(Ticks, 99);
                BareP50 = Percentile(BareTicks, 50);
                BareP99 = Percentile(BareTicks, 99);
                Ratio = Math.Round(P50 / BareP50, 2);
                P99VsP50 = Math.Round(P99 / P50, 2);
                BytesPerFrame = Math.Round((double)Bytes / Math.Max(1, Frames), 3);
            }

            public string Json(string prefix, string bareKey)
            {
                return string.Format(CultureInfo.InvariantCulture,
                    "\"{0}_us_p50\": {1}, \"{0}_us_p99\": {2}, \"{13}\": {3}, \"{0}_ratio\": {4}, \"{0}_p99_vs_p50\": {5}, " +
                    "\"{0}_allocated_bytes_per_frame\": {6}, \"{0}_frames\": {7}, \"{0}_batches_dropped\": {8}, \"{0}_agent_steps_sent\": {9}, " +
                    "\"{0}_frame_interval_us\": {10}, \"{0}_server_agent_steps_per_s\": {11}, \"{0}_server_kept_up\": {12}, " +
                    "\"{14}\": {15}, \"{16}\": {17}, \"{0}_p99_vs_bare_p99\": {18}",
                    prefix, P50, P99, BareP50, Ratio, P99VsP50, BytesPerFrame, Frames, Dropped, TotalSent, IntervalUs, Math.Round(ServerAgentStepsPerSecond),
                    Dropped == 0 && Sent >= (long)Frames * Agents * 8 / 10 ? "true" : "false", bareKey,
                    bareKey.Replace("_us_p50", "_us_p99"), BareP99, bareKey.Replace("_us_p50", "_p99_vs_p50"),
                    Math.Round(BareP99 / BareP50, 2), Math.Round(P99 / BareP99, 2));
            }
        }

        // --batch-calls frames of 256 agents of one module through a MultiAgentClient against the server
        // on `port`, after 200 warm-up frames, paced at run.IntervalUs: GetActions timed, its allocations
        // counted, a bare batch-256 run beside each frame (before it, then after it, in turn).
        static void FramesAgainst(int port, ulong seed, string name, OnnxRuntimeBackend bare, float[][] pool, int batchCalls, FrameRun run)
        {
            const int agents = FrameRun.Agents;
            int nObs = pool.Length;
            var batchObs = new float[agents * 4];
            var batchOut = new float[agents * 2];
            using (MultiAgentClient multi = MultiAgentClient.Connect(new ClientOptions { Port = port, Seed = seed, ClientName = name }))
            {
                string frameEpisode = multi.StartEpisode();
                var frame = new AgentFrame();
                var ids = new string[agents];
                for (int a = 0; a < agents; ++a) ids[a] = "agent_" + a;
                long interval = run.IntervalUs * Stopwatch.Frequency / 1000000, next = Stopwatch.GetTimestamp();
                int warm = Math.Min(200, batchCalls);
                long sentAtStart = 0, startTicks = 0;
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
                    WaitUntil(next);
                    if (i == 0)
                    {
                        sentAtStart = multi.AgentStepsSent;
                        startTicks = Stopwatch.GetTimestamp();
                    }
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
                    run.Ticks.Add(t);
                    run.BareTicks.Add(bareTime);
                    run.Bytes += spent;
                }
                double seconds = (double)(Stopwatch.GetTimestamp() - startTicks) / Stopwatch.Frequency;
                run.Dropped = multi.BatchesDropped;
                run.Sent = multi.AgentStepsSent - sentAtStart;
                run.TotalSent = multi.AgentStepsSent;
                run.ServerAgentStepsPerSecond = seconds > 0 ? run.Sent / seconds : 0;
            }
            run.Finish();
        }

        // Images (a byte box, protocol 1.4): --cnn-calls bare OnnxRuntimeBackend.Run(byte[]) calls (the
        // uint8 input bound once; the image is copied into it) against as many TetherClient.GetAction
        // calls on the same 84x84x4 images given as byte[], against the server on `port` that serves the
        // model, alternating in blocks of 10 after 50 warm-up calls of each. Between blocks the episode's
        // steps are sent (Flush, untimed, then 20 ms for the server to store them), as a batch is cut in a
        // long run, so each step is recorded into arrays that kept their capacity. One JSON object.
        static string MeasureCnn(string modelFile, int port, int cnnCalls, ulong seed, string inputName, string outputName)
        {
            const int blockCalls = 10, images = 64;
            using (var bare = new OnnxRuntimeBackend())
            using (TetherClient client = TetherClient.Connect(new ClientOptions { Port = port, Seed = seed, ClientName = "bench-act-latency-csharp-cnn" }))
            {
                int size = client.ObservationSpace.FlatDim;
                if (!client.ObservationSpace.IsBytes || size != 84 * 84 * 4) throw new InvalidOperationException("the CNN server's observation space is not an 84x84x4 byte box");
                int actions = client.ActionSpace.DistInputsSize;
                bare.Load(File.ReadAllBytes(modelFile), inputName, outputName);
                if (!bare.InputIsBytes) throw new InvalidOperationException("the CNN model's input is not uint8");
                var rng = new Rng(seed);
                var pool = new byte[images][];
                for (int i = 0; i < images; ++i)
                {
                    pool[i] = new byte[size];
                    for (int j = 0; j < size; ++j) pool[i][j] = (byte)(rng.NextU64() & 0xff);
                }
                var output = new float[actions];
                var action = new double[1];
                string episode = client.StartEpisode();
                var bareTicks = new List<long>(cnnCalls);
                var sdkTicks = new List<long>(cnnCalls);
                long allocated = 0;
                int warmup = Math.Min(50, cnnCalls);
                for (int done = -warmup; done < cnnCalls; done += blockCalls)
                {
                    int n = done < 0 ? warmup : Math.Min(blockCalls, cnnCalls - done);
                    bool keep = done >= 0;
                    for (int i = 0; i < n; ++i)
                    {
                        byte[] image = pool[(done + warmup + i) % images];
                        long t0 = Stopwatch.GetTimestamp();
                        bare.Run(image, 1, size, output, actions);
                        long t = Stopwatch.GetTimestamp() - t0;
                        if (keep) bareTicks.Add(t);
                    }
                    for (int i = 0; i < n; ++i)
                    {
                        byte[] image = pool[(done + warmup + i) % images];
                        long bytes = GC.GetAllocatedBytesForCurrentThread();
                        long t0 = Stopwatch.GetTimestamp();
                        client.GetAction(episode, image, action);
                        long t = Stopwatch.GetTimestamp() - t0;
                        long spent = GC.GetAllocatedBytesForCurrentThread() - bytes;
                        client.LogReturns(episode, 1.0);
                        if (!keep) continue;
                        sdkTicks.Add(t);
                        allocated += spent;
                    }
                    client.Flush(60);
                    System.Threading.Thread.Sleep(20);  // (the server stores the batch after answering)
                    if (done < 0) done = -blockCalls;  // (the warm-up was one block)
                }
                double bareP50 = Percentile(bareTicks, 50), sdkP50 = Percentile(sdkTicks, 50);
                return string.Format(CultureInfo.InvariantCulture,
                    "{{\"ort_csharp_cnn_us_p50\": {0}, \"ort_csharp_cnn_us_p99\": {1}, \"sdk_csharp_cnn_us_p50\": {2}, \"sdk_csharp_cnn_us_p99\": {3}, " +
                    "\"sdk_csharp_cnn_ratio\": {4}, \"sdk_csharp_cnn_calls\": {5}, \"sdk_csharp_cnn_allocated_bytes_per_call\": {6}, \"sdk_csharp_cnn_env_steps_sent\": {7}}}",
                    bareP50, Percentile(bareTicks, 99), sdkP50, Percentile(sdkTicks, 99), bareP50 > 0 ? Math.Round(sdkP50 / bareP50, 3) : 0.0,
                    sdkTicks.Count, Math.Round((double)allocated / Math.Max(1, sdkTicks.Count), 3), client.EnvStepsSent);
            }
        }

        // Memory (protocol 1.5): --lstm-calls bare OnnxRuntimeBackend.Run calls with the recurrent state fed
        // back (the state tensors bound once with the rest) against as many TetherClient.GetAction calls
        // against the server on `port`, which serves the model and announces its recurrent_state; the same
        // observations, in alternating blocks of 10 after 5000 warm-up calls of each (alike), the episode's steps sent
        // every 500 calls (Flush, untimed), so that each step is recorded, its state included. One JSON object.
        static string MeasureLstm(string modelFile, int port, int lstmCalls, ulong seed, string inputName, string outputName)
        {
            const int blockCalls = 10, observations = 64;
            using (var bare = new OnnxRuntimeBackend())
            using (TetherClient client = TetherClient.Connect(new ClientOptions { Port = port, Seed = seed, ClientName = "bench-act-latency-csharp-lstm" }))
            {
                Tether.Protocol.RecurrentState state = client.RecurrentState;
                if (state == null) throw new InvalidOperationException("the LSTM server announces no recurrent_state");
                int size = client.ObservationSpace.FlatDim, actions = client.ActionSpace.DistInputsSize;
                BackendLoading.Load(bare, File.ReadAllBytes(modelFile), null, inputName, outputName, state);
                var rng = new Rng(seed);
                var pool = new float[observations][];
                for (int i = 0; i < observations; ++i)
                {
                    pool[i] = new float[size];
                    for (int j = 0; j < size; ++j) pool[i][j] = (float)((rng.NextU64() >> 11) * (2.0 / (1UL << 53)) - 1.0);
                }
                var output = new float[actions];
                var carried = new float[state.Width];
                var action = new double[client.ActionSpace.FlatDim];
                string episode = client.StartEpisode();
                var bareTicks = new List<long>(lstmCalls);
                var sdkTicks = new List<long>(lstmCalls);
                long allocated = 0;
                int warmup = Math.Min(5000, lstmCalls), sinceFlush = 0;
                for (int done = -warmup; done < lstmCalls; done += blockCalls)
                {
                    int n = Math.Min(blockCalls, lstmCalls - done);
                    bool keep = done >= 0;
                    for (int i = 0; i < n; ++i)
                    {
                        float[] obs = pool[(done + warmup + i) % observations];
                        long t0 = Stopwatch.GetTimestamp();
                        bare.Run(obs, 1, size, output, actions, carried, carried);
                        long t = Stopwatch.GetTimestamp() - t0;
                        if (keep) bareTicks.Add(t);
                    }
                    for (int i = 0; i < n; ++i)
                    {
                        float[] obs = pool[(done + warmup + i) % observations];
                        long bytes = GC.GetAllocatedBytesForCurrentThread();
                        long t0 = Stopwatch.GetTimestamp();
                        client.GetAction(episode, obs, action);
                        long t = Stopwatch.GetTimestamp() - t0;
                        long spent = GC.GetAllocatedBytesForCurrentThread() - bytes;
                        client.LogReturns(episode, 1.0);
                        if (!keep) continue;
                        sdkTicks.Add(t);
                        allocated += spent;
                    }
                    // Every 500 calls the steps go (a batch cut, as in a long run); the warm-up's calls gave the
                    // episode's arrays and the reused batches the capacity they need.
                    sinceFlush += n;
                    if (sinceFlush >= 500)
                    {
                        client.Flush(60);
                        sinceFlush = 0;
                    }
                }
                double bareP50 = Percentile(bareTicks, 50), sdkP50 = Percentile(sdkTicks, 50);
                return string.Format(CultureInfo.InvariantCulture,
                    "{{\"ort_csharp_lstm_us_p50\": {0}, \"ort_csharp_lstm_us_p99\": {1}, \"sdk_csharp_lstm_us_p50\": {2}, \"sdk_csharp_lstm_us_p99\": {3}, " +
                    "\"sdk_csharp_lstm_ratio\": {4}, \"sdk_csharp_lstm_calls\": {5}, \"sdk_csharp_lstm_allocated_bytes_per_call\": {6}, \"sdk_csharp_lstm_env_steps_sent\": {7}, " +
                    "\"sdk_csharp_lstm_state_width\": {8}}}",
                    bareP50, Percentile(bareTicks, 99), sdkP50, Percentile(sdkTicks, 99), bareP50 > 0 ? Math.Round(sdkP50 / bareP50, 3) : 0.0,
                    sdkTicks.Count, Math.Round((double)allocated / Math.Max(1, sdkTicks.Count), 3), client.EnvStepsSent, state.Width);
            }
        }

        static int Main(string[] argv)
        {
            string model = null, cnnModel = null, cnnInputName = "onnx::Gemm_0", cnnOutputName = "action_dist_inputs";
            int cnnPort = 0, cnnCalls = 300;
            string lstmModel = null, lstmInputName = "onnx::Gemm_0", lstmOutputName = "action_dist_inputs";
            int lstmPort = 0, lstmCalls = 20000;
            int port = 0, sendingPort = 0, calls = 20000, warmup = 2000, blocks = 10, allocWarmup = 20000, allocCalls = 100000, allocIntervalUs = 50, batchCalls = 2000, frameIntervalUs = 1000, sustainedIntervalUs = 0;
            ulong seed = 0;
            for (int i = 0; i + 1 < argv.Length; i += 2)
            {
                string value = argv[i + 1];
                switch (argv[i])
                {
                    case "--model": model = value; break;
                    case "--cnn-model": cnnModel = value; break;
                    case "--cnn-port": cnnPort = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--cnn-calls": cnnCalls = Math.Max(1, int.Parse(value, CultureInfo.InvariantCulture)); break;
                    case "--cnn-input-name": cnnInputName = value; break;
                    case "--cnn-output-name": cnnOutputName = value; break;
                    case "--lstm-model": lstmModel = value; break;
                    case "--lstm-port": lstmPort = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--lstm-calls": lstmCalls = Math.Max(1, int.Parse(value, CultureInfo.InvariantCulture)); break;
                    case "--lstm-input-name": lstmInputName = value; break;
                    case "--lstm-output-name": lstmOutputName = value; break;
                    case "--port": port = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--sending-port": sendingPort = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--alloc-warmup": allocWarmup = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--alloc-calls": allocCalls = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--alloc-interval-us": allocIntervalUs = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--batch-calls": batchCalls = Math.Max(1, int.Parse(value, CultureInfo.InvariantCulture)); break;
                    case "--frame-interval-us": frameIntervalUs = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--sustained-frame-interval-us": sustainedIntervalUs = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--calls": calls = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--warmup": warmup = int.Parse(value, CultureInfo.InvariantCulture); break;
                    case "--blocks": blocks = Math.Max(1, int.Parse(value, CultureInfo.InvariantCulture)); break;
                    case "--seed": seed = ulong.Parse(value, CultureInfo.InvariantCulture); break;
                    default:
                        Console.Error.WriteLine("act_latency: unknown flag " + argv[i]);
                        return 2;
                }
            }
            if (lstmModel != null && model == null)
            {
                if (lstmPort == 0)
                {
                    Console.Error.WriteLine("act_latency: --lstm-model needs --lstm-port");
                    return 2;
                }
                Console.WriteLine(MeasureLstm(lstmModel, lstmPort, lstmCalls, seed, lstmInputName, lstmOutputName));
                return 0;
            }
            if (cnnModel != null && model == null)
            {
                if (cnnPort == 0)
                {
                    Console.Error.WriteLine("act_latency: --cnn-model needs --cnn-port");
                    return 2;
                }
                Console.WriteLine(MeasureCnn(cnnModel, cnnPort, cnnCalls, seed, cnnInputName, cnnOutputName));
                return 0;
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
                // 256 agents in one frame through the multi-agent client: at --frame-interval-us, then
                // at a pace the sending server keeps up with (--sustained-frame-interval-us; 0: twice
                // the time the server took per frame's agent steps in the first run, whole milliseconds).
                var fast = new FrameRun(frameIntervalUs);
                FramesAgainst(sendingPort, seed, "bench-act-latency-csharp-multi", bare, pool, batchCalls, fast);
                int sustainedUs = sustainedIntervalUs;
                if (sustainedUs <= 0)
                {
                    double perFrameUs = fast.ServerAgentStepsPerSecond > 0 ? 1e6 * FrameRun.Agents / fast.ServerAgentStepsPerSecond : 10000;
                    sustainedUs = (int)Math.Min(50000, Math.Max(2000, 1000 * Math.Ceiling(2 * perFrameUs / 1000)));
                }
                System.Threading.Thread.Sleep(1000);  // (the server finishes what the first client left)
                var sustained = new FrameRun(sustainedUs);
                FramesAgainst(sendingPort, seed, "bench-act-latency-csharp-multi-sustained", bare, pool, batchCalls, sustained);
                Console.WriteLine("{" + fast.Json("sdk_csharp_batch256", "ort_csharp_batch256_paced_us_p50") + ", " +
                                  sustained.Json("sdk_csharp_batch256_sustained", "ort_csharp_batch256_sustained_paced_us_p50") + "}");
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
