// What the single-agent and the multi-agent clients share: the link to the server's I/O thread,
// the counters and the training state it hands over, the order in which its events are applied,
// and the record_share draw. Each client fills in what its own records and models need.
using System;
using System.Collections.Generic;
using System.IO;
using Tether.Protocol;
using Tether.Sampling;

namespace Tether.Client
{
    /// <summary>
    /// The connection and the server's training state as <see cref="TetherClient"/> and
    /// <see cref="MultiAgentClient"/> both report them. Only those two derive from it.
    /// Not thread-safe: call a client from one thread (the game's).
    /// </summary>
    public abstract class ClientBase : IDisposable
    {
        internal readonly ClientOptions options;
        internal readonly ServerLink link;
        internal readonly Rng rng;
        // Errors the I/O thread reported, raised one per call (RaisePending); the one that ended the link.
        internal readonly Queue<TetherException> errors = new Queue<TetherException>();
        internal TetherException fatal;
        internal bool ended;  // the game's thread has taken the end of training (§6.6): nothing is recorded any more
        internal int connection;  // the connection of the last event taken
        internal int stepsPerSample = 500;
        internal long episodesHeldBack;
        // Protocol 1.8 (§6.5): the server run of the connection whose events are applied (PONG run_id; null: not
        // named), whether the Connected event being applied reached another run than the connection before it,
        // and the steps not cut yet that were let go at such a reconnect.
        string runId;
        internal bool runChanged;
        internal long otherRunUnsentDropped;
        // Protocol 1.6 (§18): the demonstration file the client writes while it plays (ClientOptions.DemoPath),
        // null while it writes none; stopped for good when the server's spaces change under it.
        internal DemoWriter demos;
        bool demosStopped;
        int demosWritten;  // episodes written by writers closed since
        readonly List<LinkEvent> taken = new List<LinkEvent>();
        readonly HashSet<string> dropped = new HashSet<string>();
        readonly List<Batch> droppedBatches = new List<Batch>();
        // Protocol 1.7 (§19): the parameter set held (swapped in between two calls), and the generator's
        // uniform draws as one delegate (made once: drawing an episode's values allocates no delegate).
        EnvParams envParams;
        readonly Func<double> uniform;

        internal ClientBase(ClientOptions options, bool multiAgent)
        {
            this.options = options;
            rng = new Rng(options.Seed ?? (ulong)DateTime.UtcNow.Ticks);
            uniform = rng.Uniform;
            link = new ServerLink(options, multiAgent);
        }

        /// <summary>
        /// The environment parameters the server asks the game to play with (protocol 1.7, §19): the last valid
        /// set it sent, swapped in on the game's thread at the start of a client call (never within one), as a
        /// new model is; null while the server sent none (a server older than 1.7: its <c>env_params</c> are
        /// ignored) and after a server said it has none (its answer to a state request after a (re)connect
        /// carried no set: the held one is dropped). Episodes started from then on draw their values from it
        /// (<see cref="EpisodeParams"/>); an episode started without a set has none. A set that breaks §19.1's
        /// rules is ignored (<see cref="EnvParamsIgnored"/>): the client keeps the one it holds.
        /// </summary>
        public EnvParams EnvParams { get { return envParams; } }

        /// <summary>
        /// Raised when the set held changes (protocol 1.7, §19.2, "Change callback"): on the game's thread, once
        /// per taking-in of the server's answers that swapped in one or more sets or dropped the held one (in the
        /// client call that takes them: StartEpisode, GetAction / GetActions, EndEpisode, Flush...), after all of
        /// the answers' events (models, sets) are applied and before the call does its own work, with the set
        /// held then (<see cref="EnvParams"/>; null after a server said it has no parameters). A handler added
        /// while the client holds a set is called at once with it (on the thread that adds it), so a set sent in
        /// the handshake is not missed. The server resends its set on every new connection, so the event is
        /// raised again after a reconnect (with the same <see cref="Tether.Protocol.EnvParams.Seq"/> when the set
        /// did not change). An exception a handler throws comes out of that client call; what was taken in stays
        /// applied and is not applied (nor raised) again.
        /// </summary>
        public event Action<EnvParams> EnvParamsChanged
        {
            add
            {
                envParamsChanged += value;
                EnvParams held = envParams;
                if (held != null && value != null) value(held);
            }
            remove { envParamsChanged -= value; }
        }

        Action<EnvParams> envParamsChanged;

        /// <summary>Parameter sets the server sent that broke protocol 1.7's rules (§19.1) and were ignored.</summary>
        public int EnvParamsIgnored { get { return link.EnvParamsIgnored; } }

        /// <summary>
        /// The values episode <paramref name="episodeId"/> plays with (protocol 1.7, §19.1), by parameter name:
        /// each fixed number of the set held when it started, and what each sampler gave then (drawn with the
        /// client's generator, the one that samples actions). They stay the episode's to its end, whatever set
        /// comes meanwhile. Empty when the client held no set as it started. INVALID_ARGUMENT for an episode
        /// the client does not know (<see cref="ReportMeasure"/> says which it knows).
        /// </summary>
        public IReadOnlyDictionary<string, double> EpisodeParams(string episodeId)
        {
            EpisodeEnvParams drawn = DrawnParams(episodeId, "EpisodeParams");
            return drawn == null ? EpisodeEnvParams.NoValues : drawn.Values;
        }

        /// <summary>
        /// Reports episode <paramref name="episodeId"/>'s measure (protocol 1.7, §19.3): a score a curriculum may
        /// advance lessons on, sent in <c>env_params</c> with the record that ends the episode (a later report
        /// replaces an earlier one); an episode without values (<see cref="EpisodeParams"/> empty) or not recorded
        /// sends none. Refused with NON_FINITE_VALUE for a value that is not finite or whose magnitude is beyond
        /// 1e300, and INVALID_ARGUMENT for an episode the client does not know: a <see cref="TetherClient"/>
        /// knows its running episodes (report before EndEpisode), a <see cref="MultiAgentClient"/> also the ended
        /// ones whose last steps it has not cut into a batch yet.
        /// </summary>
        public void ReportMeasure(string episodeId, double value)
        {
            DrawnParams(episodeId, "ReportMeasure");  // (an unknown episode first, as every SDK checks)
            SetMeasure(episodeId, EpisodeEnvParams.CheckMeasure(value, "ReportMeasure"), "ReportMeasure");
        }

        /// <summary>Connections re-established after a loss.</summary>
        public int Reconnects { get { return link.Reconnects; } }

        /// <summary>
        /// Redirects followed (protocol 1.9, §6.7): a server that is one rank of a group asked this client, in its
        /// PONG, to move to a less loaded rank, and the client was served there. A redirect is no reconnect (nothing
        /// but PING was sent on the connection it left) and no new connection for the client's counters; a rank
        /// that could not be reached sends the client back to the one that redirected it, uncounted.
        /// </summary>
        public int Redirects { get { return link.Redirects; } }

        /// <summary>
        /// "host:port" (an IPv6 host in brackets) of the server this client's connection was made to: the options'
        /// address, or (protocol 1.9, §6.7) another rank of the server's group, reached by a redirect or by a
        /// reconnect after its rank went away (attempts go to the lost rank first, then to the others the last PONG
        /// named, in order). While the client reconnects, that of the last connection made.
        /// </summary>
        public string ConnectedAddress { get { return link.ConnectedAddress; } }

        /// <summary>Batches dropped because the server took them slower than the game made them.</summary>
        public int BatchesDropped { get { return link.BatchesDropped; } }

        /// <summary>Heartbeat PINGs sent while the connection was idle (§6.6).</summary>
        public int HeartbeatsSent { get { return link.HeartbeatsSent; } }

        /// <summary>
        /// Steps (agent steps, for a <see cref="MultiAgentClient"/>) the server refused as too stale to be
        /// trained (§13.2): it answered for them but will not train on them, so acting faster than it
        /// learns wastes them. Added up from SET_STATE's steps_refused_stale over every connection.
        /// </summary>
        public long StepsRefusedStale { get { return link.StepsRefusedStale; } }

        /// <summary>
        /// The share of new training episodes this client records (SET_STATE record_share,
        /// §13.2): the last valid value the server sent, 1 (every episode) until one came
        /// and whenever a SET_STATE comes without one.
        /// </summary>
        public double RecordShare { get { return link.RecordShare; } }

        /// <summary>
        /// Whether the client acts from an offline policy file (<see cref="ClientOptions.OfflinePolicy"/>, §20): no
        /// server; nothing is recorded for training or sent.
        /// </summary>
        public bool Offline { get { return !string.IsNullOrEmpty(options.OfflinePolicy); } }

        /// <summary>
        /// Steps (agent steps, for a <see cref="MultiAgentClient"/>) played in training episodes (recorded
        /// or held back) per batch (SET_STATE steps_per_batch, §13.2): env_steps_per_sample, or fewer
        /// while the server holds clients back and asks for smaller, fresher batches. The last valid
        /// value the server sent, at most env_steps_per_sample; env_steps_per_sample until one came and
        /// whenever a SET_STATE comes without one.
        /// </summary>
        public int StepsPerBatch { get { return BatchSteps(); } }

        /// <summary>
        /// Training episodes held back: played (every agent's policy acted, returns counted) but none
        /// of their steps recorded or sent, as the server's record_share asked (§13.2).
        /// </summary>
        public long EpisodesHeldBack { get { return episodesHeldBack; } }

        /// <summary>
        /// Steps let go because they were to be sent to a server older than protocol 1.6 (§15): a record (a
        /// multi-agent client's agent entry) holding a logged step is not sent to such a server, which would
        /// train on it as its policy's sample. Only a batch resent after a reconnect to an older server can
        /// meet one (LogAction refuses while the server is older); 0 otherwise.
        /// </summary>
        public long LoggedStepsDropped { get { return link.LoggedStepsDropped; } }

        /// <summary>
        /// Agent steps not sent because they were acted with the weights of another server run (protocol 1.8,
        /// §6.5: a reconnect reached a server restarted without resuming, its PONG naming another run_id than
        /// the connection's before): the steps recorded and not cut into a batch yet when the game's thread took
        /// the new connection (its episodes go on, each one's next chunk from its next observation, and recurrent
        /// states start again from zeros), and those of batches cut before it and not answered (not resent,
        /// unlike a batch resent to the same run; not an error). 0 while every server names the same run, or
        /// names none (a server older than 1.8: the client cannot tell, and sends them).
        /// </summary>
        public long OtherRunStepsDropped { get { return otherRunUnsentDropped + link.OtherRunStepsDropped; } }

        /// <summary>
        /// Whether the client is writing a demonstration file (protocol 1.6, §18; <see cref="ClientOptions.DemoPath"/>).
        /// It stops for good when a reconnect's server describes other spaces than the file's header names
        /// (its running episodes are then written as truncated), or when a line could not be written.
        /// </summary>
        public bool RecordsDemonstrations { get { return demos != null; } }

        /// <summary>Agent episodes written to the demonstration file so far (<see cref="ClientOptions.DemoPath"/>).</summary>
        public int DemonstrationsWritten { get { return demosWritten + (demos == null ? 0 : demos.EpisodesWritten); } }

        /// <summary>This client's session id (exactly-once batches, §13.5).</summary>
        public string ClientSession { get { return link.ClientSession; } }

        /// <summary>Whether a batch is queued or in flight.</summary>
        public bool Sending { get { return link.Busy; } }

        /// <summary>
        /// Null while training goes on. Once the server said its run is done (ERROR TRAINING_DONE,
        /// protocol 1.3, §6.6 "End of training"), the summary it sent: why (Reason), the run's totals
        /// (EnvSteps, AgentSteps, AgentStepsTrained, Updates, Episodes), the last WeightsSeqNo and
        /// ReturnMean. The normal end of training, not an error: no exception is raised and
        /// <see cref="FatalError"/> stays null; the client does not reconnect, the batches not yet
        /// answered are discarded (<see cref="BatchesUnsentAtEnd"/>), and GetAction (GetActions),
        /// EndEpisode and Flush go on without waiting, acting with the last models and recording
        /// nothing. A multi-agent client's agents already mapped keep their module; a server that
        /// maps with a function cannot map new ones any more (their GetActions throws TRAINING_DONE,
        /// as any MAP_AGENTS then does).
        /// </summary>
        public TrainingSummary TrainingDone { get { return link.TrainingDone; } }

        /// <summary>
        /// Batches discarded because training was done before they were sent or answered (§6.6):
        /// queued or in flight when it ended, cut afterwards, and the steps recorded but not cut
        /// yet then (as one). 0 while training goes on.
        /// </summary>
        public int BatchesUnsentAtEnd { get { return link.BatchesUnsentAtEnd; } }

        /// <summary>
        /// The error that ended the link for good (the server could not be
        /// reached again within ReconnectTimeoutSeconds; CLOSED once Dispose
        /// was called); null while it lives. Every later call throws it.
        /// </summary>
        public TetherException FatalError { get { return fatal; } }

        /// <summary>
        /// Sends every complete step now and waits until the server has every batch (or <paramref name="seconds"/> pass).
        /// Once training is done (<see cref="TrainingDone"/>) it returns at once: nothing is sent any more.
        /// </summary>
        public void Flush(double seconds = 60)
        {
            Poll();
            SendBatch(false);  // (a cut, even of nothing: the held-back steps count anew)
            if (!link.WaitIdle(seconds)) throw new TetherException(ErrorCode.Timeout, "the server at " + options.Address + " did not take every batch within " + seconds + " s (Flush)");
            Sync();
        }

        /// <summary>
        /// Stops the I/O thread and releases the models. Steps not sent are dropped (call Flush first to keep them).
        /// A demonstration file (<see cref="ClientOptions.DemoPath"/>) gets the episodes still running, each as
        /// truncated at its last complete step, and is closed.
        /// </summary>
        public void Dispose()
        {
            try
            {
                StopDemonstrations();
            }
            catch (IOException)
            {
                // (a file that cannot be written to any more: its complete lines stay)
            }
            if (fatal == null) fatal = new TetherException(ErrorCode.Closed, "the client was disposed");
            link.Dispose();
            ReleaseModels();
        }

        // ---- what each client does its own way ---------------------------------------------

        // Whether a SET_CONFIG has been applied.
        internal abstract bool Configured { get; }

        // Applies a connection's SET_CONFIG, and then its first state.
        internal abstract void Connected(LinkEvent e);

        // Swaps in the model(s) and weights version a SET_STATE brought.
        internal abstract void Apply(PreparedState state);

        // Stops recording these episodes: the rest of them is not sent (a refused batch's, or those of a
        // batch the full queue dropped: the server never sees a fragment of an episode as if it were whole).
        internal abstract void ForgetEpisodes(ICollection<string> episodeIds);

        // The server took the batch: its steps count as sent.
        internal abstract void Answered(Batch batch);

        // The batch's arrays go back for reuse.
        internal abstract void Recycle(Batch batch);

        // The server's run is done (§6.6): what the episodes recorded and had not cut yet is let go, and
        // they play on unrecorded. Returns whether such steps were let go (they count as one batch).
        internal abstract bool StopRecording();

        // Cuts every complete step into a batch and queues it. `sendEmpty`: sent even without records
        // (held-back episodes made it due), for its answer.
        internal abstract void SendBatch(bool sendEmpty);

        // Releases the models (the link has stopped).
        internal abstract void ReleaseModels();

        // Called with the events about to be applied, before any is.
        internal virtual void Taking(List<LinkEvent> events) { }

        // 1.7: the values drawn for the episode when it started (null: none); INVALID_ARGUMENT naming `call`
        // for an episode the client does not know.
        internal abstract EpisodeEnvParams DrawnParams(string episodeId, string call);

        // 1.7: keeps the episode's measure for the record that ends it; INVALID_ARGUMENT as DrawnParams.
        internal abstract void SetMeasure(string episodeId, double measure, string call);

        // ---- shared ---------------------------------------------------------------------------

        // Connects and takes the handshake's events; on a failure, or without a SET_CONFIG (TRAINING_DONE when
        // the server's run ended first), disposes of the client and throws.
        internal void Open()
        {
            try
            {
                link.Start();
                Sync();
                if (!Configured)
                {
                    TrainingSummary done = link.TrainingDone;
                    if (done != null)
                    {
                        throw new TetherException(ErrorCode.TrainingDone, "the server at " + options.Address + " ended its run (training is done: " +
                                                  done + ") before the handshake finished");
                    }
                    throw new TetherException(ErrorCode.NotReady, "the server sent no configuration");
                }
            }
            catch
            {
                Dispose();
                throw;
            }
        }

        // Takes the I/O thread's news when there is any, and raises the next error not raised yet.
        internal void Poll()
        {
            if (link.EventsPending) TakeEvents();
            RaisePending();
        }

        // Takes every event, then raises the next error not raised yet (a fatal one on every call).
        internal void Sync()
        {
            TakeEvents();
            RaisePending();
        }

        internal void RaisePending()
        {
            if (fatal != null) throw fatal;
            if (errors.Count > 0) throw errors.Dequeue();
        }

        // Applies what the I/O thread reported, in order; errors wait for RaisePending.
        internal void TakeEvents()
        {
            taken.Clear();
            link.TakeEvents(taken);
            if (taken.Count > 0) Taking(taken);
            bool changed = false;
            foreach (LinkEvent e in taken)
            {
                switch (e.Kind)
                {
                    case LinkEventKind.Connected:
                        {
                            // (1.8, §6.5) whether this connection reached another server run than the one before it
                            string run = ServerRuns.RunIdOf(e.Info);
                            runChanged = ServerRuns.FromAnotherRun(runId, run);
                            runId = run;
                        }
                        Connected(e);
                        changed |= TakeEnvParams(e.State);
                        break;
                    case LinkEventKind.State:
                        connection = e.Connection;
                        Apply(e.State);
                        changed |= TakeEnvParams(e.State);
                        break;
                    case LinkEventKind.Batch:
                        if (e.Batch.OtherRun)
                        {
                            // (1.8, §6.5) acted with another run's weights: not sent, counted by the link; its episodes go on
                        }
                        else if (e.Batch.Error != null)
                        {
                            errors.Enqueue(e.Batch.Error);
                            ForgetEpisodes(e.Batch.EpisodeIds);
                        }
                        else
                        {
                            Answered(e.Batch);
                        }
                        Recycle(e.Batch);
                        break;
                    case LinkEventKind.Error:
                        errors.Enqueue(e.Error);
                        break;
                    case LinkEventKind.Fatal:
                        if (fatal == null) fatal = e.Error;
                        break;
                    case LinkEventKind.TrainingDone:
                        ended = true;
                        if (StopRecording()) link.CountUnsentAtEnd();
                        break;
                }
            }
            taken.Clear();
            // (once, every event applied, with the set held now: a handler that throws leaves none half taken,
            // and none is applied again)
            Action<EnvParams> handler = envParamsChanged;
            if (changed && handler != null) handler(envParams);
        }

        // 1.7 (§19.2): swaps in the set an answer carried, or drops the held one when the answer says the server
        // has no parameters. Whether the set held changed (a new set always does; a drop only when one was held).
        bool TakeEnvParams(PreparedState state)
        {
            if (state == null) return false;
            if (state.EnvParams != null)
            {
                envParams = state.EnvParams;
                return true;
            }
            if (!state.DropEnvParams || envParams == null) return false;
            envParams = null;
            return true;
        }

        // 1.7 (§19.1): a new episode's values, drawn from the set held now with the client's generator; null without a set.
        internal EpisodeEnvParams DrawEpisodeParams()
        {
            EnvParams set = envParams;
            return set == null ? null : set.Draw(uniform);
        }

        // Queues a cut batch, whose steps' versions are compared on this connection (§7.6); `sendEmpty`: sent
        // even without records. Returns whether it was queued (else it is reused at once). A batch the
        // full queue dropped is reused too, its episodes forgotten. `wait` (strict on-policy): waits for
        // the server's answer, TIMEOUT after UpdateTimeoutSeconds.
        internal bool Submit(Batch batch, bool sendEmpty, bool wait)
        {
            batch.VersionsConnection = connection;
            batch.SendEmpty = sendEmpty;
            bool queued = link.Submit(batch, dropped, droppedBatches);
            // Batches dropped from the queue are no one else's: their arrays are reused.
            foreach (Batch gone in droppedBatches) Recycle(gone);
            droppedBatches.Clear();
            if (dropped.Count > 0) ForgetEpisodes(dropped);
            if (!queued)
            {
                Recycle(batch);
                return false;
            }
            if (wait && !link.WaitFor(batch, options.UpdateTimeoutSeconds))
            {
                throw new TetherException(ErrorCode.Timeout, "server " + options.Address + " did not answer a batch within " + options.UpdateTimeoutSeconds + " s (UpdateTimeoutSeconds)");
            }
            return true;
        }

        // ---- demonstrations (1.6, §18) ------------------------------------------------------------

        // Creates the demonstration file of these modules' spaces (the server's) when one is asked for and none
        // is written yet: at the first configuration. The file system's exception when it cannot be created.
        internal void StartDemonstrations(IDictionary<string, ModuleSpec> modules)
        {
            if (options.DemoPath == null || demos != null || demosStopped) return;
            demos = new DemoWriter(options.DemoPath, modules);
        }

        // Writes the running episodes (as truncated) and closes the file; nothing more is written to it.
        internal void StopDemonstrations()
        {
            if (demos == null) return;
            DemoWriter closing = demos;
            demos = null;
            demosStopped = true;
            demosWritten += closing.EpisodesWritten;
            closing.Dispose();
        }

        // Ends an actor's demonstration episode (its final observation at obs[at...]): a line that cannot be
        // written stops the recording and is raised once, at the next call, as the client's other errors are.
        internal void EndDemonstration(string episodeId, string agentId, float[] obs, int at, bool terminated)
        {
            try
            {
                demos.EndRow(episodeId, agentId, obs, at, terminated);
            }
            catch (IOException e)
            {
                errors.Enqueue(new TetherException(ErrorCode.InvalidArgument, "the demonstration file " + options.DemoPath + " could not be written (" +
                                                   e.Message + "): demonstration recording stopped", e));
                try
                {
                    StopDemonstrations();
                }
                catch (IOException)
                {
                }
            }
        }

        // Steps per batch: env_steps_per_sample, or fewer when the server asks (SET_STATE steps_per_batch, §13.2).
        internal int BatchSteps()
        {
            return Tether.Protocol.StepsPerBatch.Effective(link.StepsPerBatch, stepsPerSample);
        }

        // Whether a new training episode is recorded: with the probability record_share (§13.2), one
        // draw per episode, for all its agents. At share 1 no number is drawn, so the actions sampled
        // are those of a client without shares.
        internal bool Records()
        {
            double share = link.RecordShare;
            if (share >= 1.0 || rng.Uniform() < share) return true;
            ++episodesHeldBack;
            return false;
        }
    }
}
