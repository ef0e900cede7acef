// SET_STATE's steps_per_batch (docs/protocol.md §7.6, §13.2 "Holding clients back", 1.3):
// the steps a client plays in training episodes per batch.
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>
    /// <c>steps_per_batch</c> (§7.6): the steps the server asks a client to play in training
    /// episodes per batch, from the answer that carries it on. Absent means
    /// <c>env_steps_per_sample</c>; a value that is not a JSON integer &gt;= 1 (a boolean, a
    /// string, 0, 2.5, null) is ignored, the client keeping the last valid one. A value above
    /// <c>env_steps_per_sample</c> counts as <c>env_steps_per_sample</c> (<see cref="Effective"/>).
    /// </summary>
    public static class StepsPerBatch
    {
        /// <summary>The SET_STATE field's name.</summary>
        public const string Field = "steps_per_batch";

        /// <summary>What <see cref="Read"/> returns for "none asked": <c>env_steps_per_sample</c>.</summary>
        public const int None = 0;

        /// <summary>
        /// The value after <paramref name="setState"/> arrived, <paramref name="current"/> being
        /// the one held before: <see cref="None"/> when the member is absent; its value (at most
        /// int.MaxValue) when it is a JSON integer &gt;= 1; else <paramref name="current"/>.
        /// </summary>
        public static int Read(JObject setState, int current)
        {
            JToken every = setState == null ? null : setState[Field];
            if (every == null) return None;
            if (every.Type != JTokenType.Integer) return current;
            // Clamped, not overflowed: any integer that large counts as env_steps_per_sample.
            long value = Messages.IntegerOr(every, 0, 0, int.MaxValue);
            return value >= 1 ? (int)value : current;
        }

        /// <summary>
        /// The steps per batch in force: <paramref name="envStepsPerSample"/> when
        /// <paramref name="asked"/> is <see cref="None"/>, else the smaller of the two.
        /// </summary>
        public static int Effective(int asked, int envStepsPerSample)
        {
            return asked == None || asked > envStepsPerSample ? envStepsPerSample : asked;
        }
    }
}
