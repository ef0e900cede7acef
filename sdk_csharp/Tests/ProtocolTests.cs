// Framing and message decoding beyond the shared vectors: hostile and odd input.
using System.Collections.Generic;
using System.Linq;
using System.Text;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class ProtocolTests
    {
        static byte[] Bytes(string s) { return Encoding.UTF8.GetBytes(s); }

        [Test]
        public void PolicyMappingModulesAreInCodePointOrder()
        {
            // Every module a rule can produce, as C++'s modules() (a std::set of UTF-8) and Python's sorted(): U+1F600
            // comes after U+FFFD, which ordinal UTF-16 order (a surrogate pair first) would put the other way.
            PolicyMapping mapping = PolicyMapping.FromJson(JArray.Parse(
                "[{\"agent_id\": \"x\", \"module\": \"m1\"}, {\"pattern\": \"y_*\", \"choose_from\": [\"\uFFFD\", \"b\", \"\\ud83d\\ude00\"]}," +
                " {\"pattern\": \"*\", \"module\": \"a\"}, {\"pattern\": \"z\", \"module\": \"b\"}]"));
            Assert.That(mapping.Modules(), Is.EqualTo(new[] { "a", "b", "m1", "\uFFFD", "\U0001F600" }));
        }

        [Test]
        public void IntegersFromTheServerAreClampedNotOverflowed()
        {
            JObject config = JObject.Parse("{\"huge\": 1000000000000000000000000000000, \"big\": 1000000000000, \"neg\": -5, \"float\": 3.0, \"text\": \"7\"}");
            Assert.That(Messages.IntegerOr(config["huge"], 0), Is.EqualTo(long.MaxValue));
            Assert.That(Messages.IntegerOr(config["big"], 0, 1, int.MaxValue), Is.EqualTo(int.MaxValue));
            Assert.That(Messages.IntegerOr(config["neg"], 0, 1), Is.EqualTo(1));
            Assert.That(Messages.IntegerOr(config["float"], 9), Is.EqualTo(9));  // 3.0 is not a JSON integer here
            Assert.That(Messages.IntegerOr(config["text"], 9), Is.EqualTo(9));
            Assert.That(Messages.IntegerOr(config["missing"], 9), Is.EqualTo(9));
        }

        [Test]
        public void TrainingDoneClosesTheConnectionPairsWithNothingAndKeepsItsSummary()
        {
            Assert.That(ErrorCodes.ToWire(ErrorCode.TrainingDone), Is.EqualTo("TRAINING_DONE"));
            Assert.That(ErrorCodes.FromWire("TRAINING_DONE"), Is.EqualTo(ErrorCode.TrainingDone));
            Assert.That(Messages.ClosesConnection(ErrorCode.TrainingDone), Is.True);
            var connection = new ClientConnection();
            connection.Send(JObject.Parse("{\"type\": \"GET_STATE\"}"));
            byte[] frame = Messages.EncodeFrame(JObject.Parse("{\"type\": \"ERROR\", \"code\": \"TRAINING_DONE\", \"message\": \"done\", " +
                                                              "\"summary\": {\"reason\": \"max_env_steps\", \"updates\": 4, \"return_mean\": null}}"));
            var responses = new List<Response>();
            var e = Assert.Throws<TetherException>(() => connection.ReceiveData(frame, 0, frame.Length, responses));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.TrainingDone));
            Assert.That(responses.Count, Is.EqualTo(1));
            Assert.That(responses[0].Request, Is.Null, "a connection-level ERROR answers no request");
            Assert.That(connection.Closed, Is.True);
            Assert.That((string)connection.ClosingError["summary"]["reason"], Is.EqualTo("max_env_steps"));
            connection.Reset();
            Assert.That(connection.ClosingError, Is.Null);

            TrainingSummary summary = TrainingSummary.FromJson(JObject.Parse("{\"reason\": \"max_env_steps\", \"env_steps\": 5000, \"updates\": 4, " +
                                                                             "\"weights_seq_no\": 4, \"return_mean\": null}"));
            Assert.That(summary.Reason, Is.EqualTo("max_env_steps"));
            Assert.That(summary.EnvSteps, Is.EqualTo(5000));
            Assert.That(summary.Updates, Is.EqualTo(4));
            Assert.That(summary.WeightsSeqNo, Is.EqualTo(4));
            Assert.That(summary.ReturnMean, Is.Null, "no episode finished");
            Assert.That(summary.AgentStepsTrained, Is.EqualTo(0), "absent");
            Assert.That(TrainingSummary.FromJson(JObject.Parse("{\"return_mean\": 12}")).ReturnMean, Is.EqualTo(12.0));
            // Anything the server got wrong reads as absent: the end of training is never an error.
            TrainingSummary odd = TrainingSummary.FromJson(JObject.Parse("{\"reason\": 3, \"updates\": \"4\", \"episodes\": -2, \"return_mean\": \"x\"}"));
            Assert.That(odd.Reason, Is.Null);
            Assert.That(odd.Updates, Is.EqualTo(0));
            Assert.That(odd.Episodes, Is.EqualTo(0));
            Assert.That(odd.ReturnMean, Is.Null);
            foreach (JToken none in new JToken[] { null, JValue.CreateNull(), new JArray(), new JValue("summary") })
            {
                TrainingSummary empty = TrainingSummary.FromJson(none);
                Assert.That(empty.Json.Count, Is.EqualTo(0));
                Assert.That(empty.Reason, Is.Null);
            }
        }

        [Test]
        public void RecordShareIsANumberInZeroToOneAbsentMeansOneAndAnythingElseIsIgnored()
        {
            Assert.That(RecordShare.Read(JObject.Parse("{\"type\": \"SET_STATE\"}"), 0.5), Is.EqualTo(1.0), "absent: record every episode");
            Assert.That(RecordShare.Read(JObject.Parse("{\"record_share\": 0.25}"), 0.5), Is.EqualTo(0.25));
            Assert.That(RecordShare.Read(JObject.Parse("{\"record_share\": 1}"), 0.5), Is.EqualTo(1.0));
            Assert.That(RecordShare.Read(JObject.Parse("{\"record_share\": 1.0}"), 0.5), Is.EqualTo(1.0));
            Assert.That(RecordShare.Read(JObject.Parse("{\"record_share\": 1e-9}"), 0.5), Is.EqualTo(1e-9));
            foreach (string bad in new[] { "\"0.25\"", "true", "false", "0", "0.0", "-0.5", "1.5", "2", "null", "[0.25]", "{}", "100000000000000000000000" })
            {
                Assert.That(RecordShare.Read(JObject.Parse("{\"record_share\": " + bad + "}"), 0.5), Is.EqualTo(0.5), bad);
            }
            var nan = new JObject { { "record_share", double.NaN } };
            Assert.That(RecordShare.Read(nan, 0.5), Is.EqualTo(0.5), "NaN");
            Assert.That(RecordShare.Read(new JObject { { "record_share", double.PositiveInfinity } }, 0.5), Is.EqualTo(0.5));
        }

        [Test]
        public void StepsPerBatchIsAnIntegerOfAtLeastOneAbsentMeansEnvStepsPerSampleAndAnythingElseIsIgnored()
        {
            Assert.That(StepsPerBatch.Read(JObject.Parse("{\"type\": \"SET_STATE\"}"), 7), Is.EqualTo(StepsPerBatch.None), "absent: env_steps_per_sample");
            Assert.That(StepsPerBatch.Read(null, 7), Is.EqualTo(StepsPerBatch.None));
            Assert.That(StepsPerBatch.Read(JObject.Parse("{\"steps_per_batch\": 4}"), 7), Is.EqualTo(4));
            Assert.That(StepsPerBatch.Read(JObject.Parse("{\"steps_per_batch\": 1}"), 7), Is.EqualTo(1));
            Assert.That(StepsPerBatch.Read(JObject.Parse("{\"steps_per_batch\": 100000000000000000000000}"), 7), Is.EqualTo(int.MaxValue), "any integer that large");
            foreach (string bad in new[] { "true", "false", "\"3\"", "0", "-1", "2.5", "4.0", "null", "[4]", "{}", "-100000000000000000000000" })
            {
                Assert.That(StepsPerBatch.Read(JObject.Parse("{\"steps_per_batch\": " + bad + "}"), 7), Is.EqualTo(7), bad);
            }
            Assert.That(StepsPerBatch.Effective(StepsPerBatch.None, 10), Is.EqualTo(10));
            Assert.That(StepsPerBatch.Effective(4, 10), Is.EqualTo(4));
            Assert.That(StepsPerBatch.Effective(10, 10), Is.EqualTo(10));
            Assert.That(StepsPerBatch.Effective(50, 10), Is.EqualTo(10), "above env_steps_per_sample: env_steps_per_sample");
        }

        [Test]
        public void FramesRoundTripWhateverPiecesTheyArriveIn()
        {
            var stream = new List<byte>();
            string[] bodies = { "{\"type\":\"PING\"}", "", new string('x', 10000), "{\"é\":1}" };
            foreach (string b in bodies) stream.AddRange(Framing.Encode(Bytes(b)));
            byte[] all = stream.ToArray();
            Assert.That(Encoding.ASCII.GetString(all, 0, 8), Is.EqualTo("00000015"));
            foreach (int step in new[] { 1, 3, 4096, all.Length })
            {
                var decoder = new FrameDecoder();
                var got = new List<byte[]>();
                for (int i = 0; i < all.Length; i += step) decoder.Feed(all, i, System.Math.Min(step, all.Length - i), got);
                Assert.That(got.Select(g => Encoding.UTF8.GetString(g)), Is.EqualTo(bodies), "step " + step);
            }
        }

        [Test]
        public void AnOversizedHeaderIsRefusedBeforeItsBodyArrives()
        {
            var decoder = new FrameDecoder(1024);
            var e = Assert.Throws<ProtocolException>(() => decoder.Feed(Bytes("99999999"), new List<byte[]>()));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.FrameTooLarge));
            Assert.That(e.Message, Is.StringContaining("99999999 bytes exceeds the limit of 1024"));
        }

        [Test]
        public void DeepNestingIsRefusedWithoutParsing()
        {
            string deep = "{\"type\":\"PING\",\"x\":" + new string('[', 100000) + new string(']', 100000) + "}";
            var e = Assert.Throws<ProtocolException>(() => Messages.Decode(Bytes(deep)));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidJson));
            Assert.That(e.Message, Is.StringContaining("at most 64"));
            string fine = "{\"type\":\"PING\",\"x\":" + new string('[', 63) + new string(']', 63) + "}";
            Assert.That(Messages.Decode(Bytes(fine)).Type, Is.EqualTo(MessageType.Ping));
        }

        [Test]
        public void PythonsNonFiniteNumbersAreReadAndDatesStayStrings()
        {
            Message m = Messages.Decode(Bytes("{\"type\":\"SET_STATE\",\"a\":NaN,\"b\":-Infinity,\"when\":\"2020-01-01T00:00:00\"}"));
            Assert.That(double.IsNaN((double)m.Body["a"]), Is.True);
            Assert.That(double.IsNegativeInfinity((double)m.Body["b"]), Is.True);
            Assert.That(m.Body["when"].Type, Is.EqualTo(JTokenType.String));
            Assert.That((string)m.Body["when"], Is.EqualTo("2020-01-01T00:00:00"));
        }

        [Test]
        public void TrailingBytesAndOverlongUtf8AreRefused()
        {
            var e = Assert.Throws<ProtocolException>(() => Messages.Decode(Bytes("{\"type\":\"PING\"} {}")));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidJson));
            byte[] overlong = { (byte)'{', (byte)'"', 0xC0, 0xAF, (byte)'"', (byte)':', (byte)'1', (byte)'}' };
            e = Assert.Throws<ProtocolException>(() => Messages.Decode(overlong));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidUtf8));
            Assert.That(e.Message, Is.StringContaining("at byte 2"));
            byte[] surrogate = { (byte)'"', 0xED, 0xA0, 0x80, (byte)'"' };
            Assert.That(Messages.FirstInvalidUtf8(surrogate), Is.EqualTo(1));
        }

        [Test]
        public void ServerErrorsKeepTheirCodeEvenAnUnknownOne()
        {
            var known = new ServerErrorException("OBS_SHAPE_MISMATCH", "episodes[0]: obs has 3 values", "EPISODES");
            Assert.That(known.Code, Is.EqualTo(ErrorCode.ObsShapeMismatch));
            Assert.That(known.Message, Is.StringContaining("OBS_SHAPE_MISMATCH").And.StringContaining("episodes[0]"));
            var newer = new ServerErrorException("FROM_THE_FUTURE", "x", null);
            Assert.That(newer.Code, Is.EqualTo(ErrorCode.UnknownServerCode));
            Assert.That(newer.ServerCode, Is.EqualTo("FROM_THE_FUTURE"));
            foreach (ErrorCode code in System.Enum.GetValues(typeof(ErrorCode)))
            {
                Assert.That(ErrorCodes.FromWire(ErrorCodes.ToWire(code)), Is.EqualTo(code));
            }
            Assert.That(ErrorCodes.ToWire(ErrorCode.InvalidUtf8), Is.EqualTo("INVALID_UTF8"));
        }

        [Test]
        public void SpacesRefuseSizesBeyondTheLimitBeforeAllocating()
        {
            var e = Assert.Throws<TetherException>(() => Space.FromJson(JObject.Parse("{\"type\":\"Box\",\"shape\":[100000,100000,100000]}")));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidField));
            Assert.That(e.Message, Is.StringContaining("exceeds"));
            e = Assert.Throws<TetherException>(() => Space.FromJson(JObject.Parse("{\"type\":\"Discrete\",\"n\":99999999999999999999999}")));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidField));
        }
    }
}
