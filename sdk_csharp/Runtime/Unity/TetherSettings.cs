// The settings asset: where the server is and how the scene's agents talk to it.
#if UNITY_5_3_OR_NEWER
using System;
using Tether.Client;
using Tether.Inference;
using UnityEngine;

namespace Tether.Unity
{
    /// <summary>Which runtime runs the policy models in the game.</summary>
    public enum InferenceBackendKind
    {
        /// <summary>ONNX Runtime's native library (a native plugin the project ships), by P/Invoke.</summary>
        OnnxRuntime,
        /// <summary>Unity's Inference Engine (com.unity.ai.inference): no native plugin.</summary>
        InferenceEngine,
        /// <summary>The SDK's own C# runner of MLP policies (<see cref="ManagedPolicyBackend"/>): no plugin, no package, every platform; slow for many agents.</summary>
        Managed,
    }

    /// <summary>
    /// A project asset (Create > Tether > Settings) that a <see cref="TetherManager"/>
    /// reads: the server's address and token, timeouts, the send queue and the
    /// inference backend. Every field maps to one <see cref="ClientOptions"/> field.
    /// </summary>
    [CreateAssetMenu(fileName = "TetherSettings", menuName = "Tether/Settings")]
    public sealed class TetherSettings : ScriptableObject
    {
        /// <summary>The training server's host name or address.</summary>
        public string host = "127.0.0.1";
        /// <summary>The training server's port (tether serve --port).</summary>
        public int port = 5555;
        /// <summary>The server's auth token (tether serve --auth-token), or empty.</summary>
        public string authToken = "";
        /// <summary>The name the server shows for this game.</summary>
        public string clientName = "tether-unity";
        /// <summary>Keep retrying a lost connection this long before giving up for good.</summary>
        public float reconnectTimeoutSeconds = 60f;
        /// <summary>Limit of one TCP connect attempt.</summary>
        public float connectTimeoutSeconds = 10f;
        /// <summary>Limit of a handshake answer or a MAP_AGENTS answer.</summary>
        public float responseTimeoutSeconds = 60f;
        /// <summary>When the server is slower than the game: drop the oldest batches (the game never waits) or wait for room.</summary>
        public QueueFullPolicy whenQueueFull = QueueFullPolicy.DropOldest;
        /// <summary>Seed of the action sampler; 0 picks one at random.</summary>
        public long seed;
        /// <summary>The inference runtime.</summary>
        public InferenceBackendKind backend = InferenceBackendKind.InferenceEngine;
        /// <summary>Sends experience to the server; off, the agents only act (evaluation, or a build without training).</summary>
        public bool training = true;
        /// <summary>
        /// A demonstration file (protocol 1.6, §18) the game writes while it plays: every agent's episode, one
        /// line each as it ends; empty: none. A server trains from it (docs/demonstrations.md).
        /// </summary>
        public string demoPath = "";
        /// <summary>
        /// An offline policy file (a server's <c>offline_policy.json</c>, docs/protocol.md §20): the scene's agents act
        /// with its policy and no server is reached; nothing is sent (the demonstration file is still written). A
        /// relative path is under StreamingAssets, so a desktop or console build can ship it (on Android and WebGL
        /// StreamingAssets is no folder: give an absolute path, e.g. under Application.persistentDataPath).
        /// Empty: connect to the server.
        /// </summary>
        public string offlinePolicyPath = "";

        /// <summary>The client options these settings describe; <paramref name="makeBackend"/> makes the backend for each model.</summary>
        public ClientOptions ToClientOptions(Func<IInferenceBackend> makeBackend)
        {
            return new ClientOptions
            {
                Host = host,
                Port = port,
                AuthToken = string.IsNullOrEmpty(authToken) ? null : authToken,
                ClientName = clientName,
                ReconnectTimeoutSeconds = reconnectTimeoutSeconds,
                ConnectTimeoutSeconds = connectTimeoutSeconds,
                ResponseTimeoutSeconds = responseTimeoutSeconds,
                WhenQueueFull = whenQueueFull,
                Seed = seed == 0 ? (ulong?)null : (ulong)seed,
                BackendFactory = makeBackend,
                DemoPath = string.IsNullOrEmpty(demoPath) ? null : demoPath,
                OfflinePolicy = string.IsNullOrEmpty(offlinePolicyPath) ? null
                    : System.IO.Path.IsPathRooted(offlinePolicyPath) ? offlinePolicyPath
                    : System.IO.Path.Combine(Application.streamingAssetsPath, offlinePolicyPath),
            };
        }
    }
}
#endif
