// What the [a, n] step runs of a chunk (docs/protocol.md §10.1) share: weights_seq_no_runs
// (VersionRuns, [version, n]) and logged_runs (LoggedRuns, [start, n]).
using System;
using System.Collections.Generic;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>
    /// Runs of equal consecutive per-step values, and the check every <c>[a, n]</c> run field
    /// starts with (a list of pairs of JSON integers, §10.6 checks 18a and 20a).
    /// </summary>
    internal static class StepRuns
    {
        /// <summary>
        /// The number of consecutive values from <paramref name="from"/> (before <paramref name="end"/>)
        /// equal to <c>values[from]</c>: at least 1.
        /// </summary>
        internal static int Length<T>(IList<T> values, int from, int end) where T : IEquatable<T>
        {
            int n = 1;
            while (from + n < end && values[from + n].Equals(values[from])) ++n;
            return n;
        }

        /// <summary>
        /// <paramref name="runs"/> as a list of pairs, or null when absent or null. INVALID_FIELD unless it
        /// is a list of pairs of JSON integers (no booleans, no 4.0, no strings); <paramref name="first"/>
        /// names a pair's first member in the message ("version", "start").
        /// </summary>
        internal static JArray Pairs(JToken runs, string field, string first, string where)
        {
            if (runs == null || runs.Type == JTokenType.Null) return null;
            var list = runs as JArray;
            bool pairs = list != null;
            if (pairs)
            {
                foreach (JToken run in list)
                {
                    var pair = run as JArray;
                    if (pair == null || pair.Count != 2 || pair[0].Type != JTokenType.Integer || pair[1].Type != JTokenType.Integer)
                    {
                        pairs = false;
                        break;
                    }
                }
            }
            if (!pairs)
            {
                throw new TetherException(ErrorCode.InvalidField, where + ": \"" + field + "\" must be a list of [" + first + ", steps] integer pairs");
            }
            return list;
        }

        /// <summary>INVALID_FIELD for a pair of <paramref name="field"/> that breaks <paramref name="rule"/>.</summary>
        internal static TetherException BadRun(JToken run, string field, string rule, string where)
        {
            return new TetherException(ErrorCode.InvalidField, where + ": \"" + field + "\" has " + run.ToString(Newtonsoft.Json.Formatting.None) + ": " + rule);
        }
    }
}
