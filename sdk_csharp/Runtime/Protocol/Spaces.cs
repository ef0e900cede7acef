// Observation and action spaces (docs/protocol.md §8): Box, Discrete, MultiDiscrete, and
// (protocol 1.4, §8.6) the composite Dict and Tuple, for observations only.
using System;
using System.Collections.Generic;
using System.Numerics;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>The kinds of space.</summary>
    public enum SpaceKind
    {
        /// <summary>Real-valued arrays within bounds.</summary>
        Box,
        /// <summary>One integer of n.</summary>
        Discrete,
        /// <summary>One integer per entry of nvec.</summary>
        MultiDiscrete,
        /// <summary>Named subspaces (protocol 1.4, §8.6; observations only).</summary>
        Dict,
        /// <summary>Subspaces in order (protocol 1.4, §8.6; observations only).</summary>
        Tuple,
    }

    /// <summary>
    /// A space as SET_CONFIG describes it. Immutable. A Box's values are
    /// prod(shape) floats (a byte box's, dtype "uint8", the integers 0 to 255:
    /// see <see cref="IsBytes"/>); a Discrete's one integer in [start, start + n); a
    /// MultiDiscrete's one integer per entry of nvec.
    /// </summary>
    public sealed class Space
    {
        /// <summary>The most numbers one value or one distribution of a space may need (4 Mi).</summary>
        public const long MaxSpaceElements = 4L * 1024 * 1024;

        /// <summary>The most Dict or Tuple spaces on a path from the outermost space to a leaf (§8.6).</summary>
        public const int MaxNesting = 8;
        /// <summary>The most leaves a Dict or Tuple space may have (§8.6).</summary>
        public const int MaxLeaves = 64;

        /// <summary>Box, Discrete, MultiDiscrete, Dict or Tuple.</summary>
        public SpaceKind Kind { get; private set; }
        /// <summary>A Box's shape; [] for Discrete; [len(nvec)] for MultiDiscrete; [FlatDim] (the flat row) for Dict and Tuple.</summary>
        public long[] Shape { get; private set; }
        /// <summary>A Discrete's number of actions.</summary>
        public long N { get; private set; }
        /// <summary>A Discrete's first action.</summary>
        public long Start { get; private set; }
        /// <summary>A MultiDiscrete's sizes.</summary>
        public long[] Nvec { get; private set; }
        /// <summary>A Box's lower bounds, one per element (may be -infinity).</summary>
        public double[] Low { get; private set; }
        /// <summary>A Box's upper bounds, one per element (may be +infinity).</summary>
        public double[] High { get; private set; }
        /// <summary>A Box's dtype as written ("float32" by default).</summary>
        public string Dtype { get; private set; }

        /// <summary>The dtype of a byte box (protocol 1.4, §8.1).</summary>
        public const string ByteDtype = "uint8";

        /// <summary>
        /// Whether it is a byte box (protocol 1.4, §8.1): a Box of dtype "uint8", whose values are the
        /// integers 0 to 255, such as a camera image of shape [height, width, channels]. Its model
        /// takes the observation as bytes in its own shape (§12.1), and a 1.4 server is sent its
        /// observations as one uint8 tensor per record (§10.9). Every other Box is float32.
        /// </summary>
        public bool IsBytes { get { return Kind == SpaceKind.Box && Dtype == ByteDtype; } }

        /// <summary>Whether it is a Dict or a Tuple (protocol 1.4, §8.6).</summary>
        public bool IsComposite { get { return Kind == SpaceKind.Dict || Kind == SpaceKind.Tuple; } }

        /// <summary>
        /// A composite space's leaves in leaf order (§8.6: a Dict's keys sorted by code point, a Tuple's
        /// subspaces in order, depth first); empty for any other space.
        /// </summary>
        public IReadOnlyList<SpaceLeaf> Leaves { get { return leaves; } }

        /// <summary>A Dict's subspaces by key in leaf order, a Tuple's by index ("0", "1", ...); empty for any other space.</summary>
        public IReadOnlyList<KeyValuePair<string, Space>> Children { get { return children; } }

        SpaceLeaf[] leaves = new SpaceLeaf[0];
        KeyValuePair<string, Space>[] children = new KeyValuePair<string, Space>[0];
        int nesting;    // Dict or Tuple spaces on the deepest path (0 for a leaf)
        int flatDim;    // a composite space's flat row length

        Space() { }

        /// <summary>The index in <see cref="Leaves"/> of the leaf at <paramref name="path"/> ("camera", "sensors.0"), or -1.</summary>
        public int LeafIndex(string path)
        {
            for (int i = 0; i < leaves.Length; ++i)
            {
                if (string.Equals(leaves[i].Path, path, StringComparison.Ordinal)) return i;
            }
            return -1;
        }

        /// <summary>Numbers in one value: prod(shape) for a Box, 1 for a Discrete, len(nvec) for a MultiDiscrete.</summary>
        public int FlatDim
        {
            get
            {
                switch (Kind)
                {
                    case SpaceKind.Box: return (int)Product(Shape);
                    case SpaceKind.Discrete: return 1;
                    case SpaceKind.MultiDiscrete: return Nvec.Length;
                    default: return flatDim;
                }
            }
        }

        /// <summary>Numbers in one distribution (a model's output row, §11): 2 x flat for a Box, n, or sum(nvec); 0 for Dict and Tuple.</summary>
        public int DistInputsSize
        {
            get
            {
                switch (Kind)
                {
                    case SpaceKind.Box: return 2 * FlatDim;
                    case SpaceKind.Discrete: return (int)N;
                    case SpaceKind.Dict:
                    case SpaceKind.Tuple: return 0;
                    default:
                        long total = 0;
                        foreach (long v in Nvec) total += v;
                        return (int)total;
                }
            }
        }

        /// <summary>
        /// A Box with per-element bounds. INVALID_ARGUMENT for a bad shape or bounds (a byte box's,
        /// dtype "uint8", must lie within [0, 255]).
        /// </summary>
        public static Space Box(long[] shape, double[] low, double[] high, string dtype = "float32")
        {
            if (dtype == null) throw new TetherException(ErrorCode.InvalidArgument, "Box dtype must be a string");
            foreach (long d in shape)
            {
                if (d < 0) throw new TetherException(ErrorCode.InvalidArgument, "Box shape must be non-negative");
            }
            if (CappedProduct(shape) > MaxSpaceElements) throw new TetherException(ErrorCode.InvalidArgument, TooLarge("Box prod(shape)"));
            long size = Product(shape);
            if (low.Length != size || high.Length != size)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "Box bounds need prod(shape) = " + size + " entries each");
            }
            for (int i = 0; i < size; ++i)
            {
                if (low[i] > high[i]) throw new TetherException(ErrorCode.InvalidArgument, "Box low must not exceed high");
                if (dtype == ByteDtype && (low[i] < 0 || high[i] > 255))
                {
                    throw new TetherException(ErrorCode.InvalidArgument, "a uint8 Box's bounds must lie within [0, 255]");
                }
            }
            return new Space
            {
                Kind = SpaceKind.Box, Shape = (long[])shape.Clone(), Low = (double[])low.Clone(),
                High = (double[])high.Clone(), Dtype = dtype,
            };
        }

        /// <summary>A Box with the same bounds for every element (<paramref name="dtype"/> "uint8": a byte box).</summary>
        public static Space Box(long[] shape, double low, double high, string dtype = "float32")
        {
            if (CappedProduct(shape) > MaxSpaceElements) throw new TetherException(ErrorCode.InvalidArgument, TooLarge("Box prod(shape)"));
            long size = 1;
            foreach (long d in shape) size *= Math.Max(0, d);
            var lows = new double[size];
            var highs = new double[size];
            for (long i = 0; i < size; ++i)
            {
                lows[i] = low;
                highs[i] = high;
            }
            return Box(shape, lows, highs, dtype);
        }

        /// <summary>
        /// A byte box (protocol 1.4, §8.1) of bounds [0, 255]: an image of shape [height, width, channels]
        /// as an engine's camera gives it.
        /// </summary>
        public static Space ByteBox(long[] shape) { return Box(shape, 0, 255, ByteDtype); }

        /// <summary>Discrete(n, start). INVALID_ARGUMENT unless 1 &lt;= n &lt;= MaxSpaceElements.</summary>
        public static Space Discrete(long n, long start = 0)
        {
            if (n < 1) throw new TetherException(ErrorCode.InvalidArgument, "Discrete n must be a positive integer");
            if (n > MaxSpaceElements) throw new TetherException(ErrorCode.InvalidArgument, TooLarge("Discrete n"));
            return new Space { Kind = SpaceKind.Discrete, Shape = new long[0], N = n, Start = start };
        }

        /// <summary>MultiDiscrete(nvec). INVALID_ARGUMENT for an empty nvec or a size below 1.</summary>
        public static Space MultiDiscrete(long[] nvec)
        {
            if (nvec.Length == 0) throw new TetherException(ErrorCode.InvalidArgument, "MultiDiscrete nvec must not be empty");
            long total = 0;
            foreach (long v in nvec)
            {
                if (v < 1) throw new TetherException(ErrorCode.InvalidArgument, "MultiDiscrete nvec must be positive integers");
                total += Math.Min(v, MaxSpaceElements + 1);
                if (total > MaxSpaceElements) throw new TetherException(ErrorCode.InvalidArgument, TooLarge("MultiDiscrete sum(nvec)"));
            }
            return new Space { Kind = SpaceKind.MultiDiscrete, Shape = new long[] { nvec.Length }, Nvec = (long[])nvec.Clone() };
        }

        /// <summary>
        /// A Dict (protocol 1.4, §8.6) of the named subspaces, in any order (its leaves follow the keys
        /// sorted by code point). INVALID_ARGUMENT for no subspace, a key that is not of A-Z a-z 0-9 _ -,
        /// or beyond 8 levels or 64 leaves.
        /// </summary>
        public static Space Dict(IEnumerable<KeyValuePair<string, Space>> spaces)
        {
            if (spaces == null) throw new TetherException(ErrorCode.InvalidArgument, "a Dict needs its subspaces");
            var sorted = new List<KeyValuePair<string, Space>>(spaces);
            foreach (KeyValuePair<string, Space> item in sorted)
            {
                if (!ValidKey(item.Key)) throw new TetherException(ErrorCode.InvalidArgument, "Dict key " + Quote(item.Key) + " is not a non-empty string of A-Z a-z 0-9 _ -");
                if (item.Value == null) throw new TetherException(ErrorCode.InvalidArgument, "Dict key '" + item.Key + "' has no space");
            }
            sorted.Sort((a, b) => string.CompareOrdinal(a.Key, b.Key));
            for (int i = 1; i < sorted.Count; ++i)
            {
                if (sorted[i].Key == sorted[i - 1].Key) throw new TetherException(ErrorCode.InvalidArgument, "Dict key '" + sorted[i].Key + "' is given twice");
            }
            return Composite(SpaceKind.Dict, sorted);
        }

        /// <summary>A Tuple (protocol 1.4, §8.6) of the subspaces in order. INVALID_ARGUMENT for none, or beyond 8 levels or 64 leaves.</summary>
        public static Space Tuple(params Space[] spaces)
        {
            if (spaces == null) throw new TetherException(ErrorCode.InvalidArgument, "a Tuple needs its subspaces");
            var items = new List<KeyValuePair<string, Space>>();
            for (int i = 0; i < spaces.Length; ++i)
            {
                if (spaces[i] == null) throw new TetherException(ErrorCode.InvalidArgument, "Tuple entry " + i + " has no space");
                items.Add(new KeyValuePair<string, Space>(i.ToString(System.Globalization.CultureInfo.InvariantCulture), spaces[i]));
            }
            return Composite(SpaceKind.Tuple, items);
        }

        static Space Composite(SpaceKind kind, List<KeyValuePair<string, Space>> items)
        {
            string name = kind == SpaceKind.Dict ? "Dict" : "Tuple";
            if (items.Count == 0) throw new TetherException(ErrorCode.InvalidArgument, "a " + name + " needs at least one subspace");
            var space = new Space { Kind = kind, children = items.ToArray() };
            var found = new List<SpaceLeaf>();
            long total = 0;
            foreach (KeyValuePair<string, Space> item in items)
            {
                Space child = item.Value;
                space.nesting = Math.Max(space.nesting, child.nesting + 1);
                if (!child.IsComposite)
                {
                    found.Add(new SpaceLeaf(item.Key, child, found.Count, (int)total));
                    total += child.FlatDim;
                }
                else
                {
                    foreach (SpaceLeaf leaf in child.leaves)
                    {
                        found.Add(new SpaceLeaf(item.Key + "." + leaf.Path, leaf.Space, found.Count, (int)total));
                        total += leaf.Size;
                    }
                }
                if (found.Count > MaxLeaves) throw new TetherException(ErrorCode.InvalidArgument, "a " + name + " has more than " + MaxLeaves + " leaves");
                if (total > MaxSpaceElements) throw new TetherException(ErrorCode.InvalidArgument, TooLarge(name + " flat row"));
            }
            if (space.nesting > MaxNesting) throw new TetherException(ErrorCode.InvalidArgument, "a " + name + " nests more than " + MaxNesting + " Dict or Tuple spaces");
            space.leaves = found.ToArray();
            space.flatDim = (int)total;
            space.Shape = new long[] { total };
            return space;
        }

        static bool ValidKey(string key)
        {
            if (string.IsNullOrEmpty(key)) return false;
            foreach (char c in key)
            {
                bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
                if (!ok) return false;
            }
            return true;
        }

        static string Quote(string s) { return s == null ? "None" : "'" + s + "'"; }

        /// <summary>The space a JSON description gives (§8.1). Throws INVALID_FIELD naming what is wrong.</summary>
        public static Space FromJson(JToken data)
        {
            var obj = data as JObject;
            if (obj == null) throw Invalid("a space must be a JSON object, got " + Messages.Describe(data));
            JToken kindToken = obj["type"];
            string kind = kindToken != null && kindToken.Type == JTokenType.String ? (string)kindToken : null;
            try
            {
                if (kind == "Box") return BoxFromJson(obj);
                if (kind == "Discrete") return DiscreteFromJson(obj);
                if (kind == "MultiDiscrete") return MultiDiscreteFromJson(obj);
                if (kind == "Dict") return DictFromJson(obj);
                if (kind == "Tuple") return TupleFromJson(obj);
            }
            catch (TetherException e)
            {
                if (e.Code == ErrorCode.InvalidField) throw;
                throw Invalid(e.Detail);  // a factory's INVALID_ARGUMENT: the description is what is wrong
            }
            throw Invalid("unknown space type " + (kindToken == null ? "None" : kindToken.ToString(Newtonsoft.Json.Formatting.None)) +
                          " (Box, Discrete, MultiDiscrete, Dict, Tuple)");
        }

        /// <summary>
        /// <see cref="FromJson"/> for a module's action space: INVALID_FIELD for a Dict or Tuple too (§8.6:
        /// composite spaces are for observations only).
        /// </summary>
        public static Space ActionFromJson(JToken data)
        {
            Space space = FromJson(data);
            if (space.IsComposite) throw Invalid("an action space must be a Box, Discrete or MultiDiscrete, not a " + space.Kind);
            return space;
        }

        static Space DictFromJson(JObject obj)
        {
            var spaces = obj["spaces"] as JObject;
            if (spaces == null) throw Invalid("a Dict's spaces must be an object of key -> space");
            var items = new List<KeyValuePair<string, Space>>();
            foreach (JProperty item in spaces.Properties())
            {
                if (!ValidKey(item.Name)) throw Invalid("Dict key " + Quote(item.Name) + " is not a non-empty string of A-Z a-z 0-9 _ -");
                items.Add(new KeyValuePair<string, Space>(item.Name, FromJson(item.Value)));
            }
            return Dict(items);
        }

        static Space TupleFromJson(JObject obj)
        {
            var spaces = obj["spaces"] as JArray;
            if (spaces == null) throw Invalid("a Tuple's spaces must be an array of spaces");
            var items = new Space[spaces.Count];
            for (int i = 0; i < items.Length; ++i) items[i] = FromJson(spaces[i]);
            return Tuple(items);
        }

        static Space BoxFromJson(JObject obj)
        {
            JToken shapeToken = obj["shape"];
            if (shapeToken == null) throw Invalid("missing key 'shape'");
            var shapeArray = shapeToken as JArray;
            if (shapeArray == null) throw Invalid("Box shape must be a list of integers");
            var shape = new List<long>();
            foreach (JToken d in shapeArray)
            {
                if (d.Type != JTokenType.Integer) throw Invalid("Box shape must be a list of integers");
                long v = AsInt64(d);
                if (v < 0) throw Invalid("Box shape must be non-negative");
                shape.Add(v);
            }
            long[] dims = shape.ToArray();
            if (CappedProduct(dims) > MaxSpaceElements) throw Invalid(TooLarge("Box prod(shape)"));
            long size = Product(dims);
            double[] low = Bound(obj["low"] ?? new JValue("-inf"), size, "low");
            double[] high = Bound(obj["high"] ?? new JValue("inf"), size, "high");
            for (long i = 0; i < size; ++i)
            {
                if (low[i] > high[i]) throw Invalid("Box low must not exceed high");
            }
            JToken dtype = obj["dtype"];
            if (dtype != null && dtype.Type != JTokenType.String) throw Invalid("Box dtype must be a string, got " + dtype.ToString(Newtonsoft.Json.Formatting.None));
            return Box(dims, low, high, dtype == null ? "float32" : (string)dtype);
        }

        static Space DiscreteFromJson(JObject obj)
        {
            JToken n = obj["n"];
            if (n == null) throw Invalid("missing key 'n'");
            if (n.Type != JTokenType.Integer || AsInt64(n) < 1) throw Invalid("Discrete n must be a positive integer, got " + n.ToString(Newtonsoft.Json.Formatting.None));
            long start = 0;
            JToken s = obj["start"];
            if (s != null)
            {
                if (s.Type != JTokenType.Integer) throw Invalid("Discrete start must be an integer");
                start = AsInt64(s);
            }
            return Discrete(AsInt64(n), start);
        }

        static Space MultiDiscreteFromJson(JObject obj)
        {
            JToken nvecToken = obj["nvec"];
            if (nvecToken == null) throw Invalid("missing key 'nvec'");
            var nvecArray = nvecToken as JArray;
            if (nvecArray == null) throw Invalid("MultiDiscrete nvec must be a list of positive integers");
            var nvec = new List<long>();
            foreach (JToken v in nvecArray)
            {
                if (v.Type != JTokenType.Integer || AsInt64(v) < 1) throw Invalid("MultiDiscrete nvec must be positive integers");
                nvec.Add(AsInt64(v));
            }
            if (nvec.Count == 0) throw Invalid("MultiDiscrete nvec must be positive integers, got []");
            return MultiDiscrete(nvec.ToArray());
        }

        /// <summary>Whether <paramref name="width"/> values at <paramref name="offset"/> are one member of the space (a Box compared at float32 precision).</summary>
        public bool Contains(double[] x, int offset, int width)
        {
            if (width != FlatDim || IsComposite) return false;  // (actions are never composite)
            switch (Kind)
            {
                case SpaceKind.Box:
                    for (int i = 0; i < width; ++i)
                    {
                        float v = (float)x[offset + i];
                        if (!(v >= (float)Low[i] && v <= (float)High[i])) return false;
                    }
                    return true;
                case SpaceKind.Discrete:
                    return IsWhole(x[offset]) && x[offset] >= Start && x[offset] < Start + N;
                default:
                    for (int i = 0; i < width; ++i)
                    {
                        if (!IsWhole(x[offset + i]) || x[offset + i] < 0 || x[offset + i] >= Nvec[i]) return false;
                    }
                    return true;
            }
        }

        static bool IsWhole(double x) { return !double.IsNaN(x) && !double.IsInfinity(x) && x == Math.Round(x); }

        /// <summary>The canonical JSON description (bounds that are all equal written once; infinities as "inf"/"-inf").</summary>
        public JObject ToJson()
        {
            switch (Kind)
            {
                case SpaceKind.Box:
                    return new JObject
                    {
                        { "type", "Box" }, { "shape", new JArray(Shape) }, { "dtype", Dtype },
                        { "low", BoundToJson(Low) }, { "high", BoundToJson(High) },
                    };
                case SpaceKind.Discrete:
                    return new JObject { { "type", "Discrete" }, { "n", N }, { "start", Start } };
                case SpaceKind.MultiDiscrete:
                    return new JObject { { "type", "MultiDiscrete" }, { "nvec", new JArray(Nvec) } };
                case SpaceKind.Dict:
                    var keyed = new JObject();
                    foreach (KeyValuePair<string, Space> child in children) keyed[child.Key] = child.Value.ToJson();
                    return new JObject { { "type", "Dict" }, { "spaces", keyed } };
                default:
                    var ordered = new JArray();
                    foreach (KeyValuePair<string, Space> child in children) ordered.Add(child.Value.ToJson());
                    return new JObject { { "type", "Tuple" }, { "spaces", ordered } };
            }
        }

        static double[] Bound(JToken value, long size, string what)
        {
            var values = new double[size];
            var array = value as JArray;
            if (array != null)
            {
                if (array.Count != size) throw Invalid("Box " + what + " has " + array.Count + " entries, the shape needs " + size);
                for (int i = 0; i < size; ++i)
                {
                    if (!BoundNumber(array[i], out values[i])) throw Invalid("Box " + what + " entries must be numbers or 'inf'/'-inf', got " + array[i].ToString(Newtonsoft.Json.Formatting.None));
                }
                return values;
            }
            double v;
            if (!BoundNumber(value, out v)) throw Invalid("Box " + what + " entries must be numbers or 'inf'/'-inf', got " + value.ToString(Newtonsoft.Json.Formatting.None));
            for (long i = 0; i < size; ++i) values[i] = v;
            return values;
        }

        static bool BoundNumber(JToken value, out double number)
        {
            number = 0;
            if (value.Type == JTokenType.String)
            {
                string s = (string)value;
                if (s == "inf") number = double.PositiveInfinity;
                else if (s == "-inf") number = double.NegativeInfinity;
                else return false;
                return true;
            }
            if (value.Type != JTokenType.Integer && value.Type != JTokenType.Float) return false;
            number = (double)value;
            return true;
        }

        static JToken NumberToJson(double v)
        {
            if (double.IsPositiveInfinity(v)) return "inf";
            if (double.IsNegativeInfinity(v)) return "-inf";
            if (v == Math.Floor(v) && Math.Abs(v) < 9007199254740992.0) return (long)v;
            return v;
        }

        static JToken BoundToJson(double[] values)
        {
            bool allEqual = values.Length > 0;
            foreach (double v in values) allEqual = allEqual && v.Equals(values[0]);
            if (allEqual) return NumberToJson(values[0]);
            var array = new JArray();
            foreach (double v in values) array.Add(NumberToJson(v));
            return array;
        }

        internal static long AsInt64(JToken value)
        {
            object raw = ((JValue)value).Value;
            if (raw is BigInteger)
            {
                var big = (BigInteger)raw;
                return big > long.MaxValue ? long.MaxValue : big < long.MinValue ? long.MinValue : (long)big;
            }
            return Convert.ToInt64(raw);
        }

        static long Product(long[] shape)
        {
            long n = 1;
            foreach (long d in shape) n *= d;
            return n;
        }

        // prod(shape) without overflow; MaxSpaceElements + 1 once it is beyond the limit.
        static long CappedProduct(long[] shape)
        {
            long n = 1;
            foreach (long d in shape)
            {
                if (d == 0) return 0;
                if (d < 0 || d > MaxSpaceElements || n > MaxSpaceElements / d) n = MaxSpaceElements + 1;
                else n *= d;
            }
            return Math.Min(n, MaxSpaceElements + 1);
        }

        static string TooLarge(string what) { return what + " exceeds the " + MaxSpaceElements + " numbers a space may need"; }

        static TetherException Invalid(string detail) { return new TetherException(ErrorCode.InvalidField, "invalid space: " + detail); }
    }
}
