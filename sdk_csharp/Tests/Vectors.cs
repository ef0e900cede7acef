// Loading the shared conformance vectors (tests/conformance/*.json).
using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Text;
using Newtonsoft.Json;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Protocol;

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

        /// <summary>Runs <paramref name="check"/> on every case of <paramref name="file"/>, which has some; every case must pass.</summary>
        public static void Check(string file, Action<JObject, JObject> check)
        {
            int ran;
            List<string> failures = Run(file, check, out ran);
            Assert.That(ran, Is.GreaterThan(0), file + " has no cases");
            Assert.That(failures, Is.Empty, string.Join("\n", failures.ToArray()));
        }

        /// <summary>A case's check: fails it with <paramref name="what"/> unless <paramref name="condition"/>.</summary>
        public static void Expect(bool condition, string what)
        {
            if (!condition) throw new Exception(what);
        }

        /// <summary>A case's check: <paramref name="call"/> must throw a TetherException of the wire code <paramref name="code"/>.</summary>
        public static void ExpectError(string code, Action call)
        {
            try
            {
                call();
            }
            catch (TetherException e)
            {
                Expect(ErrorCodes.ToWire(e.Code) == code, "expected " + code + ", got " + ErrorCodes.ToWire(e.Code) + ": " + e.Message);
                return;
            }
            throw new Exception("expected " + code + ", no error");
        }

        /// <summary>
        /// An episodes case (episodes.json, composite.json's "episode" kind): its body, checked as the server
        /// checks it with these spaces (and mask), is refused with its error, or holds its env steps.
        /// </summary>
        public static void CheckEpisodesCase(JObject c, Space obs, Space act, ActionMask mask = null)
        {
            Func<int> validate = () =>
            {
                Message m = Messages.Decode(Encoding.UTF8.GetBytes((string)c["body"]));
                return EpisodeRecords.ValidateEpisodes(m.Body, obs, act, (bool)c["require_logp"], m.Attachment, mask);
            };
            if (c["error"] != null)
            {
                ExpectError((string)c["error"], () => validate());
                return;
            }
            int steps = validate();
            Expect(steps == (int)c["env_steps"], "env steps " + steps);
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
