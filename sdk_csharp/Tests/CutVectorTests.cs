// tests/conformance/cuts.json (§13.3, where a batch is cut) against both clients: each case's engine
// calls played by a TetherClient (kind "single") or a MultiAgentClient (kind "multi", agents a_* of the
// module "solo") of a loopback server, then a flush; the batches the server received, read back as the
// vectors write them (each observation by its value, records and entries by id), are the case's. A case
// with "reconnect": the first connection closes at batch 1, and later ones describe other bounds
// ("bounds_changed") or the same config. The same vectors run in the Python SDK
// (tests/sdk/test_cut_vectors.py) and the C++ SDK (test_cut_vectors.cpp).
using System;
using System.Collections.Generic;
using System.Linq;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class CutVectorTests
    {
        const int Width = 4;  // (the scripted server's Box(4), single-agent and module "solo" alike)

        [Test]
        public void BatchesAreCutWhereTheVectorsSay()
        {
            Vectors.Check("cuts.json", (file, c) =>
            {
                string kind = (string)c["kind"];
                Vectors.Expect(kind == "single" || kind == "multi", "unknown kind " + kind);
                bool reconnect = c["reconnect"] != null;
                using (ReconnectingServer server = Server(c))
                {
                    // (a full queue waits: every batch is delivered; with "wait_for_weights", the call that cut a
                    // batch waits for its answer)
                    var options = new ClientOptions
                    {
                        Port = server.Port, Seed = 1, ReconnectTimeoutSeconds = 5, ResponseTimeoutSeconds = 5, UpdateTimeoutSeconds = 5,
                        WhenQueueFull = QueueFullPolicy.Wait, WaitForWeights = (bool)c["wait_for_weights"],
                    };
                    if (kind == "single")
                    {
                        using (TetherClient client = TetherClient.Connect(options))
                        {
                            PlaySingle(client, (JArray)c["calls"]);
                            client.Flush(10);
                        }
                    }
                    else
                    {
                        using (MultiAgentClient client = MultiAgentClient.Connect(options))
                        {
                            PlayMulti(client, (JArray)c["calls"]);
                            client.Flush(10);
                        }
                    }
                    List<JObject> received = server.Received(), batches = server.Batches();
                    Vectors.Expect(received.Count - batches.Count == (reconnect ? 1 : 0), received.Count + " batches received, " + batches.Count + " of them once");
                    Vectors.Expect(!reconnect || JToken.DeepEquals(received[0], received[1]), "batch 1 was not sent again unchanged");
                    var got = new JArray();
                    for (int i = 0; i < batches.Count; ++i)
                    {
                        Vectors.Expect((long)batches[i]["batch_seq"] == i + 1, "a batch sent twice or skipped: " + batches[i]["batch_seq"]);
                        got.Add(AsTheVectorsWrite(kind, batches[i]));
                    }
                    Vectors.Expect(Same(got, c["batches"]), "sent " + got.ToString(Newtonsoft.Json.Formatting.None) +
                                   "\nthe vectors' " + c["batches"].ToString(Newtonsoft.Json.Formatting.None));
                }
            });
        }

        // Connection 0 describes observations in [-10, 10], later ones in [-9, 9] with "bounds_changed"; the
        // first connection is lost at batch 1 with "reconnect". Every handshake sends the model, a batch is
        // answered with the weights the client has, and SET_STATE n (0: the handshake's, n: the answer to
        // batch n on the connection) carries the case's record_shares[n], the last one repeated.
        static ReconnectingServer Server(JObject c)
        {
            string kind = (string)c["kind"], reconnect = (string)c["reconnect"];
            string model = OnnxCodec.Encode(ScriptedServer.TestModel);
            Func<int, JObject> configOf = connection =>
            {
                double bound = connection > 0 && reconnect == "bounds_changed" ? 9 : 10;
                var spaces = new JObject
                {
                    { "observation_space", Space.Box(new long[] { Width }, -bound, bound).ToJson() }, { "action_space", Space.Discrete(2).ToJson() },
                    { "onnx_input_names", new JArray("onnx::Gemm_0") }, { "onnx_output_names", new JArray("action_dist_inputs") },
                };
                var config = new JObject
                {
                    { "type", "SET_CONFIG" }, { "env_steps_per_sample", c["steps_per_batch"] }, { "force_on_policy", true },
                    { "protocol_version", "1.3" }, { "heartbeat_interval_s", 0 },
                };
                if (kind == "single")
                {
                    config.Merge(spaces);
                    return config;
                }
                config["modules"] = new JObject { { "solo", spaces } };
                config["policy_mapping"] = JArray.Parse("[{\"pattern\": \"*\", \"module\": \"solo\"}]");
                return config;
            };
            var shares = (JArray)c["record_shares"];
            Func<int, JObject> state = n =>
            {
                bool withModel = n == 0;
                JObject answer;
                if (kind == "single")
                {
                    answer = new JObject { { "type", "SET_STATE" }, { "weights_seq_no", 0 } };
                    if (withModel) answer["onnx_file"] = model;
                }
                else
                {
                    var models = new JObject();
                    if (withModel) models["solo"] = new JObject { { "weights_seq_no", 0 }, { "onnx_file", model } };
                    answer = new JObject { { "type", "SET_STATE" }, { "models", models } };
                }
                if (shares != null) answer["record_share"] = shares[Math.Min(n, shares.Count - 1)].DeepClone();
                return answer;
            };
            return new ReconnectingServer
            {
                ConfigOf = configOf,
                StateOf = connection => state(0),
                BatchAnswer = (connection, n) => reconnect != null && connection == 0 ? null : state(n),
            };
        }

        static float[] Obs(JToken v)
        {
            var obs = new float[Width];
            for (int i = 0; i < Width; ++i) obs[i] = (float)v;
            return obs;
        }

        static AgentFrame Frame(JToken values, bool truncated = false)
        {
            var frame = new AgentFrame();
            foreach (JProperty agent in ((JObject)values).Properties()) frame.Add(agent.Name, Obs(agent.Value), truncated);
            return frame;
        }

        static void PlaySingle(TetherClient client, JArray calls)
        {
            var started = new HashSet<string>();
            var action = new double[1];
            foreach (JArray call in calls)
            {
                string what = (string)call[0], episode = (string)call[1];
                if (started.Add(episode)) client.StartEpisode(episode, what != "start" || (bool)call[2]);
                if (what == "start") continue;
                if (what == "act") client.GetAction(episode, Obs(call[2]), action);
                else if (what == "reward") client.LogReturns(episode, (double)call[2]);
                else client.EndEpisode(episode, Obs(call[2]), what == "truncate");
            }
        }

        static void PlayMulti(MultiAgentClient client, JArray calls)
        {
            var started = new HashSet<string>();
            foreach (JArray call in calls)
            {
                string what = (string)call[0], episode = (string)call[1];
                if (started.Add(episode)) client.StartEpisode(episode, what != "start" || (bool)call[2]);
                if (what == "start") continue;
                if (what == "frame") client.GetActions(episode, Frame(call[2]));
                else if (what == "reward") client.LogReturns(episode, (string)call[2], (double)call[3]);
                else if (what == "end_agents" || what == "truncate_agents") client.EndAgents(episode, Frame(call[2], what == "truncate_agents"));
                else client.EndEpisode(episode, Frame(call[2]), what == "truncate");
            }
        }

        // The value of each observation row; a row whose elements differ is not the case's.
        static JArray Markers(JToken rows)
        {
            var values = new JArray();
            foreach (JArray row in rows)
            {
                Vectors.Expect(row.Count == Width && row.All(x => (double)x == (double)row[0]), "an observation not of the case: " + row);
                values.Add((double)row[0]);
            }
            return values;
        }

        static JObject Steps(JToken entry)
        {
            int steps = ((JArray)entry["rewards"]).Count;
            Vectors.Expect(steps >= 1 && ((JArray)entry["actions"]).Count == steps && ((JArray)entry["obs"]).Count == steps + 1, "step counts of " + entry);
            return new JObject { { "obs", Markers(entry["obs"]) }, { "rewards", entry["rewards"].DeepClone() } };
        }

        // A record's or an entry's end flag: a boolean (optional: false when left out).
        static JToken Flag(JToken part, string name, bool optional = false)
        {
            JToken flag = part[name];
            if (flag == null && optional) return false;
            Vectors.Expect(flag != null && flag.Type == JTokenType.Boolean, name + " of " + part);
            return flag.DeepClone();
        }

        // A batch as the vectors write it: episode id -> record (a single-agent record's flags are required,
        // a multi-agent record's default to false; an entry's start_step is an integer).
        static JObject AsTheVectorsWrite(string kind, JObject batch)
        {
            var records = new JObject();
            bool multi = kind == "multi";
            foreach (JObject record in (JArray)batch["episodes"])
            {
                string id = (string)record["episode_id"];
                Vectors.Expect(records[id] == null, "two records of " + id + " in one batch");
                JObject mine = multi ? new JObject() : Steps(record);
                mine["is_terminated"] = Flag(record, "is_terminated", multi);
                mine["is_truncated"] = Flag(record, "is_truncated", multi);
                if (multi)
                {
                    var agents = new JObject();
                    foreach (JProperty agent in ((JObject)record["agents"]).Properties())
                    {
                        JObject entry = Steps(agent.Value);
                        Vectors.Expect(agent.Value["start_step"].Type == JTokenType.Integer, "start_step of " + agent.Value);
                        entry["start_step"] = agent.Value["start_step"].DeepClone();
                        entry["is_terminated"] = Flag(agent.Value, "is_terminated");
                        entry["is_truncated"] = Flag(agent.Value, "is_truncated");
                        agents[agent.Name] = entry;
                    }
                    mine["agents"] = agents;
                }
                records[id] = mine;
            }
            return records;
        }

        // Numbers compared as doubles (the vectors write 0, a client 0.0); objects by member, not order.
        static bool Same(JToken got, JToken want)
        {
            bool number = got.Type == JTokenType.Integer || got.Type == JTokenType.Float;
            if (number && (want.Type == JTokenType.Integer || want.Type == JTokenType.Float)) return (double)got == (double)want;
            if (got.Type != want.Type) return false;
            var gotObject = got as JObject;
            if (gotObject != null)
            {
                var wantObject = (JObject)want;
                return gotObject.Count == wantObject.Count &&
                       wantObject.Properties().All(p => gotObject[p.Name] != null && Same(gotObject[p.Name], p.Value));
            }
            var gotArray = got as JArray;
            if (gotArray != null)
            {
                var wantArray = (JArray)want;
                return gotArray.Count == wantArray.Count && gotArray.Zip(wantArray, Same).All(same => same);
            }
            return JToken.DeepEquals(got, want);
        }
    }
}
