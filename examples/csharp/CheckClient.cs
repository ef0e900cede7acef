// The client program `tether check-client` runs against (docs/check-client.md),
// written with the C# SDK.
//
// It plays the checker's "echo env" through a TetherClient: the spaces, ONNX
// names and model come from the server, the env executes exactly the action
// the SDK returns, and every server refusal the SDK raises is printed and
// survived (the call that raised it did nothing, so it is made again). After
// --steps env steps it stays idle for --idle-s seconds (the SDK keeps the
// connection alive with heartbeats), then closes.
//
//   tether check-client --port 5556 &
//   mono checkclient.exe --port 5556 [--host H] [--steps 300] [--idle-s 3] [--auth-token T] [--seed S]
//
// Exit status: 0 when it played every step; 1 when the SDK gave up (a failed
// connection is not something this program may paper over).
using System;
using System.Globalization;
using System.Threading;
using Tether.Client;
using Tether.Protocol;

namespace Tether.Examples
{
    static class CheckClient
    {
        const int EpisodeLength = 10;

        /// <summary>Runs <paramref name="call"/>, printing and surviving the server's refusals it raises; a fatal error ends the program.</summary>
        static T Survive<T>(TetherClient client, Func<T> call)
        {
            while (true)
            {
                try
                {
                    return call();
                }
                catch (TetherException e) when (client.FatalError == null)
                {
                    Console.WriteLine("server reported: " + e.Message);
                }
            }
        }

        static int Main(string[] argv)
        {
            var options = new ClientOptions
            {
                Port = 5556,
                ClientName = "check-client-csharp",
                Seed = 0,
                ReconnectTimeoutSeconds = 30,
                // The checker answers slowly on purpose and must see every batch:
                // wait for room in the send queue instead of dropping the oldest batches.
                WhenQueueFull = QueueFullPolicy.Wait,
            };
            long stepsWanted = 300;
            double idleSeconds = 3;
            var flags = new Flags("checkclient")
                .Text("--host", "H", v => options.Host = v).Int("--port", "P", 0, 65535, v => options.Port = (int)v)
                .Int("--steps", "N", long.MinValue, long.MaxValue, v => stepsWanted = v)
                .Number("--idle-s", "S", v => idleSeconds = v).Text("--auth-token", "T", v => options.AuthToken = v)
                .ULong("--seed", "S", v => options.Seed = v);
            if (!flags.Parse(argv)) return 2;

            TetherClient client;
            try
            {
                client = TetherClient.Connect(options);
            }
            catch (TetherException e)
            {
                Console.Error.WriteLine("checkclient: " + e.Message);
                return 1;
            }
            using (client)
            {
                // obs = [t / 10, the action the env executed last, 1]; reward = that action; 10 steps.
                var obs = new float[3];
                var action = new double[1];
                long steps = 0;
                try
                {
                    while (steps < stepsWanted)
                    {
                        int t = 0;
                        obs[0] = 0f; obs[1] = 0f; obs[2] = 1f;
                        string episode = Survive(client, () => client.StartEpisode());
                        while (t < EpisodeLength)
                        {
                            Survive(client, () => { client.GetAction(episode, obs, action); return 0; });
                            double executed = action[0];  // as given: the SDK already clipped it
                            ++t;
                            obs[0] = (float)t / EpisodeLength;
                            obs[1] = (float)executed;
                            obs[2] = 1f;
                            Survive(client, () => { client.LogReturns(episode, executed); return 0; });
                            ++steps;
                        }
                        Survive(client, () => client.EndEpisode(episode, obs));
                    }
                    Thread.Sleep(TimeSpan.FromSeconds(idleSeconds));
                    // Raises what arrived while idle (a refusal is printed; a fatal error ends the run).
                    Survive(client, () => { client.StartEpisode("idle-check", trainingEnabled: false); return 0; });
                }
                catch (TetherException e)
                {
                    Console.Error.WriteLine("checkclient: " + e.Message);
                    return 1;
                }
                Console.WriteLine("played " + steps + " steps (reconnects " + client.Reconnects + ", heartbeats " + client.HeartbeatsSent + ")");
            }
            return 0;
        }
    }
}
