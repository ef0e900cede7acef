// ONNX Runtime through its C API, by P/Invoke into the native library (the one
// Unity's ONNX Runtime packages ship for every platform).
using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using Tether.Protocol;

namespace Tether.Inference
{
    /// <summary>
    /// An <see cref="IInferenceBackend"/> on ONNX Runtime's C API: one session
    /// with one intra-op thread (the engine owns the other cores), and per batch
    /// size pinned input and output buffers bound to the session once, so a
    /// run copies the observations in, runs, and copies the outputs out without
    /// allocating. It reads the element type and shape of the model's input: float32
    /// (batch, obs_dim), or (protocol 1.4, §12.1) the uint8 (batch, *shape) of a byte
    /// box's model, which it feeds bytes in that shape (from bytes, or from floats holding
    /// the integers 0 to 255). Native handles are released by <see cref="Dispose"/> (and by
    /// the finalizer of the handles, should a caller forget). The model of a Dict or Tuple observation
    /// space (protocol 1.4, §12.1) is loaded with <see cref="Load(byte[], Space, string)"/>: one input
    /// per leaf, bound by its leaf path, each fed its slice of the flat rows. A model with memory (protocol
    /// 1.5, §12.1) gets its state inputs and outputs bound by name too (<see cref="BindState"/>), one pinned
    /// buffer each per batch size: a run copies the actors' states in and the states after the step out.
    /// </summary>
    public sealed class OnnxRuntimeBackend : IByteInferenceBackend, ILeafInferenceBackend, IRecurrentInferenceBackend
    {
        const int MaxBindings = 4;  // batch sizes kept bound at once; a game runs one or two
        const int ElementFloat = 1, ElementUint8 = 2;  // ONNXTensorElementDataType

        sealed class Binding : IDisposable
        {
            public int Batch;
            public long LastUsed;
            public float[] Input;       // a float32 input's buffer
            public byte[] InputBytes;   // a uint8 input's buffer
            public float[] Output;
            public GCHandle InputPin;
            public GCHandle OutputPin;
            public OrtHandle InputValue;
            public OrtHandle OutputValue;
            public OrtHandle Io;
            public int InputLength;      // batch x obs_dim values
            public float[][] LeafInput;  // per leaf input (a Dict or Tuple model): a float32 input's buffer, or null
            public byte[][] LeafBytes;   // ... a uint8 input's buffer, or null
            public GCHandle[] LeafPins;
            public OrtHandle[] LeafValues;
            public float[][] StateIn;    // per state tensor (a model with memory): batch x size, fed
            public float[][] StateOut;   // ... and read back
            public GCHandle[] StatePins;  // inputs' pins, then outputs'
            public OrtHandle[] StateValues;

            public void Dispose()
            {
                if (StateValues != null)
                {
                    foreach (OrtHandle value in StateValues) if (value != null) value.Dispose();
                }
                if (StatePins != null)
                {
                    foreach (GCHandle pin in StatePins) if (pin.IsAllocated) pin.Free();
                }
                if (LeafValues != null)
                {
                    foreach (OrtHandle value in LeafValues) if (value != null) value.Dispose();
                }
                if (LeafPins != null)
                {
                    foreach (GCHandle pin in LeafPins) if (pin.IsAllocated) pin.Free();
                }
                if (Io != null) Io.Dispose();
                if (InputValue != null) InputValue.Dispose();
                if (OutputValue != null) OutputValue.Dispose();
                if (InputPin.IsAllocated) InputPin.Free();
                if (OutputPin.IsAllocated) OutputPin.Free();
            }
        }

        OrtHandle env;
        OrtHandle session;
        OrtHandle memoryInfo;
        string inputName;
        string outputName;
        readonly List<Binding> bindings = new List<Binding>();
        long runs;
        bool disposed;
        long[] inputDims = new long[0];  // the input's dimensions after the batch (-1 where the model leaves one open)

        // One input of a Dict or Tuple model: a leaf's values, at Offset in the flat row.
        sealed class LeafInput
        {
            public string Name;
            public int Offset;
            public int Size;
            public bool Bytes;   // the model takes uint8
            public long[] Dims;  // after the batch: the leaf's shape for uint8 (when fixed), [size] for float32
        }

        LeafInput[] leafInputs;  // null: a model of one input
        RecurrentState state;    // a model with memory's state tensors (protocol 1.5), or null

        /// <inheritdoc/>
        public RecurrentState State { get { return state; } }

        /// <inheritdoc/>
        public void BindState(RecurrentState recurrent)
        {
            if (session == null) throw new TetherException(ErrorCode.NotReady, "no model loaded");
            if (recurrent != null)
            {
                foreach (StateTensor tensor in recurrent.Tensors)
                {
                    CheckStateIo(true, tensor.Input, tensor.Size);
                    CheckStateIo(false, tensor.Output, tensor.Size);
                }
            }
            // The bindings made so far lack the state tensors (or have those of another state).
            foreach (Binding binding in bindings) binding.Dispose();
            bindings.Clear();
            state = recurrent;
        }

        // A state input (or output) the model must have (§12.1): float32 (batch, size). INVALID_FIELD otherwise.
        void CheckStateIo(bool input, string name, int size)
        {
            bool bytes;
            long[] dims;
            int width;
            try
            {
                width = CheckIo(input, name, out bytes, out dims);
            }
            catch (TetherException e)
            {
                throw new TetherException(ErrorCode.InvalidField, "the model does not fit its announced recurrent_state: " + e.Detail, e);
            }
            if (bytes || (width != 0 && width != size))
            {
                throw new TetherException(ErrorCode.InvalidField, "the model's state " + (input ? "input" : "output") + " '" + name + "' is " +
                                          (bytes ? "uint8" : "of width " + width) + ", the announced recurrent_state has float32 of size " + size);
            }
        }

        /// <inheritdoc/>
        public bool Loaded { get { return session != null; } }

        /// <inheritdoc/>
        public int ObsDim { get; private set; }

        /// <inheritdoc/>
        public int OutDim { get; private set; }

        /// <inheritdoc/>
        public bool InputIsBytes { get; private set; }

        /// <summary>
        /// The loaded model input's dimensions after the batch: [obs_dim] for a float32 input, the
        /// observation's own shape for a uint8 one ([84, 84, 4]); -1 where the model leaves one open.
        /// </summary>
        public long[] InputDims { get { return (long[])inputDims.Clone(); } }

        /// <summary>The native library's version ("1.29.0").</summary>
        public static string RuntimeVersion { get { return OrtApi.Instance.Version; } }

        /// <inheritdoc/>
        public void Load(byte[] model, string inputName, string outputName)
        {
            OpenSession(model);
            try
            {
                bool bytes;
                long[] dims;
                ObsDim = CheckIo(true, inputName, out bytes, out dims);
                InputIsBytes = bytes;
                inputDims = dims;
                OutDim = CheckIo(false, outputName, out bytes, out dims);
            }
            catch (TetherException)
            {
                Unload();
                throw;
            }
            this.inputName = inputName;
            this.outputName = outputName;
        }

        /// <inheritdoc/>
        public void Load(byte[] model, Space observationSpace, string outputName)
        {
            if (observationSpace == null || !observationSpace.IsComposite)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "Load by leaves needs a Dict or Tuple observation space");
            }
            OpenSession(model);
            try
            {
                var inputs = new LeafInput[observationSpace.Leaves.Count];
                for (int i = 0; i < inputs.Length; ++i)
                {
                    SpaceLeaf leaf = observationSpace.Leaves[i];
                    bool bytes;
                    long[] dims;
                    int width = CheckIo(true, leaf.Path, out bytes, out dims);
                    if (width != 0 && width != leaf.Size)
                    {
                        throw new TetherException(ErrorCode.InferenceFailed, "the model's input '" + leaf.Path + "' takes " + width + " values, the leaf has " + leaf.Size);
                    }
                    bool fixedDims = bytes && dims.Length > 0;
                    foreach (long d in dims) fixedDims = fixedDims && d >= 0;
                    inputs[i] = new LeafInput
                    {
                        Name = leaf.Path, Offset = leaf.Offset, Size = leaf.Size, Bytes = bytes,
                        Dims = fixedDims ? dims : new long[] { leaf.Size },
                    };
                }
                bool ignored;
                long[] outDims;
                OutDim = CheckIo(false, outputName, out ignored, out outDims);
                leafInputs = inputs;
                ObsDim = observationSpace.FlatDim;
            }
            catch (TetherException)
            {
                Unload();
                throw;
            }
            this.outputName = outputName;
        }

        // A session of `model`, replacing any loaded.
        void OpenSession(byte[] model)
        {
            if (disposed) throw new ObjectDisposedException("OnnxRuntimeBackend");
            if (model == null || model.Length == 0) throw new TetherException(ErrorCode.InferenceFailed, "the model is empty");
            OrtApi api = OrtApi.Instance;
            Unload();
            IntPtr raw;
            api.Check(api.CreateEnv(3 /* ORT_LOGGING_LEVEL_ERROR */, "tether", out raw), "creating the environment");
            env = new OrtHandle(raw, api.ReleaseEnv);
            api.Check(api.CreateSessionOptions(out raw), "creating session options");
            using (var options = new OrtHandle(raw, api.ReleaseSessionOptions))
            {
                api.Check(api.SetIntraOpNumThreads(options.Pointer, 1), "setting one intra-op thread");
                api.Check(api.SetInterOpNumThreads(options.Pointer, 1), "setting one inter-op thread");
                api.Check(api.SetSessionExecutionMode(options.Pointer, 0 /* ORT_SEQUENTIAL */), "setting sequential execution");
                api.Check(api.SetSessionGraphOptimizationLevel(options.Pointer, 99 /* ORT_ENABLE_ALL */), "enabling optimizations");
                try
                {
                    api.Check(api.CreateSessionFromArray(env.Pointer, model, (UIntPtr)model.Length, options.Pointer, out raw), "loading the model");
                }
                catch (TetherException)
                {
                    Unload();
                    throw;
                }
                session = new OrtHandle(raw, api.ReleaseSession, env);
            }
            api.Check(api.CreateCpuMemoryInfo(1 /* OrtArenaAllocator */, 0 /* OrtMemTypeDefault */, out raw), "creating memory info");
            memoryInfo = new OrtHandle(raw, api.ReleaseMemoryInfo);
        }

        // The named input (or output) exists and is float32 (batch, width), or (an input, 1.4) uint8
        // (batch, *dims); its fixed width (the product of the dims), or 0.
        int CheckIo(bool input, string name, out bool isBytes, out long[] inputRest)
        {
            OrtApi api = OrtApi.Instance;
            UIntPtr count;
            api.Check(input ? api.SessionGetInputCount(session.Pointer, out count) : api.SessionGetOutputCount(session.Pointer, out count),
                      "counting the model's " + (input ? "inputs" : "outputs"));
            IntPtr allocator;
            api.Check(api.GetAllocatorWithDefaultOptions(out allocator), "getting the default allocator");
            var names = new List<string>();
            for (ulong i = 0; i < (ulong)count; ++i)
            {
                IntPtr rawName;
                api.Check(input ? api.SessionGetInputName(session.Pointer, (UIntPtr)i, allocator, out rawName)
                                : api.SessionGetOutputName(session.Pointer, (UIntPtr)i, allocator, out rawName), "reading a name");
                string found = Marshal.PtrToStringAnsi(rawName);
                api.AllocatorFree(allocator, rawName);
                names.Add(found);
                if (found != name) continue;
                IntPtr typeInfo;
                api.Check(input ? api.SessionGetInputTypeInfo(session.Pointer, (UIntPtr)i, out typeInfo)
                                : api.SessionGetOutputTypeInfo(session.Pointer, (UIntPtr)i, out typeInfo), "reading the type of '" + name + "'");
                using (new OrtHandle(typeInfo, api.ReleaseTypeInfo))
                {
                    IntPtr tensorInfo;
                    api.Check(api.CastTypeInfoToTensorInfo(typeInfo, out tensorInfo), "'" + name + "' is not a tensor");
                    int elementType;
                    api.Check(api.GetTensorElementType(tensorInfo, out elementType), "reading the element type of '" + name + "'");
                    bool bytes = input && elementType == ElementUint8;
                    if (elementType != ElementFloat && !bytes)
                    {
                        throw new TetherException(ErrorCode.InferenceFailed, "'" + name + "' holds element type " + elementType + ", not float32" +
                                                  (input ? " or uint8" : ""));
                    }
                    UIntPtr rank;
                    api.Check(api.GetDimensionsCount(tensorInfo, out rank), "reading the rank of '" + name + "'");
                    if (bytes ? (ulong)rank < 2 || (ulong)rank > 33 : (ulong)rank != 2)
                    {
                        throw new TetherException(ErrorCode.InferenceFailed, "'" + name + "' has " + rank + " dimensions; " +
                                                  (bytes ? "(batch, *observation shape) is needed" : "(batch, width) is needed"));
                    }
                    var dims = new long[(int)(ulong)rank];
                    api.Check(api.GetDimensions(tensorInfo, dims, rank), "reading the shape of '" + name + "'");
                    long width = 1;
                    var rest = new long[dims.Length - 1];
                    for (int d = 1; d < dims.Length; ++d)
                    {
                        rest[d - 1] = dims[d] > 0 ? dims[d] : dims[d] == 0 ? 0 : -1;
                        width = dims[d] < 0 || width < 0 ? -1 : dims[d] != 0 && width > int.MaxValue / dims[d] ? int.MaxValue : width * dims[d];
                    }
                    isBytes = bytes;
                    inputRest = rest;
                    return width > 0 ? (int)width : 0;
                }
            }
            throw new TetherException(ErrorCode.InferenceFailed, "the model has no " + (input ? "input" : "output") + " '" + name +
                                      "' (it has: " + string.Join(", ", names.ToArray()) + ")");
        }

        /// <inheritdoc/>
        /// <remarks>A model with memory is fed zeros as its state (and the state after the step is not kept).</remarks>
        public void Run(float[] obs, int batch, int obsDim, float[] output, int outDim) { Run(obs, null, batch, obsDim, output, outDim, null, null); }

        /// <inheritdoc/>
        public void Run(byte[] obs, int batch, int obsDim, float[] output, int outDim) { Run(null, obs, batch, obsDim, output, outDim, null, null); }

        /// <inheritdoc/>
        public void Run(float[] obs, int batch, int obsDim, float[] output, int outDim, float[] stateIn, float[] stateOut)
        {
            RunWithState(obs, null, batch, obsDim, output, outDim, stateIn, stateOut);
        }

        /// <inheritdoc/>
        public void Run(byte[] obs, int batch, int obsDim, float[] output, int outDim, float[] stateIn, float[] stateOut)
        {
            RunWithState(null, obs, batch, obsDim, output, outDim, stateIn, stateOut);
        }

        void RunWithState(float[] floats, byte[] bytes, int batch, int obsDim, float[] output, int outDim, float[] stateIn, float[] stateOut)
        {
            if (session != null && state == null) throw new TetherException(ErrorCode.InvalidArgument, "the loaded model has no recurrent state (BindState)");
            int width = state == null ? 0 : state.Width;
            if (stateIn == null || stateOut == null || stateIn.Length < batch * width || stateOut.Length < batch * width)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "the state buffers hold fewer than " + batch + " rows of " + width + " values");
            }
            Run(floats, bytes, batch, obsDim, output, outDim, stateIn, stateOut);
        }

        // A run on observations given as floats, or else as bytes; a model with memory is fed stateIn
        // (null: zeros) and its state after the step goes to stateOut (null: nowhere).
        void Run(float[] floats, byte[] bytes, int batch, int obsDim, float[] output, int outDim, float[] stateIn, float[] stateOut)
        {
            int length = floats != null ? floats.Length : bytes != null ? bytes.Length : -1;
            Binding binding = Prepare(length, batch, obsDim, output, outDim);
            if (binding.StateIn != null)
            {
                int size = state.Size, width = state.Width;
                for (int k = 0; k < binding.StateIn.Length; ++k)
                {
                    float[] into = binding.StateIn[k];
                    if (stateIn == null) Array.Clear(into, 0, batch * size);
                    else for (int b = 0; b < batch; ++b) Array.Copy(stateIn, b * width + k * size, into, b * size, size);
                }
            }
            if (leafInputs != null)
            {
                for (int l = 0; l < leafInputs.Length; ++l)
                {
                    // Each leaf's slice of every flat row into its own input's buffer.
                    LeafInput leaf = leafInputs[l];
                    for (int b = 0; b < batch; ++b)
                    {
                        CopyInput(floats, bytes, b * obsDim + leaf.Offset, binding.LeafInput[l], binding.LeafBytes[l], b * leaf.Size, leaf.Size, leaf.Name);
                    }
                }
            }
            else
            {
                CopyInput(floats, bytes, 0, binding.Input, binding.InputBytes, 0, batch * obsDim, null);
            }
            Finish(binding, output, batch * outDim);
            if (binding.StateOut != null && stateOut != null)
            {
                int size = state.Size, width = state.Width;
                for (int k = 0; k < binding.StateOut.Length; ++k)
                {
                    float[] from = binding.StateOut[k];
                    for (int b = 0; b < batch; ++b) Array.Copy(from, b * size, stateOut, b * width + k * size, size);
                }
            }
        }

        // `n` observation values, floats (or else bytes) from `from` on, into a float input's buffer (or
        // else a uint8 input's) from `to` on. For a uint8 input the floats must be the integers 0-255
        // (the clients check them); `leafName` names the input in the refusal (null: the one input).
        static void CopyInput(float[] floats, byte[] bytes, int from, float[] intoFloats, byte[] intoBytes, int to, int n, string leafName)
        {
            if (floats != null && intoFloats != null)
            {
                Buffer.BlockCopy(floats, from * sizeof(float), intoFloats, to * sizeof(float), n * sizeof(float));
            }
            else if (floats != null)
            {
                for (int i = 0; i < n; ++i)
                {
                    float v = floats[from + i];
                    if (!(v >= 0f && v <= 255f && (float)(int)v == v))
                    {
                        throw new TetherException(ErrorCode.ObsDtypeMismatch, (leafName == null ? "observation" : "leaf '" + leafName + "'") + " value " + i + " is " +
                                                  v.ToString("R", System.Globalization.CultureInfo.InvariantCulture) + ": the model takes uint8 (integers 0-255)");
                    }
                    intoBytes[to + i] = (byte)v;
                }
            }
            else if (intoBytes != null)
            {
                Buffer.BlockCopy(bytes, from, intoBytes, to, n);
            }
            else
            {
                for (int i = 0; i < n; ++i) intoFloats[to + i] = bytes[from + i];
            }
        }

        void Finish(Binding binding, float[] output, int n)
        {
            OrtApi api = OrtApi.Instance;
            api.Check(api.RunWithBinding(session.Pointer, IntPtr.Zero, binding.Io.Pointer), "running the model");
            Buffer.BlockCopy(binding.Output, 0, output, 0, n * sizeof(float));
        }

        // Checks a run's arguments (`obsLength`: the observations' length, -1 without any); the binding for its batch size.
        Binding Prepare(int obsLength, int batch, int obsDim, float[] output, int outDim)
        {
            if (session == null) throw new TetherException(ErrorCode.NotReady, "no model loaded");
            if (obsLength < 0 || output == null || batch <= 0 || obsDim <= 0 || outDim <= 0)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "Run needs observations, an output buffer and sizes above zero");
            }
            if (ObsDim != 0 && obsDim != ObsDim)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "observation width " + obsDim + " does not match the model's " + ObsDim);
            }
            if (OutDim != 0 && outDim != OutDim)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "output width " + outDim + " does not match the model's " + OutDim);
            }
            if (obsLength < batch * obsDim || output.Length < batch * outDim)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "the buffers hold fewer than " + batch + " rows");
            }
            Binding binding = BindingFor(batch, obsDim, outDim);
            binding.LastUsed = ++runs;
            return binding;
        }

        // The input tensor's shape for `batch` rows of `obsDim` values: (batch, obsDim), or a uint8
        // input's (batch, *dims) when the model fixes every dimension.
        long[] InputShape(int batch, int obsDim)
        {
            bool fixedDims = InputIsBytes && inputDims.Length > 0;
            foreach (long d in inputDims) fixedDims = fixedDims && d >= 0;
            if (!fixedDims) return new long[] { batch, obsDim };
            var shape = new long[inputDims.Length + 1];
            shape[0] = batch;
            Array.Copy(inputDims, 0, shape, 1, inputDims.Length);
            return shape;
        }

        Binding BindingFor(int batch, int obsDim, int outDim)
        {
            foreach (Binding candidate in bindings)
            {
                if (candidate.Batch == batch && candidate.InputLength == batch * obsDim && candidate.Output.Length == batch * outDim) return candidate;
            }
            OrtApi api = OrtApi.Instance;
            var fresh = new Binding { Batch = batch, Output = new float[batch * outDim], InputLength = batch * obsDim };
            if (leafInputs != null) return Remember(BindLeaves(fresh, batch, outDim));
            if (InputIsBytes) fresh.InputBytes = new byte[batch * obsDim];
            else fresh.Input = new float[batch * obsDim];
            try
            {
                fresh.InputPin = GCHandle.Alloc(InputIsBytes ? (object)fresh.InputBytes : fresh.Input, GCHandleType.Pinned);
                fresh.OutputPin = GCHandle.Alloc(fresh.Output, GCHandleType.Pinned);
                IntPtr raw;
                long[] shape = InputShape(batch, obsDim);
                api.Check(api.CreateTensorWithDataAsOrtValue(memoryInfo.Pointer, fresh.InputPin.AddrOfPinnedObject(),
                          (UIntPtr)(InputIsBytes ? fresh.InputBytes.Length : fresh.Input.Length * sizeof(float)), shape, (UIntPtr)shape.Length,
                          InputIsBytes ? ElementUint8 : ElementFloat, out raw), "creating the input tensor");
                fresh.InputValue = new OrtHandle(raw, api.ReleaseValue);
                api.Check(api.CreateTensorWithDataAsOrtValue(memoryInfo.Pointer, fresh.OutputPin.AddrOfPinnedObject(),
                          (UIntPtr)(fresh.Output.Length * sizeof(float)), new long[] { batch, outDim }, (UIntPtr)2, 1, out raw), "creating the output tensor");
                fresh.OutputValue = new OrtHandle(raw, api.ReleaseValue);
                // Both tensors bound by name once: a run skips ONNX Runtime's per-run name lookups.
                api.Check(api.CreateIoBinding(session.Pointer, out raw), "creating the tensors' binding");
                fresh.Io = new OrtHandle(raw, api.ReleaseIoBinding, session);
                api.Check(api.BindInput(fresh.Io.Pointer, inputName, fresh.InputValue.Pointer), "binding the input");
                api.Check(api.BindOutput(fresh.Io.Pointer, outputName, fresh.OutputValue.Pointer), "binding the output");
                BindStates(fresh, batch);
            }
            catch
            {
                fresh.Dispose();
                throw;
            }
            return Remember(fresh);
        }

        // A Dict or Tuple model's binding: one tensor per leaf input, bound by its leaf path.
        Binding BindLeaves(Binding fresh, int batch, int outDim)
        {
            OrtApi api = OrtApi.Instance;
            int n = leafInputs.Length;
            fresh.LeafInput = new float[n][];
            fresh.LeafBytes = new byte[n][];
            fresh.LeafPins = new GCHandle[n];
            fresh.LeafValues = new OrtHandle[n];
            try
            {
                IntPtr raw;
                api.Check(api.CreateIoBinding(session.Pointer, out raw), "creating the tensors' binding");
                fresh.Io = new OrtHandle(raw, api.ReleaseIoBinding, session);
                for (int l = 0; l < n; ++l)
                {
                    LeafInput leaf = leafInputs[l];
                    object buffer;
                    int bytes;
                    if (leaf.Bytes)
                    {
                        fresh.LeafBytes[l] = new byte[batch * leaf.Size];
                        buffer = fresh.LeafBytes[l];
                        bytes = batch * leaf.Size;
                    }
                    else
                    {
                        fresh.LeafInput[l] = new float[batch * leaf.Size];
                        buffer = fresh.LeafInput[l];
                        bytes = batch * leaf.Size * sizeof(float);
                    }
                    fresh.LeafPins[l] = GCHandle.Alloc(buffer, GCHandleType.Pinned);
                    var shape = new long[leaf.Dims.Length + 1];
                    shape[0] = batch;
                    Array.Copy(leaf.Dims, 0, shape, 1, leaf.Dims.Length);
                    api.Check(api.CreateTensorWithDataAsOrtValue(memoryInfo.Pointer, fresh.LeafPins[l].AddrOfPinnedObject(), (UIntPtr)bytes, shape,
                              (UIntPtr)shape.Length, leaf.Bytes ? ElementUint8 : ElementFloat, out raw), "creating the input tensor of '" + leaf.Name + "'");
                    fresh.LeafValues[l] = new OrtHandle(raw, api.ReleaseValue);
                    api.Check(api.BindInput(fresh.Io.Pointer, leaf.Name, fresh.LeafValues[l].Pointer), "binding the input '" + leaf.Name + "'");
                }
                fresh.OutputPin = GCHandle.Alloc(fresh.Output, GCHandleType.Pinned);
                api.Check(api.CreateTensorWithDataAsOrtValue(memoryInfo.Pointer, fresh.OutputPin.AddrOfPinnedObject(),
                          (UIntPtr)(fresh.Output.Length * sizeof(float)), new long[] { batch, outDim }, (UIntPtr)2, 1, out raw), "creating the output tensor");
                fresh.OutputValue = new OrtHandle(raw, api.ReleaseValue);
                api.Check(api.BindOutput(fresh.Io.Pointer, outputName, fresh.OutputValue.Pointer), "binding the output");
                BindStates(fresh, batch);
            }
            catch
            {
                fresh.Dispose();
                throw;
            }
            return fresh;
        }

        // A model with memory's state tensors, bound by name once per batch size (protocol 1.5, §12.1): per
        // tensor a pinned input buffer and a pinned output buffer of batch x size floats.
        void BindStates(Binding fresh, int batch)
        {
            if (state == null) return;
            OrtApi api = OrtApi.Instance;
            int n = state.Tensors.Count, size = state.Size;
            fresh.StateIn = new float[n][];
            fresh.StateOut = new float[n][];
            fresh.StatePins = new GCHandle[2 * n];
            fresh.StateValues = new OrtHandle[2 * n];
            var shape = new long[] { batch, size };
            for (int i = 0; i < 2 * n; ++i)
            {
                int k = i % n;
                bool input = i < n;
                var buffer = new float[batch * size];
                if (input) fresh.StateIn[k] = buffer;
                else fresh.StateOut[k] = buffer;
                fresh.StatePins[i] = GCHandle.Alloc(buffer, GCHandleType.Pinned);
                string name = input ? state.Tensors[k].Input : state.Tensors[k].Output;
                IntPtr raw;
                api.Check(api.CreateTensorWithDataAsOrtValue(memoryInfo.Pointer, fresh.StatePins[i].AddrOfPinnedObject(), (UIntPtr)(buffer.Length * sizeof(float)),
                          shape, (UIntPtr)2, ElementFloat, out raw), "creating the state tensor '" + name + "'");
                fresh.StateValues[i] = new OrtHandle(raw, api.ReleaseValue);
                if (input) api.Check(api.BindInput(fresh.Io.Pointer, name, fresh.StateValues[i].Pointer), "binding the state input '" + name + "'");
                else api.Check(api.BindOutput(fresh.Io.Pointer, name, fresh.StateValues[i].Pointer), "binding the state output '" + name + "'");
            }
        }

        // Keeps `fresh` bound, releasing the least recently used binding beyond MaxBindings.
        Binding Remember(Binding fresh)
        {
            if (bindings.Count >= MaxBindings)
            {
                Binding oldest = bindings[0];
                foreach (Binding candidate in bindings)
                {
                    if (candidate.LastUsed < oldest.LastUsed) oldest = candidate;
                }
                bindings.Remove(oldest);
                oldest.Dispose();
            }
            bindings.Add(fresh);
            return fresh;
        }

        void Unload()
        {
            foreach (Binding binding in bindings) binding.Dispose();
            bindings.Clear();
            if (memoryInfo != null) memoryInfo.Dispose();
            if (session != null) session.Dispose();
            if (env != null) env.Dispose();
            memoryInfo = session = env = null;
            ObsDim = OutDim = 0;
            InputIsBytes = false;
            inputDims = new long[0];
            leafInputs = null;
            state = null;
        }

        /// <summary>Releases the session, its tensors and the pinned buffers.</summary>
        public void Dispose()
        {
            if (disposed) return;
            disposed = true;
            Unload();
        }
    }

    /// <summary>An owned native ONNX Runtime object, released once (by Dispose or, failing that, by the finalizer).</summary>
    internal sealed class OrtHandle : SafeHandle
    {
        readonly OrtApi.ReleaseFn release;
        readonly OrtHandle dependsOn;

        /// <summary>Owns <paramref name="pointer"/>; with <paramref name="dependsOn"/> (a session's
        /// environment, a binding's session), that one is released only after this one, whatever
        /// order finalizers run in for objects nobody disposed.</summary>
        public OrtHandle(IntPtr pointer, OrtApi.ReleaseFn release, OrtHandle dependsOn = null) : base(IntPtr.Zero, true)
        {
            this.release = release;
            SetHandle(pointer);  // (first: owned, so released below if the dependency cannot be held)
            if (dependsOn == null) return;
            bool added = false;
            try
            {
                dependsOn.DangerousAddRef(ref added);
            }
            catch (ObjectDisposedException)
            {
            }
            if (!added)
            {
                Dispose();
                throw new TetherException(ErrorCode.InferenceFailed, "an ONNX Runtime object outlived the one it needs (released already)");
            }
            this.dependsOn = dependsOn;
        }

        /// <summary>The handle this one keeps alive until it is released (or null).</summary>
        internal OrtHandle DependsOn { get { return dependsOn; } }

        public IntPtr Pointer { get { return handle; } }

        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }

        protected override bool ReleaseHandle()
        {
            try
            {
                release(handle);
            }
            finally
            {
                if (dependsOn != null) dependsOn.DangerousRelease();
            }
            return true;
        }
    }

    /// <summary>
    /// ONNX Runtime's OrtApi function table, read once. The table only ever
    /// grows at its end, so a function's slot is fixed from the version that
    /// added it on (the slots below are those of onnxruntime_c_api.h).
    /// </summary>
    internal sealed class OrtApi
    {
        const uint ApiVersion = 11;  // ONNX Runtime 1.11 or newer: every function used here

        [DllImport("onnxruntime", CallingConvention = CallingConvention.Cdecl)]
        static extern IntPtr OrtGetApiBase();

        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] delegate IntPtr GetApiFn(uint version);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] delegate IntPtr GetVersionStringFn();
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate void ReleaseFn(IntPtr p);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr GetErrorMessageFn(IntPtr status);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr CreateEnvFn(int level, [MarshalAs(UnmanagedType.LPStr)] string id, out IntPtr env);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr CreateSessionFromArrayFn(IntPtr env, byte[] model, UIntPtr length, IntPtr options, out IntPtr session);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr OutPtrFn(out IntPtr result);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr IntSettingFn(IntPtr options, int value);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr CreateCpuMemoryInfoFn(int allocator, int memType, out IntPtr info);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr CreateTensorFn(IntPtr info, IntPtr data, UIntPtr bytes, long[] shape, UIntPtr rank, int type, out IntPtr value);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr CountFn(IntPtr session, out UIntPtr count);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr NameFn(IntPtr session, UIntPtr index, IntPtr allocator, out IntPtr name);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr AllocatorFreeFn(IntPtr allocator, IntPtr p);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr TypeInfoFn(IntPtr session, UIntPtr index, out IntPtr typeInfo);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr CastFn(IntPtr typeInfo, out IntPtr tensorInfo);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr ElementTypeFn(IntPtr tensorInfo, out int type);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr DimsCountFn(IntPtr tensorInfo, out UIntPtr count);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr DimsFn(IntPtr tensorInfo, long[] dims, UIntPtr count);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr CreateIoBindingFn(IntPtr session, out IntPtr binding);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr BindFn(IntPtr binding, [MarshalAs(UnmanagedType.LPStr)] string name, IntPtr value);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)] public delegate IntPtr RunWithBindingFn(IntPtr session, IntPtr runOptions, IntPtr binding);

        static OrtApi instance;
        static readonly object InstanceLock = new object();

        public readonly string Version;
        public readonly GetErrorMessageFn GetErrorMessage;
        public readonly CreateEnvFn CreateEnv;
        public readonly CreateSessionFromArrayFn CreateSessionFromArray;
        public readonly OutPtrFn CreateSessionOptions;
        public readonly IntSettingFn SetSessionExecutionMode;
        public readonly IntSettingFn SetSessionGraphOptimizationLevel;
        public readonly IntSettingFn SetIntraOpNumThreads;
        public readonly IntSettingFn SetInterOpNumThreads;
        public readonly CountFn SessionGetInputCount;
        public readonly CountFn SessionGetOutputCount;
        public readonly TypeInfoFn SessionGetInputTypeInfo;
        public readonly TypeInfoFn SessionGetOutputTypeInfo;
        public readonly NameFn SessionGetInputName;
        public readonly NameFn SessionGetOutputName;
        public readonly CreateTensorFn CreateTensorWithDataAsOrtValue;
        public readonly CastFn CastTypeInfoToTensorInfo;
        public readonly ElementTypeFn GetTensorElementType;
        public readonly DimsCountFn GetDimensionsCount;
        public readonly DimsFn GetDimensions;
        public readonly CreateCpuMemoryInfoFn CreateCpuMemoryInfo;
        public readonly AllocatorFreeFn AllocatorFree;
        public readonly OutPtrFn GetAllocatorWithDefaultOptions;
        public readonly ReleaseFn ReleaseEnv;
        public readonly ReleaseFn ReleaseStatus;
        public readonly ReleaseFn ReleaseMemoryInfo;
        public readonly ReleaseFn ReleaseSession;
        public readonly ReleaseFn ReleaseValue;
        public readonly ReleaseFn ReleaseTypeInfo;
        public readonly ReleaseFn ReleaseSessionOptions;
        public readonly RunWithBindingFn RunWithBinding;
        public readonly CreateIoBindingFn CreateIoBinding;
        public readonly ReleaseFn ReleaseIoBinding;
        public readonly BindFn BindInput;
        public readonly BindFn BindOutput;

        /// <summary>The table, read on first use; INFERENCE_FAILED when the native library is missing or too old.</summary>
        public static OrtApi Instance
        {
            get
            {
                lock (InstanceLock)
                {
                    return instance ?? (instance = new OrtApi());
                }
            }
        }

        OrtApi()
        {
            IntPtr baseTable;
            try
            {
                baseTable = OrtGetApiBase();
            }
            catch (DllNotFoundException e)
            {
                throw new TetherException(ErrorCode.InferenceFailed, "the native ONNX Runtime library (onnxruntime) was not found: " + e.Message, e);
            }
            var getApi = Fn<GetApiFn>(Marshal.ReadIntPtr(baseTable, 0));
            Version = Marshal.PtrToStringAnsi(Fn<GetVersionStringFn>(Marshal.ReadIntPtr(baseTable, IntPtr.Size))());
            IntPtr table = getApi(ApiVersion);
            if (table == IntPtr.Zero)
            {
                throw new TetherException(ErrorCode.InferenceFailed, "ONNX Runtime " + Version + " is older than 1.11, which this SDK needs");
            }
            GetErrorMessage = Slot<GetErrorMessageFn>(table, 2);
            CreateEnv = Slot<CreateEnvFn>(table, 3);
            CreateSessionFromArray = Slot<CreateSessionFromArrayFn>(table, 8);
            CreateSessionOptions = Slot<OutPtrFn>(table, 10);
            SetSessionExecutionMode = Slot<IntSettingFn>(table, 13);
            SetSessionGraphOptimizationLevel = Slot<IntSettingFn>(table, 23);
            SetIntraOpNumThreads = Slot<IntSettingFn>(table, 24);
            SetInterOpNumThreads = Slot<IntSettingFn>(table, 25);
            SessionGetInputCount = Slot<CountFn>(table, 30);
            SessionGetOutputCount = Slot<CountFn>(table, 31);
            SessionGetInputTypeInfo = Slot<TypeInfoFn>(table, 33);
            SessionGetOutputTypeInfo = Slot<TypeInfoFn>(table, 34);
            SessionGetInputName = Slot<NameFn>(table, 36);
            SessionGetOutputName = Slot<NameFn>(table, 37);
            CreateTensorWithDataAsOrtValue = Slot<CreateTensorFn>(table, 49);
            CastTypeInfoToTensorInfo = Slot<CastFn>(table, 55);
            GetTensorElementType = Slot<ElementTypeFn>(table, 60);
            GetDimensionsCount = Slot<DimsCountFn>(table, 61);
            GetDimensions = Slot<DimsFn>(table, 62);
            CreateCpuMemoryInfo = Slot<CreateCpuMemoryInfoFn>(table, 69);
            AllocatorFree = Slot<AllocatorFreeFn>(table, 76);
            GetAllocatorWithDefaultOptions = Slot<OutPtrFn>(table, 78);
            ReleaseEnv = Slot<ReleaseFn>(table, 92);
            ReleaseStatus = Slot<ReleaseFn>(table, 93);
            ReleaseMemoryInfo = Slot<ReleaseFn>(table, 94);
            ReleaseSession = Slot<ReleaseFn>(table, 95);
            ReleaseValue = Slot<ReleaseFn>(table, 96);
            ReleaseTypeInfo = Slot<ReleaseFn>(table, 98);
            ReleaseSessionOptions = Slot<ReleaseFn>(table, 100);
            RunWithBinding = Slot<RunWithBindingFn>(table, 133);
            CreateIoBinding = Slot<CreateIoBindingFn>(table, 134);
            ReleaseIoBinding = Slot<ReleaseFn>(table, 135);
            BindInput = Slot<BindFn>(table, 136);
            BindOutput = Slot<BindFn>(table, 137);
        }

        static T Fn<T>(IntPtr pointer) where T : class
        {
            return (T)(object)Marshal.GetDelegateForFunctionPointer(pointer, typeof(T));
        }

        static T Slot<T>(IntPtr table, int index) where T : class
        {
            return Fn<T>(Marshal.ReadIntPtr(table, index * IntPtr.Size));
        }

        /// <summary>Throws INFERENCE_FAILED with ONNX Runtime's message when <paramref name="status"/> is an error.</summary>
        public void Check(IntPtr status, string what)
        {
            if (status == IntPtr.Zero) return;
            string message = Marshal.PtrToStringAnsi(GetErrorMessage(status));
            ReleaseStatus(status);
            throw new TetherException(ErrorCode.InferenceFailed, what + ": " + message);
        }
    }
}
