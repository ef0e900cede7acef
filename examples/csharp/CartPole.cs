// CartPole-v1 as an external Tether client written in C#: the environment runs
// here (gymnasium's CartPole-v1 physics), actions come from the local ONNX model
// the server sends, experience goes to the server.
//
//   mono cartpole.exe --host 127.0.0.1 --port 5555 --max-steps 300000 --seed 0
//   mono cartpole.exe --random --max-steps 20000      # a uniformly random policy, no server
//   mono cartpole.exe --offline-policy run/offline_policy.json --demo-file play.jsonl --max-steps 20000
//                                  # a server's offline policy file and no server (§20): nothing is sent,
//                                  # every episode is written to play.jsonl (§18)
//
// It stops after --max-steps env steps, or when the server goes away (a
// `tether serve --stop-at-return 450` that reached its target), and prints one
// JSON line: {"episodes", "mean_return_last_100", "env_steps", "env_steps_sent",
// "reconnects", "max_act_ms", "wall_s", "random", "stopped_by"[, "summary"]}.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.Linq;
using Tether.Client;
using Tether.Protocol;
using Tether.Sampling;

namespace Tether.Examples
{
    /// <summary>gymnasium's CartPole-v1: the same constants, Euler integration, termination at |x| &gt; 2.4 or |theta| &gt; 12 degrees, truncation after 500 steps.</summary>
    sealed class CartPoleEnv
    {
        const double Gravity = 9.8, MassCart = 1.0, MassPole = 0.1, TotalMass = MassCart + MassPole, Length = 0.5;
        const double PoleMassLength = MassPole * Length, ForceMag = 10.0, Tau = 0.02, XThreshold = 2.4;
        const double ThetaThreshold = 12.0 * 2.0 * Math.PI / 360.0;
        const int MaxEpisodeSteps = 500;

        readonly double[] state = new double[4];
        readonly Rng rng;
        int steps;

        public CartPoleEnv(ulong seed) { rng = new Rng(seed); }

        public void Reset(float[] obs)
        {
            for (int i = 0; i < 4; ++i) state[i] = -0.05 + 0.1 * rng.Uniform();
            steps = 0;
            Observe(obs);
        }

        /// <summary>Applies action 0 (push left) or 1 (push right); returns the reward.</summary>
        public double Step(int action, float[] obs, out bool terminated, out bool truncated)
        {
            double force = action == 1 ? ForceMag : -ForceMag;
            double cos = Math.Cos(state[2]), sin = Math.Sin(state[2]);
            double temp = (force + PoleMassLength * state[3] * state[3] * sin) / TotalMass;
            double thetaAcc = (Gravity * sin - cos * temp) / (Length * (4.0 / 3.0 - MassPole * cos * cos / TotalMass));
            double xAcc = temp - PoleMassLength * thetaAcc * cos / TotalMass;
            state[0] += Tau * state[1];
            state[1] += Tau * xAcc;
            state[2] += Tau * state[3];
            state[3] += Tau * thetaAcc;
            ++steps;
            terminated = state[0] < -XThreshold || state[0] > XThreshold || state[2] < -ThetaThreshold || state[2] > ThetaThreshold;
            truncated = !terminated && steps >= MaxEpisodeSteps;
            Observe(obs);
            return 1.0;
        }

        void Observe(float[] obs)
        {
            for (int i = 0; i < 4; ++i) obs[i] = (float)state[i];
        }
    }

    static class CartPole
    {
        static int Main(string[] argv)
        {
            string host = "127.0.0.1";
            int port = 5555;
            long maxSteps = 300000;
            ulong seed = 0;
            bool random = false;
            double reconnectTimeout = 5;
            string offlinePolicy = null, demoFile = null;
            var flags = new Flags("cartpole")
                .Text("--host", "H", v => host = v).Int("--port", "P", 0, 65535, v => port = (int)v)
                .Int("--max-steps", "N", long.MinValue, long.MaxValue, v => maxSteps = v).ULong("--seed", "S", v => seed = v)
                .Toggle("--random", () => random = true).Number("--reconnect-timeout", "S", v => reconnectTimeout = v)
                .Text("--offline-policy", "FILE", v => offlinePolicy = v).Text("--demo-file", "FILE", v => demoFile = v);
            if (!flags.Parse(argv)) return 2;
            var clock = Stopwatch.StartNew();
            var env = new CartPoleEnv(seed * 7919 + 1);
            var obs = new float[4];
            var action = new double[1];
            var lastReturns = new Queue<double>();
            long episodes = 0, envSteps = 0;
            double maxActMs = 0;
            string stoppedBy = "max_steps";
            int status = 0;
            TetherClient client = null;
            try
            {
                if (!random)
                {
                    client = TetherClient.Connect(new ClientOptions
                    {
                        Host = host,
                        Port = port,
                        ClientName = "cartpole-csharp-" + seed,
                        Seed = seed,
                        ReconnectTimeoutSeconds = reconnectTimeout,
                        // This CartPole steps in microseconds, far faster than a learner trains: wait for
                        // room in the send queue so every step is delivered, at the server's pace.
                        WhenQueueFull = QueueFullPolicy.Wait,
                        OfflinePolicy = offlinePolicy,
                        DemoPath = demoFile,
                    });
                }
                var coin = new Rng(seed);
                while (envSteps < maxSteps && stoppedBy == "max_steps")
                {
                    string episode = client != null ? client.StartEpisode() : null;
                    env.Reset(obs);
                    double total = 0;
                    bool terminated = false, truncated = false;
                    while (!terminated && !truncated)
                    {
                        if (client != null)
                        {
                            long started = clock.ElapsedTicks;
                            try
                            {
                                client.GetAction(episode, obs, action);
                            }
                            catch (TetherException e)
                            {
                                stoppedBy = e.Code == ErrorCode.ConnectionFailed ? "server_gone" : "error";
                                if (stoppedBy == "error")
                                {
                                    Console.Error.WriteLine("cartpole: " + e.Message);
                                    status = 1;
                                }
                                break;
                            }
                            maxActMs = Math.Max(maxActMs, (clock.ElapsedTicks - started) * 1000.0 / Stopwatch.Frequency);
                        }
                        else
                        {
                            action[0] = coin.NextU64() & 1;
                        }
                        double reward = env.Step((int)action[0], obs, out terminated, out truncated);
                        if (client != null) client.LogReturns(episode, reward);
                        total += reward;
                        ++envSteps;
                    }
                    if (stoppedBy != "max_steps") break;
                    if (client != null) client.EndEpisode(episode, obs, truncated);
                    // The server reached its target and said so (TRAINING_DONE, protocol §6.6): a normal end.
                    if (client != null && client.TrainingDone != null) stoppedBy = "training_done";
                    ++episodes;
                    lastReturns.Enqueue(total);
                    if (lastReturns.Count > 100) lastReturns.Dequeue();
                }
            }
            catch (TetherException e)
            {
                Console.Error.WriteLine("cartpole: " + e.Message);
                stoppedBy = e.Code == ErrorCode.ConnectionFailed ? "server_gone" : "error";
                status = stoppedBy == "error" ? 1 : 0;
            }
            double mean = lastReturns.Count > 0 ? lastReturns.Average() : 0;
            // The run's summary the server sent with TRAINING_DONE, when it did.
            TrainingSummary summary = client != null ? client.TrainingDone : null;
            string summaryField = summary != null ? ", \"summary\": " + summary.Json.ToString(Newtonsoft.Json.Formatting.None) : "";
            Console.WriteLine(string.Format(CultureInfo.InvariantCulture,
                "{{\"episodes\": {0}, \"mean_return_last_100\": {1:F2}, \"env_steps\": {2}, \"env_steps_sent\": {3}, \"reconnects\": {4}, " +
                "\"batches_dropped\": {5}, \"max_act_ms\": {6:F3}, \"wall_s\": {7:F2}, \"random\": {8}, \"stopped_by\": \"{9}\"{10}, " +
                "\"offline\": {11}}}",
                episodes, mean, envSteps, client != null ? client.EnvStepsSent : 0, client != null ? client.Reconnects : 0,
                client != null ? client.BatchesDropped : 0, maxActMs, clock.Elapsed.TotalSeconds, random ? "true" : "false", stoppedBy,
                summaryField, client != null && client.Offline ? "true" : "false"));
            if (client != null) client.Dispose();
            return status;
        }
    }
}
