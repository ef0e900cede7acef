// Loading the shared conformance vectors (tests/conformance/*.json).
using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using Newtonsoft.Json;
using Newtonsoft.Json.Linq;

namespace Tether.Tests
{
    /// <summary>The shared vectors: TETHER_CONFORMANCE_DIR, or tests/conformance above this assembly.</summary>
    internal static class Vectors
    {
        public static string Directory
        {
            get
            {
                string dir = Environment.GetEnvironmentVariable("TETHER_CONFORMANCE_DIR");
                if (!string.IsNullOrEmpty(dir)) return dir;
                string at = AppDomain.CurrentDomain.BaseDirectory;
                while (at != null)
                {
                    string candidate = Path.Combine(Path.Combine(at, "tests"), "conformance");
                    if (System.IO.Directory.Exists(candidate)) return candidate;
                    at = Path.GetDirectoryName(at.TrimEnd(Path.DirectorySeparatorChar));
                }
                throw new InvalidOperationException("tests/conformance not found: set TETHER_CONFORMANCE_DIR");
            }
        }

        public static JObject Load(string file)
        {
            using (var reader = new JsonTextReader(new StreamReader(Path.Combine(Directory, file))))
            {
                reader.DateParseHandling = DateParseHandling.None;
                return JObject.Load(reader);
            }
        }

        public static byte[] FromHex(string hex)
        {
            var bytes = new byte[hex.Length / 2];
            for (int i = 0; i < bytes.Length; ++i) bytes[i] = byte.Parse(hex.Substring(2 * i, 2), NumberStyles.HexNumber);
            return bytes;
        }

        /// <summary>Runs <paramref name="check"/> on every case of <paramref name="file"/>; the failures, by case name.</summary>
        public static List<string> Run(string file, Action<JObject, JObject> check, out int ran)
        {
            JObject data = Load(file);
            var failures = new List<string>();
            ran = 0;
            foreach (JObject c in (JArray)data["cases"])
            {
                ++ran;
                try
                {
                    check(data, c);
                }
                catch (Exception e)
                {
                    failures.Add(file + " / " + (string)c["name"] + ": " + e.Message);
                }
            }
            Console.WriteLine("[ conformance ] " + file + ": " + ran + " cases run, " + failures.Count + " failed");
            return failures;
        }

        public static double[] Flat(JToken value)
        {
            var values = new List<double>();
            if (value is JArray)
            {
                foreach (JToken v in (JArray)value) values.AddRange(Flat(v));
            }
            else
            {
                values.Add(Number(value));
            }
            return values.ToArray();
        }

        public static double Number(JToken value)
        {
            if (value.Type == JTokenType.String)
            {
                string s = (string)value;
                if (s == "inf") return double.PositiveInfinity;
                if (s == "-inf") return double.NegativeInfinity;
                if (s == "nan") return double.NaN;
            }
            return (double)value;
        }
    }
}
