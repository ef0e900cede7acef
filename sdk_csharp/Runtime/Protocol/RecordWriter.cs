// Episode records written straight to JSON text: the I/O thread's fast path.
// Building a JToken per number (EpisodeRecords.Encode) costs tens of
// milliseconds for a few thousand steps; this writes the same JSON, number by
// number, into one reused buffer.
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Text;
using Newtonsoft.Json;

namespace Tether.Protocol
{
    /// <summary>
    /// Writes a JSON array of episode records (§10.1, §10.7) as text, the same
    /// values as EpisodeRecords.Encode / EncodeAgentEntry give (float32 values as
    /// their shortest decimal, which may use an exponent where Encode does not:
    /// the same number). Not thread-safe; reuse one per thread.
    /// </summary>
    public sealed class RecordWriter
    {
        readonly StringBuilder text = new StringBuilder(1 << 16);
        int records;

        /// <summary>Starts a new array of records.</summary>
        public void Begin()
        {
            text.Length = 0;
            text.Append('[');
            records = 0;
        }

        /// <summary>The array written so far, closed.</summary>
        public string Finish()
        {
            text.Append(']');
            return text.ToString();
        }

        /// <summary>Appends a single-agent record (with its episode_id when the chunk has one). INVALID_ARGUMENT when an array does not fit.</summary>
        public void SingleAgentRecord(EpisodeChunk chunk, Space observationSpace, Space actionSpace)
        {
            if (records++ > 0) text.Append(',');
            text.Append('{');
            Fields(chunk, observationSpace, actionSpace);
            if (chunk.EpisodeId != null)
            {
                text.Append(",\"episode_id\":");
                text.Append(JsonConvert.ToString(chunk.EpisodeId));
            }
            text.Append('}');
        }

        /// <summary>Starts a multi-agent record; add its agents with <see cref="AgentEntry"/>, then call <see cref="EndMultiAgentRecord"/>.</summary>
        public void BeginMultiAgentRecord(string episodeId, bool isTerminated, bool isTruncated)
        {
            if (records++ > 0) text.Append(',');
            text.Append("{\"episode_id\":").Append(JsonConvert.ToString(episodeId));
            text.Append(",\"is_terminated\":").Append(isTerminated ? "true" : "false");
            text.Append(",\"is_truncated\":").Append(isTruncated ? "true" : "false");
            text.Append(",\"agents\":{");
            entries = 0;
        }

        int entries;

        /// <summary>Appends one agent entry of the record begun last (see EpisodeRecords.EncodeAgentEntry).</summary>
        public void AgentEntry(string agentId, EpisodeChunk chunk, ModuleSpec module, long startStep, IList<float> valueObs)
        {
            if (entries++ > 0) text.Append(',');
            text.Append(JsonConvert.ToString(agentId)).Append(":{");
            Fields(chunk, module.ObservationSpace, module.ActionSpace);
            text.Append(",\"module\":").Append(JsonConvert.ToString(module.ModuleId));
            text.Append(",\"start_step\":").Append(startStep.ToString(CultureInfo.InvariantCulture));
            int v = module.ValueObsDim;
            if (v > 0)
            {
                int rows = chunk.Steps + 1;
                EpisodeRecords.CheckSize("value_obs", valueObs == null ? 0 : valueObs.Count, rows * v);
                text.Append(",\"value_obs\":[");
                for (int r = 0; r < rows; ++r)
                {
                    if (r > 0) text.Append(',');
                    text.Append('[');
                    for (int j = 0; j < v; ++j)
                    {
                        if (j > 0) text.Append(',');
                        Float32(valueObs[r * v + j]);
                    }
                    text.Append(']');
                }
                text.Append(']');
            }
            text.Append('}');
        }

        /// <summary>Closes the multi-agent record begun last.</summary>
        public void EndMultiAgentRecord()
        {
            text.Append("}}");
        }

        void Fields(EpisodeChunk chunk, Space observationSpace, Space actionSpace)
        {
            EpisodeRecords.CheckChunk(chunk, observationSpace, actionSpace);
            int steps = chunk.Steps, actDim = actionSpace.FlatDim, k = actionSpace.DistInputsSize;
            bool discrete = actionSpace.Kind != SpaceKind.Box;
            text.Append("\"obs\":");
            RowsOfFloats(chunk.Obs, steps + 1, observationSpace.Shape);
            text.Append(",\"actions\":[");
            for (int r = 0; r < steps; ++r)
            {
                if (r > 0) text.Append(',');
                Nest(chunk.Actions, r * actDim, actionSpace.Shape, 0, discrete);
            }
            text.Append("],\"rewards\":[");
            for (int r = 0; r < steps; ++r)
            {
                if (r > 0) text.Append(',');
                Float32(chunk.Rewards[r]);
            }
            text.Append(']');
            if (chunk.ActionLogp.Count != 0)
            {
                text.Append(",\"action_logp\":[");
                for (int r = 0; r < steps; ++r)
                {
                    if (r > 0) text.Append(',');
                    Float64(chunk.ActionLogp[r]);
                }
                text.Append(']');
            }
            if (chunk.ActionDistInputs.Count != 0)
            {
                text.Append(",\"action_dist_inputs\":");
                RowsOfFloats(chunk.ActionDistInputs, steps, new long[] { k });
            }
            if (chunk.StepVersions.Count != 0)
            {
                text.Append(",\"").Append(VersionRuns.Field).Append("\":");
                VersionRuns.Write(chunk.StepVersions, text);
            }
            text.Append(",\"is_terminated\":").Append(chunk.IsTerminated ? "true" : "false");
            text.Append(",\"is_truncated\":").Append(chunk.IsTruncated ? "true" : "false");
        }

        void RowsOfFloats(List<float> flat, int rows, long[] shape)
        {
            int width = 1;
            foreach (long d in shape) width *= (int)d;
            text.Append('[');
            for (int r = 0; r < rows; ++r)
            {
                if (r > 0) text.Append(',');
                NestFloats(flat, r * width, shape, 0);
            }
            text.Append(']');
        }

        void NestFloats(List<float> data, int at, long[] shape, int dim)
        {
            if (dim == shape.Length)
            {
                Float32(data[at]);
                return;
            }
            int stride = 1;
            for (int d = dim + 1; d < shape.Length; ++d) stride *= (int)shape[d];
            text.Append('[');
            for (int i = 0; i < shape[dim]; ++i)
            {
                if (i > 0) text.Append(',');
                NestFloats(data, at + i * stride, shape, dim + 1);
            }
            text.Append(']');
        }

        // An action: integers for Discrete/MultiDiscrete, float32 values for a Box (as Encode writes them).
        void Nest(List<double> data, int at, long[] shape, int dim, bool integer)
        {
            if (dim == shape.Length)
            {
                if (integer) text.Append(((long)Math.Round(data[at])).ToString(CultureInfo.InvariantCulture));
                else Float32((float)data[at]);
                return;
            }
            int stride = 1;
            for (int d = dim + 1; d < shape.Length; ++d) stride *= (int)shape[d];
            text.Append('[');
            for (int i = 0; i < shape[dim]; ++i)
            {
                if (i > 0) text.Append(',');
                Nest(data, at + i * stride, shape, dim + 1, integer);
            }
            text.Append(']');
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
            string s = value.ToString("R", CultureInfo.InvariantCulture);
            text.Append(s);
            if (s.IndexOf('.') < 0 && s.IndexOf('E') < 0 && s.IndexOf('e') < 0) text.Append(".0");
        }

        // The shortest decimal that reads back as the same float32 ("0.1", not "0.10000000149011612").
        void Float32(float value)
        {
            if (float.IsNaN(value) || float.IsInfinity(value))
            {
                Float64(value);
                return;
            }
            string s = value.ToString("R", CultureInfo.InvariantCulture);
            text.Append(s);
            if (s.IndexOf('.') < 0 && s.IndexOf('E') < 0 && s.IndexOf('e') < 0) text.Append(".0");
        }
    }
}
