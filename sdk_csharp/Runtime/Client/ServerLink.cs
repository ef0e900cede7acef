// The I/O thread: one connection kept up (handshake, heartbeats, reconnect with
// backoff; 1.9: redirects followed and reconnects spread over a group's ranks),
// batches sent exactly once in order, models decoded and loaded; the game's
// thread only enqueues batches and takes events.
using System;
using System.Collections.Generic;
using System.Threading;
using Newtonsoft.Json.Linq;
using Tether.Inference;
using Tether.Protocol;
using Tether.Sampling;

namespace Tether.Client
{
    /// <summary>One agent's (or group's) steps in a multi-agent record (§10.7).</summary>
    internal sealed class AgentEntry
    {
        public string AgentId;
        public ModuleSpec Module;
        public long StartStep;
        public StepTable Table;      // where its steps are: the rows the batch's RowIndex[First...] names
        public int First;            // Steps + 1 rows (the observation after the last action closes it)
        public int Steps;
        public bool IsTerminated;
        public bool IsTruncated;
        public bool WithVersions;    // the steps' versions go as weights_seq_no_runs (§10.1)
        public bool WithLogged;      // protocol 1.6: some step was logged, written as logged_runs (§10.1)

        public void Clear()
        {
            AgentId = null;
            Module = null;
            StartStep = 0;
            Table = null;
            First = Steps = 0;
            IsTerminated = IsTruncated = WithVersions = WithLogged = false;
        }
    }

    /// <summary>One chunk of one multi-agent episode (§10.7).</summary>
    internal sealed class MultiAgentRecord
    {
        public string EpisodeId;
        public bool IsTerminated;
        public bool IsTruncated;
        public readonly List<AgentEntry> Agents = new List<AgentEntry>();
        public EpisodeEnvParams EnvParams;  // protocol 1.7: the values its episode plays with (§19.3), or null
        public double? Measure;             // the episode's measure, on the record that ends it when one was reported

        public int AgentSteps
        {
            get
            {
                int steps = 0;
                foreach (AgentEntry entry in Agents) steps += entry.Steps;
                return steps;
            }
        }
    }

    /// <summary>Steps cut on the game's thread and handed to the I/O thread, which encodes and sends them.</summary>
    internal sealed class Batch
    {
        public readonly List<EpisodeChunk> Chunks = new List<EpisodeChunk>();          // single-agent
        public readonly List<MultiAgentRecord> Records = new List<MultiAgentRecord>();  // multi-agent
        public readonly Dictionary<string, long> ModuleClaims = new Dictionary<string, long>();  // multi-agent: per module (§7.6)
        public int AgentSteps;       // multi-agent: agent steps (what the queue counts)
        public int EnvSteps;
        public long? Claim;          // weights_seq_no the steps claim (§7.6), sent unchanged on every attempt
        public int VersionsConnection;  // the connection the chunks' StepVersions were learned on (the game's when it cut them)
        public bool SendEmpty;       // sent even with no records (held-back episodes made it due): its answer brings weights and record_share
        public long Seq;             // batch_seq, given when first sent
        public int Attempts;         // connections it was sent on
        public volatile bool Done;   // answered (or given up)
        public TetherException Error;
        public bool OtherRun;        // (1.8) not sent: its steps were acted with another server run's weights (§6.5)
        public readonly List<string> EpisodeIds = new List<string>();
        public Space ObsSpace, ActSpace;  // single-agent: the spaces its records are written with (those of its first connection)
        public int[] RowIndex = new int[0];  // multi-agent: the entries' rows in their step tables
        public int RowIndexCount;
        public readonly List<StepTable> Tables = new List<StepTable>();  // multi-agent: the step tables its entries read

        /// <summary>Whether it holds no records.</summary>
        public bool IsEmpty { get { return Chunks.Count == 0 && Records.Count == 0; } }

        /// <summary>The steps the send queue counts: agent steps of multi-agent records, else env steps.</summary>
        public int QueueSteps { get { return Records.Count > 0 ? AgentSteps : EnvSteps; } }

        public void Reset()
        {
            Chunks.Clear();
            Records.Clear();
            ModuleClaims.Clear();
            AgentSteps = 0;
            EnvSteps = 0;
            Claim = null;
            VersionsConnection = 0;
            SendEmpty = false;
            Seq = 0;
            Attempts = 0;
            Done = false;
            Error = null;
            OtherRun = false;
            EpisodeIds.Clear();
            ObsSpace = ActSpace = null;
            RowIndexCount = 0;
            Tables.Clear();
        }
    }

    /// <summary>A model the I/O thread loaded, with its version.</summary>
    internal sealed class PreparedState
    {
        public long? Seq;
        public IInferenceBackend Backend;  // null: the server sent no new model
        // Multi-agent (the per-module form of SET_STATE): the modules whose model came, with their versions.
        public Dictionary<string, IInferenceBackend> ModuleBackends;
        public Dictionary<string, long> ModuleSeqs;
        // Protocol 1.7: the parameter set the answer carried (§19.2), swapped in on the game's thread with the model.
        public EnvParams EnvParams;
        // Protocol 1.7: the answer says the server has no parameters (§19.2: asked with env_params_seq 0, it sent
        // none): the game's thread drops the set it holds.
        public bool DropEnvParams;

        public bool IsEmpty
        {
            get { return Backend == null && !Seq.HasValue && (ModuleSeqs == null || ModuleSeqs.Count == 0) && EnvParams == null && !DropEnvParams; }
        }

        public void Dispose()
        {
            if (Backend != null) Backend.Dispose();
            if (ModuleBackends != null)
            {
                foreach (IInferenceBackend backend in ModuleBackends.Values) backend.Dispose();
            }
        }
    }

    /// <summary>A request the game's thread waits for (MAP_AGENTS), sent by the I/O thread between batches.</summary>
    internal sealed class LinkRequest
    {
        public JObject Message;
        public JObject Answer;
        public TetherException Error;
        public bool Done;
    }

    internal enum LinkEventKind { Connected, State, Batch, Error, Fatal, TrainingDone }

    internal sealed class LinkEvent
    {
        public LinkEventKind Kind;
        public JObject Info;
        public JObject Config;
        public PreparedState State;
        public int Connection;  // the connection it came on (counted from 1)
        public Batch Batch;
        public TetherException Error;
    }

    /// <summary>The connection's I/O thread. Thread-safe where it says so; everything else runs on the I/O thread.</summary>
    internal sealed class ServerLink : IDisposable
    {
        const int MaxRefusedEpisodes = 4096;
        /// <summary>The SDK's name and version, sent in the handshake PING (§7.1).</summary>
        internal const string SdkName = "tether-csharp/0.1.0";

        readonly ClientOptions options;
        readonly TcpTransport transport;
        readonly object sync = new object();
        readonly Queue<Batch> outbox = new Queue<Batch>();
        readonly LinkedList<LinkEvent> events = new LinkedList<LinkEvent>();
        readonly HashSet<string> refused = new HashSet<string>();
        readonly Queue<string> refusedOrder = new Queue<string>();
        readonly Queue<IInferenceBackend> retired = new Queue<IInferenceBackend>();
        readonly Queue<LinkRequest> requests = new Queue<LinkRequest>();
        readonly bool multiAgent;
        readonly RecordWriter writer = new RecordWriter();  // I/O thread
        byte[] frame;  // I/O thread: a batch's message, framed (reused)
        JObject limitConfig;  // under sync: the configuration configLimit was read from
        bool limitRead;
        int configLimit;
        readonly Dictionary<string, long> moduleSeqs = new Dictionary<string, long>();  // I/O thread: versions held
        readonly AutoResetEvent wake = new AutoResetEvent(false);
        readonly ManualResetEvent connectedOnce = new ManualResetEvent(false);
        readonly Thread thread;
        volatile bool closing;
        volatile bool offline;  // (§20) started from an offline policy file: no I/O thread, nothing sent
        volatile bool eventsPending;
        Batch inFlight;
        int queuedSteps;
        long nextSeq = 1;
        DateTime lastSend = DateTime.UtcNow;
        long lastSeq = -1;
        int connection;  // handshakes completed: the connection in use now
        JObject config;
        Space recordObsSpace, recordActSpace;  // single-agent: the spaces records are written with (read once per connection)
        JObject info;
        Exception fatal;
        long stepsRefusedStale;  // written on the I/O thread, under sync
        long recordShareBits = BitConverter.DoubleToInt64Bits(1.0);  // a double's bits: read on the game's thread without a lock or an allocation
        volatile int stepsPerBatch = Tether.Protocol.StepsPerBatch.None;  // written on the I/O thread, read on the game's
        volatile TrainingSummary trainingDone;  // set once, under sync, by the I/O thread as it ends
        // Under sync: the request sent on a connection that ended before its answer. It goes first on the next
        // connection (§6.5, as Python's and C++'s links do), or fails at the end of training.
        LinkRequest unanswered;
        int batchesUnsentAtEnd;  // under sync
        long loggedStepsDropped;  // under sync
        readonly List<string> runIds = new List<string>();  // (1.8) under sync: the run each connection's PONG named (null: none), connection 1 first
        long otherRunStepsDropped;  // (1.8) under sync
        long envParamsSeq;  // I/O thread (1.7, §19.2): the seq of the last set this connection was sent, 0 if none
        bool envParamsDropped;  // I/O thread (1.7, §19.2): this connection told the game's thread to drop its set (and sent none since)
        int envParamsIgnored;  // written on the I/O thread (Interlocked): sets that broke §19.1
        readonly RankAddress given;  // (1.9, §6.7) the address the application gave
        List<RankAddress> ranks = new List<RankAddress>();  // (1.9) I/O thread: the ranks of the latest PONG that named any
        bool redirected;  // (1.9) I/O thread: the connection being made follows a redirect (its PING says so)
        int redirects;  // (1.9) written on the I/O thread (Interlocked)
        volatile string connectedAddress;  // (1.9) the address of the last connection made

        /// <summary>One per client object, kept across reconnects (exactly-once batches, §13.5).</summary>
        public readonly string ClientSession = Guid.NewGuid().ToString("N");

        public int Reconnects { get; private set; }
        public int BatchesDropped { get; private set; }
        public int HeartbeatsSent { get; private set; }

        /// <summary>Agent steps the server refused as too stale to be trained (SET_STATE steps_refused_stale, §13.2), all connections together.</summary>
        public long StepsRefusedStale { get { lock (sync) return stepsRefusedStale; } }  // (a long is not read atomically everywhere)

        /// <summary>The share of new training episodes to record (SET_STATE record_share, §13.2): the last valid one received, 1 until one came.</summary>
        public double RecordShare { get { return BitConverter.Int64BitsToDouble(Interlocked.Read(ref recordShareBits)); } }

        /// <summary>
        /// The steps per batch the server asked for (SET_STATE steps_per_batch, §13.2): the last valid one
        /// received, StepsPerBatch.None (env_steps_per_sample) until one came and whenever a SET_STATE came without one.
        /// </summary>
        public int StepsPerBatch { get { return stepsPerBatch; } }

        /// <summary>
        /// Null while training goes on; once the server said its run is done (ERROR TRAINING_DONE,
        /// §6.6), the summary it sent. The I/O thread has then ended: nothing is sent or reconnected.
        /// </summary>
        public TrainingSummary TrainingDone { get { return trainingDone; } }

        /// <summary>Batches discarded because training was done before they were sent or answered (§6.6).</summary>
        public int BatchesUnsentAtEnd { get { lock (sync) return batchesUnsentAtEnd; } }

        /// <summary>
        /// Steps of records (agent entries) holding logged steps that were let go because the server they were
        /// to be sent to is older than protocol 1.6 (§15): it would train on them as its policy's samples.
        /// </summary>
        public long LoggedStepsDropped { get { lock (sync) return loggedStepsDropped; } }

        /// <summary>
        /// Agent steps of batches not sent because they were acted with the weights of another server run than
        /// the connection's (protocol 1.8, §6.5): cut under a connection whose PONG named another run_id.
        /// </summary>
        public long OtherRunStepsDropped { get { lock (sync) return otherRunStepsDropped; } }

        /// <summary>Connections made (handshakes completed); the game's thread has their Connected events once it sees them counted.</summary>
        public int Connections { get { lock (sync) return runIds.Count; } }

        /// <summary>Parameter sets (SET_STATE env_params, protocol 1.7, §19.2) that broke §19.1's rules and were ignored.</summary>
        public int EnvParamsIgnored { get { return Volatile.Read(ref envParamsIgnored); } }

        /// <summary>
        /// Redirects followed (protocol 1.9, §6.7): connections made because a PONG asked this client to move to
        /// another rank of the server's group, and completed there. Neither reconnects nor connections lost.
        /// </summary>
        public int Redirects { get { return Volatile.Read(ref redirects); } }

        /// <summary>
        /// "host:port" (an IPv6 host in brackets) of the server the connection in use was made to (protocol 1.9,
        /// §6.7: a rank of a group, after a redirect or a reconnect to another rank, may differ from the options'
        /// address); while the link reconnects, that of the last connection made; null before the first.
        /// </summary>
        public string ConnectedAddress { get { return connectedAddress; } }

        /// <summary>Counts steps the game recorded but had not cut into a batch when training ended, as one batch discarded.</summary>
        public void CountUnsentAtEnd()
        {
            lock (sync) ++batchesUnsentAtEnd;
        }

        public ServerLink(ClientOptions options, bool multiAgent = false)
        {
            this.options = options;
            this.multiAgent = multiAgent;
            transport = new TcpTransport(options);
            given = transport.Target;
            thread = new Thread(Run) { IsBackground = true, Name = "tether-link-" + options.Address };
        }

        // ---- the game's thread -------------------------------------------------------------

        /// <summary>Starts the I/O thread and waits for the first connection; throws what ended the first attempt.</summary>
        public void Start()
        {
            if (!string.IsNullOrEmpty(options.OfflinePolicy))
            {
                StartOffline();
                return;
            }
            thread.Start();
            connectedOnce.WaitOne();
            if (fatal != null) throw fatal as TetherException ?? new TetherException(ErrorCode.ConnectionFailed, fatal.Message, fatal);
        }

        /// <summary>Whether events wait to be taken (a cheap check for every call).</summary>
        public bool EventsPending { get { return eventsPending; } }

        /// <summary>Whether a batch is queued or in flight.</summary>
        public bool Busy { get { lock (sync) return inFlight != null || outbox.Count > 0; } }

        /// <summary>Moves the reported events into <paramref name="output"/>, in order; a fatal event stays (every later call sees it).</summary>
        public void TakeEvents(List<LinkEvent> output)
        {
            lock (sync)
            {
                while (events.Count > 0)
                {
                    LinkEvent e = events.First.Value;
                    output.Add(e);
                    if (e.Kind == LinkEventKind.Fatal) break;
                    events.RemoveFirst();
                    if (e.Kind == LinkEventKind.Batch && e.Batch.Error != null)
                    {
                        // The game now hears of the refusal and stops recording those episodes:
                        // an id it uses again is a new episode.
                        foreach (string id in e.Batch.EpisodeIds) refused.Remove(id);
                    }
                }
                eventsPending = events.Count > 0;
            }
        }

        /// <summary>
        /// Queues a batch. When the waiting batches would exceed their bounds
        /// (MaxQueuedBatches, MaxQueuedSteps) it waits for room (QueueFullPolicy.Wait)
        /// or drops the oldest waiting batches and the rest of their episodes;
        /// fills <paramref name="gone"/> with the ids of the episodes dropped, which
        /// the client stops recording. Returns whether the batch was queued (false:
        /// refusals emptied it, and it is the caller's again). The batches dropped from
        /// the queue go to <paramref name="droppedBatches"/> when given: they are the caller's again.
        /// </summary>
        public bool Submit(Batch batch, HashSet<string> gone, List<Batch> droppedBatches = null)
        {
            gone.Clear();
            if (offline) return false;  // (§20) nobody to send to: an offline client records nothing to send
            lock (sync)
            {
                if (trainingDone != null) return DiscardAtEnd();
                DropEpisodes(batch, refused);  // (and their steps from the batch's counts)
                if (batch.IsEmpty && !batch.SendEmpty) return false;
                int limit = QueueLimitSteps();
                while (outbox.Count > 0 && (outbox.Count >= options.MaxQueuedBatches || queuedSteps + batch.QueueSteps > limit) && fatal == null &&
                       trainingDone == null)
                {
                    if (options.WhenQueueFull == QueueFullPolicy.Wait)
                    {
                        Monitor.Wait(sync, 100);
                        continue;
                    }
                    Batch dropped = outbox.Dequeue();
                    queuedSteps -= dropped.QueueSteps;
                    ++BatchesDropped;
                    if (droppedBatches != null) droppedBatches.Add(dropped);
                    foreach (EpisodeChunk chunk in dropped.Chunks)
                    {
                        if (chunk.EpisodeId != null) gone.Add(chunk.EpisodeId);
                    }
                    foreach (MultiAgentRecord record in dropped.Records)
                    {
                        if (record.EpisodeId != null) gone.Add(record.EpisodeId);
                    }
                }
                if (gone.Count > 0)
                {
                    // The server never sees a fragment of an episode as if it were whole.
                    foreach (Batch waiting in outbox) queuedSteps -= DropEpisodes(waiting, gone);
                    DropEpisodes(batch, gone);
                }
                // Training ended while it waited for room: nobody takes it any more (§6.6).
                if (trainingDone != null) return DiscardAtEnd();
                // Again after waiting for room: a refusal that came meanwhile takes its episodes out of this batch too.
                DropEpisodes(batch, refused);
                if (batch.IsEmpty && !batch.SendEmpty) return false;
                outbox.Enqueue(batch);
                queuedSteps += batch.QueueSteps;
            }
            wake.Set();
            return true;
        }

        // A batch cut after training ended (§6.6): counted, never queued; it is the caller's again.
        bool DiscardAtEnd()
        {
            ++batchesUnsentAtEnd;
            return false;
        }

        // Without a delegate: Submit runs on the game's thread, which must not allocate.
        static void RemoveChunksOf(Batch batch, HashSet<string> episodes)
        {
            if (episodes.Count == 0) return;
            List<EpisodeChunk> chunks = batch.Chunks;
            int kept = 0;
            for (int i = 0; i < chunks.Count; ++i)
            {
                EpisodeChunk chunk = chunks[i];
                if (chunk.EpisodeId != null && episodes.Contains(chunk.EpisodeId)) continue;
                chunks[kept++] = chunk;
            }
            chunks.RemoveRange(kept, chunks.Count - kept);
            List<MultiAgentRecord> records = batch.Records;
            kept = 0;
            for (int i = 0; i < records.Count; ++i)
            {
                MultiAgentRecord record = records[i];
                if (record.EpisodeId != null && episodes.Contains(record.EpisodeId)) continue;
                records[kept++] = record;
            }
            records.RemoveRange(kept, records.Count - kept);
        }

        static int DropEpisodes(Batch batch, HashSet<string> gone)
        {
            int removed = 0;
            foreach (EpisodeChunk chunk in batch.Chunks)
            {
                if (chunk.EpisodeId != null && gone.Contains(chunk.EpisodeId)) removed += chunk.Steps;
            }
            foreach (MultiAgentRecord record in batch.Records)
            {
                if (record.EpisodeId != null && gone.Contains(record.EpisodeId)) removed += record.AgentSteps;
            }
            RemoveChunksOf(batch, gone);
            if (batch.Records.Count > 0 || batch.AgentSteps > 0) batch.AgentSteps -= removed;
            else batch.EnvSteps -= removed;
            return removed;
        }

        int QueueLimitSteps()
        {
            if (options.MaxQueuedSteps > 0) return options.MaxQueuedSteps;
            if (limitRead && config == limitConfig) return configLimit;  // (read once per configuration: Submit runs on the game's thread)
            limitRead = true;
            limitConfig = config;
            configLimit = ConfigQueueLimit();
            return configLimit;
        }

        int ConfigQueueLimit()
        {
            long batchSize = Messages.IntegerOr(config == null ? null : config["train_batch_size"], -1, -1, int.MaxValue);
            long staleness = Messages.IntegerOr(config == null ? null : config["max_staleness"], -1, -1, int.MaxValue);
            if (batchSize > 0 && staleness >= 0) return (int)Math.Min(int.MaxValue, (staleness + 1) * batchSize);
            long perSample = Messages.IntegerOr(config == null ? null : config["env_steps_per_sample"], 500, 1, int.MaxValue / 2);
            return (int)(2 * perSample);
        }

        /// <summary>Waits until nothing is queued or in flight, or <paramref name="seconds"/> pass; whether it got there.</summary>
        public bool WaitIdle(double seconds)
        {
            DateTime deadline = DateTime.UtcNow.AddSeconds(seconds);
            lock (sync)
            {
                while ((inFlight != null || outbox.Count > 0) && fatal == null)
                {
                    TimeSpan left = deadline - DateTime.UtcNow;
                    if (left <= TimeSpan.Zero) return false;
                    Monitor.Wait(sync, left);
                }
                return true;
            }
        }

        /// <summary>
        /// Waits until <paramref name="batch"/> is answered, or <paramref name="seconds"/> pass; true
        /// also once training is done (the batch was discarded: nothing will answer it, §6.6).
        /// </summary>
        public bool WaitFor(Batch batch, double seconds)
        {
            DateTime deadline = DateTime.UtcNow.AddSeconds(seconds);
            lock (sync)
            {
                while (!batch.Done && fatal == null && trainingDone == null)
                {
                    TimeSpan left = deadline - DateTime.UtcNow;
                    if (left <= TimeSpan.Zero) return false;
                    Monitor.Wait(sync, left);
                }
                return batch.Done || trainingDone != null;
            }
        }

        /// <summary>
        /// Sends <paramref name="message"/> (MAP_AGENTS) through the I/O thread,
        /// between batches, and waits for its answer: TIMEOUT after
        /// <paramref name="seconds"/>, the server's ERROR as ServerErrorException,
        /// TRAINING_DONE once the server's run is done (§6.6: nothing answers it any more).
        /// A request whose connection is lost before its answer is sent again, unchanged,
        /// on the next connection (§6.5); the link's fatal error once it gives up.
        /// </summary>
        public JObject Request(JObject message, double seconds)
        {
            if (offline)
            {
                // (§20) MAP_AGENTS (the one request a client makes) has nobody to answer it.
                throw new TetherException(ErrorCode.NotReady, (string)message["type"] + ": an offline client has no server to ask (offline policy '" +
                                          options.OfflinePolicy + "', whose SET_CONFIG names no policy_mapping rules for this)");
            }
            var request = new LinkRequest { Message = message };
            DateTime deadline = DateTime.UtcNow.AddSeconds(seconds);
            lock (sync)
            {
                if (fatal != null) throw fatal as TetherException ?? new TetherException(ErrorCode.ConnectionFailed, fatal.Message);
                if (trainingDone != null) throw TrainingDoneError((string)message["type"]);
                requests.Enqueue(request);
            }
            wake.Set();
            lock (sync)
            {
                while (!request.Done && fatal == null && !closing)
                {
                    TimeSpan left = deadline - DateTime.UtcNow;
                    if (left <= TimeSpan.Zero)
                    {
                        request.Done = true;  // abandoned: the I/O thread skips it
                        throw new TetherException(ErrorCode.Timeout, "server " + options.Address + " did not answer " + (string)message["type"] +
                                                  " within " + seconds + " s (ResponseTimeoutSeconds)");
                    }
                    Monitor.Wait(sync, left);
                }
                if (request.Error != null) throw request.Error;
                if (request.Answer == null && fatal == null) throw new TetherException(ErrorCode.Closed, "client closed");
                if (request.Answer == null) throw fatal as TetherException ?? new TetherException(ErrorCode.ConnectionFailed, "the link to " + options.Address + " ended");
                return request.Answer;
            }
        }

        TetherException TrainingDoneError(string request)
        {
            return new TetherException(ErrorCode.TrainingDone, request + " cannot be answered: the server at " + options.Address +
                                       " ended its run (training is done) and answers nothing more");
        }

        /// <summary>Hands a replaced backend to the I/O thread to release (the game never pays for it).</summary>
        public void Retire(IInferenceBackend backend)
        {
            if (backend == null) return;
            if (offline)
            {
                backend.Dispose();  // (no I/O thread to hand it to)
                return;
            }
            lock (sync) retired.Enqueue(backend);
            wake.Set();
        }

        public void Dispose()
        {
            closing = true;
            lock (sync) Monitor.PulseAll(sync);  // (a request's waiter gives up: CLOSED)
            wake.Set();
            transport.Dispose();  // (a connect in progress is abandoned, so the join is short)
            if (thread.IsAlive && !thread.Join(TimeSpan.FromSeconds(10))) { /* resolving a host name: it ends with the lookup */ }
            lock (sync)
            {
                while (retired.Count > 0) retired.Dequeue().Dispose();
                foreach (LinkEvent e in events)
                {
                    if (e.State != null) e.State.Dispose();
                }
                events.Clear();
            }
        }

        // ---- the I/O thread ---------------------------------------------------------------

        void Post(LinkEvent e)
        {
            lock (sync) PostLocked(e);
        }

        void PostLocked(LinkEvent e)
        {
            if (events.Count >= options.MaxQueuedEvents)
            {
                // A game that does not read its events loses the oldest error first.
                LinkedListNode<LinkEvent> node = events.First;
                while (node != null && node.Value.Kind != LinkEventKind.Error) node = node.Next;
                if (node != null) events.Remove(node);
                else if (e.Kind == LinkEventKind.Error) return;
            }
            events.AddLast(e);
            eventsPending = true;
            Monitor.PulseAll(sync);
        }

        void Run()
        {
            try
            {
                DateTime downSince = DateTime.UtcNow;
                while (!closing)
                {
                    if (!transport.Connected)
                    {
                        try
                        {
                            Connect(downSince);
                        }
                        catch (TetherException e) when (e.Code == ErrorCode.TrainingDone && !closing)
                        {
                            EndTraining(e);  // (the run ended while this client was shaking hands)
                            break;
                        }
                        connectedOnce.Set();
                    }
                    try
                    {
                        Serve();
                    }
                    catch (TetherException e)
                    {
                        if (closing) break;
                        if (e.Code == ErrorCode.TrainingDone)
                        {
                            EndTraining(e);
                            break;
                        }
                        if (e.Code == ErrorCode.Timeout) Post(new LinkEvent { Kind = LinkEventKind.Error, Error = e });
                        if (!(e is ConnectionLostException) && e.Code != ErrorCode.Timeout) throw;
                        GiveUpIfExhausted(e);
                        transport.Close();
                        ++Reconnects;
                        downSince = DateTime.UtcNow;
                    }
                }
            }
            catch (Exception e)
            {
                if (!closing)
                {
                    lock (sync)
                    {
                        fatal = e;
                        PostLocked(new LinkEvent { Kind = LinkEventKind.Fatal, Error = e as TetherException ?? new TetherException(ErrorCode.Internal, e.ToString(), e) });
                    }
                }
            }
            finally
            {
                transport.Close();
                connectedOnce.Set();
                lock (sync)
                {
                    while (retired.Count > 0) retired.Dequeue().Dispose();
                    Monitor.PulseAll(sync);
                }
            }
        }

        // The server's run is done (ERROR TRAINING_DONE, §6.6): nothing is resent and no new connection
        // is made; the batches queued or in flight are discarded and counted, the requests waiting fail,
        // and the game hears of it (not as an error) from the TrainingDone event. The I/O thread then ends.
        void EndTraining(TetherException e)
        {
            transport.Close();
            var lost = e as ConnectionLostException;
            TrainingSummary summary = TrainingSummary.FromJson(lost != null && lost.ClosingError != null ? lost.ClosingError["summary"] : null);
            lock (sync)
            {
                trainingDone = summary;
                if (inFlight != null) ++batchesUnsentAtEnd;
                inFlight = null;
                batchesUnsentAtEnd += outbox.Count;
                outbox.Clear();
                queuedSteps = 0;
                if (unanswered != null) requests.Enqueue(unanswered);
                unanswered = null;
                while (requests.Count > 0)
                {
                    LinkRequest request = requests.Dequeue();
                    if (request.Done) continue;
                    request.Error = TrainingDoneError((string)request.Message["type"]);
                    request.Done = true;
                }
                PostLocked(new LinkEvent { Kind = LinkEventKind.TrainingDone });
                Monitor.PulseAll(sync);
            }
        }

        // The unsolicited ERROR TRAINING_DONE (§6.6): no error to report; the lost connection after it ends training.
        static bool IsTrainingDone(JObject error)
        {
            JToken code = error["code"];
            return error["request"] == null && code != null && code.Type == JTokenType.String && (string)code == "TRAINING_DONE";
        }

        // Connects and shakes hands, retrying with capped exponential backoff until ReconnectTimeoutSeconds after
        // `downSince`. (1.9, §6.7) Attempt k (0, 1, ...) goes to the k-th address of the reconnect order from the
        // address last connected to (the first retries it, the next ones the other ranks the last PONG named);
        // the first connection's goes to the address the application gave.
        void Connect(DateTime downSince)
        {
            DateTime deadline = downSince.AddSeconds(options.ReconnectTimeoutSeconds);
            double delay = 0.05;
            List<RankAddress> order = RankAddresses.ReconnectOrder(given, ranks, transport.Target);
            for (int attempt = 0; ; ++attempt)
            {
                if (closing) throw new ConnectionLostException("client closed", ErrorCode.Closed);
                Exception last;
                try
                {
                    ConnectTo(order[attempt % order.Count]);
                    return;
                }
                catch (ServerErrorException e)
                {
                    transport.Close();
                    if (e.Code == ErrorCode.AuthFailed || e.Code == ErrorCode.VersionMismatch) throw;
                    last = e;
                }
                catch (TetherException e)
                {
                    transport.Close();
                    // A model this game cannot load will not load on the next attempt either, nor
                    // will a server of another major version or one whose spaces the options must give;
                    // a server whose run is done is not connected to again (§6.6).
                    if (e.Code == ErrorCode.InferenceFailed || e.Code == ErrorCode.VersionMismatch || e.Code == ErrorCode.InvalidArgument ||
                        e.Code == ErrorCode.TrainingDone) throw;
                    last = e;
                }
                DateTime now = DateTime.UtcNow;
                if (now >= deadline)
                {
                    throw new TetherException(ErrorCode.ConnectionFailed, "could not reach a Tether server at " + Describe(order) + " within " +
                                              options.ReconnectTimeoutSeconds + " s (ReconnectTimeoutSeconds): " + last.Message, last);
                }
                // A server at its connection limit, or refusing this address for a while, asks for at
                // least 1 s between attempts (§6.6).
                bool tooMany = last is TetherException && (((TetherException)last).Code == ErrorCode.TooManyConnections
                                                           || ((TetherException)last).Code == ErrorCode.AuthThrottled);
                double pause = Math.Min(tooMany ? Math.Max(delay, 1.0) : delay, (deadline - now).TotalSeconds);
                wake.WaitOne(TimeSpan.FromSeconds(Math.Max(0, pause)));
                delay = Math.Min(delay * 2, 1.0);
            }
        }

        // The addresses the attempts went to, for an error: the given one, or every one of the order.
        static string Describe(List<RankAddress> order)
        {
            if (order.Count == 1) return RankAddresses.Format(order[0]);
            var names = new string[order.Count];
            for (int i = 0; i < order.Count; ++i) names[i] = RankAddresses.Format(order[i]);
            return string.Join(", ", names) + " (the ranks of a group)";
        }

        // One attempt: connects to `address` and shakes hands. (1.9, §6.7) When the PONG redirects the client, it
        // sends nothing more there, closes, and connects to the rank named, saying it was redirected; if that fails
        // at the connection level, it comes back to `address`, saying so too (so it is kept there). A redirect is
        // no reconnect: nothing but PING was sent on the connection it leaves.
        void ConnectTo(RankAddress address)
        {
            transport.Target = address;
            redirected = false;
            transport.Connect();
            RankAddress? target = Handshake();
            if (!target.HasValue) return;
            transport.Close();
            redirected = true;
            try
            {
                transport.Target = target.Value;
                transport.Connect();
                Handshake();  // (made on a redirect: a redirect in its PONG is not followed)
                Interlocked.Increment(ref redirects);
                return;
            }
            catch (TetherException e) when (CannotFollow(e))
            {
                // (the C# SDK has no logger: ConnectedAddress and Redirects tell where the client went)
            }
            transport.Close();
            transport.Target = address;
            transport.Connect();
            Handshake();
        }

        // Whether `e` says the rank a redirect named could not be reached or did not answer (the client goes back),
        // rather than ending the attempt: the client closing, the run done, or what no other rank changes.
        static bool CannotFollow(TetherException e)
        {
            if (e is ServerErrorException) return false;
            if (e is ConnectionLostException) return e.Code != ErrorCode.TrainingDone && e.Code != ErrorCode.Closed;
            return e.Code == ErrorCode.Timeout;
        }

        // PING, GET_CONFIG and GET_STATE on a new connection. (1.9, §6.7) Stops after the PONG and returns the rank
        // it redirects to, when it does (and this connection was not made on a redirect); null once the connection
        // is ready.
        RankAddress? Handshake()
        {
            var ping = new JObject { { "type", "PING" }, { "protocol_version", Messages.ProtocolVersion }, { "client_name", options.ClientName },
                                     { "sdk", SdkName } };
            if (options.AuthToken != null) ping["auth_token"] = options.AuthToken;
            if (redirected) ping["redirected"] = true;
            JObject pong = Exchange(ping, options.ResponseTimeoutSeconds, "ResponseTimeoutSeconds");
            CheckMajorVersion(pong);
            // (1.9) the group's ranks, remembered from the latest PONG that names any, and a redirect to follow first
            List<RankAddress> named = RankAddresses.FromPong(pong);
            if (named.Count > 0) ranks = named;
            RankAddress? target = RankAddresses.RedirectOf(pong, transport.Target, redirected);
            if (target.HasValue) return target;
            JObject setConfig = Exchange(new JObject { { "type", "GET_CONFIG" } }, options.ResponseTimeoutSeconds, "ResponseTimeoutSeconds");
            if (!multiAgent) FillSpaces(setConfig);
            // A new connection gets every model again: versions count from 0 after a server restart.
            var getState = new JObject { { "type", "GET_STATE" } };
            if (multiAgent) getState["weights_seq_nos"] = new JObject();  // the per-module form: every module's model (§7.6)
            // ...and the parameter set again (1.7, §19.2): a restarted server reuses seqs.
            envParamsSeq = 0;
            envParamsDropped = false;
            bool asksEnvParams = SpeaksVersion(pong, 1, 7);
            if (asksEnvParams) getState[EnvParams.SeqField] = envParamsSeq;
            JObject setState = Exchange(getState, options.ResponseTimeoutSeconds, "ResponseTimeoutSeconds");
            TakeConnection(pong, setConfig, setState, asksEnvParams, transport.Address);
            return null;
        }

        // A connection's PONG, SET_CONFIG and SET_STATE (for a request that asked for the parameter set when
        // `asksEnvParams`), taken in: its models prepared here, its Connected event posted. `address`: where it was made.
        void TakeConnection(JObject pong, JObject setConfig, JObject setState, bool asksEnvParams, string address)
        {
            ReadState(setState);
            bool drop;
            EnvParams received = TakeEnvParams(setState, asksEnvParams, out drop);
            PreparedState prepared = Prepare(setConfig, setState);
            prepared.EnvParams = received;
            prepared.DropEnvParams = drop;
            if (prepared.Seq.HasValue) lastSeq = prepared.Seq.Value;
            if (prepared.ModuleSeqs != null)
            {
                moduleSeqs.Clear();
                foreach (KeyValuePair<string, long> module in prepared.ModuleSeqs) moduleSeqs[module.Key] = module.Value;
            }
            if (!multiAgent)
            {
                // Read once per connection, on this thread (the only one writing records).
                recordObsSpace = Space.FromJson(setConfig["observation_space"]);
                recordActSpace = Space.FromJson(setConfig["action_space"]);
            }
            lock (sync)
            {
                info = pong;
                config = setConfig;
            }
            // A new connection: step versions learned on an earlier one are not sent on it (§10.1).
            ++connection;
            lock (sync)
            {
                runIds.Add(ServerRuns.RunIdOf(pong));  // (1.8, §6.5: the run it reached)
                connectedAddress = address;
                PostLocked(new LinkEvent { Kind = LinkEventKind.Connected, Info = pong, Config = setConfig, State = prepared, Connection = connection });
            }
        }

        // (§20) No server: the offline policy file's PONG, SET_CONFIG and SET_STATE are taken as a first
        // connection's handshake takes them, and no I/O thread starts. Submit lets batches go, Request refuses
        // MAP_AGENTS, a retired model is released at once. Throws what is wrong with the file, naming it.
        void StartOffline()
        {
            OfflinePolicy file = OfflinePolicy.Read(options.OfflinePolicy);
            string named = "offline policy '" + options.OfflinePolicy + "': ";
            CheckMajorVersion(file.Pong, named + "its server");
            if (!multiAgent && file.State["onnx_file"] == null)
            {
                throw new TetherException(ErrorCode.InvalidField, named + "its server has no default module (it has several, or maps agents " +
                                          "itself): a single-agent client has no model in it; use a multi-agent client");
            }
            envParamsSeq = 0;
            envParamsDropped = false;
            offline = true;
            try
            {
                if (!multiAgent) FillSpaces(file.Config);
                TakeConnection(file.Pong, file.Config, file.State, SpeaksVersion(file.Pong, 1, 7), "offline:" + options.OfflinePolicy);
            }
            catch (TetherException e)
            {
                throw new TetherException(e.Code, named + e.Detail);  // (a space or a model a server could not send either)
            }
        }

        // (1.8) The run connection `n` (1, 2, ...) reached, if its PONG named one (I/O thread).
        string RunOf(int n)
        {
            lock (sync) return n >= 1 && n <= runIds.Count ? runIds[n - 1] : null;
        }

        // (1.8, §6.5) `batch` was cut under another server run than this connection's: its versions name other
        // weights here and no model of this run explains its action_logp. It is let go, counted, and answered to
        // the game's thread as not sent (not an error: its episodes go on). The C# SDK has no logger: the count
        // (ClientBase.OtherRunStepsDropped) is the report.
        void DropOtherRun(Batch batch)
        {
            lock (sync)
            {
                if (inFlight == batch) inFlight = null;
                batch.OtherRun = true;
                batch.Done = true;
                otherRunStepsDropped += multiAgent ? batch.AgentSteps : batch.EnvSteps;
                PostLocked(new LinkEvent { Kind = LinkEventKind.Batch, Batch = batch });
            }
        }

        // A PONG of another major version speaks a protocol this client cannot read (§6.2);
        // none at all is a plain RLlink v1 server.
        void CheckMajorVersion(JObject pong)
        {
            CheckMajorVersion(pong, "the server at " + transport.Address);
        }

        // The same, `who` naming the PONG's source in the message ("the server at host:port").
        static void CheckMajorVersion(JObject pong, string who)
        {
            JToken version = pong["protocol_version"];
            if (version == null || version.Type == JTokenType.Null) return;
            string text = version.Type == JTokenType.String ? (string)version : version.ToString(Newtonsoft.Json.Formatting.None);
            int[] parsed = Messages.ParseVersion(text);
            int ours = Messages.ParseVersion(Messages.ProtocolVersion)[0];
            if (parsed == null || parsed[0] != ours)
            {
                throw new TetherException(ErrorCode.VersionMismatch, who + " speaks RLlink " + text + ", this client " +
                                          Messages.ProtocolVersion + " (major versions must match)");
            }
        }

        // A plain RLlink v1 server (RLlib's) describes no spaces: the options give them.
        void FillSpaces(JObject setConfig)
        {
            if (setConfig["observation_space"] == null && options.ObservationSpace != null) setConfig["observation_space"] = options.ObservationSpace.ToJson();
            if (setConfig["action_space"] == null && options.ActionSpace != null) setConfig["action_space"] = options.ActionSpace.ToJson();
            foreach (string field in new[] { "observation_space", "action_space" })
            {
                if (setConfig[field] != null) continue;
                throw new TetherException(ErrorCode.InvalidArgument, "the server at " + transport.Address + " describes no " + field +
                                          " (a plain RLlink v1 server): give ClientOptions.ObservationSpace and ActionSpace");
            }
        }

        // A plain RLlink v1 server (RLlib's) announces none.
        bool AnnouncesVersion
        {
            get
            {
                JToken version = info == null ? null : info["protocol_version"];
                return version != null && version.Type == JTokenType.String;
            }
        }

        static bool HasStepVersions(Batch batch)
        {
            foreach (EpisodeChunk chunk in batch.Chunks)
            {
                if (chunk.StepVersions.Count != 0) return true;
            }
            foreach (MultiAgentRecord record in batch.Records)
            {
                foreach (AgentEntry entry in record.Agents)
                {
                    if (entry.WithVersions) return true;
                }
            }
            return false;
        }

        // The records (agent entries) of `batch` holding logged steps are taken out of it and counted (their
        // arrays are not reused: this happens only when a batch meets a server older than 1.6).
        void DropLogged(Batch batch)
        {
            long dropped = 0;
            List<EpisodeChunk> chunks = batch.Chunks;
            int kept = 0;
            for (int i = 0; i < chunks.Count; ++i)
            {
                EpisodeChunk chunk = chunks[i];
                if (LoggedRuns.Any(chunk.Logged, chunk.Logged.Count))
                {
                    dropped += chunk.Steps;
                    batch.EnvSteps -= chunk.Steps;
                    continue;
                }
                chunks[kept++] = chunk;
            }
            chunks.RemoveRange(kept, chunks.Count - kept);
            foreach (MultiAgentRecord record in batch.Records)
            {
                List<AgentEntry> agents = record.Agents;
                kept = 0;
                for (int i = 0; i < agents.Count; ++i)
                {
                    AgentEntry entry = agents[i];
                    if (entry.WithLogged)
                    {
                        dropped += entry.Steps;
                        batch.AgentSteps -= entry.Steps;
                        continue;
                    }
                    agents[kept++] = entry;
                }
                agents.RemoveRange(kept, agents.Count - kept);
            }
            if (dropped > 0)
            {
                lock (sync) loggedStepsDropped += dropped;
            }
        }

        static void ClearStepVersions(Batch batch)
        {
            foreach (EpisodeChunk chunk in batch.Chunks) chunk.StepVersions.Clear();
            foreach (MultiAgentRecord record in batch.Records)
            {
                foreach (AgentEntry entry in record.Agents) entry.WithVersions = false;
            }
        }

        // A Discrete agent entry's steps whose log-probability was left for later (NaN: a steady-state
        // frame's draws, SampleRows's discreteLogpLater) get the one their draw had, from their dist
        // inputs and action, as they are written: here, off the game's thread, in the cut table the
        // link owns until the batch is answered. (A NaN of any other space is a value that is not
        // finite, which the writer refuses as such.)
        static void TakeLogpLeftForLater(StepTable table, Space actionSpace, int[] rows, int from, int steps)
        {
            if (actionSpace.Kind != SpaceKind.Discrete) return;
            double[] logp = table.Logp;
            for (int i = 0; i < steps; ++i)
            {
                int row = rows[from + i];
                if (!double.IsNaN(logp[row])) continue;
                if (table.DistDim != actionSpace.N || table.ActDim != 1)
                {
                    throw new TetherException(ErrorCode.InvalidArgument, "a step's log-probability was left for later, and its action space is not the Discrete one it was drawn from");
                }
                logp[row] = Distributions.DrawnCategoricalLogp(table.Dist, row * table.DistDim, table.DistDim, (int)(table.Actions[row] - actionSpace.Start));
            }
        }

        // What every SET_STATE tells of this client besides the weights (§7.6): steps_refused_stale
        // (anything but a JSON integer >= 1 is ignored, never an error), record_share and steps_per_batch.
        void ReadState(JObject setState)
        {
            Interlocked.Exchange(ref recordShareBits, BitConverter.DoubleToInt64Bits(Tether.Protocol.RecordShare.Read(setState, RecordShare)));
            stepsPerBatch = Tether.Protocol.StepsPerBatch.Read(setState, stepsPerBatch);
            long refused = Messages.IntegerOr(setState["steps_refused_stale"], 0, 0);
            if (refused < 1) return;
            lock (sync) stepsRefusedStale = refused > long.MaxValue - stepsRefusedStale ? long.MaxValue : stepsRefusedStale + refused;
        }

        // SET_STATE's env_params (1.7, §19.2), when it carries one that keeps §19.1's rules: its seq is the
        // connection's env_params_seq from now on. `asked`: the request carried env_params_seq (the server's
        // PONG announced 1.7 or later); from any other server env_params is ignored. Null when absent; a set
        // that breaks the rules is ignored (counted), the client keeping the set it holds and its
        // env_params_seq. `drop`: the answer to a request asking with env_params_seq 0 carried none, so the
        // server has no parameters and the game's thread drops its set (said once per connection: no set can
        // come without making env_params_seq other than 0).
        EnvParams TakeEnvParams(JObject setState, bool asked, out bool drop)
        {
            drop = false;
            if (!asked) return null;
            JToken body = setState[EnvParams.Field];
            if (body == null)
            {
                if (envParamsSeq == 0 && !envParamsDropped) drop = envParamsDropped = true;
                return null;
            }
            EnvParams set;
            string error;
            if (!EnvParams.TryParse(body, out set, out error))
            {
                Interlocked.Increment(ref envParamsIgnored);
                return null;
            }
            envParamsSeq = set.Seq;
            envParamsDropped = false;
            return set;
        }

        bool Speaks13 { get { return Speaks(1, 3); } }

        // Whether the PONG of this connection announced protocol major.minor or later.
        bool Speaks(int major, int minor) { return SpeaksVersion(info, major, minor); }

        // Whether `pong` announced protocol major.minor or later.
        static bool SpeaksVersion(JObject pong, int major, int minor)
        {
            JToken version = pong == null ? null : pong["protocol_version"];
            int[] parsed = version != null && version.Type == JTokenType.String ? Messages.ParseVersion((string)version) : null;
            return parsed != null && (parsed[0] > major || (parsed[0] == major && parsed[1] >= minor));
        }

        bool ForceOnPolicy
        {
            get
            {
                JToken value = config == null ? null : config["force_on_policy"];
                return value == null || value.Type != JTokenType.Boolean || (bool)value;
            }
        }

        PreparedState Prepare(JObject setConfig, JObject state)
        {
            if (multiAgent) return PrepareModules(setConfig, state);
            var prepared = new PreparedState();
            JToken seq = state["weights_seq_no"];
            if (seq != null && seq.Type == JTokenType.Integer) prepared.Seq = Messages.IntegerOr(seq, 0, 0);
            JToken file = state["onnx_file"];
            if (file != null && file.Type == JTokenType.String && ((string)file).Length > 0)
            {
                byte[] model = OnnxCodec.Decode((string)file);
                IInferenceBackend backend = options.BackendFactory();
                try
                {
                    // (1.5: a model with memory gets its state inputs and outputs bound, §12.1)
                    BackendLoading.Load(backend, model, setConfig["observation_space"] == null ? null : Space.FromJson(setConfig["observation_space"]), FirstName(setConfig["onnx_input_names"], "obs"),
                                        FirstName(setConfig["onnx_output_names"], "action_dist_inputs"), RecurrentState.FromJson(setConfig["recurrent_state"]));
                }
                catch
                {
                    backend.Dispose();
                    throw;
                }
                prepared.Backend = backend;
            }
            return prepared;
        }

        // The per-module form of SET_STATE: "models" holds the modules whose model changed (§7.6).
        PreparedState PrepareModules(JObject setConfig, JObject state)
        {
            var prepared = new PreparedState { ModuleBackends = new Dictionary<string, IInferenceBackend>(), ModuleSeqs = new Dictionary<string, long>() };
            var models = state["models"] as JObject;
            if (models == null) throw new ProtocolException(ErrorCode.InvalidField, "SET_STATE answering a per-module request has no \"models\" object");
            var modules = setConfig["modules"] as JObject;
            try
            {
                foreach (JProperty model in models.Properties())
                {
                    JToken spec = modules == null ? null : modules[model.Name];
                    if (spec == null) throw new ProtocolException(ErrorCode.InvalidField, "SET_STATE sends a model for module '" + model.Name + "', which SET_CONFIG does not describe");
                    ModuleSpec module = ModuleSpec.FromJson(model.Name, spec);
                    JToken seq = model.Value["weights_seq_no"], file = model.Value["onnx_file"];
                    if (seq == null || seq.Type != JTokenType.Integer || file == null || file.Type != JTokenType.String)
                    {
                        throw new ProtocolException(ErrorCode.InvalidField, "SET_STATE model '" + model.Name + "' needs an integer weights_seq_no and an onnx_file string");
                    }
                    IInferenceBackend backend = options.BackendFactory();
                    prepared.ModuleBackends[model.Name] = backend;
                    try
                    {
                        BackendLoading.Load(backend, OnnxCodec.Decode((string)file), module.ObservationSpace, module.OnnxInputName, module.OnnxOutputName,
                                            module.RecurrentState);
                    }
                    catch (TetherException e)
                    {
                        throw new TetherException(e.Code, "module '" + model.Name + "': " + e.Detail, e);
                    }
                    prepared.ModuleSeqs[model.Name] = Messages.IntegerOr(seq, 0, 0);
                }
            }
            catch
            {
                prepared.Dispose();
                throw;
            }
            return prepared;
        }

        static string FirstName(JToken names, string fallback)
        {
            var array = names as JArray;
            return array != null && array.Count > 0 && array[0].Type == JTokenType.String ? (string)array[0] : fallback;
        }

        // Sends a request and returns its answer; an ERROR answering it is thrown as
        // ServerErrorException. An ERROR for an earlier EPISODES goes to `episodesRefused`
        // when given (it refuses the batch being sent), else it is reported.
        JObject Exchange(JObject request, double seconds, string setting, Action<ServerErrorException> episodesRefused = null)
        {
            transport.Send(request);
            return Answer((string)request["type"], seconds, setting, episodesRefused);
        }

        // Exchange for a request framed by the caller (a batch).
        JObject Exchange(MessageType kind, byte[] frame, int length, double seconds, string setting)
        {
            transport.Send(kind, frame, length);
            return Answer(Messages.ToWire(kind), seconds, setting, null);
        }

        JObject Answer(string type, double seconds, string setting, Action<ServerErrorException> episodesRefused)
        {
            lastSend = DateTime.UtcNow;
            DateTime deadline = DateTime.UtcNow.AddSeconds(seconds);
            while (true)
            {
                Response response = transport.Receive(deadline, type, setting, seconds);
                if (response.Message.Type == MessageType.Error)
                {
                    if (IsTrainingDone(response.Message.Body)) continue;  // (the next Receive raises the end of the connection)
                    ServerErrorException error = ToServerError(response.Message.Body);
                    if (response.Request.HasValue && Messages.ToWire(response.Request.Value) == type) throw error;
                    if (episodesRefused != null && error.Request == "EPISODES") episodesRefused(error);
                    else Post(new LinkEvent { Kind = LinkEventKind.Error, Error = error });
                    continue;
                }
                return response.Message.Body;
            }
        }

        static ServerErrorException ToServerError(JObject body)
        {
            JToken code = body["code"], message = body["message"], request = body["request"];
            return new ServerErrorException(code != null && code.Type == JTokenType.String ? (string)code : "UNKNOWN",
                                            message != null && message.Type == JTokenType.String ? (string)message : "(no message)",
                                            request != null && request.Type == JTokenType.String ? (string)request : null);
        }

        void Serve()
        {
            while (!closing)
            {
                lock (sync)
                {
                    while (retired.Count > 0) retired.Dequeue().Dispose();
                }
                // A batch sent before a reconnect goes again first; then the requests the game waits for (the one
                // whose connection was lost first), before the queued batches: the order of the Python and C++ links.
                LinkRequest request = null;
                Batch batch;
                lock (sync)
                {
                    batch = inFlight;
                    if (batch == null)
                    {
                        if (unanswered != null && !unanswered.Done) request = unanswered;  // (not if the game stopped waiting)
                        unanswered = null;
                        while (request == null && requests.Count > 0)
                        {
                            request = requests.Dequeue();
                            if (request.Done) request = null;  // the game stopped waiting for it
                        }
                    }
                    while (batch == null && request == null && outbox.Count > 0)
                    {
                        batch = outbox.Dequeue();
                        queuedSteps -= batch.QueueSteps;
                        Monitor.PulseAll(sync);
                        if (batch.IsEmpty && !batch.SendEmpty) batch = null;  // every episode in it was dropped or refused
                    }
                    inFlight = batch;
                }
                if (request != null)
                {
                    Answer(request);
                    continue;
                }
                if (batch != null) SendBatch(batch);
                else Idle();
            }
        }

        void Answer(LinkRequest request)
        {
            JObject answer = null;
            TetherException error = null;
            try
            {
                answer = Exchange(request.Message, options.ResponseTimeoutSeconds, "ResponseTimeoutSeconds");
            }
            catch (ServerErrorException e)
            {
                error = e;
            }
            catch (TetherException e)
            {
                // The connection is lost: the request is sent again on the next one (the game's wait is bounded by
                // its own deadline); at the end of training EndTraining fails it, once TrainingDone is set. It fails
                // when its answer timed out (§6.6: a late answer would pair with the next request) or the server
                // refused its bytes (BAD_HEADER, FRAME_TOO_LARGE: they would be refused again); the link reconnects.
                bool refusedBytes = e.Code == ErrorCode.BadHeader || e.Code == ErrorCode.FrameTooLarge;
                if ((e is ConnectionLostException && !refusedBytes) || e.Code == ErrorCode.TrainingDone)
                {
                    lock (sync) unanswered = request;
                    throw;
                }
                lock (sync)
                {
                    request.Error = new TetherException(e.Code, (string)request.Message["type"] + " was not answered: " + e.Message, e);
                    request.Done = true;
                    Monitor.PulseAll(sync);
                }
                throw;
            }
            lock (sync)
            {
                request.Answer = answer;
                request.Error = error;
                request.Done = true;
                Monitor.PulseAll(sync);
            }
        }

        void Idle()
        {
            double interval = HeartbeatInterval;
            double waitSeconds = interval > 0 ? Math.Max(0, interval - (DateTime.UtcNow - lastSend).TotalSeconds) : 1.0;
            // Watch the socket (a closed connection or an unsolicited ERROR is noticed at once) in short slices.
            bool readable = transport.Readable((int)(Math.Min(waitSeconds, 0.005) * 1e6));
            if (readable)
            {
                transport.ReadAvailable();
                foreach (Response response in transport.Pending)
                {
                    if (response.Message.Type != MessageType.Error) throw new ConnectionLostException("server " + transport.Address + " sent an unrequested " + Messages.ToWire(response.Message.Type));
                    if (IsTrainingDone(response.Message.Body)) continue;  // (the next read raises the end of the connection)
                    Post(new LinkEvent { Kind = LinkEventKind.Error, Error = ToServerError(response.Message.Body) });
                }
                transport.Pending.Clear();
                return;
            }
            if (interval > 0 && (DateTime.UtcNow - lastSend).TotalSeconds >= interval)
            {
                ++HeartbeatsSent;
                try
                {
                    Exchange(new JObject { { "type", "PING" } }, options.ResponseTimeoutSeconds, "ResponseTimeoutSeconds");
                }
                catch (ServerErrorException e)
                {
                    Post(new LinkEvent { Kind = LinkEventKind.Error, Error = e });
                }
            }
            wake.WaitOne(0);
        }

        double HeartbeatInterval
        {
            get
            {
                JToken value = config == null ? null : config["heartbeat_interval_s"];
                return value != null && (value.Type == JTokenType.Float || value.Type == JTokenType.Integer) ? (double)value : 0;
            }
        }

        void SendBatch(Batch batch)
        {
            // Steps acted with another server run's weights are not sent (1.8, §6.5): unlike a batch resent to
            // the same run, this one is dropped.
            if (ServerRuns.FromAnotherRun(RunOf(batch.VersionsConnection), RunOf(connection)))
            {
                DropOtherRun(batch);
                return;
            }
            if (batch.Seq == 0) batch.Seq = nextSeq++;
            // Step versions go only to a server that announced a protocol_version, and only on the
            // connection they were learned on (§10.1): the server of a later one may be another run,
            // so a batch resent after a reconnect is written again without them.
            bool versionsValid = batch.VersionsConnection == connection && AnnouncesVersion;
            if (!versionsValid && HasStepVersions(batch)) ClearStepVersions(batch);
            // Logged steps go only to a server of 1.6 or later: an older one would train on them as its
            // policy's samples (§15). A record (or agent entry) holding any is let go, decided per send
            // (a batch cut for a 1.6 server may be resent to an older one after a reconnect).
            if (!Speaks(1, 6)) DropLogged(batch);
            // The whole message is written straight into one reused frame: sending a batch allocates
            // (almost) nothing, so it brings no garbage collection upon the game's thread.
            bool force = ForceOnPolicy;
            MessageType kind = force ? MessageType.EpisodesAndGetState : MessageType.Episodes;
            try
            {
                // A byte box's observations go as uint8 tensors (§10.9) only to a server of 1.4 or later,
                // decided per send: a batch resent to an older server after a reconnect goes as numbers (§15).
                writer.BeginMessage(Messages.ToWire(kind), Speaks(1, 4));
                if (multiAgent)
                {
                    foreach (MultiAgentRecord record in batch.Records)
                    {
                        writer.BeginMultiAgentRecord(record.EpisodeId, record.IsTerminated, record.IsTruncated, record.EnvParams, record.Measure);
                        foreach (AgentEntry entry in record.Agents)
                        {
                            TakeLogpLeftForLater(entry.Table, entry.Module.ActionSpace, batch.RowIndex, entry.First, entry.Steps);
                            writer.AgentEntryRows(entry.AgentId, entry.Module, entry.StartStep, entry.Table, batch.RowIndex, entry.First, entry.Steps,
                                                  entry.WithVersions, entry.IsTerminated, entry.IsTruncated, entry.WithLogged);
                        }
                        writer.EndMultiAgentRecord();
                    }
                }
                else
                {
                    // Written with the spaces of the connection it was first sent on, every time (a new
                    // connection's may differ: the server there answers for what it was cut as).
                    if (batch.ObsSpace == null)
                    {
                        batch.ObsSpace = recordObsSpace;
                        batch.ActSpace = recordActSpace;
                    }
                    foreach (EpisodeChunk chunk in batch.Chunks) writer.SingleAgentRecord(chunk, batch.ObsSpace, batch.ActSpace);
                }
                writer.EndEpisodes();
            }
            catch (TetherException e)
            {
                Finish(batch, e, null);
                return;
            }
            ++batch.Attempts;
            // A 1.2 server counts agent steps as env_steps (§7.8).
            bool speaks13 = Speaks13;
            writer.Field("env_steps", multiAgent && !speaks13 ? batch.AgentSteps : batch.EnvSteps);
            // The claim is resent unchanged on a later connection (§6.5, §10.1).
            if (batch.Claim.HasValue) writer.Field("weights_seq_no", batch.Claim.Value);
            if (multiAgent) writer.Field("weights_seq_nos", batch.ModuleClaims);
            if (speaks13)
            {
                writer.Field("agent_steps", multiAgent ? batch.AgentSteps : batch.EnvSteps);
                writer.Field("client_session", ClientSession);
                writer.Field("batch_seq", batch.Seq);
            }
            // (1.7, §19.2) the seq of the last parameter set this connection was sent
            bool asksEnvParams = Speaks(1, 7);
            if (force && asksEnvParams) writer.Field(EnvParams.SeqField, envParamsSeq);
            int length = writer.EndMessage(ref frame);
            TetherException refusal = null;
            JObject answer = null;
            if (force)
            {
                try
                {
                    answer = Exchange(kind, frame, length, options.UpdateTimeoutSeconds, "UpdateTimeoutSeconds");
                }
                catch (ServerErrorException e)
                {
                    refusal = e;
                }
            }
            else
            {
                transport.Send(kind, frame, length);
                lastSend = DateTime.UtcNow;
                // GET_STATE right behind: its answer acknowledges the EPISODES (an ERROR for them comes first).
                var getState = new JObject { { "type", "GET_STATE" } };
                if (multiAgent)
                {
                    var held = new JObject();
                    foreach (KeyValuePair<string, long> module in moduleSeqs) held[module.Key] = module.Value;
                    getState["weights_seq_nos"] = held;
                }
                else if (lastSeq >= 0)
                {
                    getState["weights_seq_no"] = lastSeq;
                }
                if (asksEnvParams) getState[EnvParams.SeqField] = envParamsSeq;
                try
                {
                    answer = Exchange(getState, options.UpdateTimeoutSeconds, "UpdateTimeoutSeconds", e => refusal = e);
                }
                catch (ServerErrorException e)
                {
                    // Refuses the GET_STATE, not the EPISODES before it: the batch was delivered.
                    Post(new LinkEvent { Kind = LinkEventKind.Error, Error = e });
                }
            }
            PreparedState prepared = null;
            if (answer != null)
            {
                ReadState(answer);
                bool drop;
                EnvParams received = TakeEnvParams(answer, asksEnvParams, out drop);
                try
                {
                    prepared = Prepare(config, answer);
                }
                catch (TetherException e)
                {
                    // The batch was delivered; a new model that cannot be loaded is reported and the
                    // game keeps acting with the one it has (asked for again with the next batch).
                    Post(new LinkEvent { Kind = LinkEventKind.Error, Error = new TetherException(e.Code, "a new model from " + transport.Address +
                                                                                                       " could not be loaded; acting on with the current one: " + e.Detail, e) });
                    // (the parameter set it carried is swapped in all the same: its seq is the connection's now)
                    Finish(batch, refusal, received == null && !drop ? null : new PreparedState { EnvParams = received, DropEnvParams = drop });
                    return;
                }
                prepared.EnvParams = received;
                prepared.DropEnvParams = drop;
                if (prepared.Seq.HasValue) lastSeq = prepared.Seq.Value;
                if (prepared.ModuleSeqs != null)
                {
                    foreach (KeyValuePair<string, long> module in prepared.ModuleSeqs) moduleSeqs[module.Key] = module.Value;
                }
            }
            Finish(batch, refusal, prepared);
        }

        void Finish(Batch batch, TetherException error, PreparedState prepared)
        {
            lock (sync)
            {
                if (inFlight == batch) inFlight = null;
                batch.Error = error;
                batch.Done = true;
                batch.EpisodeIds.Clear();
                foreach (EpisodeChunk chunk in batch.Chunks)
                {
                    if (chunk.EpisodeId != null) batch.EpisodeIds.Add(chunk.EpisodeId);
                }
                foreach (MultiAgentRecord record in batch.Records)
                {
                    if (record.EpisodeId != null) batch.EpisodeIds.Add(record.EpisodeId);
                }
                // The chunks stay: the game's thread reuses them once it takes the event.
                if (error != null) ForgetRefusedLocked(batch);
                if (prepared != null && !prepared.IsEmpty) PostLocked(new LinkEvent { Kind = LinkEventKind.State, State = prepared, Connection = connection });
                PostLocked(new LinkEvent { Kind = LinkEventKind.Batch, Batch = batch });
            }
        }

        void ForgetRefusedLocked(Batch batch)
        {
            foreach (string id in batch.EpisodeIds)
            {
                if (refused.Add(id)) refusedOrder.Enqueue(id);
            }
            while (refusedOrder.Count > MaxRefusedEpisodes) refused.Remove(refusedOrder.Dequeue());
            // The rest of a refused batch's episodes is not sent either: the server must not take a fragment for a whole episode.
            var gone = new HashSet<string>(batch.EpisodeIds);
            foreach (Batch waiting in outbox) queuedSteps -= DropEpisodes(waiting, gone);
        }

        // The batch in flight lost its connection: it goes again after the reconnect, unless it was
        // sent on MaxBatchAttempts connections already.
        void GiveUpIfExhausted(TetherException lost)
        {
            Batch batch;
            lock (sync) batch = inFlight;
            if (batch == null || batch.Attempts < options.MaxBatchAttempts) return;
            Finish(batch, new TetherException(ErrorCode.ConnectionFailed, "batch " + batch.Seq + " was sent on " + batch.Attempts + " connections to " +
                                              options.Address + ", each lost before its answer (" + lost.Message + "); given up (MaxBatchAttempts)"), null);
        }
    }
}
