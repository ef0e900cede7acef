// SET_STATE's record_share (docs/protocol.md §7.6, §13.2 "Holding clients back", 1.3):
// the share of its new training episodes a client records and sends.
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>
    /// <c>record_share</c> (§7.6): the share of new training episodes the server asks a
    /// client to record. Absent means 1 (record every one); a value that is not a JSON
    /// number with 0 &lt; value &lt;= 1 is ignored, the client keeping the last valid one.
    /// </summary>
    public static class RecordShare
    {
        /// <summary>The SET_STATE field's name.</summary>
        public const string Field = "record_share";

        /// <summary>
        /// The share after <paramref name="setState"/> arrived, <paramref name="current"/>
        /// being the one held before: 1 when the member is absent; its value when it is a
        /// JSON number (not a boolean, not a string) in (0, 1]; else <paramref name="current"/>.
        /// </summary>
        public static double Read(JObject setState, double current)
        {
            JToken share = setState == null ? null : setState[Field];
            if (share == null) return 1.0;
            double value;
            if (share.Type == JTokenType.Integer)
            {
                // Clamped, not overflowed: an integer beyond a long is out of range either way.
                value = Messages.IntegerOr(share, 0);
            }
            else if (share.Type == JTokenType.Float)
            {
                value = (double)share;
            }
            else
            {
                return current;
            }
            // (NaN fails both comparisons)
            return value > 0 && value <= 1 ? value : current;
        }
    }
}
