// The example programs' command lines. Each program lists its flags and where
// their values go; all of them then parse alike and refuse alike: a flag they
// do not know, a flag without its value, or a value that is not a number of the
// flag's type ends the program with a line that names the flag, and the usage
// line is built from the list ("usage: cartpole [--host H] [--port P] ...").
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace examples {

/// The flags of one program. Declare them, then call parse():
///
///   examples::Flags flags("cartpole");
///   flags.value("--host", args.host, "H").value("--port", args.port, "P").toggle("--random", args.random);
///   if (!flags.parse(argc, argv)) return 2;
class Flags {
 public:
  explicit Flags(const char* program) : program_(program) {}
  Flags(const Flags&) = delete;  // (its flags' setters point at this object)
  Flags& operator=(const Flags&) = delete;

  /// `name VALUE` sets `out`: a string as given (an optional one is set even
  /// to ""); a number (an integer or a floating-point type) only when the whole
  /// value is one (see number_text) that fits `out`, which is left as it was otherwise.
  template <class T>
  Flags& value(const char* name, T& out, const char* meta) {
    flags_.push_back({name, meta, [this, name, &out](const char* text) { return assign(name, text, out); }});
    return *this;
  }

  /// `name VALUE` sets `out`, VALUE being one of `choices`.
  Flags& choice(const char* name, std::string& out, std::vector<std::string> choices) {
    std::string meta;
    for (const std::string& choice : choices) meta += (meta.empty() ? "" : "|") + choice;
    flags_.push_back({name, meta, [this, name, &out, choices = std::move(choices), meta](const char* text) {
                        for (const std::string& choice : choices) {
                          if (choice == text) {
                            out = text;
                            return true;
                          }
                        }
                        std::fprintf(stderr, "%s: %s takes one of %s, not '%s'\n", program_, name, meta.c_str(), text);
                        return false;
                      }});
    return *this;
  }

  /// `name` alone sets `out` to true.
  Flags& toggle(const char* name, bool& out) {
    flags_.push_back({name, "", [&out](const char*) { return out = true; }});
    return *this;
  }

  /// Reads argv[1..]. False, with a line on stderr, at the first flag that is
  /// unknown, lacks its value or has a value of the wrong kind.
  bool parse(int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      const Flag* flag = find(argv[i]);
      if (flag == nullptr) {
        std::fprintf(stderr, "%s: unknown flag '%s'\n%s\n", program_, argv[i], usage().c_str());
        return false;
      }
      const char* text = nullptr;
      if (!flag->meta.empty()) {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "%s: %s needs a value (%s)\n", program_, flag->name, flag->meta.c_str());
          return false;
        }
        text = argv[++i];
      }
      if (!flag->set(text)) return false;
    }
    return true;
  }

  /// "usage: PROGRAM [--flag META] ... [--toggle]".
  std::string usage() const {
    std::string line = std::string("usage: ") + program_;
    for (const Flag& flag : flags_) {
      line += std::string(" [") + flag.name + (flag.meta.empty() ? "" : " " + flag.meta) + "]";
    }
    return line;
  }

 private:
  struct Flag {
    const char* name;
    std::string meta;  // empty for a toggle
    std::function<bool(const char*)> set;
  };

  const Flag* find(const std::string& name) const {
    for (const Flag& flag : flags_) {
      if (name == flag.name) return &flag;
    }
    return nullptr;
  }

  bool assign(const char*, const char* text, std::string& out) const {
    out = text;
    return true;
  }

  bool assign(const char*, const char* text, std::optional<std::string>& out) const {
    out = std::string(text);  // (given, even when empty)
    return true;
  }

  // One grammar for the C++ and C# examples (examples/csharp/Shared/Flags.cs): a whole number is
  // [+-]?[0-9]+ (no '-' for a flag that cannot be negative), a number [+-]?(D+(.D*)?|.D+)([eE][+-]?D+)?
  // with a finite value; nothing around them (no spaces, no hex, no inf or nan).
  static bool digits(const char*& at) {
    const char* start = at;
    while (*at >= '0' && *at <= '9') ++at;
    return at != start;
  }

  static bool whole_number_text(const char* text, bool negative_allowed) {
    if (*text == '+' || (negative_allowed && *text == '-')) ++text;
    return digits(text) && *text == '\0';
  }

  static bool number_text(const char* text) {
    if (*text == '+' || *text == '-') ++text;
    const bool whole = digits(text);
    const bool fraction = *text == '.' && (++text, digits(text));
    if (!whole && !fraction) return false;
    if (*text == 'e' || *text == 'E') {
      ++text;
      if (*text == '+' || *text == '-') ++text;
      if (!digits(text)) return false;
    }
    return *text == '\0';
  }

  template <class T>
  bool assign(const char* name, const char* text, T& out) const {
    static_assert(std::is_arithmetic<T>::value, "a flag's value is a string or a number");
    errno = 0;
    if constexpr (std::is_floating_point<T>::value) {
      const bool well_formed = number_text(text);
      const double parsed = well_formed ? std::strtod(text, nullptr) : 0.0;
      // (ERANGE also flags a tiny value rounded towards 0: it is a finite number all the same)
      if (well_formed && std::isfinite(parsed) && std::fabs(parsed) <= std::numeric_limits<T>::max()) {
        out = static_cast<T>(parsed);
        return true;
      }
      std::fprintf(stderr, "%s: %s takes a number, not '%s'\n", program_, name, text);
    } else if constexpr (std::is_signed<T>::value) {
      const bool well_formed = whole_number_text(text, true);
      const long long parsed = well_formed ? std::strtoll(text, nullptr, 10) : 0;
      if (well_formed && errno == 0 && parsed >= std::numeric_limits<T>::min() &&
          parsed <= std::numeric_limits<T>::max()) {
        out = static_cast<T>(parsed);
        return true;
      }
      std::fprintf(stderr, "%s: %s takes a whole number, not '%s'\n", program_, name, text);
    } else {
      const bool well_formed = whole_number_text(text, false);
      const unsigned long long parsed = well_formed ? std::strtoull(text, nullptr, 10) : 0;
      if (well_formed && errno == 0 && parsed <= std::numeric_limits<T>::max()) {
        out = static_cast<T>(parsed);
        return true;
      }
      std::fprintf(stderr, "%s: %s takes a whole number from 0 to %llu, not '%s'\n", program_, name,
                   static_cast<unsigned long long>(std::numeric_limits<T>::max()), text);
    }
    return false;
  }

  const char* program_;
  std::vector<Flag> flags_;
};

}  // namespace examples
