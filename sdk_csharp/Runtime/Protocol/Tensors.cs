// Binary tensors (docs/protocol.md §10.9, protocol 1.4): an array as its raw bytes, in the body's
// binary attachment (§4.3) or inline as base64, instead of one JSON number per value.
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Text;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>
    /// A decoded tensor object: its element type, shape and raw bytes (row-major, each element
    /// little-endian). Immutable once made.
    /// </summary>
    public sealed class Tensor
    {
        readonly byte[] data;
        readonly int start;

        /// <summary>"uint8" or "float32".</summary>
        public string Dtype { get; private set; }

        /// <summary>The array's shape (1 to 32 dimensions).</summary>
        public long[] Shape { get; private set; }

        /// <summary>Number of elements: prod(shape).</summary>
        public int Count { get; private set; }

        /// <summary>Bytes per element: 1 for uint8, 4 for float32.</summary>
        public int ElementSize { get { return Tensors.SizeOf(Dtype); } }

        internal Tensor(string dtype, long[] shape, int count, byte[] data, int start)
        {
            Dtype = dtype;
            Shape = shape;
            Count = count;
            this.data = data;
            this.start = start;
        }

        /// <summary>Element <paramref name="i"/> (row-major) as a double: a byte's value, or a float32's.</summary>
        public double this[int i]
        {
            get
            {
                if ((uint)i >= (uint)Count) throw new ArgumentOutOfRangeException("i", "the tensor has " + Count + " elements");
                return Dtype == Tensors.Uint8 ? data[start + i] : Tensors.ReadFloat32(data, start + 4 * i);
            }
        }

        /// <summary>Every element, row-major, as doubles.</summary>
        public double[] ToDoubles()
        {
            var values = new double[Count];
            for (int i = 0; i < values.Length; ++i) values[i] = this[i];
            return values;
        }

        /// <summary>The raw bytes (Count x ElementSize of them), copied.</summary>
        public byte[] ToBytes()
        {
            var bytes = new byte[Count * ElementSize];
            Buffer.BlockCopy(data, start, bytes, 0, bytes.Length);
            return bytes;
        }
    }

    /// <summary>
    /// Reading and writing tensor objects (§10.9):
    /// <c>{"dtype": "uint8", "shape": [3, 84, 84, 4], "offset": 0}</c> (its bytes in the body's
    /// attachment, from that offset) or <c>{"dtype": "uint8", "shape": [...], "b64": "AAEC..."}</c>
    /// (padded standard base64). A client sends tensors only to a server whose PONG announced 1.4 or later.
    /// </summary>
    public static class Tensors
    {
        /// <summary>The dtype of one byte per element.</summary>
        public const string Uint8 = "uint8";
        /// <summary>The dtype of an IEEE 754 binary32 per element.</summary>
        public const string Float32 = "float32";
        /// <summary>The most dimensions a tensor may have.</summary>
        public const int MaxRank = 32;
        /// <summary>The largest dimension a tensor may have (2^31 - 1).</summary>
        public const long MaxDim = int.MaxValue;

        // Beyond any body a frame can hold: a tensor that needs more bytes is refused by its length checks.
        const long Beyond = 1L << 62;

        /// <summary>Whether <paramref name="value"/> is written as a tensor object (a JSON object where numbers may be).</summary>
        public static bool IsTensor(JToken value) { return value is JObject; }

        /// <summary>Bytes per element of <paramref name="dtype"/>; 0 for a dtype no tensor has.</summary>
        public static int SizeOf(string dtype) { return dtype == Uint8 ? 1 : dtype == Float32 ? 4 : 0; }

        /// <summary>
        /// The array a tensor object holds. <paramref name="attachment"/>: the body's attachment (§4.3),
        /// which an "offset" refers to (null when the body had none). Throws INVALID_TENSOR saying
        /// which member is wrong, in the order of §10.9: the members, dtype, shape, then offset or b64
        /// (whose length is checked before it is decoded).
        /// </summary>
        public static Tensor Decode(JToken value, byte[] attachment = null)
        {
            var obj = value as JObject;
            if (obj == null) throw Invalid("a tensor must be a JSON object, got " + Messages.Describe(value));
            bool hasB64 = false, hasOffset = false, others = false;
            var names = new List<string>();
            foreach (JProperty member in obj.Properties())
            {
                names.Add(member.Name);
                if (member.Name == "b64") hasB64 = true;
                else if (member.Name == "offset") hasOffset = true;
                else if (member.Name != "dtype" && member.Name != "shape") others = true;
            }
            if (others || obj["dtype"] == null || obj["shape"] == null || hasB64 == hasOffset)
            {
                names.Sort(StringComparer.Ordinal);
                throw Invalid("a tensor has exactly the members dtype, shape and one of b64 and offset, got [" + string.Join(", ", names.ToArray()) + "]");
            }
            JToken dtypeToken = obj["dtype"];
            string dtype = dtypeToken.Type == JTokenType.String ? (string)dtypeToken : null;
            int size = SizeOf(dtype);
            if (size == 0) throw Invalid("tensor dtype must be one of uint8, float32, got " + Text(dtypeToken));
            var shapeArray = obj["shape"] as JArray;
            bool shapeValid = shapeArray != null && shapeArray.Count >= 1 && shapeArray.Count <= MaxRank;
            var shape = new long[shapeValid ? shapeArray.Count : 0];
            for (int i = 0; shapeValid && i < shape.Length; ++i)
            {
                JToken d = shapeArray[i];
                shapeValid = d.Type == JTokenType.Integer && Space.AsInt64(d) >= 0 && Space.AsInt64(d) <= MaxDim;
                if (shapeValid) shape[i] = Space.AsInt64(d);
            }
            if (!shapeValid)
            {
                throw Invalid("tensor shape must be a list of 1 to " + MaxRank + " integers from 0 to " + MaxDim + ", got " + Text(obj["shape"]));
            }
            long count = Product(shape);
            long expected = count >= Beyond / size ? Beyond : count * size;
            if (hasOffset)
            {
                JToken offsetToken = obj["offset"];
                if (offsetToken.Type != JTokenType.Integer || Space.AsInt64(offsetToken) < 0)
                {
                    throw Invalid("tensor offset must be an integer >= 0, got " + Text(offsetToken));
                }
                long offset = Space.AsInt64(offsetToken);
                if (attachment == null) throw Invalid("tensor offset refers to the attachment, but the body has none");
                if (offset > attachment.Length || expected > attachment.Length - offset)
                {
                    throw Invalid("tensor of shape " + ShapeText(shape) + " and dtype " + dtype + " needs " + expected + " bytes at offset " + offset +
                                  ", but the attachment holds " + attachment.Length);
                }
                return new Tensor(dtype, shape, (int)count, attachment, (int)offset);
            }
            JToken b64 = obj["b64"];
            if (b64.Type != JTokenType.String) throw Invalid("tensor b64 must be a string, got " + Messages.Describe(b64));
            string text = (string)b64;
            // Checked before decoding: a short header cannot make a receiver decode (or allocate) more than it got.
            long characters = expected >= Beyond ? Beyond : 4 * ((expected + 2) / 3);
            if (text.Length != characters)
            {
                throw Invalid("tensor of shape " + ShapeText(shape) + " and dtype " + dtype + " holds " + expected + " bytes: its b64 must be " +
                              characters + " characters, got " + text.Length);
            }
            byte[] raw = FromBase64(text);
            if (raw == null) throw Invalid("tensor b64 is not valid base64 (standard alphabet, padded)");
            if (raw.Length != expected) throw Invalid("tensor b64 decodes to " + raw.Length + " bytes, its shape and dtype need " + expected);
            return new Tensor(dtype, shape, (int)count, raw, 0);
        }

        /// <summary>The tensor object of <paramref name="values"/> as a uint8 array of <paramref name="shape"/>, inline as base64.</summary>
        public static JObject Encode(byte[] values, long[] shape)
        {
            CheckCount(values == null ? -1 : values.Length, shape);
            return new JObject { { "dtype", Uint8 }, { "shape", new JArray(shape) }, { "b64", Convert.ToBase64String(values) } };
        }

        /// <summary>The tensor object of <paramref name="values"/> as a float32 array of <paramref name="shape"/> (little-endian), inline as base64.</summary>
        public static JObject Encode(float[] values, long[] shape)
        {
            CheckCount(values == null ? -1 : values.Length, shape);
            var bytes = new byte[4 * values.Length];
            for (int i = 0; i < values.Length; ++i) WriteFloat32(values[i], bytes, 4 * i);
            return new JObject { { "dtype", Float32 }, { "shape", new JArray(shape) }, { "b64", Convert.ToBase64String(bytes) } };
        }

        /// <summary>The tensor object of a decoded tensor, inline as base64 (what <see cref="Decode"/> read, written back).</summary>
        public static JObject Encode(Tensor tensor)
        {
            return new JObject { { "dtype", tensor.Dtype }, { "shape", new JArray(tensor.Shape) }, { "b64", Convert.ToBase64String(tensor.ToBytes()) } };
        }

        /// <summary>
        /// The tensor object of an array of <paramref name="dtype"/> and <paramref name="shape"/> whose
        /// bytes the body's attachment holds from <paramref name="offset"/> on (§4.3).
        /// </summary>
        public static JObject EncodeAt(string dtype, long[] shape, long offset)
        {
            if (SizeOf(dtype) == 0) throw new TetherException(ErrorCode.InvalidArgument, "tensors are uint8 or float32, not " + dtype);
            CheckShape(shape);
            if (offset < 0) throw new TetherException(ErrorCode.InvalidArgument, "a tensor's offset must be >= 0");
            return new JObject { { "dtype", dtype }, { "shape", new JArray(shape) }, { "offset", offset } };
        }

        static void CheckShape(long[] shape)
        {
            if (shape == null || shape.Length < 1 || shape.Length > MaxRank)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "a tensor has 1 to " + MaxRank + " dimensions");
            }
            foreach (long d in shape)
            {
                if (d < 0 || d > MaxDim) throw new TetherException(ErrorCode.InvalidArgument, "a tensor's dimensions are 0 to " + MaxDim + ", not " + d);
            }
        }

        static void CheckCount(int count, long[] shape)
        {
            CheckShape(shape);
            if (count != Product(shape))
            {
                throw new TetherException(ErrorCode.InvalidArgument, "a tensor of shape " + ShapeText(shape) + " holds " + Product(shape) + " values, got " + Math.Max(0, count));
            }
        }

        // prod(shape), Beyond once it is beyond any body.
        static long Product(long[] shape)
        {
            long n = 1;
            foreach (long d in shape)
            {
                if (d == 0) return 0;
            }
            foreach (long d in shape)
            {
                if (n > Beyond / d) return Beyond;
                n *= d;
            }
            return n;
        }

        // Padded standard base64 (RFC 4648 §4), nothing else: no line breaks, no other characters (which
        // Convert.FromBase64String would skip). Null when the text is not such base64. Its length is a
        // multiple of 4 (checked before).
        static byte[] FromBase64(string text)
        {
            int n = text.Length;
            if (n % 4 != 0) return null;
            int pad = n > 0 && text[n - 1] == '=' ? (n > 1 && text[n - 2] == '=' ? 2 : 1) : 0;
            var raw = new byte[n / 4 * 3 - pad];
            int at = 0;
            for (int i = 0; i < n; i += 4)
            {
                int bits = 0;
                for (int k = 0; k < 4; ++k)
                {
                    int v = Sextet(text[i + k]);
                    if (v < 0)
                    {
                        // '=' only as the padding at the very end.
                        if (text[i + k] != '=' || i + 4 != n || k < 4 - pad) return null;
                        v = 0;
                    }
                    bits = (bits << 6) | v;
                }
                if (at < raw.Length) raw[at++] = (byte)(bits >> 16);
                if (at < raw.Length) raw[at++] = (byte)(bits >> 8);
                if (at < raw.Length) raw[at++] = (byte)bits;
            }
            return raw;
        }

        static int Sextet(char c)
        {
            if (c >= 'A' && c <= 'Z') return c - 'A';
            if (c >= 'a' && c <= 'z') return c - 'a' + 26;
            if (c >= '0' && c <= '9') return c - '0' + 52;
            if (c == '+') return 62;
            if (c == '/') return 63;
            return -1;
        }

        internal static float ReadFloat32(byte[] data, int at)
        {
            if (!BitConverter.IsLittleEndian)
            {
                var swapped = new byte[] { data[at + 3], data[at + 2], data[at + 1], data[at] };
                return BitConverter.ToSingle(swapped, 0);
            }
            return BitConverter.ToSingle(data, at);
        }

        // A float's bits without allocating (BitConverter.GetBytes allocates).
        [System.Runtime.InteropServices.StructLayout(System.Runtime.InteropServices.LayoutKind.Explicit)]
        internal struct FloatBits
        {
            [System.Runtime.InteropServices.FieldOffset(0)] public float Value;
            [System.Runtime.InteropServices.FieldOffset(0)] public int Bits;
        }

        internal static void WriteFloat32(float value, byte[] into, int at)
        {
            int bits = new FloatBits { Value = value }.Bits;
            into[at] = (byte)bits;
            into[at + 1] = (byte)(bits >> 8);
            into[at + 2] = (byte)(bits >> 16);
            into[at + 3] = (byte)(bits >> 24);
        }

        internal static string ShapeText(long[] shape)
        {
            var text = new StringBuilder("[");
            for (int i = 0; i < shape.Length; ++i) text.Append(i > 0 ? ", " : "").Append(shape[i].ToString(CultureInfo.InvariantCulture));
            return text.Append(']').ToString();
        }

        static string Text(JToken value)
        {
            string text = value.ToString(Newtonsoft.Json.Formatting.None);
            return text.Length <= 80 ? text : text.Substring(0, 77) + "...";
        }

        static TetherException Invalid(string detail) { return new TetherException(ErrorCode.InvalidTensor, detail); }
    }
}
