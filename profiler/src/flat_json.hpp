#pragma once
// A scanner for flat JSON objects ({"key": scalar, ...}), the shape of every phase and step line.
// Much faster than building a DOM for each of millions of lines; the reader falls back to
// nlohmann::json for lines holding nested values (header, footer). Internal to profiler/.
#include <array>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

namespace threewalls::profiler::detail {

struct FlatValue {
  enum class Kind : std::uint8_t { number, string, null, boolean, nested };
  Kind kind = Kind::null;
  double number = 0.0;
  std::string_view text;  // string contents (unescaped; may point into the scanner's scratch)
  bool boolean = false;
};

// Characters that end the fast scan of a string: the closing quote, a backslash, control characters.
inline constexpr auto kStringStop = [] {
  std::array<bool, 256> t{};
  for (int c = 0; c < 0x20; ++c) t[static_cast<std::size_t>(c)] = true;
  t['"'] = true;
  t['\\'] = true;
  return t;
}();

class FlatScanner {
 public:
  explicit FlatScanner(std::string_view line) : s_(line) {}

  // Call begin() once, then next() until it returns false. On a syntax error both return false and
  // error() is non-empty; column() is the 1-based column of the error.
  bool begin() {
    skip_ws();
    if (!eat('{')) return fail("expected '{' at the start of the record");
    skip_ws();
    if (peek() == '}') {
      ++i_;
      done_ = true;
    }
    return true;
  }

  // Reads the next key and value. A nested object or array is reported as Kind::nested (and skipped
  // only when `nested_ok`; otherwise the scan stops so the caller can fall back to a full parser).
  bool next(std::string_view& key, FlatValue& value) {
    if (done_ || !error_.empty()) return false;
    skip_ws();
    if (!parse_string(key_scratch_, key)) return false;
    skip_ws();
    if (!eat(':')) return fail("expected ':' after key");
    skip_ws();
    if (!parse_value(value)) return false;
    skip_ws();
    if (eat(',')) return true;
    if (eat('}')) {
      done_ = true;
      skip_ws();
      if (i_ != s_.size()) {
        fail("unexpected text after the record");
        return true;  // the value is fine; the caller checks error() after the loop
      }
      return true;
    }
    if (i_ >= s_.size()) return fail("line ends inside the record (truncated?)");
    return fail("expected ',' or '}'");
  }

  [[nodiscard]] bool finished() const { return done_ && error_.empty(); }
  [[nodiscard]] const std::string& error() const { return error_; }
  [[nodiscard]] int column() const { return static_cast<int>(err_pos_) + 1; }
  [[nodiscard]] bool nested_seen() const { return nested_; }

 private:
  [[nodiscard]] char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n')) ++i_;
  }
  bool fail(std::string what) {
    if (error_.empty()) {
      error_ = std::move(what);
      err_pos_ = i_;
    }
    return false;
  }

  static void put_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool hex4(std::uint32_t& cp) {
    if (i_ + 4 > s_.size()) return fail("truncated \\u escape");
    cp = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      cp <<= 4;
      if (c >= '0' && c <= '9') cp |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') cp |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') cp |= static_cast<std::uint32_t>(c - 'A' + 10);
      else return fail("bad \\u escape");
    }
    return true;
  }

  // Parses a string at i_; `out` views either the line itself (no escapes) or `scratch`.
  bool parse_string(std::string& scratch, std::string_view& out) {
    if (!eat('"')) return fail(i_ >= s_.size() ? "line ends inside the record (truncated?)" : "expected a string");
    std::size_t start = i_;
    while (i_ < s_.size() && !kStringStop[static_cast<unsigned char>(s_[i_])]) ++i_;
    if (i_ < s_.size() && static_cast<unsigned char>(s_[i_]) < 0x20) return fail("control character in a string");
    if (i_ >= s_.size()) return fail("line ends inside a string (truncated?)");
    if (s_[i_] == '"') {
      out = s_.substr(start, i_ - start);
      ++i_;
      return true;
    }
    scratch.assign(s_.data() + start, i_ - start);
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in a string");
      if (c != '\\') {
        scratch += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      char e = s_[i_++];
      switch (e) {
        case '"': scratch += '"'; break;
        case '\\': scratch += '\\'; break;
        case '/': scratch += '/'; break;
        case 'b': scratch += '\b'; break;
        case 'f': scratch += '\f'; break;
        case 'n': scratch += '\n'; break;
        case 'r': scratch += '\r'; break;
        case 't': scratch += '\t'; break;
        case 'u': {
          std::uint32_t cp = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00) {
            std::uint32_t lo = 0;
            if (!(eat('\\') && eat('u') && hex4(lo)) || lo < 0xDC00 || lo >= 0xE000) {
              return fail("bad surrogate pair in \\u escape");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(scratch, cp);
          break;
        }
        default: return fail("bad escape in a string");
      }
    }
    if (i_ >= s_.size()) return fail("line ends inside a string (truncated?)");
    ++i_;
    out = scratch;
    return true;
  }

  bool parse_literal(std::string_view word) {
    if (s_.substr(i_, word.size()) == word) {
      i_ += word.size();
      return true;
    }
    return fail(i_ + word.size() > s_.size() ? "line ends inside a value (truncated?)" : "invalid literal");
  }

  bool parse_value(FlatValue& v) {
    char c = peek();
    if (c == '"') {
      v.kind = FlatValue::Kind::string;
      return parse_string(val_scratch_, v.text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      // JSON grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
      std::size_t start = i_;
      if (s_[i_] == '-') ++i_;
      if (i_ >= s_.size() || !(s_[i_] >= '0' && s_[i_] <= '9')) return fail("invalid number");
      if (s_[i_] == '0' && i_ + 1 < s_.size() && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9') {
        return fail("invalid number (leading zero)");
      }
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      if (i_ < s_.size() && s_[i_] == '.') {
        ++i_;
        if (i_ >= s_.size() || !(s_[i_] >= '0' && s_[i_] <= '9')) return fail("invalid number");
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      }
      if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
        ++i_;
        if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
        if (i_ >= s_.size() || !(s_[i_] >= '0' && s_[i_] <= '9')) return fail("invalid number");
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      }
      auto [p, ec] = std::from_chars(s_.data() + start, s_.data() + i_, v.number);
      if (ec == std::errc::result_out_of_range) {
        i_ = start;
        return fail("number out of range");
      }
      if (ec != std::errc() || p != s_.data() + i_) {
        i_ = start;
        return fail("invalid number");
      }
      v.kind = FlatValue::Kind::number;
      return true;
    }
    if (c == 'n') {
      v.kind = FlatValue::Kind::null;
      return parse_literal("null");
    }
    if (c == 't') {
      v.kind = FlatValue::Kind::boolean;
      v.boolean = true;
      return parse_literal("true");
    }
    if (c == 'f') {
      v.kind = FlatValue::Kind::boolean;
      v.boolean = false;
      return parse_literal("false");
    }
    if (c == '{' || c == '[') {
      nested_ = true;
      v.kind = FlatValue::Kind::nested;
      return fail("nested value");
    }
    if (i_ >= s_.size()) return fail("line ends where a value was expected (truncated?)");
    return fail("expected a value");
  }

  std::string_view s_;
  std::size_t i_ = 0;
  std::size_t err_pos_ = 0;
  std::string error_;
  std::string key_scratch_;
  std::string val_scratch_;
  bool done_ = false;
  bool nested_ = false;
};

}  // namespace threewalls::profiler::detail
