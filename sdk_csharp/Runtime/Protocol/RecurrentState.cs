// A module's recurrent state (protocol 1.5, docs/protocol.md §9.1, §12.1): the state tensors its model
// takes and returns beside the observation and the dist inputs.
using System.Collections.Generic;
using System.Collections.ObjectModel;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>One tensor of a module's recurrent state (§12.1): the model's input and output names and its units.</summary>
    public sealed class StateTensor
    {
        /// <summary>The model input fed with the state before the step (float32 [batch, size]).</summary>
        public string Input { get; private set; }

        /// <summary>The model output that gives the state after the step (float32 [batch, size]).</summary>
        public string Output { get; private set; }

        /// <summary>Its units (1 to <see cref="RecurrentState.MaxSize"/>).</summary>
        public int Size { get; private set; }

        /// <summary>A state tensor; the names and size are not checked here (see <see cref="RecurrentState.FromJson"/>).</summary>
        public StateTensor(string input, string output, int size)
        {
            Input = input;
            Output = output;
            Size = size;
        }
    }

    /// <summary>
    /// A module's <c>recurrent_state</c> (protocol 1.5, §9.1): its model has memory, one state tensor per
    /// entry, all of one size. The client keeps the state per actor (§12.4) as one flat row of
    /// <see cref="Width"/> floats: tensor k's values at k × <see cref="Size"/>. A module without memory has
    /// none (null).
    /// </summary>
    public sealed class RecurrentState
    {
        /// <summary>The most units a state tensor may have (§9.1).</summary>
        public const int MaxSize = 4096;

        readonly ReadOnlyCollection<StateTensor> tensors;
        readonly string[] inputNames;

        /// <summary>
        /// A recurrent state of <paramref name="tensors"/>, checked as §9.1 says: at least one, names non-empty
        /// and distinct, sizes 1 to <see cref="MaxSize"/> and equal. INVALID_FIELD otherwise.
        /// </summary>
        public RecurrentState(IList<StateTensor> tensors)
        {
            const string where = "recurrent_state";
            if (tensors == null || tensors.Count == 0) throw new TetherException(ErrorCode.InvalidField, where + " must be a non-empty array");
            var names = new HashSet<string>();
            foreach (StateTensor tensor in tensors)
            {
                if (tensor == null || string.IsNullOrEmpty(tensor.Input) || string.IsNullOrEmpty(tensor.Output))
                {
                    throw new TetherException(ErrorCode.InvalidField, where + ": each entry needs input and output names");
                }
                if (tensor.Size < 1 || tensor.Size > MaxSize)
                {
                    throw new TetherException(ErrorCode.InvalidField, where + ": size must be an integer from 1 to " + MaxSize + ", got " + tensor.Size);
                }
                if (!names.Add(tensor.Input) || !names.Add(tensor.Output) || tensor.Size != tensors[0].Size)
                {
                    throw new TetherException(ErrorCode.InvalidField, where + ": names must be distinct and sizes equal");
                }
            }
            this.tensors = new List<StateTensor>(tensors).AsReadOnly();
            inputNames = new string[tensors.Count];
            for (int k = 0; k < inputNames.Length; ++k) inputNames[k] = tensors[k].Input;
        }

        /// <summary>The state tensors, in the order the model takes them.</summary>
        public IList<StateTensor> Tensors { get { return tensors; } }

        /// <summary>Units of each tensor.</summary>
        public int Size { get { return tensors[0].Size; } }

        /// <summary>Values of one actor's whole state: tensors × size.</summary>
        public int Width { get { return tensors.Count * tensors[0].Size; } }

        /// <summary>The input names, tensor by tensor (the members of a record's <c>state_in</c>).</summary>
        internal string[] InputNames { get { return inputNames; } }

        /// <summary>
        /// The <c>recurrent_state</c> member of a module object or a single-module SET_CONFIG (§9.1, §7.4):
        /// null when absent or JSON null (no memory). INVALID_FIELD for a value that is not a non-empty array,
        /// an entry without string <c>input</c> and <c>output</c> names (non-empty) or without an integer
        /// <c>size</c> from 1 to 4096, a repeated name, or entries of different sizes.
        /// </summary>
        public static RecurrentState FromJson(JToken value)
        {
            if (value == null || value.Type == JTokenType.Null) return null;
            var array = value as JArray;
            if (array == null || array.Count == 0) throw new TetherException(ErrorCode.InvalidField, "recurrent_state must be a non-empty array, got " + Messages.Describe(value));
            var tensors = new List<StateTensor>();
            foreach (JToken item in array)
            {
                var entry = item as JObject;
                JToken input = entry == null ? null : entry["input"], output = entry == null ? null : entry["output"];
                if (input == null || output == null || input.Type != JTokenType.String || output.Type != JTokenType.String)
                {
                    throw new TetherException(ErrorCode.InvalidField, "recurrent_state: each entry needs input and output names");
                }
                JToken size = entry["size"];
                // (a JSON integer: not 3.5, not 3.0, not true)
                if (size == null || size.Type != JTokenType.Integer || !(((JValue)size).Value is long) || (long)size < 1 || (long)size > MaxSize)
                {
                    throw new TetherException(ErrorCode.InvalidField, "recurrent_state: size must be an integer from 1 to " + MaxSize + ", got " +
                                              (size == null ? "none" : size.ToString(Newtonsoft.Json.Formatting.None)));
                }
                tensors.Add(new StateTensor((string)input, (string)output, (int)(long)size));
            }
            return new RecurrentState(tensors);
        }

        /// <summary>The JSON array of §9.1.</summary>
        public JArray ToJson()
        {
            var array = new JArray();
            foreach (StateTensor t in tensors) array.Add(new JObject { { "input", t.Input }, { "output", t.Output }, { "size", t.Size } });
            return array;
        }

        /// <summary>
        /// Whether <paramref name="a"/> and <paramref name="b"/> are the same state (the same names, in order,
        /// and size; both null included): a state kept under one is valid under the other (§12.4).
        /// </summary>
        public static bool Same(RecurrentState a, RecurrentState b)
        {
            if (a == null || b == null) return a == b;
            if (a.tensors.Count != b.tensors.Count) return false;
            for (int k = 0; k < a.tensors.Count; ++k)
            {
                StateTensor x = a.tensors[k], y = b.tensors[k];
                if (x.Input != y.Input || x.Output != y.Output || x.Size != y.Size) return false;
            }
            return true;
        }
    }
}
