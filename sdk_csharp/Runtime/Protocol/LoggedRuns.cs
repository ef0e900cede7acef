// The logged steps of a chunk (docs/protocol.md §10.1 "Logged steps", 1.6): logged_runs,
// [start, n] runs of steps whose actions the policy did not choose.
using System.Collections.Generic;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>
    /// <c>logged_runs</c> (protocol 1.6, §10.1): the steps of a record (or agent entry) whose actions
    /// the policy did not choose, as <c>[start, n]</c> runs in step order. Writing it from one flag
    /// per step (adjacent logged steps as one run), and checking it as a server does (§10.6 checks
    /// 20a, 20b).
    /// </summary>
    public static class LoggedRuns
    {
        /// <summary>The record and agent-entry field's name.</summary>
        public const string Field = "logged_runs";

        /// <summary>Whether any of the first <paramref name="count"/> flags of <paramref name="logged"/> is set.</summary>
        public static bool Any(IList<bool> logged, int count)
        {
            for (int i = 0; i < count; ++i)
            {
                if (logged[i]) return true;
            }
            return false;
        }

        /// <summary>
        /// The runs of <paramref name="logged"/> (one flag per step, in order; true: logged), adjacent
        /// logged steps as one run; null when no step is logged (the field is then left out).
        /// </summary>
        public static JArray ToJson(IList<bool> logged)
        {
            JArray runs = null;
            for (int t = 0; t < logged.Count;)
            {
                int n = StepRuns.Length(logged, t, logged.Count);
                if (logged[t])
                {
                    if (runs == null) runs = new JArray();
                    runs.Add(new JArray(t, n));
                }
                t += n;
            }
            return runs;
        }

        /// <summary>
        /// Checks a record's (or agent entry's) <c>logged_runs</c> as a server does, for a chunk of
        /// <paramref name="steps"/> steps; absent or null passes. INVALID_FIELD unless it is a list of
        /// pairs of JSON integers (no booleans, no 2.0, no strings) [start, n] with start &gt;= 0, n &gt;= 1
        /// and each start at or after the end of the run before it (check 20a); then
        /// EPISODE_LENGTH_MISMATCH when a run reaches past the chunk (20b).
        /// <paramref name="where"/> starts the message ("episodes[0]").
        /// </summary>
        public static void Validate(JToken runs, int steps, string where)
        {
            JArray list = StepRuns.Pairs(runs, Field, "start", where);
            if (list == null) return;
            long end = 0;
            foreach (JToken run in list)
            {
                // Clamped, not overflowed: an integer beyond a long is out of range either way.
                long start = Messages.IntegerOr(run[0], -1), n = Messages.IntegerOr(run[1], 0);
                if (start < end || n < 1)
                {
                    throw StepRuns.BadRun(run, Field, "runs are in step order, apart, and have at least 1 step", where);
                }
                end = n > long.MaxValue - start ? long.MaxValue : start + n;
            }
            if (end > steps)
            {
                throw new TetherException(ErrorCode.EpisodeLengthMismatch, where + ": \"" + Field + "\" reaches step " + (end - 1) + ", the chunk has " + steps + " steps");
            }
        }

        /// <summary>
        /// The logged step indices of <paramref name="runs"/>, a <c>logged_runs</c> that passed
        /// <see cref="Validate"/> (empty when absent, null or []).
        /// </summary>
        public static List<int> Steps(JToken runs)
        {
            var steps = new List<int>();
            var list = runs as JArray;
            if (list == null) return steps;
            foreach (JToken run in list)
            {
                long start = Messages.IntegerOr(run[0], 0), n = Messages.IntegerOr(run[1], 0);
                for (long t = start; t < start + n; ++t) steps.Add((int)t);
            }
            return steps;
        }
    }
}
