// The end of training (docs/protocol.md §6.6 "End of training"): the summary a server
// sends with ERROR TRAINING_DONE before it stops.
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>
    /// The run's totals that came with ERROR TRAINING_DONE (protocol 1.3, §6.6 "End of
    /// training"): the server's run is done and it stopped. Not an error: the client does not
    /// reconnect, sends nothing more and acts on with the last model it holds. A member the
    /// server left out, or sent as another kind of value, reads as null (Reason, ReturnMean)
    /// or 0; <see cref="Json"/> holds the summary as sent, members this SDK does not name too.
    /// </summary>
    public sealed class TrainingSummary
    {
        /// <summary>Why the run ended: "stop_at_return", "max_env_steps", or another a server documents; null if not given.</summary>
        public string Reason { get; private set; }

        /// <summary>Env steps the server counted over the run.</summary>
        public long EnvSteps { get; private set; }

        /// <summary>Agent steps the server counted over the run.</summary>
        public long AgentSteps { get; private set; }

        /// <summary>Agent steps the learner trained on.</summary>
        public long AgentStepsTrained { get; private set; }

        /// <summary>Learner updates made.</summary>
        public long Updates { get; private set; }

        /// <summary>Episodes that finished.</summary>
        public long Episodes { get; private set; }

        /// <summary>The last weights version published.</summary>
        public long WeightsSeqNo { get; private set; }

        /// <summary>The windowed mean episode return; null when no episode finished.</summary>
        public double? ReturnMean { get; private set; }

        /// <summary>The summary object as the server sent it (an empty object when the ERROR carried none).</summary>
        public JObject Json { get; private set; }

        /// <summary>Reads a TRAINING_DONE ERROR's "summary" (anything but an object reads as an empty one); never throws.</summary>
        public static TrainingSummary FromJson(JToken summary)
        {
            JObject body = summary as JObject ?? new JObject();
            JToken reason = body["reason"], mean = body["return_mean"];
            return new TrainingSummary
            {
                Json = body,
                Reason = reason != null && reason.Type == JTokenType.String ? (string)reason : null,
                EnvSteps = Messages.IntegerOr(body["env_steps"], 0, 0),
                AgentSteps = Messages.IntegerOr(body["agent_steps"], 0, 0),
                AgentStepsTrained = Messages.IntegerOr(body["agent_steps_trained"], 0, 0),
                Updates = Messages.IntegerOr(body["updates"], 0, 0),
                Episodes = Messages.IntegerOr(body["episodes"], 0, 0),
                WeightsSeqNo = Messages.IntegerOr(body["weights_seq_no"], 0, 0),
                ReturnMean = NumberOrNull(mean),
            };
        }

        static double? NumberOrNull(JToken token)
        {
            if (token == null || (token.Type != JTokenType.Float && token.Type != JTokenType.Integer)) return null;
            object raw = ((JValue)token).Value;
            if (raw is System.Numerics.BigInteger) return (double)(System.Numerics.BigInteger)raw;
            return System.Convert.ToDouble(raw, System.Globalization.CultureInfo.InvariantCulture);
        }

        /// <summary>The summary as JSON text.</summary>
        public override string ToString()
        {
            return Json.ToString(Newtonsoft.Json.Formatting.None);
        }
    }
}
