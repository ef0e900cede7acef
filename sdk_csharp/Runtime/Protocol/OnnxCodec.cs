// The onnx_file field of SET_STATE: base64(gzip(ONNX bytes)), as RLlink v1.
using System;
using System.IO;
using System.IO.Compression;

namespace Tether.Protocol
{
    /// <summary>Decoding and encoding the onnx_file field (§7.6).</summary>
    public static class OnnxCodec
    {
        /// <summary>The largest model accepted once decompressed (256 MiB), checked while inflating.</summary>
        public const int MaxModelBytes = 256 << 20;

        /// <summary>The model bytes of an onnx_file field. INVALID_FIELD when it is not base64(gzip), or too large.</summary>
        public static byte[] Decode(string field, int maxSize = MaxModelBytes)
        {
            byte[] compressed;
            try
            {
                compressed = Convert.FromBase64String(field);
            }
            catch (FormatException e)
            {
                throw new TetherException(ErrorCode.InvalidField, "onnx_file is not base64: " + e.Message);
            }
            try
            {
                using (var input = new GZipStream(new MemoryStream(compressed), CompressionMode.Decompress))
                using (var output = new MemoryStream())
                {
                    var buffer = new byte[81920];
                    int read;
                    while ((read = input.Read(buffer, 0, buffer.Length)) > 0)
                    {
                        if (output.Length + read > maxSize)
                        {
                            throw new TetherException(ErrorCode.InvalidField, "onnx_file inflates to more than " + maxSize + " bytes");
                        }
                        output.Write(buffer, 0, read);
                    }
                    if (output.Length == 0) throw new TetherException(ErrorCode.InvalidField, "onnx_file holds an empty model");
                    return output.ToArray();
                }
            }
            catch (InvalidDataException e)
            {
                throw new TetherException(ErrorCode.InvalidField, "onnx_file is not gzip: " + e.Message);
            }
            catch (IOException e)
            {
                throw new TetherException(ErrorCode.InvalidField, "onnx_file is corrupt: " + e.Message);
            }
        }

        /// <summary>An onnx_file field for model bytes (what a server sends).</summary>
        public static string Encode(byte[] model)
        {
            using (var output = new MemoryStream())
            {
                using (var gzip = new GZipStream(output, CompressionMode.Compress, true)) gzip.Write(model, 0, model.Length);
                return Convert.ToBase64String(output.ToArray());
            }
        }
    }
}
