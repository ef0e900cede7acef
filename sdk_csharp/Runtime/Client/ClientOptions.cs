// What a client needs to know to reach and use a Tether server.
using System;
using Tether.Inference;
using Tether.Protocol;

namespace Tether.Client
{
    /// <summary>What GetAction does when the batches waiting to be sent would exceed their bound.</summary>
    public enum QueueFullPolicy
    {
        /// <summary>Drop the oldest waiting batch (and the rest of its episodes): the game never waits.</summary>
        DropOldest,
        /// <summary>Wait for room (backpressure): every step is delivered, at the server's pace.</summary>
        Wait,
    }

    /// <summary>Settings of a <see cref="TetherClient"/>; the defaults suit a local server.</summary>
    public sealed class ClientOptions
    {
        /// <summary>
        /// The server's host name or address. (Protocol 1.9, §6.7: when that server is one rank of a group, the
        /// client may be redirected to, or reconnect to, the other ranks its PONGs name;
        /// <see cref="ClientBase.ConnectedAddress"/> says which it reached.)
        /// </summary>
        public string Host = "127.0.0.1";
        /// <summary>The server's port.</summary>
        public int Port = 5555;
        /// <summary>Sent in PING so the server's logs name this client.</summary>
        public string ClientName = "tether-csharp";
        /// <summary>The server's auth token, or null when it needs none.</summary>
        public string AuthToken;
        /// <summary>Seconds to keep retrying a lost (or never made) connection before giving up with CONNECTION_FAILED.</summary>
        public double ReconnectTimeoutSeconds = 60;
        /// <summary>Seconds one TCP connect attempt may take.</summary>
        public double ConnectTimeoutSeconds = 10;
        /// <summary>Seconds an answer may take (PONG, SET_CONFIG, SET_STATE for GET_STATE).</summary>
        public double ResponseTimeoutSeconds = 60;
        /// <summary>Seconds the answer to a batch may take (it may wait for a learner update).</summary>
        public double UpdateTimeoutSeconds = 600;
        /// <summary>Seed of the action sampler; null: from the clock.</summary>
        public ulong? Seed;
        /// <summary>Wait for the weights that answer each batch (strict on-policy); null: only with a plain RLlink v1 server.</summary>
        public bool? WaitForWeights;
        /// <summary>A hard cap on batches waiting behind the one in flight.</summary>
        public int MaxQueuedBatches = 64;
        /// <summary>Steps that may wait behind the batch in flight; 0: (max_staleness + 1) x train_batch_size from SET_CONFIG, or 2 x env_steps_per_sample.</summary>
        public int MaxQueuedSteps;
        /// <summary>What happens when a batch would exceed those bounds.</summary>
        public QueueFullPolicy WhenQueueFull = QueueFullPolicy.DropOldest;
        /// <summary>Connections a batch is sent on before it is given up (each lost before its answer).</summary>
        public int MaxBatchAttempts = 5;
        /// <summary>Events kept for a game that does not read them; beyond it the oldest error goes first.</summary>
        public int MaxQueuedEvents = 1024;
        /// <summary>The largest frame accepted from the server.</summary>
        public int MaxFrameBytes = Protocol.Framing.DefaultMaxFrameBytes;
        /// <summary>Makes the inference backend for each model the server sends (on the I/O thread); ONNX Runtime by default.</summary>
        public Func<IInferenceBackend> BackendFactory = () => new OnnxRuntimeBackend();
        /// <summary>The observation space, used only when the server's SET_CONFIG has none (a plain RLlink v1 server such as RLlib's).</summary>
        public Space ObservationSpace;
        /// <summary>The action space, used only when the server's SET_CONFIG has none (a plain RLlink v1 server such as RLlib's).</summary>
        public Space ActionSpace;

        /// <summary>
        /// Protocol 1.6 (§18): the path of a demonstration file the client writes while it plays, or null (the
        /// default) for none. Created (or overwritten) when the client connects, its header naming the
        /// server's spaces (a TetherClient's module "default_policy", agent "default_agent"; a
        /// MultiAgentClient's modules, its agents and groups by id); then one line per actor episode as it
        /// ends, with every step the client played in it — GetAction's and LogAction's, recorded for training
        /// or not — and flushed. Dispose writes the episodes still running as truncated. A server trains from
        /// such a file (behavioural cloning, docs/demonstrations.md).
        /// </summary>
        public string DemoPath;

        /// <summary>
        /// When set, the path of an offline policy file (a server's <c>offline_policy.json</c>, docs/protocol.md §20):
        /// the client reaches no server and acts with the file's configuration and models (spaces, mapping rules,
        /// groups, recurrent state, environment parameters), as if a server had sent them. Nothing is recorded for
        /// training or sent; a demonstration file (<see cref="DemoPath"/>) is still written, which is how a game
        /// records episodes acted by a trained policy with no server. Host, Port and the connection options are
        /// unused; a MAP_AGENTS the file's rules cannot spare is NOT_READY. Opening the client throws what is
        /// wrong with the file (INVALID_JSON, INVALID_FIELD, INVALID_ARGUMENT when it cannot be read), naming it.
        /// Null: off.
        /// </summary>
        public string OfflinePolicy;

        /// <summary>"host:port".</summary>
        public string Address { get { return Host + ":" + Port; } }
    }
}
