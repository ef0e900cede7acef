// The weights version of every step of a chunk (docs/protocol.md §10.1
// "Versions per step", 1.3): weights_seq_no_runs, [version, steps] runs.
using System.Collections.Generic;
using System.Globalization;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>
    /// <c>weights_seq_no_runs</c> (§10.1): a chunk's per-step weights versions as
    /// <c>[v, n]</c> runs, <c>n</c> consecutive steps computed with version <c>v</c>,
    /// in step order, covering every step. Writing it from one version per step,
    /// and checking it as a server does (§10.6 checks 18a, 18b).
    /// </summary>
    public static class VersionRuns
    {
        /// <summary>The record and agent-entry field's name.</summary>
        public const string Field = "weights_seq_no_runs";

        /// <summary>The largest version a run may name (every SDK holds it in 32 bits).</summary>
        public const long MaxVersion = int.MaxValue;

        // Whether versions[from..from+count) hold more than one version: Tether's SDKs send
        // the field exactly then (a chunk of one version has the message's claim, as before 1.3).
        internal static bool Mixed(IList<long> versions, int from, int count)
        {
            return StepRuns.Length(versions, from, from + count) < count;
        }

        /// <summary>The runs of <paramref name="versions"/> (one per step, in order), consecutive equal versions collapsed.</summary>
        public static JArray ToJson(IList<long> versions)
        {
            var runs = new JArray();
            for (int i = 0; i < versions.Count;)
            {
                int n = StepRuns.Length(versions, i, versions.Count);
                runs.Add(new JArray(versions[i], n));
                i += n;
            }
            return runs;
        }

        // INVALID_ARGUMENT unless versions is empty or one version in 0..MaxVersion per step.
        internal static void CheckVersions(IList<long> versions, int steps)
        {
            if (versions.Count == 0) return;
            EpisodeRecords.CheckSize("step_versions", versions.Count, steps);
            foreach (long v in versions)
            {
                if (v < 0 || v > MaxVersion)
                {
                    throw new TetherException(ErrorCode.InvalidArgument, "a step's weights version " + v + " is not in 0.." + MaxVersion);
                }
            }
        }

        /// <summary>
        /// Checks a record's (or agent entry's) <c>weights_seq_no_runs</c> as a server
        /// does, for a chunk of <paramref name="steps"/> steps; absent or null passes.
        /// INVALID_FIELD unless it is a list of pairs of JSON integers (no booleans, no
        /// 4.0, no strings) [v, n] with 0 &lt;= v &lt;= MaxVersion and n &gt;= 1 (check 18a);
        /// then EPISODE_LENGTH_MISMATCH unless the n add up to <paramref name="steps"/> (18b).
        /// <paramref name="where"/> starts the message ("episodes[0]").
        /// </summary>
        public static void Validate(JToken runs, int steps, string where)
        {
            JArray list = StepRuns.Pairs(runs, Field, "version", where);
            if (list == null) return;
            foreach (JToken run in list)
            {
                // Clamped, not overflowed: an integer beyond a long is out of range either way.
                long v = Messages.IntegerOr(run[0], -1), n = Messages.IntegerOr(run[1], 0);
                if (v < 0 || v > MaxVersion || n < 1)
                {
                    throw StepRuns.BadRun(run, Field, "a version is 0.." + MaxVersion + ", a run has at least 1 step", where);
                }
            }
            long total = 0;
            bool over = false;
            foreach (JToken run in list)
            {
                // Compared before adding: an n near long.MaxValue must not wrap the total around.
                long n = Messages.IntegerOr(run[1], 0);
                if (n > steps - total)
                {
                    over = true;
                    break;
                }
                total += n;
            }
            if (over || total != steps)
            {
                throw new TetherException(ErrorCode.EpisodeLengthMismatch, where + ": \"" + Field + "\" covers " + (over ? "more than " + steps : total.ToString(CultureInfo.InvariantCulture)) +
                                          " steps, the chunk has " + steps);
            }
        }
    }
}
