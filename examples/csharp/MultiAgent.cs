// A small multi-agent game written in C#, trained by `tether serve` through the
// MultiAgentClient: two modules chosen by the server's policy mapping and one
// agent group (the server options are examples/configs/cpp_multi_agent.json: the
// same game as examples/cpp/multi_agent.cpp).
//
//   * scouts ("scout_0", "scout_1" -> module "scout"): each sees a one-hot
//     target among 3 and earns 1 for naming it. scout_1 joins at step 4 and
//     leaves at step 12 of each 16-step episode.
//   * the lifters ("lift_0" + "lift_1", the group "pair" -> module "lifter"):
//     each member sees its own cue (one of 2) and earns 0.5 for choosing its
//     PARTNER's cue, so only the group, which sees both cues, can do well.
//
// A uniformly random policy earns about 16 per episode, a perfect one 40.
//
//   mono multiagent.exe --port 5555 --max-steps 6000 --seed 0
//   mono multiagent.exe --random --max-steps 3000           # random actions, no server
//
// It stops after --max-steps env steps (or when the server goes away) and
// prints one JSON line: {"episodes", "mean_return_last_100", ...}.
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Linq;
using Tether.Client;
using Tether.Protocol;
using Tether.Sampling;

namespace Tether.Examples
{
    /// <summary>The game's state and rules: the engine side of the example.</summary>
    sealed class RelayGame
    {
        public const int EpisodeSteps = 16;
        const int Targets = 3;
        readonly Rng rng;
        readonly int[] target = new int[2];
        readonly int[] cue = new int[2];
        readonly float[] scoutObs = new float[Targets + 1];
        readonly float[] liftObs = new float[2];

        public RelayGame(ulong seed) { rng = new Rng(seed); }

        public int Step { get; private set; }

        public bool Scout1Present { get { return Step >= 4 && Step < 12; } }

        public void Reset()
        {
            Step = 0;
            Draw();
        }

        /// <summary>Observations of the agents acting now.</summary>
        public void Observe(AgentFrame frame)
        {
            frame.Clear();
            AddScout(frame, "scout_0", target[0]);
            if (Scout1Present) AddScout(frame, "scout_1", target[1]);
            AddLifter(frame, "lift_0", cue[0]);
            AddLifter(frame, "lift_1", cue[1]);
        }

        public double Reward(string agent, long action)
        {
            switch (agent)
            {
                case "scout_0": return action == target[0] ? 1.0 : 0.0;
                case "scout_1": return action == target[1] ? 1.0 : 0.0;
                case "lift_0": return action == cue[1] ? 0.5 : 0.0;
                case "lift_1": return action == cue[0] ? 0.5 : 0.0;
                default: return 0.0;
            }
        }

        public static int Choices(string agent) { return agent.StartsWith("scout_", StringComparison.Ordinal) ? Targets : 2; }

        public void Advance()
        {
            ++Step;
            Draw();
        }

        void Draw()
        {
            for (int i = 0; i < 2; ++i) target[i] = (int)(rng.NextU64() % Targets);
            for (int i = 0; i < 2; ++i) cue[i] = (int)(rng.NextU64() % 2);
        }

        void AddScout(AgentFrame frame, string id, int which)
        {
            for (int k = 0; k < Targets; ++k) scoutObs[k] = k == which ? 1f : 0f;
            scoutObs[Targets] = (float)Step / EpisodeSteps;
            frame.Add(id, scoutObs);
        }

        void AddLifter(AgentFrame frame, string id, int which)
        {
            liftObs[0] = which == 0 ? 1f : 0f;
            liftObs[1] = which == 1 ? 1f : 0f;
            frame.Add(id, liftObs);
        }
    }

    static class MultiAgentExample
    {
        static double Mean(List<double> values, bool first)
        {
            if (values.Count == 0) return 0;
            IEnumerable<double> window = first ? values.Take(100) : values.Skip(Math.Max(0, values.Count - 100));
            return window.Average();
        }

        static string Number(double value) { return value.ToString("0.000", CultureInfo.InvariantCulture); }

        static int Main(string[] argv)
        {
            string host = "127.0.0.1";
            int port = 5555;
            long maxSteps = 6000;
            ulong seed = 0;
            bool random = false;
            double reconnectTimeout = 5;
            var flags = new Flags("multiagent")
                .Text("--host", "H", v => host = v).Int("--port", "P", 0, 65535, v => port = (int)v)
                .Int("--max-steps", "N", long.MinValue, long.MaxValue, v => maxSteps = v).ULong("--seed", "S", v => seed = v)
                .Number("--reconnect-timeout", "S", v => reconnectTimeout = v).Toggle("--random", () => random = true);
            if (!flags.Parse(argv)) return 2;
            var game = new RelayGame(seed);
            var frame = new AgentFrame();
            var returns = new List<double>();
            long steps = 0;
            if (random)
            {
                var rng = new Rng(seed + 1);
                while (steps < maxSteps)
                {
                    game.Reset();
                    double total = 0;
                    while (game.Step < RelayGame.EpisodeSteps)
                    {
                        game.Observe(frame);
                        for (int i = 0; i < frame.Count; ++i) total += game.Reward(frame.AgentId(i), (long)(rng.NextU64() % (ulong)RelayGame.Choices(frame.AgentId(i))));
                        game.Advance();
                        ++steps;
                    }
                    returns.Add(total);
                }
                Console.WriteLine("{\"episodes\": " + returns.Count + ", \"mean_return_last_100\": " + Number(Mean(returns, false)) + ", \"env_steps\": " + steps + ", \"policy\": \"random\"}");
                return 0;
            }

            MultiAgentClient client;
            try
            {
                client = MultiAgentClient.Connect(new ClientOptions
                {
                    Host = host,
                    Port = port,
                    Seed = seed,
                    ReconnectTimeoutSeconds = reconnectTimeout,
                    WhenQueueFull = QueueFullPolicy.Wait,
                    ClientName = "csharp-multi-agent-example",
                    // Strict on-policy: each batch waits for the weights that answer it (no data goes stale).
                    WaitForWeights = true,
                });
            }
            catch (TetherException e)
            {
                Console.Error.WriteLine("connect failed: " + e.Message);
                return 1;
            }
            string stoppedBy = "max_steps";
            var leaving = new AgentFrame();
            using (client)
            {
                try
                {
                    while (steps < maxSteps)
                    {
                        string episode = client.StartEpisode();
                        game.Reset();
                        double total = 0;
                        while (game.Step < RelayGame.EpisodeSteps)
                        {
                            game.Observe(frame);
                            client.GetActions(episode, frame);
                            for (int i = 0; i < frame.Count; ++i)
                            {
                                double reward = game.Reward(frame.AgentId(i), frame.DiscreteAction(i));
                                total += reward;
                                client.LogReturns(episode, frame.AgentId(i), reward);
                            }
                            game.Advance();
                            ++steps;
                            if (game.Step == 12)  // scout_1 leaves the episode (its final observation)
                            {
                                leaving.Clear();
                                leaving.Add("scout_1", new float[] { 0, 0, 0, 1 });
                                client.EndAgents(episode, leaving);
                            }
                        }
                        game.Observe(frame);  // the last observations
                        client.EndEpisode(episode, frame, truncated: true);
                        returns.Add(total);
                        // The server's run is done (TRAINING_DONE, protocol §6.6): a normal end.
                        if (client.TrainingDone != null)
                        {
                            stoppedBy = "training_done";
                            break;
                        }
                    }
                    client.Flush();
                }
                catch (TetherException e)
                {
                    if (client.TrainingDone != null)
                        stoppedBy = "training_done";  // (a MAP_AGENTS question the finished run no longer answers)
                    else if (client.FatalError == null)
                    {
                        Console.Error.WriteLine("multi_agent: " + e.Message);
                        return 1;
                    }
                    else
                        stoppedBy = "server_gone";
                }
                Console.WriteLine("{\"episodes\": " + returns.Count + ", \"mean_return_last_100\": " + Number(Mean(returns, false)) +
                                  ", \"mean_return_first_100\": " + Number(Mean(returns, true)) + ", \"env_steps\": " + steps +
                                  ", \"env_steps_sent\": " + client.EnvStepsSent + ", \"agent_steps_sent\": " + client.AgentStepsSent +
                                  ", \"models_loaded\": " + client.ModelsLoaded + ", \"inference_runs\": " + client.InferenceRuns +
                                  ", \"stopped_by\": \"" + stoppedBy + "\"}");
            }
            return 0;
        }
    }
}
