// A policy network read from ONNX bytes into dense layers: what the managed
// backend runs, and what the Inference Engine backend rebuilds with its
// functional API (Unity's runtime cannot import ONNX itself).
using System;
using System.Collections.Generic;
using System.Text;
using Tether.Protocol;

namespace Tether.Inference
{
    /// <summary>What a <see cref="PolicyGraph"/> step does.</summary>
    public enum PolicyStepKind
    {
        /// <summary>output = input x Weights^T + Bias (Weights is out x in, row-major).</summary>
        Dense,
        /// <summary>output = input + Bias (a row broadcast over the batch).</summary>
        AddBias,
        /// <summary>Element-wise tanh.</summary>
        Tanh,
        /// <summary>Element-wise max(0, x).</summary>
        Relu,
        /// <summary>Element-wise 1 / (1 + e^-x).</summary>
        Sigmoid,
        /// <summary>Columns side by side: each part a computed value or a constant row repeated per batch row.</summary>
        Concat,
    }

    /// <summary>One part of a <see cref="PolicyStepKind.Concat"/>: a computed value, or a constant row.</summary>
    public sealed class ConcatPart
    {
        /// <summary>The computed value taken (-1 for a constant row).</summary>
        public int Value = -1;
        /// <summary>The constant row repeated for every batch row (null for a computed value).</summary>
        public float[] Constant;
        /// <summary>Columns this part adds.</summary>
        public int Width;
    }

    /// <summary>One operation of a <see cref="PolicyGraph"/>, from value <see cref="Input"/> to value <see cref="Output"/>.</summary>
    public sealed class PolicyStep
    {
        /// <summary>What it does.</summary>
        public PolicyStepKind Kind;
        /// <summary>The value it reads (0 is the model's input); unused by Concat.</summary>
        public int Input;
        /// <summary>The value it writes.</summary>
        public int Output;
        /// <summary>Dense: out x in weights, row-major.</summary>
        public float[] Weights;
        /// <summary>Dense and AddBias: one value per output column.</summary>
        public float[] Bias;
        /// <summary>Concat: the parts, left to right.</summary>
        public ConcatPart[] Parts;
    }

    /// <summary>
    /// A feed-forward policy as a list of steps over values of shape (batch,
    /// width). It reads what Tether's server exports and what torch.onnx.export
    /// writes for an MLP: Gemm, MatMul, Add, Tanh, Relu, Sigmoid, Identity, and
    /// the Shape/Expand/Concat that appends a state-independent log_std; and the
    /// Flatten (axis 1) and Cast to float that begin the model of a byte box
    /// (protocol 1.4, §12.1), whose input is then fed the bytes' values as floats,
    /// one row per observation. Any other operator is refused with INFERENCE_FAILED naming it.
    /// </summary>
    public sealed class PolicyGraph
    {
        /// <summary>The steps in order; each writes a new value.</summary>
        public readonly List<PolicyStep> Steps = new List<PolicyStep>();
        /// <summary>Width of each value; value 0 is the model's input.</summary>
        public readonly List<int> Widths = new List<int>();
        /// <summary>The value the model's output is.</summary>
        public int OutputValue { get; private set; }
        /// <summary>Observation width (the input's).</summary>
        public int InputWidth { get { return Widths[0]; } }
        /// <summary>Output width (dist inputs per row).</summary>
        public int OutputWidth { get { return Widths[OutputValue]; } }

        // What a name in the graph stands for while it is read.
        sealed class Symbol
        {
            public int Value = -1;        // a computed value
            public float[] Constant;      // an initializer's data
            public long[] Dims;           // its dims
            public int ShapeOf = -1;      // the output of Shape(value)
            public float[] ConstantRow;   // Expand(constant, Shape(x)): a row repeated per batch row
        }

        /// <summary>Reads an ONNX model; <paramref name="inputName"/> and <paramref name="outputName"/> as SET_CONFIG names them.</summary>
        public static PolicyGraph Read(byte[] onnx, string inputName, string outputName)
        {
            if (onnx == null || onnx.Length == 0) throw Fail("the model is empty");
            OnnxModel model;
            try
            {
                model = OnnxModel.Parse(onnx);
            }
            catch (FormatException e)
            {
                throw Fail("the model is not a readable ONNX file: " + e.Message);
            }
            var graph = new PolicyGraph();
            var symbols = new Dictionary<string, Symbol>(StringComparer.Ordinal);
            foreach (OnnxTensor t in model.Initializers) symbols[t.Name] = new Symbol { Constant = t.Data, Dims = t.Dims };
            if (!model.Inputs.Contains(inputName)) throw Fail("the model has no input '" + inputName + "'");
            graph.Widths.Add(-1);  // known from the first layer that reads it
            symbols[inputName] = new Symbol { Value = 0 };
            foreach (OnnxNode node in model.Nodes) graph.Add(node, symbols);
            Symbol output;
            if (!model.Outputs.Contains(outputName) || !symbols.TryGetValue(outputName, out output)) throw Fail("the model has no output '" + outputName + "'");
            if (output.Value < 0) throw Fail("the output '" + outputName + "' does not depend on the observation");
            if (graph.Widths[0] < 0) throw Fail("the model's input width is not fixed by any layer");
            graph.OutputValue = output.Value;
            return graph;
        }

        static TetherException Fail(string message) { return new TetherException(ErrorCode.InferenceFailed, message); }

        int NewValue(int width)
        {
            Widths.Add(width);
            return Widths.Count - 1;
        }

        static Symbol Get(Dictionary<string, Symbol> symbols, OnnxNode node, int index)
        {
            Symbol s;
            if (index >= node.Inputs.Count || !symbols.TryGetValue(node.Inputs[index], out s)) throw Fail(node.OpType + " node '" + node.Name + "' reads an unknown input");
            return s;
        }

        Symbol Computed(Dictionary<string, Symbol> symbols, OnnxNode node, int index)
        {
            Symbol s = Get(symbols, node, index);
            if (s.Value < 0) throw Fail(node.OpType + " node '" + node.Name + "': input " + index + " must depend on the observation");
            return s;
        }

        static float[] Row(Symbol s, int width, OnnxNode node)
        {
            if (s.Constant == null) throw Fail(node.OpType + " node '" + node.Name + "': a constant (initializer) is needed");
            long count = 1;
            foreach (long d in s.Dims) count *= d;
            bool rowShaped = s.Dims.Length == 1 || (s.Dims.Length == 2 && s.Dims[0] == 1);
            if (!rowShaped || count != width) throw Fail(node.OpType + " node '" + node.Name + "': a constant of " + width + " values is needed");
            return s.Constant;
        }

        // The input width is learnt from the first layer reading it; later layers must agree.
        void Expect(int value, int width, OnnxNode node)
        {
            if (Widths[value] < 0) Widths[value] = width;
            else if (Widths[value] != width) throw Fail(node.OpType + " node '" + node.Name + "' takes " + width + " columns, its input has " + Widths[value]);
        }

        void Add(OnnxNode node, Dictionary<string, Symbol> symbols)
        {
            if (node.Outputs.Count != 1) throw Fail(node.OpType + " node '" + node.Name + "' has " + node.Outputs.Count + " outputs");
            string output = node.Outputs[0];
            switch (node.OpType)
            {
                case "Gemm":
                case "MatMul":
                {
                    Symbol x = Computed(symbols, node, 0);
                    Symbol w = Get(symbols, node, 1);
                    if (w.Constant == null || w.Dims.Length != 2) throw Fail(node.OpType + " node '" + node.Name + "': the weights must be a 2-D initializer");
                    bool gemm = node.OpType == "Gemm";
                    if (gemm && node.Int("transA", 0) != 0) throw Fail("Gemm node '" + node.Name + "': transA is not supported");
                    bool transB = gemm && node.Int("transB", 0) != 0;
                    float alpha = gemm ? node.Float("alpha", 1f) : 1f, beta = gemm ? node.Float("beta", 1f) : 1f;
                    int inWidth = (int)(transB ? w.Dims[1] : w.Dims[0]), outWidth = (int)(transB ? w.Dims[0] : w.Dims[1]);
                    Expect(x.Value, inWidth, node);
                    var weights = new float[outWidth * inWidth];
                    for (int o = 0; o < outWidth; ++o)
                    {
                        for (int i = 0; i < inWidth; ++i) weights[o * inWidth + i] = alpha * (transB ? w.Constant[o * inWidth + i] : w.Constant[i * outWidth + o]);
                    }
                    var bias = new float[outWidth];
                    if (gemm && node.Inputs.Count > 2 && node.Inputs[2].Length > 0)
                    {
                        float[] c = Row(Get(symbols, node, 2), outWidth, node);
                        for (int o = 0; o < outWidth; ++o) bias[o] = beta * c[o];
                    }
                    int y = NewValue(outWidth);
                    Steps.Add(new PolicyStep { Kind = PolicyStepKind.Dense, Input = x.Value, Output = y, Weights = weights, Bias = bias });
                    symbols[output] = new Symbol { Value = y };
                    return;
                }
                case "Add":
                {
                    Symbol a = Get(symbols, node, 0), b = Get(symbols, node, 1);
                    Symbol x = a.Value >= 0 ? a : b, c = a.Value >= 0 ? b : a;
                    if (x.Value < 0 || c.Value >= 0) throw Fail("Add node '" + node.Name + "': one computed value plus one constant row is supported");
                    int width = Widths[x.Value];
                    if (width < 0) throw Fail("Add node '" + node.Name + "' reads the input before any layer fixed its width");
                    int y = NewValue(width);
                    Steps.Add(new PolicyStep { Kind = PolicyStepKind.AddBias, Input = x.Value, Output = y, Bias = (float[])Row(c, width, node).Clone() });
                    symbols[output] = new Symbol { Value = y };
                    return;
                }
                case "Tanh":
                case "Relu":
                case "Sigmoid":
                {
                    Symbol x = Computed(symbols, node, 0);
                    if (Widths[x.Value] < 0) throw Fail(node.OpType + " node '" + node.Name + "' reads the input before any layer fixed its width");
                    int y = NewValue(Widths[x.Value]);
                    var kind = node.OpType == "Tanh" ? PolicyStepKind.Tanh : node.OpType == "Relu" ? PolicyStepKind.Relu : PolicyStepKind.Sigmoid;
                    Steps.Add(new PolicyStep { Kind = kind, Input = x.Value, Output = y });
                    symbols[output] = new Symbol { Value = y };
                    return;
                }
                case "Identity":
                    symbols[output] = Get(symbols, node, 0);
                    return;
                case "Flatten":
                    // Every value here is (batch, width): rows already flat.
                    if (node.Int("axis", 1) != 1) throw Fail("Flatten node '" + node.Name + "': only axis 1 (one row per observation) is supported");
                    symbols[output] = Computed(symbols, node, 0);
                    return;
                case "Cast":
                    // Every value here is float: a byte box's uint8 input is fed its values as floats.
                    if (node.Int("to", 0) != 1 /* FLOAT */) throw Fail("Cast node '" + node.Name + "': only a cast to float is supported");
                    symbols[output] = Computed(symbols, node, 0);
                    return;
                case "Shape":
                    symbols[output] = new Symbol { ShapeOf = Computed(symbols, node, 0).Value };
                    return;
                case "Expand":
                {
                    Symbol c = Get(symbols, node, 0), shape = Get(symbols, node, 1);
                    if (c.Constant == null || shape.ShapeOf < 0) throw Fail("Expand node '" + node.Name + "': only a constant row expanded to a value's shape is supported");
                    int width = Widths[shape.ShapeOf];
                    symbols[output] = new Symbol { ConstantRow = (float[])Row(c, width, node).Clone() };
                    return;
                }
                case "Concat":
                {
                    long axis = node.Int("axis", 0);
                    if (axis != 1 && axis != -1) throw Fail("Concat node '" + node.Name + "': only columns (axis 1) are supported");
                    var parts = new ConcatPart[node.Inputs.Count];
                    int width = 0;
                    for (int k = 0; k < parts.Length; ++k)
                    {
                        Symbol s = Get(symbols, node, k);
                        if (s.Value >= 0) parts[k] = new ConcatPart { Value = s.Value, Width = Widths[s.Value] };
                        else if (s.ConstantRow != null) parts[k] = new ConcatPart { Constant = s.ConstantRow, Width = s.ConstantRow.Length };
                        else throw Fail("Concat node '" + node.Name + "': input " + k + " is neither computed nor an expanded constant");
                        if (parts[k].Width < 0) throw Fail("Concat node '" + node.Name + "' reads the input before any layer fixed its width");
                        width += parts[k].Width;
                    }
                    int y = NewValue(width);
                    Steps.Add(new PolicyStep { Kind = PolicyStepKind.Concat, Output = y, Parts = parts });
                    symbols[output] = new Symbol { Value = y };
                    return;
                }
                default:
                    throw Fail("operator " + node.OpType + " (node '" + node.Name + "') is not supported; supported: Gemm, MatMul, Add, Tanh, Relu, Sigmoid, Identity, Shape/Expand/Concat, Flatten, Cast to float");
            }
        }
    }

    // The few parts of ONNX's protobuf messages a policy needs (onnx.proto field numbers).
    sealed class OnnxTensor
    {
        public string Name = "";
        public long[] Dims = new long[0];
        public float[] Data;
    }

    sealed class OnnxNode
    {
        public readonly List<string> Inputs = new List<string>();
        public readonly List<string> Outputs = new List<string>();
        public string Name = "";
        public string OpType = "";
        public readonly Dictionary<string, long> Ints = new Dictionary<string, long>();
        public readonly Dictionary<string, float> Floats = new Dictionary<string, float>();

        public long Int(string name, long fallback) { long v; return Ints.TryGetValue(name, out v) ? v : fallback; }
        public float Float(string name, float fallback) { float v; return Floats.TryGetValue(name, out v) ? v : fallback; }
    }

    sealed class OnnxModel
    {
        public readonly List<OnnxNode> Nodes = new List<OnnxNode>();
        public readonly List<OnnxTensor> Initializers = new List<OnnxTensor>();
        public readonly HashSet<string> Inputs = new HashSet<string>(StringComparer.Ordinal);
        public readonly HashSet<string> Outputs = new HashSet<string>(StringComparer.Ordinal);

        const int FloatType = 1;
        const long MaxValues = 1L << 26;  // 256 MiB of floats: the SDK's model size limit

        public static OnnxModel Parse(byte[] bytes)
        {
            var model = new OnnxModel();
            var reader = new ProtoReader(bytes, 0, bytes.Length);
            bool sawGraph = false;
            while (reader.More)
            {
                int field, wire;
                reader.Tag(out field, out wire);
                if (field == 7 && wire == 2)  // ModelProto.graph
                {
                    sawGraph = true;
                    model.ReadGraph(reader.Sub());
                }
                else reader.Skip(wire);
            }
            if (!sawGraph) throw new FormatException("no graph");
            return model;
        }

        void ReadGraph(ProtoReader r)
        {
            while (r.More)
            {
                int field, wire;
                r.Tag(out field, out wire);
                if (field == 1 && wire == 2) Nodes.Add(ReadNode(r.Sub()));
                else if (field == 5 && wire == 2) Initializers.Add(ReadTensor(r.Sub()));
                else if (field == 11 && wire == 2) Inputs.Add(ReadValueInfoName(r.Sub()));
                else if (field == 12 && wire == 2) Outputs.Add(ReadValueInfoName(r.Sub()));
                else r.Skip(wire);
            }
        }

        static string ReadValueInfoName(ProtoReader r)
        {
            string name = "";
            while (r.More)
            {
                int field, wire;
                r.Tag(out field, out wire);
                if (field == 1 && wire == 2) name = r.String();
                else r.Skip(wire);
            }
            return name;
        }

        static OnnxNode ReadNode(ProtoReader r)
        {
            var node = new OnnxNode();
            while (r.More)
            {
                int field, wire;
                r.Tag(out field, out wire);
                if (field == 1 && wire == 2) node.Inputs.Add(r.String());
                else if (field == 2 && wire == 2) node.Outputs.Add(r.String());
                else if (field == 3 && wire == 2) node.Name = r.String();
                else if (field == 4 && wire == 2) node.OpType = r.String();
                else if (field == 5 && wire == 2) ReadAttribute(r.Sub(), node);
                else r.Skip(wire);
            }
            return node;
        }

        static void ReadAttribute(ProtoReader r, OnnxNode node)
        {
            string name = "";
            float? f = null;
            long? i = null;
            while (r.More)
            {
                int field, wire;
                r.Tag(out field, out wire);
                if (field == 1 && wire == 2) name = r.String();
                else if (field == 2 && wire == 5) f = r.Float();
                else if (field == 3 && wire == 0) i = (long)r.Varint();
                else r.Skip(wire);
            }
            if (f.HasValue) node.Floats[name] = f.Value;
            if (i.HasValue) node.Ints[name] = i.Value;
        }

        static OnnxTensor ReadTensor(ProtoReader r)
        {
            var t = new OnnxTensor();
            var dims = new List<long>();
            var floats = new List<float>();
            byte[] raw = null;
            int rawStart = 0, rawLength = 0;
            int dataType = 0;
            while (r.More)
            {
                int field, wire;
                r.Tag(out field, out wire);
                if (field == 1 && wire == 0) dims.Add((long)r.Varint());
                else if (field == 1 && wire == 2)
                {
                    ProtoReader packed = r.Sub();
                    while (packed.More) dims.Add((long)packed.Varint());
                }
                else if (field == 2 && wire == 0) dataType = (int)r.Varint();
                else if (field == 4 && wire == 2)
                {
                    ProtoReader packed = r.Sub();
                    while (packed.More) floats.Add(packed.Float());
                }
                else if (field == 4 && wire == 5) floats.Add(r.Float());
                else if (field == 8 && wire == 2) t.Name = r.String();
                else if (field == 9 && wire == 2) r.Bytes(out raw, out rawStart, out rawLength);
                else r.Skip(wire);
            }
            if (dataType != FloatType) throw new FormatException("initializer '" + t.Name + "' is not float32 (data type " + dataType + ")");
            long count = 1;
            foreach (long d in dims)
            {
                if (d < 0 || d > MaxValues) throw new FormatException("initializer '" + t.Name + "' has a dimension of " + d);
                count *= d;
                if (count > MaxValues) throw new FormatException("initializer '" + t.Name + "' is too large");
            }
            t.Dims = dims.ToArray();
            if (raw != null)
            {
                if (rawLength != count * 4) throw new FormatException("initializer '" + t.Name + "' holds " + rawLength + " bytes for " + count + " floats");
                t.Data = new float[count];
                Buffer.BlockCopy(raw, rawStart, t.Data, 0, rawLength);
                if (!BitConverter.IsLittleEndian) throw new FormatException("big-endian machines are not supported");
            }
            else
            {
                if (floats.Count != count) throw new FormatException("initializer '" + t.Name + "' holds " + floats.Count + " floats for " + count);
                t.Data = floats.ToArray();
            }
            return t;
        }
    }

    // Protocol Buffers' wire format, read-only, every length checked against the buffer.
    struct ProtoReader
    {
        readonly byte[] data;
        int at;
        readonly int end;

        public ProtoReader(byte[] data, int start, int end)
        {
            this.data = data;
            at = start;
            this.end = end;
        }

        public bool More { get { return at < end; } }

        public ulong Varint()
        {
            ulong value = 0;
            for (int shift = 0; shift < 64; shift += 7)
            {
                if (at >= end) throw new FormatException("truncated varint");
                byte b = data[at++];
                value |= (ulong)(b & 0x7f) << shift;
                if ((b & 0x80) == 0) return value;
            }
            throw new FormatException("varint longer than 10 bytes");
        }

        public void Tag(out int field, out int wire)
        {
            ulong tag = Varint();
            field = (int)(tag >> 3);
            wire = (int)(tag & 7);
            if (field <= 0) throw new FormatException("field number 0");
        }

        int Length()
        {
            ulong length = Varint();
            if (length > (ulong)(end - at)) throw new FormatException("a length runs past the end of the model");
            return (int)length;
        }

        public ProtoReader Sub()
        {
            int length = Length();
            var sub = new ProtoReader(data, at, at + length);
            at += length;
            return sub;
        }

        public void Bytes(out byte[] buffer, out int start, out int length)
        {
            length = Length();
            buffer = data;
            start = at;
            at += length;
        }

        public string String()
        {
            int length = Length();
            string s = Encoding.UTF8.GetString(data, at, length);
            at += length;
            return s;
        }

        public float Float()
        {
            if (end - at < 4) throw new FormatException("truncated float");
            float f = BitConverter.ToSingle(data, at);
            at += 4;
            return f;
        }

        public void Skip(int wire)
        {
            switch (wire)
            {
                case 0: Varint(); return;
                case 1: if (end - at < 8) throw new FormatException("truncated fixed64"); at += 8; return;
                case 2: { int length = Length(); at += length; return; }  // (Length() moves `at` first)
                case 5: if (end - at < 4) throw new FormatException("truncated fixed32"); at += 4; return;
                default: throw new FormatException("wire type " + wire + " is not supported");
            }
        }
    }
}
