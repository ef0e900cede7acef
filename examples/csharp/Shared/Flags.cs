// The example programs' command lines, as examples/cpp/flags.h parses the C++ ones: each program
// lists its flags and where their values go; all of them then parse alike and refuse alike. A flag
// they do not know, a flag without its value, or a value that is not a number of the flag's kind ends
// the program (status 2) with a line that names the flag, and the usage line is built from the list.
using System;
using System.Collections.Generic;
using System.Globalization;

namespace Tether.Examples
{
    /// <summary>The flags of one program. Declare them, then call <see cref="Parse"/>:
    /// <c>new Flags("cartpole").Text("--host", "H", v => host = v).Int("--port", "P", 0, 65535, v => port = v)</c>.</summary>
    sealed class Flags
    {
        sealed class Flag
        {
            public string Name, Meta;  // Meta is null for a toggle
            public Func<string, bool> Set;
        }

        readonly string program;
        readonly List<Flag> flags = new List<Flag>();

        /// <summary>The flags of <paramref name="program"/>, the name its messages start with.</summary>
        public Flags(string program) { this.program = program; }

        /// <summary><c>name VALUE</c> passes VALUE as given.</summary>
        public Flags Text(string name, string meta, Action<string> set)
        {
            return Add(name, meta, text => { set(text); return true; });
        }

        /// <summary><c>name VALUE</c>, VALUE a whole number from <paramref name="min"/> to <paramref name="max"/>.</summary>
        public Flags Int(string name, string meta, long min, long max, Action<long> set)
        {
            return Add(name, meta, text =>
            {
                long value;
                if (WholeNumberText(text, min < 0) &&
                    long.TryParse(text, NumberStyles.AllowLeadingSign, CultureInfo.InvariantCulture, out value) &&
                    value >= min && value <= max)
                {
                    set(value);
                    return true;
                }
                return Refuse(name, min == long.MinValue && max == long.MaxValue
                    ? "a whole number" : "a whole number from " + min + " to " + max, text);
            });
        }

        /// <summary><c>name VALUE</c>, VALUE a whole number from 0 to <see cref="ulong.MaxValue"/> (a seed).</summary>
        public Flags ULong(string name, string meta, Action<ulong> set)
        {
            return Add(name, meta, text =>
            {
                ulong value;
                if (WholeNumberText(text, false) &&
                    ulong.TryParse(text, NumberStyles.AllowLeadingSign, CultureInfo.InvariantCulture, out value))
                {
                    set(value);
                    return true;
                }
                return Refuse(name, "a whole number from 0 to " + ulong.MaxValue, text);
            });
        }

        /// <summary><c>name VALUE</c>, VALUE a finite number (seconds, a rate).</summary>
        public Flags Number(string name, string meta, Action<double> set)
        {
            return Add(name, meta, text =>
            {
                double value;
                if (NumberText(text) && double.TryParse(text, NumberStyles.Float, CultureInfo.InvariantCulture, out value) &&
                    !double.IsInfinity(value) && !double.IsNaN(value))
                {
                    set(value);
                    return true;
                }
                return Refuse(name, "a number", text);
            });
        }

        // One grammar for the C# and C++ examples (examples/cpp/flags.h): a whole number is [+-]?[0-9]+ (no '-' for
        // a flag that cannot be negative), a number [+-]?(D+(.D*)?|.D+)([eE][+-]?D+)? with a finite value; nothing
        // around them (no spaces, no hex, no Infinity or NaN).
        static bool Digits(string text, ref int at)
        {
            int start = at;
            while (at < text.Length && text[at] >= '0' && text[at] <= '9') ++at;
            return at != start;
        }

        static bool WholeNumberText(string text, bool negativeAllowed)
        {
            int at = 0;
            if (at < text.Length && (text[at] == '+' || (negativeAllowed && text[at] == '-'))) ++at;
            return Digits(text, ref at) && at == text.Length;
        }

        static bool NumberText(string text)
        {
            int at = 0;
            if (at < text.Length && (text[at] == '+' || text[at] == '-')) ++at;
            bool whole = Digits(text, ref at);
            bool fraction = false;
            if (at < text.Length && text[at] == '.')
            {
                ++at;
                fraction = Digits(text, ref at);
            }
            if (!whole && !fraction) return false;
            if (at < text.Length && (text[at] == 'e' || text[at] == 'E'))
            {
                ++at;
                if (at < text.Length && (text[at] == '+' || text[at] == '-')) ++at;
                if (!Digits(text, ref at)) return false;
            }
            return at == text.Length;
        }

        /// <summary><c>name</c> alone calls <paramref name="set"/>.</summary>
        public Flags Toggle(string name, Action set)
        {
            return Add(name, null, text => { set(); return true; });
        }

        /// <summary>Reads <paramref name="argv"/>. False, with a line on stderr, at the first flag that is
        /// unknown, lacks its value or has a value of the wrong kind.</summary>
        public bool Parse(string[] argv)
        {
            for (int i = 0; i < argv.Length; ++i)
            {
                Flag flag = flags.Find(f => f.Name == argv[i]);
                if (flag == null)
                {
                    Console.Error.WriteLine(program + ": unknown flag '" + argv[i] + "'\n" + Usage());
                    return false;
                }
                string text = null;
                if (flag.Meta != null)
                {
                    if (i + 1 >= argv.Length)
                    {
                        Console.Error.WriteLine(program + ": " + flag.Name + " needs a value (" + flag.Meta + ")");
                        return false;
                    }
                    text = argv[++i];
                }
                if (!flag.Set(text)) return false;
            }
            return true;
        }

        /// <summary>"usage: PROGRAM [--flag META] ... [--toggle]".</summary>
        public string Usage()
        {
            string line = "usage: " + program;
            foreach (Flag flag in flags) line += " [" + flag.Name + (flag.Meta == null ? "" : " " + flag.Meta) + "]";
            return line;
        }

        Flags Add(string name, string meta, Func<string, bool> set)
        {
            flags.Add(new Flag { Name = name, Meta = meta, Set = set });
            return this;
        }

        bool Refuse(string name, string kind, string text)
        {
            Console.Error.WriteLine(program + ": " + name + " takes " + kind + ", not '" + text + "'");
            return false;
        }
    }
}
