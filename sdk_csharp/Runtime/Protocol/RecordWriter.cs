// Episode records written straight to JSON text: the I/O thread's fast path.
// Building a JToken per number (EpisodeRecords.Encode) costs tens of
// milliseconds for a few thousand steps; this writes the same JSON, number by
// number, into one reused buffer, without allocating: the game's thread shares
// the garbage collector, and every collection would stop it too.
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Text;
using Newtonsoft.Json;

namespace Tether.Protocol
{
    /// <summary>
    /// One module's recorded steps in columns, one row per agent step: the observation (and its
    /// centralized-critic row) and, for a row that has one, the action taken after it with its
    /// reward, logp, dist inputs, weights version and the connection that version was learned
    /// on, and (protocol 1.6) whether the action was logged. A frame appends its rows with a few block copies; an agent's steps are the rows its
    /// list of row numbers names. A cut hands the table to the batch and moves the rows the agents
    /// keep to a fresh one: the writer reads the cut steps from the table, and the table is reused
    /// once the batch is answered. A Discrete step's logp may be NaN, left for the sending thread to
    /// take as it writes the step (the multi-agent client's steady-state frames).
    /// </summary>
    internal sealed class StepTable
    {
        public int ObsDim, ValueDim, ActDim, DistDim;
        public int StateDim;  // protocol 1.5: a module with memory's state width (0 without): the state each action row's observation was fed with
        public int Rows;
        public float[] Obs = new float[0];
        public float[] ValueObs = new float[0];
        public double[] Actions = new double[0];
        public double[] Rewards = new double[0];  // a step's logged rewards summed, as doubles (§10.5)
        public double[] Logp = new double[0];  // NaN: a Discrete draw's, left for later (taken from Dist and Actions when written)
        public float[] Dist = new float[0];
        public float[] State = new float[0];
        public bool[] Logged = new bool[0];  // protocol 1.6: the action row's action was logged (chosen outside the policy)
        // The weights version of the action rows (-1: unknown) and the connection it was learned on,
        // by runs of rows: rows from runStart[i] on have runVersion[i] (most tables have one run).
        int[] runStart = new int[4];
        long[] runVersion = new long[4];
        int[] runConnection = new int[4];
        int runs;

        /// <summary>Empties it for rows of these sizes.</summary>
        public void Reset(int obsDim, int valueDim, int actDim, int distDim, int stateDim = 0)
        {
            StateDim = stateDim;
            ObsDim = obsDim;
            ValueDim = valueDim;
            ActDim = actDim;
            DistDim = distDim;
            Rows = 0;
            runs = 0;
        }

        static T[] Grown<T>(T[] array, int needed, int keep)
        {
            var grown = new T[Math.Max(needed, 2 * array.Length)];
            Array.Copy(array, grown, Math.Min(keep, array.Length));
            return grown;
        }

        /// <summary>Room for <paramref name="rows"/> rows.</summary>
        public void Reserve(int rows)
        {
            if (rows * ObsDim > Obs.Length) Obs = Grown(Obs, Math.Max(rows, 64) * ObsDim, Rows * ObsDim);
            if (rows * ValueDim > ValueObs.Length) ValueObs = Grown(ValueObs, Math.Max(rows, 64) * ValueDim, Rows * ValueDim);
            if (rows * ActDim > Actions.Length) Actions = Grown(Actions, Math.Max(rows, 64) * ActDim, Rows * ActDim);
            if (rows * DistDim > Dist.Length) Dist = Grown(Dist, Math.Max(rows, 64) * DistDim, Rows * DistDim);
            if (rows * StateDim > State.Length) State = Grown(State, Math.Max(rows, 64) * StateDim, Rows * StateDim);
            if (rows > Rewards.Length)
            {
                int size = Math.Max(rows, 64);
                Rewards = Grown(Rewards, size, Rows);
                Logp = Grown(Logp, size, Rows);
                Logged = Grown(Logged, size, Rows);
            }
        }

        /// <summary>Whether the action rows have one version (learned on one connection): <see cref="Version"/>; or none at all.</summary>
        public bool OneVersion { get { return runs <= 1; } }

        /// <summary>The version of every action row when <see cref="OneVersion"/> (-1 without any).</summary>
        public long Version { get { return runs == 0 ? -1 : runVersion[0]; } }

        /// <summary>The connection <see cref="Version"/> was learned on.</summary>
        public int Connection { get { return runs == 0 ? 0 : runConnection[0]; } }

        /// <summary>Notes that the action rows from <paramref name="row"/> on (the last ones) have this version.</summary>
        public void NoteVersion(int row, long version, int connection)
        {
            if (runs > 0 && runVersion[runs - 1] == version && runConnection[runs - 1] == connection) return;
            if (runs == runStart.Length)
            {
                Array.Resize(ref runStart, 2 * runs);
                Array.Resize(ref runVersion, 2 * runs);
                Array.Resize(ref runConnection, 2 * runs);
            }
            runStart[runs] = row;
            runVersion[runs] = version;
            runConnection[runs] = connection;
            ++runs;
        }

        int RunOf(int row)
        {
            int low = 0, high = runs - 1;  // the last run starting at or before the row
            while (low < high)
            {
                int mid = (low + high + 1) / 2;
                if (runStart[mid] <= row) low = mid;
                else high = mid - 1;
            }
            return low;
        }

        /// <summary>Action row <paramref name="row"/>'s weights version (-1: unknown).</summary>
        public long VersionOf(int row) { return runs == 0 ? -1 : runVersion[RunOf(row)]; }

        /// <summary>The connection action row <paramref name="row"/>'s version was learned on.</summary>
        public int ConnectionOf(int row) { return runs == 0 ? 0 : runConnection[RunOf(row)]; }

        /// <summary>
        /// Copies row <paramref name="row"/> of <paramref name="from"/> (of the same sizes) into a new
        /// row; returns it. <paramref name="withAction"/>: the row holds an action (else only the observation counts).
        /// </summary>
        public int CopyRow(StepTable from, int row, bool withAction)
        {
            int to = Rows;
            Reserve(to + 1);
            for (int j = 0; j < ObsDim; ++j) Obs[to * ObsDim + j] = from.Obs[row * ObsDim + j];
            for (int j = 0; j < ValueDim; ++j) ValueObs[to * ValueDim + j] = from.ValueObs[row * ValueDim + j];
            if (withAction)
            {
                for (int j = 0; j < ActDim; ++j) Actions[to * ActDim + j] = from.Actions[row * ActDim + j];
                for (int j = 0; j < DistDim; ++j) Dist[to * DistDim + j] = from.Dist[row * DistDim + j];
                if (StateDim > 0) Array.Copy(from.State, row * StateDim, State, to * StateDim, StateDim);
                Rewards[to] = from.Rewards[row];
                Logp[to] = from.Logp[row];
                Logged[to] = from.Logged[row];
                int run = from.RunOf(row);
                NoteVersion(to, from.runVersion[run], from.runConnection[run]);
            }
            Rows = to + 1;
            return to;
        }
    }

    /// <summary>
    /// Writes a JSON array of episode records (§10.1, §10.7) as text, the same
    /// values as EpisodeRecords.Encode / EncodeAgentEntry give (float32 values as
    /// their shortest decimal, which may use an exponent where Encode does not:
    /// the same number; a byte box's observations as integers). Not thread-safe;
    /// reuse one per thread.
    /// </summary>
    public sealed class RecordWriter
    {
        static readonly UTF8Encoding Utf8 = new UTF8Encoding(false, true);  // (as Messages encodes a body)

        char[] text = new char[1 << 16];
        int length;
        readonly char[] number = new char[64];
        int records;
        int entries;
        // A message's binary attachment (1.4, §4.3): the bytes of its uint8 observation tensors (§10.9).
        byte[] attachment = new byte[0];
        int attachmentLength;
        bool tensors;         // a byte box's observations go as tensors in the attachment
        bool withAttachment;  // a tensor refers to the attachment (which may then be empty)

        // ---- text -----------------------------------------------------------------------------

        void Reserve(int more)
        {
            if (length + more <= text.Length) return;
            var grown = new char[Math.Max(length + more, 2 * text.Length)];
            Array.Copy(text, grown, length);
            text = grown;
        }

        void Append(char c)
        {
            if (length == text.Length) Reserve(1);
            text[length++] = c;
        }

        void Append(string s)
        {
            int n = s.Length;
            Reserve(n);
            s.CopyTo(0, text, length, n);
            length += n;
        }

        void Append(char[] chars, int n)
        {
            Reserve(n);
            Array.Copy(chars, 0, text, length, n);
            length += n;
        }

        void Integer(long value)
        {
            Reserve(20);
            if (value < 0)
            {
                if (value == long.MinValue)
                {
                    Append("-9223372036854775808");
                    return;
                }
                text[length++] = '-';
                value = -value;
            }
            int n = 0;
            do
            {
                number[n++] = (char)('0' + (int)(value % 10));
                value /= 10;
            } while (value != 0);
            while (n > 0) text[length++] = number[--n];
        }

        // A JSON string as JsonConvert.ToString writes it; plain ASCII without quotes or
        // backslashes (every id Tether makes) is copied as it is.
        void String(string s)
        {
            foreach (char c in s)
            {
                if (c < 0x20 || c > 0x7e || c == '"' || c == '\\')
                {
                    Append(JsonConvert.ToString(s));
                    return;
                }
            }
            Reserve(s.Length + 2);
            text[length++] = '"';
            s.CopyTo(0, text, length, s.Length);
            length += s.Length;
            text[length++] = '"';
        }

        /// <summary>Starts a new array of records.</summary>
        public void Begin()
        {
            length = 0;
            Append('[');
            records = 0;
            tensors = withAttachment = false;
            attachmentLength = 0;
        }

        /// <summary>The array written so far, closed.</summary>
        public string Finish()
        {
            Append(']');
            return new string(text, 0, length);
        }

        // ---- a whole message ------------------------------------------------------------------

        /// <summary>
        /// Starts a message {"type": type, "episodes": [records...: write them, then EndEpisodes and the other fields.
        /// <paramref name="byteTensors"/> (for a server of 1.4 or later): a byte box's observations go as one
        /// uint8 tensor per record or agent entry, their bytes in the body's attachment (§10.9, §4.3).
        /// </summary>
        internal void BeginMessage(string type, bool byteTensors = false)
        {
            length = 0;
            tensors = byteTensors;
            withAttachment = false;
            attachmentLength = 0;
            Append("{\"type\":");
            String(type);
            Append(",\"episodes\":[");
            records = 0;
        }

        /// <summary>Closes the episodes array of the message begun last.</summary>
        internal void EndEpisodes()
        {
            Append(']');
        }

        void FieldName(string name)
        {
            Append(',');
            String(name);
            Append(':');
        }

        /// <summary>An integer field of the message.</summary>
        internal void Field(string name, long value)
        {
            FieldName(name);
            Integer(value);
        }

        /// <summary>A string field of the message.</summary>
        internal void Field(string name, string value)
        {
            FieldName(name);
            String(value);
        }

        /// <summary>A field of the message holding an object of integers.</summary>
        internal void Field(string name, Dictionary<string, long> values)
        {
            FieldName(name);
            Append('{');
            bool first = true;
            foreach (KeyValuePair<string, long> item in values)
            {
                if (!first) Append(',');
                first = false;
                String(item.Key);
                Append(':');
                Integer(item.Value);
            }
            Append('}');
        }

        /// <summary>
        /// Closes the message and frames it (§3) into <paramref name="frame"/> (grown when it is too
        /// small), its JSON followed by a NUL byte and the attachment when a tensor refers to one
        /// (§4.3); returns the frame's length. FRAME_TOO_LARGE when the body does not fit the header.
        /// </summary>
        internal int EndMessage(ref byte[] frame)
        {
            Append('}');
            int extra = withAttachment ? 1 + attachmentLength : 0;
            long most = (long)Framing.HeaderSize + Utf8.GetMaxByteCount(length) + extra;
            if (most > int.MaxValue - 64)
            {
                throw new ProtocolException(ErrorCode.FrameTooLarge, "a body of about " + most + " bytes does not fit an 8-digit header");
            }
            if (frame == null || frame.Length < most) frame = new byte[Math.Max((int)most, frame == null ? 0 : (int)Math.Min(2L * frame.Length, int.MaxValue - 64))];
            int body = Utf8.GetBytes(text, 0, length, frame, Framing.HeaderSize);
            if (withAttachment)
            {
                frame[Framing.HeaderSize + body] = 0;
                Buffer.BlockCopy(attachment, 0, frame, Framing.HeaderSize + body + 1, attachmentLength);
                body += extra;
            }
            if (body > Framing.MaxEncodableBody)
            {
                throw new ProtocolException(ErrorCode.FrameTooLarge, "a body of " + body + " bytes does not fit an 8-digit header");
            }
            for (int i = Framing.HeaderSize - 1, left = body; i >= 0; --i, left /= 10) frame[i] = (byte)('0' + left % 10);
            return Framing.HeaderSize + body;
        }

        // ---- records ---------------------------------------------------------------------------

        /// <summary>Appends a single-agent record (with its episode_id when the chunk has one). INVALID_ARGUMENT when an array does not fit.</summary>
        public void SingleAgentRecord(EpisodeChunk chunk, Space observationSpace, Space actionSpace)
        {
            if (records++ > 0) Append(',');
            Append('{');
            Fields(chunk, observationSpace, actionSpace);
            if (chunk.EpisodeId != null)
            {
                Append(",\"episode_id\":");
                String(chunk.EpisodeId);
            }
            if (chunk.EnvParams != null) EnvParamsMember(chunk.EnvParams, chunk.Measure);
            Append('}');
        }

        /// <summary>
        /// ,"env_params":{"seq":s,"values":{name: value...},"measure":m} (protocol 1.7, §19.3) into the record
        /// being written: the values as doubles of round-trip precision, "measure" only when it has a value.
        /// </summary>
        internal void EnvParamsMember(EpisodeEnvParams drawn, double? measure)
        {
            Append(",\"");
            Append(EnvParams.Field);
            Append("\":{\"seq\":");
            Integer(drawn.Seq);
            Append(",\"values\":{");
            for (int i = 0; i < drawn.Count; ++i)
            {
                if (i > 0) Append(',');
                String(drawn.NameAt(i));
                Append(':');
                Float64(drawn.ValueAt(i));
            }
            Append('}');
            if (measure.HasValue)
            {
                Append(",\"measure\":");
                Float64(measure.Value);
            }
            Append('}');
        }

        /// <summary>
        /// One episode line of a demonstration file (protocol 1.6, §18), without its line feed: the chunk
        /// (its observations as JSON numbers, never tensors) with its module, agent and episode ids.
        /// </summary>
        internal string DemoLine(string module, string agentId, string episodeId, EpisodeChunk chunk, Space observationSpace, Space actionSpace)
        {
            length = 0;
            tensors = withAttachment = false;
            attachmentLength = 0;
            Append("{\"module\":");
            String(module);
            Append(",\"agent_id\":");
            String(agentId);
            Append(",\"episode_id\":");
            String(episodeId);
            Append(',');
            Fields(chunk, observationSpace, actionSpace);
            Append('}');
            return new string(text, 0, length);
        }

        /// <summary>Starts a multi-agent record; add its agents with <see cref="AgentEntry"/>, then call <see cref="EndMultiAgentRecord"/>.</summary>
        public void BeginMultiAgentRecord(string episodeId, bool isTerminated, bool isTruncated)
        {
            BeginMultiAgentRecord(episodeId, isTerminated, isTruncated, null, null);
        }

        /// <summary>
        /// <see cref="BeginMultiAgentRecord(string, bool, bool)"/> of an episode played with <paramref name="envParams"/>
        /// (protocol 1.7, §19.3: the record's top-level <c>env_params</c>, with <paramref name="measure"/> when it has
        /// a value: only on the record that ends the episode); null: the episode has none.
        /// </summary>
        public void BeginMultiAgentRecord(string episodeId, bool isTerminated, bool isTruncated, EpisodeEnvParams envParams, double? measure)
        {
            if (records++ > 0) Append(',');
            Append("{\"episode_id\":");
            String(episodeId);
            Append(",\"is_terminated\":");
            Append(isTerminated ? "true" : "false");
            Append(",\"is_truncated\":");
            Append(isTruncated ? "true" : "false");
            if (envParams != null) EnvParamsMember(envParams, measure);
            Append(",\"agents\":{");
            entries = 0;
        }

        /// <summary>Appends one agent entry of the record begun last (see EpisodeRecords.EncodeAgentEntry).</summary>
        public void AgentEntry(string agentId, EpisodeChunk chunk, ModuleSpec module, long startStep, IList<float> valueObs)
        {
            if (entries++ > 0) Append(',');
            String(agentId);
            Append(":{");
            Fields(chunk, module.ObservationSpace, module.ActionSpace);
            EntryEnd(module, startStep, chunk.Steps, valueObs == null ? 0 : valueObs.Count);
            int v = module.ValueObsDim;
            if (v > 0)
            {
                Append(",\"value_obs\":");
                FlatRows(valueObs, null, null, 0, chunk.Steps + 1, v);
            }
            Append('}');
        }

        /// <summary>
        /// Appends one agent entry of the record begun last from a step table (the multi-agent
        /// client's): <paramref name="steps"/> steps, whose steps + 1 rows are
        /// rows[<paramref name="from"/>...]; <paramref name="withVersions"/>: with weights_seq_no_runs;
        /// <paramref name="withLogged"/>: with logged_runs (protocol 1.6: some step was logged).
        /// </summary>
        internal void AgentEntryRows(string agentId, ModuleSpec module, long startStep, StepTable table, int[] rows, int from, int steps,
                                     bool withVersions, bool isTerminated, bool isTruncated, bool withLogged = false)
        {
            if (entries++ > 0) Append(',');
            String(agentId);
            Append(":{");
            Space observationSpace = module.ObservationSpace, actionSpace = module.ActionSpace;
            int obsDim = observationSpace.FlatDim, actDim = actionSpace.FlatDim, k = actionSpace.DistInputsSize, v = module.ValueObsDim;
            RecurrentState state = module.RecurrentState;
            if (obsDim != table.ObsDim || actDim != table.ActDim || k != table.DistDim || v != table.ValueDim || (state == null ? 0 : state.Width) != table.StateDim)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "agent '" + agentId + "': its steps were recorded with other sizes than module '" + module.ModuleId + "' has");
            }
            if (withVersions)
            {
                for (int i = 0; i < steps; ++i)
                {
                    long version = table.VersionOf(rows[from + i]);
                    if (version < 0 || version > VersionRuns.MaxVersion)
                    {
                        throw new TetherException(ErrorCode.InvalidArgument, "a step's weights version " + version + " is not in 0.." + VersionRuns.MaxVersion);
                    }
                }
            }
            bool discrete = actionSpace.Kind != SpaceKind.Box;
            long[] shape = observationSpace.Shape;
            bool bytes = observationSpace.IsBytes;
            if (observationSpace.IsComposite)
            {
                Append("\"obs\":");
                CompositeObs(observationSpace, null, table.Obs, rows, from, steps + 1);
                Append(",\"actions\":[");
            }
            else if (bytes && tensors)
            {
                // One uint8 tensor of shape [T + 1, *shape], its bytes in the attachment (1.4, §10.9).
                int offset = attachmentLength;
                ReserveAttachment((steps + 1) * obsDim);
                for (int r = 0; r <= steps; ++r) CopyBytes(table.Obs, rows[from + r] * obsDim, obsDim);
                Append("\"obs\":");
                TensorAt(steps + 1, shape, offset);
                Append(",\"actions\":[");
            }
            else
            {
                Append("\"obs\":[");
                for (int r = 0; r <= steps; ++r)
                {
                    if (r > 0) Append(',');
                    int row = rows[from + r];
                    if (shape.Length == 1 && !bytes) FlatRow(table.Obs, row * obsDim, obsDim);
                    else NestObs(null, table.Obs, row * obsDim, shape, bytes);
                }
                Append("],\"actions\":[");
            }
            for (int r = 0; r < steps; ++r)
            {
                if (r > 0) Append(',');
                NestAction(null, table.Actions, rows[from + r] * actDim, actionSpace.Shape, discrete);
            }
            Append("],\"rewards\":");
            Column(null, null, null, table.Rewards, rows, from, steps);
            Append(",\"action_logp\":");
            Column(null, null, null, table.Logp, rows, from, steps);
            Append(",\"action_dist_inputs\":");
            FlatRows(null, table.Dist, rows, from, steps, k);
            if (withVersions)
            {
                Append(",\"");
                Append(VersionRuns.Field);
                Append("\":");
                Runs(null, table, rows, from, steps);
            }
            if (state != null) StateIn(state, null, table.State, rows[from] * table.StateDim);
            if (withLogged) LoggedRunsOf(null, table.Logged, rows, from, steps);
            Append(",\"is_terminated\":");
            Append(isTerminated ? "true" : "false");
            Append(",\"is_truncated\":");
            Append(isTruncated ? "true" : "false");
            EntryEnd(module, startStep, steps, v > 0 ? (steps + 1) * v : 0);
            if (v > 0)
            {
                Append(",\"value_obs\":");
                FlatRows(null, table.ValueObs, rows, from, steps + 1, v);
            }
            Append('}');
        }

        // [a, b, ...]: `width` float32 values from `at`.
        void FlatRow(float[] data, int at, int width)
        {
            Append('[');
            for (int j = 0; j < width; ++j)
            {
                if (j > 0) Append(',');
                Float32(data[at + j]);
            }
            Append(']');
        }

        void EntryEnd(ModuleSpec module, long startStep, int steps, int valueObsCount)
        {
            Append(",\"module\":");
            String(module.ModuleId);
            Append(",\"start_step\":");
            Integer(startStep);
            int v = module.ValueObsDim;
            if (v > 0) EpisodeRecords.CheckSize("value_obs", valueObsCount, (steps + 1) * v);
        }

        /// <summary>Closes the multi-agent record begun last.</summary>
        public void EndMultiAgentRecord()
        {
            Append("}}");
        }

        void Fields(EpisodeChunk chunk, Space observationSpace, Space actionSpace)
        {
            EpisodeRecords.CheckChunk(chunk, observationSpace, actionSpace);
            int steps = chunk.Steps, actDim = actionSpace.FlatDim, k = actionSpace.DistInputsSize;
            bool discrete = actionSpace.Kind != SpaceKind.Box;
            Append("\"obs\":");
            if (observationSpace.IsComposite)
            {
                CompositeObs(observationSpace, chunk.Obs, null, null, 0, steps + 1);
            }
            else if (observationSpace.IsBytes && tensors)
            {
                // One uint8 tensor of shape [T + 1, *shape], its bytes in the attachment (1.4, §10.9).
                int offset = attachmentLength, n = chunk.Obs.Count;
                ReserveAttachment(n);
                List<float> obs = chunk.Obs;
                for (int i = 0; i < n; ++i) attachment[attachmentLength++] = ByteOf(obs[i]);
                TensorAt(steps + 1, observationSpace.Shape, offset);
            }
            else
            {
                RowsOfFloats(chunk.Obs, steps + 1, observationSpace.Shape, observationSpace.IsBytes);
            }
            Append(",\"actions\":[");
            for (int r = 0; r < steps; ++r)
            {
                if (r > 0) Append(',');
                NestAction(chunk.Actions, null, r * actDim, actionSpace.Shape, discrete);
            }
            Append("],\"rewards\":");
            Column(null, null, chunk.Rewards, null, null, 0, steps);
            if (chunk.ActionLogp.Count != 0)
            {
                Append(",\"action_logp\":");
                Column(null, null, chunk.ActionLogp, null, null, 0, steps);
            }
            if (chunk.ActionDistInputs.Count != 0)
            {
                Append(",\"action_dist_inputs\":");
                FlatRows(chunk.ActionDistInputs, null, null, 0, steps, k);
            }
            if (chunk.StepVersions.Count != 0)
            {
                Append(",\"");
                Append(VersionRuns.Field);
                Append("\":");
                Runs(chunk.StepVersions, null, null, 0, chunk.StepVersions.Count);
            }
            if (chunk.State != null) StateIn(chunk.State, chunk.StateIn, null, 0);
            if (LoggedRuns.Any(chunk.Logged, chunk.Logged.Count)) LoggedRunsOf(chunk.Logged, null, null, 0, steps);
            Append(",\"is_terminated\":");
            Append(chunk.IsTerminated ? "true" : "false");
            Append(",\"is_truncated\":");
            Append(chunk.IsTruncated ? "true" : "false");
        }

        // ,"state_in":{"input": [size values], ...} (protocol 1.5, §10.1): a chunk's list, or else a step
        // table's array, tensor k's values from offset + k * size.
        void StateIn(RecurrentState state, List<float> list, float[] array, int offset)
        {
            Append(",\"state_in\":{");
            string[] names = state.InputNames;
            int size = state.Size;
            for (int k = 0; k < names.Length; ++k)
            {
                if (k > 0) Append(',');
                String(names[k]);
                Append(":[");
                for (int j = 0, at = offset + k * size; j < size; ++j)
                {
                    if (j > 0) Append(',');
                    Float32(list != null ? list[at + j] : array[at + j]);
                }
                Append(']');
            }
            Append('}');
        }

        // weights_seq_no_runs as VersionRuns.ToJson gives them, [[version, steps], ...], of `count` steps: a
        // chunk's `versions`, or else the versions of `table`'s rows rows[from...].
        void Runs(List<long> versions, StepTable table, int[] rows, int from, int count)
        {
            Append('[');
            for (int i = 0; i < count;)
            {
                long version = versions != null ? versions[i] : table.VersionOf(rows[from + i]);
                int run = 1;
                while (i + run < count && (versions != null ? versions[i + run] : table.VersionOf(rows[from + i + run])) == version) ++run;
                if (i > 0) Append(',');
                Append('[');
                Integer(version);
                Append(',');
                Integer(run);
                Append(']');
                i += run;
            }
            Append(']');
        }

        // ,"logged_runs":[[start, n], ...] (protocol 1.6, §10.1) as LoggedRuns.ToJson gives them, of `count`
        // steps: a chunk's flags, or else those of `table` rows rows[from...] (`flags`, the table's Logged).
        void LoggedRunsOf(List<bool> list, bool[] flags, int[] rows, int from, int count)
        {
            Append(",\"");
            Append(LoggedRuns.Field);
            Append("\":[");
            bool first = true;
            for (int t = 0; t < count;)
            {
                if (!(list != null ? list[t] : flags[rows[from + t]]))
                {
                    ++t;
                    continue;
                }
                int n = 1;
                while (t + n < count && (list != null ? list[t + n] : flags[rows[from + t + n]])) ++n;
                if (!first) Append(',');
                first = false;
                Append('[');
                Integer(t);
                Append(',');
                Integer(n);
                Append(']');
                t += n;
            }
            Append(']');
        }

        // [v0, v1, ...]: one value per step (float32 values, or else float64 ones), a chunk list's first
        // `count`, or else (with `rows`) a step table array's at rows[from...].
        void Column(List<float> list32, float[] array32, List<double> list64, double[] array64, int[] rows, int from, int count)
        {
            Append('[');
            for (int r = 0; r < count; ++r)
            {
                if (r > 0) Append(',');
                int at = rows != null ? rows[from + r] : r;
                if (list32 != null) Float32(list32[at]);
                else if (array32 != null) Float32(array32[at]);
                else if (list64 != null) Float64(list64[at]);
                else Float64(array64[at]);
            }
            Append(']');
        }

        // [[...], ...]: `count` rows of `width` float32 values, a list's first ones, or else (with `rows`) an
        // array's rows rows[from...].
        void FlatRows(IList<float> list, float[] array, int[] rows, int from, int count, int width)
        {
            Append('[');
            for (int r = 0; r < count; ++r)
            {
                if (r > 0) Append(',');
                int at = (rows != null ? rows[from + r] : r) * width;
                if (array != null)
                {
                    FlatRow(array, at, width);
                    continue;
                }
                Append('[');
                for (int j = 0; j < width; ++j)
                {
                    if (j > 0) Append(',');
                    Float32(list[at + j]);
                }
                Append(']');
            }
            Append(']');
        }

        // Rows of observations; `bytes`: a byte box's, written as integers.
        void RowsOfFloats(List<float> flat, int rows, long[] shape, bool bytes)
        {
            int width = 1;
            foreach (long d in shape) width *= (int)d;
            Append('[');
            for (int r = 0; r < rows; ++r)
            {
                if (r > 0) Append(',');
                NestObs(flat, null, r * width, shape, bytes);
            }
            Append(']');
        }

        // ---- byte boxes (1.4) --------------------------------------------------------------------

        // A byte box's value as its byte; OBS_DTYPE_MISMATCH for one that is not an integer 0-255 (the
        // clients refuse such values at the call: a record holding one is not sent).
        static byte ByteOf(float value)
        {
            if (!EpisodeRecords.IsByteValue(value))
            {
                throw new TetherException(ErrorCode.ObsDtypeMismatch, "a record of a uint8 Box holds the observation value " +
                                          value.ToString("R", CultureInfo.InvariantCulture) + "; it is not sent");
            }
            return (byte)value;
        }

        void ReserveAttachment(int more)
        {
            if (attachmentLength + more <= attachment.Length) return;
            long needed = (long)attachmentLength + more;
            if (needed > Framing.MaxEncodableBody)
            {
                throw new ProtocolException(ErrorCode.FrameTooLarge, "an attachment of " + needed + " bytes does not fit an 8-digit header");
            }
            var grown = new byte[Math.Max((int)needed, (int)Math.Min(2L * attachment.Length, Framing.MaxEncodableBody))];
            Buffer.BlockCopy(attachment, 0, grown, 0, attachmentLength);
            attachment = grown;
        }

        void CopyBytes(float[] data, int at, int n)
        {
            byte[] into = attachment;
            int to = attachmentLength;
            for (int i = 0; i < n; ++i) into[to + i] = ByteOf(data[at + i]);
            attachmentLength = to + n;
        }

        // A Dict or Tuple's obs (1.4, §10.1): one member per leaf path, in leaf order, each the leaf's `count`
        // observations: a tensor in the attachment (uint8 for a byte leaf, float32 otherwise, §10.9) for a
        // server of 1.4 or later, JSON numbers otherwise. The rows are `list`'s first `count` rows of the
        // flat row's width, or `array`'s rows rows[from...].
        void CompositeObs(Space space, List<float> list, float[] array, int[] rows, int from, int count)
        {
            int width = space.FlatDim;
            IReadOnlyList<SpaceLeaf> leaves = space.Leaves;
            Append('{');
            for (int l = 0; l < leaves.Count; ++l)
            {
                SpaceLeaf leaf = leaves[l];
                if (l > 0) Append(',');
                String(leaf.Path);
                Append(':');
                long[] shape = leaf.Space.Shape;
                int size = leaf.Size;
                bool bytes = leaf.IsBytes;
                if (tensors)
                {
                    int offset = attachmentLength;
                    ReserveAttachment(count * size * (bytes ? 1 : 4));
                    for (int r = 0; r < count; ++r)
                    {
                        int at = (list != null ? r : rows[from + r]) * width + leaf.Offset;
                        for (int i = 0; i < size; ++i)
                        {
                            float v = list != null ? list[at + i] : array[at + i];
                            if (bytes)
                            {
                                attachment[attachmentLength++] = ByteOf(v);
                            }
                            else
                            {
                                Tensors.WriteFloat32(v, attachment, attachmentLength);
                                attachmentLength += 4;
                            }
                        }
                    }
                    TensorAt(count, shape, offset, bytes ? Tensors.Uint8 : Tensors.Float32);
                    continue;
                }
                Append('[');
                for (int r = 0; r < count; ++r)
                {
                    if (r > 0) Append(',');
                    int at = (list != null ? r : rows[from + r]) * width + leaf.Offset;
                    NestObs(list, array, at, shape, bytes);
                }
                Append(']');
            }
            Append('}');
        }

        // {"dtype":"uint8","shape":[rows,*shape],"offset":offset}: rows observations in the attachment from offset on.
        void TensorAt(int rows, long[] shape, int offset, string dtype = Tensors.Uint8)
        {
            Append("{\"dtype\":\"");
            Append(dtype);
            Append("\",\"shape\":[");
            Integer(rows);
            foreach (long d in shape)
            {
                Append(',');
                Integer(d);
            }
            Append("],\"offset\":");
            Integer(offset);
            Append('}');
            withAttachment = true;
        }

        // Observation values nested by `shape` from `at` on, read from `list` or else `array` (the chunk's
        // list and the step table's array hold the same rows); `bytes`: a byte box's, written as integers.
        void NestObs(List<float> list, float[] array, int at, long[] shape, bool bytes)
        {
            Nest(list, array, null, null, at, shape, 0, bytes ? Number.Byte : Number.Float32);
        }

        // An action: integers for Discrete/MultiDiscrete, float32 values for a Box (as Encode writes them).
        void NestAction(List<double> list, double[] array, int at, long[] shape, bool integer)
        {
            Nest(null, null, list, array, at, shape, 0, integer ? Number.Integer : Number.Float32);
        }

        enum Number { Float32, Byte, Integer }

        // Values nested by `shape` (row-major) from `at` on, read from the one of the four sources that is
        // not null (float32 values as doubles: exact), each written as `number` says.
        void Nest(List<float> floatList, float[] floats, List<double> doubleList, double[] doubles, int at, long[] shape, int dim, Number number)
        {
            if (dim == shape.Length)
            {
                double value = floats != null ? floats[at] : floatList != null ? floatList[at] : doubles != null ? doubles[at] : doubleList[at];
                if (number == Number.Integer) Integer((long)Math.Round(value));
                else if (number == Number.Byte) Integer(ByteOf((float)value));
                else Float32((float)value);
                return;
            }
            int stride = 1;
            for (int d = dim + 1; d < shape.Length; ++d) stride *= (int)shape[d];
            Append('[');
            for (int i = 0; i < shape[dim]; ++i)
            {
                if (i > 0) Append(',');
                Nest(floatList, floats, doubleList, doubles, at + i * stride, shape, dim + 1, number);
            }
            Append(']');
        }

        // As Newtonsoft.Json writes a double: round-trip digits, with ".0" on a whole number.
        void Float64(double value)
        {
            if (double.IsNaN(value) || double.IsInfinity(value))
            {
                // JSON has no NaN or infinity, and a sender MUST NOT write them (§4.1).
                throw new TetherException(ErrorCode.NonFiniteValue, "a record holds a value that is not finite (" +
                                          value.ToString(CultureInfo.InvariantCulture) + "); it is not sent");
            }
            int n;
            if (!value.TryFormat(new Span<char>(number), out n, "R".AsSpan(), CultureInfo.InvariantCulture))
            {
                Append(value.ToString("R", CultureInfo.InvariantCulture));  // (never: 64 characters hold any double)
                return;
            }
            Digits(n);
        }

        // The shortest decimal that reads back as the same float32 ("0.1", not "0.10000000149011612").
        void Float32(float value)
        {
            if (float.IsNaN(value) || float.IsInfinity(value))
            {
                Float64(value);
                return;
            }
            int n = Float32Text.Write(value, number);
            if (n > 0)
            {
                Append(number, n);
                return;
            }
            // (a value at a rounding boundary the fast path cannot decide: the runtime's exact formatting)
            if (!value.TryFormat(new Span<char>(number), out n, "R".AsSpan(), CultureInfo.InvariantCulture))
            {
                Append(value.ToString("R", CultureInfo.InvariantCulture));
                return;
            }
            Digits(n);
        }

        // Appends the n characters formatted into `number`, with ".0" on a whole number.
        void Digits(int n)
        {
            bool whole = true;
            for (int i = 0; i < n; ++i)
            {
                char c = number[i];
                if (c == '.' || c == 'E' || c == 'e')
                {
                    whole = false;
                    break;
                }
            }
            Append(number, n);
            if (whole)
            {
                Append('.');
                Append('0');
            }
        }
    }
}
