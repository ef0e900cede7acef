// Protocol 1.7 environment parameters (docs/protocol.md §19): the values a server asks the engines to
// play with, each a number or a sampler drawn from once per episode; what SET_STATE's "env_params"
// carries (§19.1, §19.2) and what a record says its episode was played with (§19.3).
using System;
using System.Collections.Generic;
using System.Collections.ObjectModel;
using System.Globalization;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>What a parameter's value is (§19.1): a fixed number, or the sampler an episode's value is drawn from.</summary>
    public enum EnvParamKind
    {
        /// <summary>A number: every episode plays with it (<see cref="EnvParamValue.Number"/>).</summary>
        Fixed,
        /// <summary><c>low + u·(high − low)</c> (<see cref="EnvParamValue.Low"/>, <see cref="EnvParamValue.High"/>).</summary>
        Uniform,
        /// <summary>Box–Muller from two draws (<see cref="EnvParamValue.Mean"/>, <see cref="EnvParamValue.Std"/>).</summary>
        Gaussian,
        /// <summary>Uniform over the union of intervals (<see cref="EnvParamValue.Ranges"/>).</summary>
        Ranges,
    }

    /// <summary>One <c>[low, high]</c> pair of a <see cref="EnvParamKind.Ranges"/> sampler.</summary>
    public struct EnvParamRange
    {
        /// <summary>The interval's lower end.</summary>
        public readonly double Low;
        /// <summary>The interval's upper end (at least <see cref="Low"/>).</summary>
        public readonly double High;

        /// <summary>The interval [<paramref name="low"/>, <paramref name="high"/>].</summary>
        public EnvParamRange(double low, double high)
        {
            Low = low;
            High = high;
        }
    }

    /// <summary>
    /// One parameter's value in a set (§19.1): a fixed number, or a sampler (<c>uniform</c>, <c>gaussian</c>,
    /// <c>ranges</c>). Immutable; every number is finite, of magnitude at most <see cref="EnvParams.MaxMagnitude"/>.
    /// </summary>
    public sealed class EnvParamValue
    {
        static readonly ReadOnlyCollection<EnvParamRange> NoRanges = new ReadOnlyCollection<EnvParamRange>(new EnvParamRange[0]);

        /// <summary>A fixed number or which sampler.</summary>
        public EnvParamKind Kind { get; private set; }
        /// <summary>The number of a <see cref="EnvParamKind.Fixed"/> value (0 otherwise).</summary>
        public double Number { get; private set; }
        /// <summary>A <see cref="EnvParamKind.Uniform"/> sampler's lower end (0 otherwise).</summary>
        public double Low { get; private set; }
        /// <summary>A <see cref="EnvParamKind.Uniform"/> sampler's upper end (0 otherwise).</summary>
        public double High { get; private set; }
        /// <summary>A <see cref="EnvParamKind.Gaussian"/> sampler's mean (0 otherwise).</summary>
        public double Mean { get; private set; }
        /// <summary>A <see cref="EnvParamKind.Gaussian"/> sampler's standard deviation, at least 0 (0 otherwise).</summary>
        public double Std { get; private set; }
        /// <summary>A <see cref="EnvParamKind.Ranges"/> sampler's 1 to 16 intervals, in order (empty otherwise).</summary>
        public IReadOnlyList<EnvParamRange> Ranges { get; private set; }

        EnvParamValue() { Ranges = NoRanges; }

        /// <summary>
        /// A parameter's value as a set's <c>values</c> holds it (§19.1): a JSON number (not a boolean), or a
        /// sampler object with exactly its kind's members. <see cref="ProtocolException"/> (INVALID_FIELD) naming
        /// <paramref name="what"/> when it breaks the rules.
        /// </summary>
        public static EnvParamValue Parse(JToken value, string what = "value")
        {
            var sampler = value as JObject;
            if (sampler == null) return new EnvParamValue { Kind = EnvParamKind.Fixed, Number = EnvParams.ReadNumber(value, what) };
            JToken kindToken = sampler["sampler"];
            string kind = kindToken != null && kindToken.Type == JTokenType.String ? (string)kindToken : null;
            string[] members;
            switch (kind)
            {
                case "uniform": members = new[] { "high", "low" }; break;
                case "gaussian": members = new[] { "mean", "std" }; break;
                case "ranges": members = new[] { "ranges" }; break;
                default:
                    string shown = kindToken == null ? "None" : kindToken.ToString(Newtonsoft.Json.Formatting.None);
                    throw Invalid(what + ": \"sampler\" must be one of uniform, gaussian, ranges, got " + (shown.Length > 40 ? shown.Substring(0, 40) : shown));
            }
            bool exact = sampler.Count == members.Length + 1;
            foreach (string member in members) exact = exact && sampler[member] != null;
            if (!exact) throw Invalid(what + ": a " + kind + " sampler has exactly the members sampler, " + string.Join(", ", members));
            if (kind == "uniform")
            {
                double low = EnvParams.ReadNumber(sampler["low"], what + ".low"), high = EnvParams.ReadNumber(sampler["high"], what + ".high");
                if (low > high) throw Invalid(what + ": low " + Text(low) + " is above high " + Text(high));
                return new EnvParamValue { Kind = EnvParamKind.Uniform, Low = low, High = high };
            }
            if (kind == "gaussian")
            {
                double mean = EnvParams.ReadNumber(sampler["mean"], what + ".mean"), std = EnvParams.ReadNumber(sampler["std"], what + ".std");
                if (std < 0) throw Invalid(what + ": std " + Text(std) + " is negative");
                return new EnvParamValue { Kind = EnvParamKind.Gaussian, Mean = mean, Std = std };
            }
            var list = sampler["ranges"] as JArray;
            if (list == null || list.Count < 1 || list.Count > EnvParams.MaxRanges)
            {
                throw Invalid(what + ": ranges must be a list of 1 to " + EnvParams.MaxRanges + " [low, high] pairs");
            }
            var ranges = new EnvParamRange[list.Count];
            for (int i = 0; i < list.Count; ++i)
            {
                var pair = list[i] as JArray;
                string at = what + ".ranges[" + i + "]";
                if (pair == null || pair.Count != 2) throw Invalid(at + " must be a [low, high] pair");
                double low = EnvParams.ReadNumber(pair[0], at + "[0]"), high = EnvParams.ReadNumber(pair[1], at + "[1]");
                if (low > high) throw Invalid(at + ": low " + Text(low) + " is above high " + Text(high));
                ranges[i] = new EnvParamRange(low, high);
            }
            return new EnvParamValue { Kind = EnvParamKind.Ranges, Ranges = new ReadOnlyCollection<EnvParamRange>(ranges) };
        }

        /// <summary>
        /// An episode's value of this parameter (§19.1), in IEEE 754 double precision: a fixed number is itself;
        /// a sampler takes one draw in [0, 1) from <paramref name="uniform"/> (a gaussian two: u1 first, for
        /// Box–Muller's radius, then u2 for its angle).
        /// </summary>
        public double Draw(Func<double> uniform)
        {
            switch (Kind)
            {
                case EnvParamKind.Fixed:
                    return Number;
                case EnvParamKind.Uniform:
                    {
                        double u = uniform();
                        return Low + u * (High - Low);
                    }
                case EnvParamKind.Gaussian:
                    {
                        double u1 = uniform();
                        double u2 = uniform();
                        return Mean + Std * Math.Sqrt(-2.0 * Math.Log(1.0 - u1)) * Math.Cos(2.0 * Math.PI * u2);
                    }
                default:
                    {
                        IReadOnlyList<EnvParamRange> ranges = Ranges;
                        double total = 0;
                        for (int i = 0; i < ranges.Count; ++i) total += ranges[i].High - ranges[i].Low;
                        double u = uniform();
                        if (total == 0)
                        {
                            // Every pair a point: the pair at index floor(u·n) gives its low, each point equally often.
                            int at = (int)Math.Min(Math.Floor(u * ranges.Count), ranges.Count - 1);
                            return ranges[Math.Max(at, 0)].Low;
                        }
                        double x = u * total;
                        for (int i = 0; i < ranges.Count; ++i)
                        {
                            double width = ranges[i].High - ranges[i].Low;
                            if (x < width) return ranges[i].Low + x;
                            x -= width;
                        }
                        return ranges[ranges.Count - 1].High;  // (x reached the total width: rounding)
                    }
            }
        }

        /// <summary>The value as a set's <c>values</c> holds it: a number, or the sampler object.</summary>
        public JToken ToJson()
        {
            switch (Kind)
            {
                case EnvParamKind.Fixed: return new JValue(Number);
                case EnvParamKind.Uniform: return new JObject { { "sampler", "uniform" }, { "low", Low }, { "high", High } };
                case EnvParamKind.Gaussian: return new JObject { { "sampler", "gaussian" }, { "mean", Mean }, { "std", Std } };
                default:
                    var pairs = new JArray();
                    foreach (EnvParamRange range in Ranges) pairs.Add(new JArray(range.Low, range.High));
                    return new JObject { { "sampler", "ranges" }, { "ranges", pairs } };
            }
        }

        internal static ProtocolException Invalid(string message) { return new ProtocolException(ErrorCode.InvalidField, message); }

        internal static string Text(double value) { return value.ToString("R", CultureInfo.InvariantCulture); }
    }

    /// <summary>
    /// A parameter set (protocol 1.7, §19.1) as SET_STATE's <c>env_params</c> carries it: the named numbers a
    /// game reads, each fixed or drawn per episode from a sampler. Immutable: the server never changes a set
    /// once sent, it sends a new one with the next <see cref="Seq"/>.
    /// </summary>
    public sealed class EnvParams
    {
        /// <summary>The SET_STATE member that carries a set, and the record member that says what an episode played with.</summary>
        public const string Field = "env_params";
        /// <summary>The GET_STATE / EPISODES_AND_GET_STATE member naming the seq of the last set the connection was sent (§19.2).</summary>
        public const string SeqField = "env_params_seq";
        /// <summary>At most this many parameters in one set.</summary>
        public const int MaxParams = 64;
        /// <summary>A name is 1 to this many characters (Unicode code points).</summary>
        public const int MaxNameChars = 64;
        /// <summary>At most this many intervals in a <c>ranges</c> sampler.</summary>
        public const int MaxRanges = 16;
        /// <summary>The largest magnitude of any number in a set, a record's values and a measure.</summary>
        public const double MaxMagnitude = 1e300;

        /// <summary>The set's number (at least 1): each new set the server makes has the next one.</summary>
        public long Seq { get; private set; }
        /// <summary>The curriculum's lesson the set belongs to (0 when the run has no lessons).</summary>
        public long Lesson { get; private set; }
        /// <summary>Each parameter's value (a fixed number or a sampler), by name.</summary>
        public IReadOnlyDictionary<string, EnvParamValue> Values { get; private set; }
        /// <summary>The parameters' names in drawing order (<see cref="CompareNames"/>).</summary>
        public IReadOnlyList<string> Names { get; private set; }

        EnvParams() { }

        /// <summary>
        /// The order names are drawn in (§19.1): by their UTF-8 bytes, which is Unicode code point order.
        /// Not <see cref="string.CompareOrdinal(string, string)"/>: UTF-16 code unit order differs between a
        /// character beyond U+FFFF (a surrogate pair, 0xD800-0xDFFF) and one of U+E000 to U+FFFF, which it sorts
        /// the other way round. Negative when <paramref name="a"/> comes first, 0 when equal, positive otherwise.
        /// </summary>
        public static int CompareNames(string a, string b)
        {
            if (ReferenceEquals(a, b)) return 0;
            if (a == null) return -1;
            if (b == null) return 1;
            int length = Math.Min(a.Length, b.Length);
            for (int i = 0; i < length; ++i)
            {
                char x = a[i], y = b[i];
                if (x != y) return CodePointRank(x) - CodePointRank(y);
            }
            return a.Length - b.Length;
        }

        // A UTF-16 code unit's rank in code point order at the first unit two well-formed strings differ in:
        // a surrogate (a character beyond U+FFFF) after every unit of U+E000 to U+FFFF.
        static int CodePointRank(char c)
        {
            if (c < 0xD800) return c;
            return c >= 0xE000 ? c - 0x800 : c + 0x2000;
        }

        /// <summary>
        /// SET_STATE's <c>env_params</c> (§19.1, §19.2): an object with an integer <c>seq</c> ≥ 1, an integer
        /// <c>lesson</c> ≥ 0 and <c>values</c>, at most <see cref="MaxParams"/> names of 1 to
        /// <see cref="MaxNameChars"/> characters each holding a number or a sampler. <see cref="ProtocolException"/>
        /// (INVALID_FIELD) saying what breaks the rules: a client ignores such a set and keeps the one it holds.
        /// </summary>
        public static EnvParams Parse(JToken body)
        {
            var obj = body as JObject;
            if (obj == null) throw EnvParamValue.Invalid("env_params must be an object");
            JToken seq = obj["seq"], lesson = obj["lesson"];
            var values = obj["values"] as JObject;
            if (seq == null || seq.Type != JTokenType.Integer || Messages.IntegerOr(seq, 0) < 1) throw EnvParamValue.Invalid("env_params.seq must be an integer >= 1");
            if (lesson == null || lesson.Type != JTokenType.Integer || Messages.IntegerOr(lesson, -1) < 0) throw EnvParamValue.Invalid("env_params.lesson must be an integer >= 0");
            if (values == null || values.Count > MaxParams) throw EnvParamValue.Invalid("env_params.values must be an object of at most " + MaxParams + " parameters");
            var parsed = new Dictionary<string, EnvParamValue>(values.Count, StringComparer.Ordinal);
            var names = new List<string>(values.Count);
            foreach (JProperty item in values.Properties())
            {
                CheckName(item.Name);
                parsed[item.Name] = EnvParamValue.Parse(item.Value, "env_params.values[" + Quote(item.Name) + "]");
                names.Add(item.Name);
            }
            names.Sort(CompareNames);
            return new EnvParams
            {
                Seq = Messages.IntegerOr(seq, 0), Lesson = Messages.IntegerOr(lesson, 0),
                Values = new ReadOnlyDictionary<string, EnvParamValue>(parsed), Names = names.AsReadOnly(),
            };
        }

        /// <summary><see cref="Parse"/> without an exception: false, with what breaks the rules in <paramref name="error"/>.</summary>
        public static bool TryParse(JToken body, out EnvParams set, out string error)
        {
            try
            {
                set = Parse(body);
                error = null;
                return true;
            }
            catch (TetherException e)
            {
                set = null;
                error = e.Detail;
                return false;
            }
        }

        /// <summary>
        /// An episode's values (§19.1): one per parameter, drawn in the order of <see cref="Names"/> (each
        /// sampler taking its draws from <paramref name="uniform"/>, numbers in [0, 1)), with this set's seq.
        /// </summary>
        public EpisodeEnvParams Draw(Func<double> uniform)
        {
            var names = new string[Names.Count];
            var values = new double[names.Length];
            for (int i = 0; i < names.Length; ++i)
            {
                names[i] = Names[i];
                values[i] = Values[names[i]].Draw(uniform);
            }
            return new EpisodeEnvParams(Seq, names, values);
        }

        /// <summary>The set as SET_STATE carries it: <c>{"seq", "lesson", "values"}</c>.</summary>
        public JObject ToJson()
        {
            var values = new JObject();
            foreach (string name in Names) values[name] = Values[name].ToJson();
            return new JObject { { "seq", Seq }, { "lesson", Lesson }, { "values", values } };
        }

        // A JSON number (not a boolean) of magnitude at most MaxMagnitude; INVALID_FIELD naming `what`.
        internal static double ReadNumber(JToken value, string what)
        {
            double number;
            if (value != null && value.Type == JTokenType.Integer)
            {
                object raw = ((JValue)value).Value;
                number = raw is System.Numerics.BigInteger ? (double)(System.Numerics.BigInteger)raw : Convert.ToDouble(raw, CultureInfo.InvariantCulture);
            }
            else if (value != null && value.Type == JTokenType.Float)
            {
                number = Convert.ToDouble(((JValue)value).Value, CultureInfo.InvariantCulture);
            }
            else
            {
                throw EnvParamValue.Invalid(what + " must be a number, got " + (value == null ? "nothing" : value.Type.ToString().ToLowerInvariant()));
            }
            if (!IsAllowed(number)) throw EnvParamValue.Invalid(what + " must be a finite number of magnitude at most 1e+300");
            return number;
        }

        // Whether a number may be a parameter's value or a measure: finite, |x| <= MaxMagnitude (NaN fails).
        internal static bool IsAllowed(double number) { return Math.Abs(number) <= MaxMagnitude; }

        // A name: 1 to MaxNameChars code points of Unicode text (no lone surrogate).
        static void CheckName(string name)
        {
            int chars = 0;
            bool text = true;
            for (int i = 0; i < name.Length; ++i, ++chars)
            {
                char c = name[i];
                if (char.IsHighSurrogate(c) && i + 1 < name.Length && char.IsLowSurrogate(name[i + 1])) ++i;
                else if (char.IsSurrogate(c)) text = false;
            }
            if (chars < 1 || chars > MaxNameChars || !text)
            {
                throw EnvParamValue.Invalid("a parameter name must be text of 1 to " + MaxNameChars + " characters, got " +
                                            Quote(name.Length > 80 ? name.Substring(0, 80) : name));
            }
        }

        static string Quote(string name) { return Newtonsoft.Json.JsonConvert.ToString(name); }
    }

    /// <summary>
    /// The values one episode plays with (protocol 1.7, §19.1): each parameter of the set numbered
    /// <see cref="Seq"/>, drawn when the episode started and kept to its end. Immutable.
    /// </summary>
    public sealed class EpisodeEnvParams
    {
        /// <summary>No values: what an episode started before the client held any set plays with.</summary>
        public static readonly IReadOnlyDictionary<string, double> NoValues = new ReadOnlyDictionary<string, double>(new Dictionary<string, double>());

        readonly string[] names;
        readonly double[] numbers;

        /// <summary>The seq of the set the values were drawn from.</summary>
        public long Seq { get; private set; }
        /// <summary>Each parameter's value, by name.</summary>
        public IReadOnlyDictionary<string, double> Values { get; private set; }

        /// <summary>Values <paramref name="values"/>[i] of the parameters <paramref name="names"/>[i] of set <paramref name="seq"/> (copied).</summary>
        public EpisodeEnvParams(long seq, IList<string> names, IList<double> values)
        {
            if (names == null || values == null || names.Count != values.Count) throw new TetherException(ErrorCode.InvalidArgument, "EpisodeEnvParams needs one value per name");
            Seq = seq;
            this.names = new string[names.Count];
            numbers = new double[names.Count];
            var byName = new Dictionary<string, double>(names.Count, StringComparer.Ordinal);
            for (int i = 0; i < this.names.Length; ++i)
            {
                this.names[i] = names[i];
                numbers[i] = values[i];
                byName[names[i]] = values[i];
            }
            Values = new ReadOnlyDictionary<string, double>(byName);
        }

        internal int Count { get { return names.Length; } }
        internal string NameAt(int i) { return names[i]; }
        internal double ValueAt(int i) { return numbers[i]; }

        /// <summary>
        /// A record's <c>env_params</c> member (§19.3): <c>{"seq", "values"}</c>, and <c>"measure"</c> when
        /// <paramref name="measure"/> has a value (only on the record that ends the episode).
        /// </summary>
        public JObject ToRecordJson(double? measure = null)
        {
            var values = new JObject();
            for (int i = 0; i < names.Length; ++i) values[names[i]] = numbers[i];
            var body = new JObject { { "seq", Seq }, { "values", values } };
            if (measure.HasValue) body["measure"] = measure.Value;
            return body;
        }

        /// <summary>
        /// A measure an engine reports for an episode (§19.3): <paramref name="value"/> when finite and of
        /// magnitude at most <see cref="EnvParams.MaxMagnitude"/>, else a <see cref="TetherException"/>
        /// (NON_FINITE_VALUE) naming <paramref name="call"/>.
        /// </summary>
        public static double CheckMeasure(double value, string call)
        {
            if (double.IsNaN(value) || double.IsInfinity(value)) throw new TetherException(ErrorCode.NonFiniteValue, call + ": the measure is not finite");
            if (!EnvParams.IsAllowed(value))
            {
                throw new TetherException(ErrorCode.NonFiniteValue, call + ": the measure " + EnvParamValue.Text(value) + " is beyond 1e300");
            }
            return value;
        }
    }
}
