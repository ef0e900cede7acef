// A scripted server on a loopback port for the client's tests: real sockets, real frames.
using System;
using System.Collections.Generic;
using System.IO;
using System.Net.Sockets;
using System.Threading;
using Newtonsoft.Json.Linq;
using Tether.Client;
using Tether.Protocol;

namespace Tether.Tests
{
    /// <summary>
    /// Answers the handshake with a CartPole-like SET_CONFIG and the C++ SDK's
    /// test model, acknowledges every batch with SET_STATE, and keeps every
    /// message it received. <see cref="RefuseSeq"/> refuses one batch_seq.
    /// <see cref="MultiAgent"/> makes a multi-agent one (<see cref="Plain"/> one without groups or critics): modules "solo" (obs 4,
    /// Discrete(2), a centralized critic over a_0 and a_1) and "lifter" (the
    /// group "pair" of m_0 and m_1, 2 values each; MultiDiscrete([2, 2])),
    /// mapped by rules or, without them, by answering MAP_AGENTS.
    /// <see cref="Seq"/> and <see cref="ModuleSeq"/> swap models; <see cref="RefusedStale"/>
    /// puts steps_refused_stale in the answers to batches, <see cref="RecordShare"/> record_share
    /// in every SET_STATE, <see cref="StepsPerBatch"/> steps_per_batch in the next ones.
    /// <see cref="Close"/> sends a connection-level ERROR (TRAINING_DONE with <see cref="Summary"/>,
    /// CLIENT_TIMEOUT...) on every open connection and closes them; <see cref="DoneOnSeq"/> and
    /// <see cref="DoneOnMapAgents"/> answer a batch or a MAP_AGENTS so; <see cref="DropMapAgents"/> loses MAP_AGENTS
    /// with their connection, <see cref="MapAgentsClosingError"/> answers them with a connection-level ERROR. <see cref="Connections"/>
    /// counts the connections accepted. <see cref="RunIdOf"/> names each connection's server run in
    /// its PONGs (protocol 1.8); <see cref="DropGate"/> holds a DropOnceSeq drop until it is set.
    /// <see cref="PongFields"/> adds fields to every PONG (protocol 1.9: a group's ranks, a redirect).
    /// </summary>
    internal sealed class ScriptedServer : LoopbackServer
    {
        readonly List<JObject> received = new List<JObject>();
        readonly Dictionary<JObject, byte[]> attachments = new Dictionary<JObject, byte[]>();  // (JObjects compare by reference)

        public readonly JObject Config;
        public long RefuseSeq = -1;
        public long DropSeq = -1;          // the batch whose arrival closes the connection unanswered, every time
        public long DropOnceSeq = -1;      // the batch whose first arrival closes the connection unanswered
        public long SlowSeq = -1;          // the batch answered only after SlowMilliseconds, the first time
        public int SlowMilliseconds;
        public string ModelFile;
        public long BadModelFromSeq = -1;  // batches from this seq on are answered with version 1, a model no runtime loads
        public string GroupModelFile;
        public bool MapsWithFunction;
        public volatile string AgentsModule = "solo";  // what MAP_AGENTS answers for a_* agents
        public long ModuleSeq;  // the version of every module's model (the per-module form); raise it to swap
        public long Seq;        // the version of the single-agent model; raise it to swap, lower it to play a restarted server
        // steps_refused_stale of the next batches' answers, one each (any JSON: what the client must ignore too).
        public readonly Queue<JToken> RefusedStale = new Queue<JToken>();
        public volatile string PongVersion = "1.3";  // null: a PONG without one, as a plain RLlink v1 server answers
        public volatile string PongVersionAfterDrop;  // when set, the PONG version from the DropOnceSeq drop on (another server answers the resend)
        // (1.8, §7.2) the run_id of the PONGs of connection n (counted from 0), as JSON text ("\"run-a\"", "7"); null
        // (the function or its answer): none.
        public volatile Func<int, string> RunIdOf;
        // (1.9, §7.2) fields every PONG carries besides these ("ranks", "redirect"); null: none.
        public volatile JObject PongFields;
        // The DropOnceSeq drop waits until this is set (at most 10 s) before it closes the connection: the test
        // decides what the client records meanwhile. Set by default.
        public readonly ManualResetEventSlim DropGate = new ManualResetEventSlim(true);
        // Module id -> its model (an onnx_file), for the per-module form of SET_STATE; null: "solo" and "lifter".
        public Dictionary<string, string> ModuleFiles;
        public volatile string RecordShare;  // record_share of every SET_STATE as JSON text ("0.25", "true"); null: none
        // steps_per_batch of the next SET_STATEs (the handshake's included), one each, as JSON text ("4", "true");
        // a null item, or none left: no member.
        public readonly Queue<string> StepsPerBatch = new Queue<string>();
        // (1.7, §19.2) the parameter set as JSON text: in a SET_STATE answering a request whose env_params_seq
        // is an integer other than the set's seq (any integer, for a set without an integer seq); null: none.
        public volatile string EnvParams;
        // (1.7, §19.2) a server that breaks the rule: the set goes in the answer to every state request, whether
        // or not it carries env_params_seq (what a client must ignore from a server whose PONG is older than 1.7).
        public volatile bool EnvParamsToEveryRequest;
        public long DoneOnSeq = -1;           // the batch whose arrival is answered by TRAINING_DONE, and the connection closed
        public volatile bool DoneOnMapAgents; // a MAP_AGENTS is answered by TRAINING_DONE, and the connection closed
        public int DropMapAgents;             // this many MAP_AGENTS (the next ones) close the connection unanswered
        public volatile JObject MapAgentsClosingError;  // a connection-level ERROR that answers every MAP_AGENTS, and closes
        // The summary of TRAINING_DONE (§6.6).
        public readonly JObject Summary = JObject.Parse("{\"reason\": \"stop_at_return\", \"env_steps\": 123456, \"agent_steps\": 123456, " +
                                                         "\"agent_steps_trained\": 120000, \"updates\": 30, \"episodes\": 987, \"weights_seq_no\": 30, " +
                                                         "\"return_mean\": 487.25, \"elapsed_s\": 61.5}");

        /// <summary>Every message received so far.</summary>
        public int ReceivedCount { get { lock (received) return received.Count; } }

        /// <summary>The unsolicited ERROR TRAINING_DONE with <see cref="Summary"/> (no "request": it answers nothing).</summary>
        public JObject TrainingDone()
        {
            return new JObject { { "type", "ERROR" }, { "code", "TRAINING_DONE" }, { "message", "training is done (stop_at_return)" }, { "summary", Summary.DeepClone() } };
        }

        public static string Repo { get { return Path.Combine(Path.GetDirectoryName(Vectors.Directory.TrimEnd('/')), ".."); } }

        public static byte[] TestModel { get { return File.ReadAllBytes(Path.Combine(Repo, "sdk_cpp/tests/data/policy_4x64x64x2.onnx")); } }

        public static byte[] GroupModel { get { return File.ReadAllBytes(Path.Combine(Repo, "sdk_csharp/Tests/data/policy_4x16x4.onnx")); } }

        /// <summary>The multi-agent server (see the class comment); <paramref name="rules"/> false: it maps with a function.</summary>
        public static ScriptedServer MultiAgent(int envStepsPerSample, bool rules)
        {
            ScriptedServer server = TwoModules(envStepsPerSample, new JObject { { "value_obs_agents", new JArray("a_0", "a_1") } });
            server.MapsWithFunction = !rules;
            JObject config = server.Config;
            config["groups"] = JObject.Parse("{\"pair\": {\"members\": [\"m_0\", \"m_1\"], \"reward\": \"mean\"}}");
            config["policy_mapping"] = rules ? JArray.Parse("[{\"pattern\": \"a_*\", \"module\": \"solo\"}, {\"agent_id\": \"pair\", \"module\": \"lifter\"}]") : (JToken)JValue.CreateNull();
            return server;
        }

        /// <summary>
        /// A multi-agent server without groups or critics: modules "solo" (obs 4, Discrete(2)) for
        /// the agents a_*, and "lifter" (obs 4, MultiDiscrete([2, 2])) for b_*, mapped by rules.
        /// </summary>
        public static ScriptedServer Plain(int envStepsPerSample)
        {
            ScriptedServer server = TwoModules(envStepsPerSample, null);
            server.Config["policy_mapping"] = JArray.Parse("[{\"pattern\": \"a_*\", \"module\": \"solo\"}, {\"pattern\": \"b_*\", \"module\": \"lifter\"}]");
            return server;
        }

        // A server of the modules "solo" (obs 4, Discrete(2), and the members of `soloExtra`) and "lifter"
        // (obs 4, MultiDiscrete([2, 2])), with their models.
        static ScriptedServer TwoModules(int envStepsPerSample, JObject soloExtra)
        {
            var server = new ScriptedServer(envStepsPerSample);
            server.GroupModelFile = OnnxCodec.Encode(GroupModel);
            JObject config = server.Config;
            config.Remove("observation_space");
            config.Remove("action_space");
            var names = new JObject { { "onnx_input_names", new JArray("onnx::Gemm_0") }, { "onnx_output_names", new JArray("action_dist_inputs") } };
            var solo = new JObject { { "observation_space", Space.Box(new long[] { 4 }, -10, 10).ToJson() }, { "action_space", Space.Discrete(2).ToJson() } };
            var lifter = new JObject { { "observation_space", Space.Box(new long[] { 4 }, -10, 10).ToJson() },
                                       { "action_space", JObject.Parse("{\"type\": \"MultiDiscrete\", \"nvec\": [2, 2]}") } };
            if (soloExtra != null) solo.Merge(soloExtra);
            solo.Merge(names);
            lifter.Merge(names);
            config["modules"] = new JObject { { "solo", solo }, { "lifter", lifter } };
            return server;
        }

        public ScriptedServer(int envStepsPerSample, bool forceOnPolicy = true)
        {
            Config = new JObject
            {
                { "type", "SET_CONFIG" }, { "env_steps_per_sample", envStepsPerSample }, { "force_on_policy", forceOnPolicy },
                { "protocol_version", "1.3" },
                { "observation_space", Space.Box(new long[] { 4 }, -10, 10).ToJson() },
                { "action_space", Space.Discrete(2).ToJson() },
                { "onnx_input_names", new JArray("onnx::Gemm_0") }, { "onnx_output_names", new JArray("action_dist_inputs") },
                { "train_batch_size", 1000000 }, { "max_staleness", 1 }, { "heartbeat_interval_s", 0 },
            };
            ModelFile = OnnxCodec.Encode(TestModel);
        }

        public List<JObject> Received(string type)
        {
            lock (received) return received.FindAll(m => (string)m["type"] == type);
        }

        /// <summary>
        /// The options a test's client connects with: this server's port, <paramref name="seed"/>, 5 s to
        /// reconnect, and a full queue that waits (the tests count every batch).
        /// </summary>
        public ClientOptions Options(ulong seed)
        {
            return new ClientOptions { Port = Port, Seed = seed, ReconnectTimeoutSeconds = 5, WhenQueueFull = QueueFullPolicy.Wait };
        }

        /// <summary>Checks a received single-agent batch as the server does (with the spaces of <see cref="Config"/>); returns its steps.</summary>
        public int Validate(JObject batch)
        {
            return EpisodeRecords.ValidateEpisodes(batch, Space.FromJson(Config["observation_space"]), Space.FromJson(Config["action_space"]), true, AttachmentOf(batch));
        }

        /// <summary>The binary attachment (§4.3) that came with a received message, or null.</summary>
        public byte[] AttachmentOf(JObject message)
        {
            byte[] attachment;
            lock (received) return attachments.TryGetValue(message, out attachment) ? attachment : null;
        }

        protected override bool Answer(Socket socket, int connection, Message decoded)
        {
            JObject message = decoded.Body;
            lock (received)
            {
                received.Add(message);
                if (decoded.Attachment != null) attachments[message] = decoded.Attachment;
            }
            switch ((string)message["type"])
            {
                case "PING":
                {
                    JObject pong = PongVersion == null ? new JObject { { "type", "PONG" } } : new JObject { { "type", "PONG" }, { "protocol_version", PongVersion } };
                    Func<int, string> runIdOf = RunIdOf;
                    string runId = runIdOf == null ? null : runIdOf(connection);
                    if (runId != null) pong["run_id"] = JToken.Parse(runId);
                    JObject fields = PongFields;
                    if (fields != null)
                    {
                        foreach (JProperty field in fields.Properties()) pong[field.Name] = field.Value.DeepClone();
                    }
                    Send(socket, pong);
                    break;
                }
                case "GET_CONFIG": Send(socket, Config); break;
                case "GET_STATE": Send(socket, State(message)); break;
                case "MAP_AGENTS":
                    if (DoneOnMapAgents)
                    {
                        Send(socket, TrainingDone());
                        return false;  // (closes the connection)
                    }
                    JObject closing = MapAgentsClosingError;
                    if (closing != null)
                    {
                        Send(socket, closing);
                        return false;
                    }
                    lock (received)
                    {
                        if (DropMapAgents > 0)
                        {
                            --DropMapAgents;
                            return false;  // (lost with the connection)
                        }
                    }
                    Send(socket, MapAgents(message));
                    break;
                case "EPISODES_AND_GET_STATE":
                    if (message["batch_seq"] != null && (long)message["batch_seq"] == DoneOnSeq)
                    {
                        Send(socket, TrainingDone());  // the batch stays unanswered
                        return false;
                    }
                    if (message["batch_seq"] != null && (long)message["batch_seq"] == DropSeq)
                    {
                        return false;  // (the batch is lost with the connection)
                    }
                    if (message["batch_seq"] != null && (long)message["batch_seq"] == DropOnceSeq)
                    {
                        DropOnceSeq = -1;  // once: the resend is answered
                        if (PongVersionAfterDrop != null) PongVersion = PongVersionAfterDrop;
                        DropGate.Wait(10000);
                        return false;
                    }
                    if (message["batch_seq"] != null && (long)message["batch_seq"] == RefuseSeq)
                    {
                        Send(socket, new JObject { { "type", "ERROR" }, { "code", "INVALID_FIELD" }, { "message", "episodes[0]: refused for the test" }, { "request", "EPISODES_AND_GET_STATE" } });
                    }
                    else
                    {
                        if (message["batch_seq"] != null && (long)message["batch_seq"] == SlowSeq)
                        {
                            SlowSeq = -1;  // once: a resend is answered at once
                            Thread.Sleep(SlowMilliseconds);
                        }
                        if (message["batch_seq"] != null && BadModelFromSeq >= 0 && (long)message["batch_seq"] >= BadModelFromSeq)
                        {
                            Send(socket, new JObject { { "type", "SET_STATE" }, { "weights_seq_no", 1 }, { "onnx_file", OnnxCodec.Encode(new byte[] { 1, 2, 3, 4, 5 }) } });
                        }
                        else
                        {
                            JObject answer = State(message);
                            lock (RefusedStale)
                            {
                                if (RefusedStale.Count > 0) answer["steps_refused_stale"] = RefusedStale.Dequeue();
                            }
                            Send(socket, answer);
                        }
                    }
                    break;
            }
            return true;
        }

        public override void Dispose()
        {
            DropGate.Set();
            base.Dispose();
        }

        JObject MapAgents(JObject request)
        {
            var modules = new JObject();
            foreach (JToken id in (JArray)request["agent_ids"])
            {
                string agent = (string)id;
                if (agent.StartsWith("a_", StringComparison.Ordinal)) modules[agent] = AgentsModule;
                else if (agent == "pair") modules[agent] = "lifter";
                else if (agent.StartsWith("ghost_", StringComparison.Ordinal)) modules[agent] = "ghost";  // (a module SET_CONFIG did not describe)
                else if (agent.StartsWith("left_out_", StringComparison.Ordinal)) continue;  // (an answer without it)
                else return new JObject { { "type", "ERROR" }, { "code", "UNMAPPED_AGENT" }, { "message", "no module for '" + agent + "'" }, { "request", "MAP_AGENTS" } };
            }
            return new JObject { { "type", "AGENT_MODULES" }, { "modules", modules } };
        }

        JObject State(JObject request)
        {
            JObject state = Weights(request);
            string share = RecordShare;
            if (share != null) state["record_share"] = JToken.Parse(share);
            string every = null;
            lock (StepsPerBatch)
            {
                if (StepsPerBatch.Count > 0) every = StepsPerBatch.Dequeue();
            }
            if (every != null) state["steps_per_batch"] = JToken.Parse(every);
            string set = EnvParams;
            JToken held = request["env_params_seq"];
            if (set != null && EnvParamsToEveryRequest && (held == null || held.Type != JTokenType.Integer))
            {
                state["env_params"] = JToken.Parse(set);
            }
            else if (set != null && held != null && held.Type == JTokenType.Integer)
            {
                JToken body = JToken.Parse(set);
                JToken seq = body is JObject ? body["seq"] : null;
                if (seq == null || seq.Type != JTokenType.Integer || (long)seq != (long)held) state["env_params"] = body;
            }
            return state;
        }

        JObject Weights(JObject request)
        {
            var claims = request["weights_seq_nos"] as JObject;
            if (claims != null)
            {
                // The per-module form: every module at version ModuleSeq; the ones not claimed at it are sent.
                var models = new JObject();
                long version = ModuleSeq;
                Dictionary<string, string> files = ModuleFiles ?? new Dictionary<string, string> { { "solo", ModelFile }, { "lifter", GroupModelFile } };
                foreach (KeyValuePair<string, string> module in files)
                {
                    JToken claim = claims[module.Key];
                    if (claim != null && claim.Type == JTokenType.Integer && (long)claim == version) continue;
                    models[module.Key] = new JObject { { "weights_seq_no", version }, { "onnx_file", module.Value } };
                }
                return new JObject { { "type", "SET_STATE" }, { "models", models } };
            }
            long seq = Seq;
            var state = new JObject { { "type", "SET_STATE" }, { "weights_seq_no", seq } };
            if (request["weights_seq_no"] == null || (long)request["weights_seq_no"] != seq) state["onnx_file"] = ModelFile;
            return state;
        }
    }
}
