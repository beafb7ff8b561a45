#include "threewalls/core/jsonl.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "threewalls/core/error.hpp"

namespace threewalls {

JsonlWriter::JsonlWriter(const std::filesystem::path& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "wb");
  if (!file_) throw SystemError(path.string() + ": cannot open for writing: " + std::strerror(errno));
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
}

JsonlWriter::~JsonlWriter() {
  if (file_) std::fclose(file_);
}

JsonlWriter::JsonlWriter(JsonlWriter&& other) noexcept
    : path_(std::move(other.path_)), file_(other.file_), lines_(other.lines_) {
  other.file_ = nullptr;
}

JsonlWriter& JsonlWriter::operator=(JsonlWriter&& other) noexcept {
  if (this != &other) {
    if (file_) std::fclose(file_);
    path_ = std::move(other.path_);
    file_ = other.file_;
    lines_ = other.lines_;
    other.file_ = nullptr;
  }
  return *this;
}

void JsonlWriter::write(const OrderedJson& value) { write_raw(value.dump()); }
void JsonlWriter::write(const Json& value) { write_raw(value.dump()); }

void JsonlWriter::write_raw(std::string_view line) {
  if (!file_) throw SystemError(path_.string() + ": write after close");
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fputc('\n', file_) == EOF) {
    throw SystemError(path_.string() + ": write failed: " + std::strerror(errno));
  }
  ++lines_;
}

void JsonlWriter::flush() {
  if (file_ && std::fflush(file_) != 0) {
    throw SystemError(path_.string() + ": flush failed: " + std::strerror(errno));
  }
}

void JsonlWriter::close() {
  if (file_) {
    flush();
    std::fclose(file_);
    file_ = nullptr;
  }
}

Json parse_json(std::string_view text, const std::string& where) {
  std::vector<std::unordered_set<std::string>> keys;  // per open object
  std::string duplicate;
  bool found = false;
  const Json::parser_callback_t check = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == Json::parse_event_t::key && !keys.empty() && !found) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(k).second) {
        found = true;
        duplicate = k;
      }
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), check);
  } catch (const Json::out_of_range& e) {
    // A number too large for a double (1e309): valid JSON syntax, but no value to read.
    throw InputError(where + ": a number out of range (" + std::string(e.what()) + ")");
  }
  if (found) {
    std::string quoted;
    append_json_string(quoted, duplicate);
    throw InputError(where + ": duplicate key " + quoted + " in one JSON object (each key may appear once)");
  }
  return j;
}

void read_jsonl(const std::filesystem::path& path, const std::function<void(Json&&, std::size_t)>& visit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(SourceLocation{path.string(), 0, 0}, "cannot open for reading");
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line == "\r") continue;
    Json value;
    try {
      value = parse_json(line, SourceLocation{path.string(), static_cast<int>(n), 0}.str());
    } catch (const Json::parse_error& e) {
      throw InputError(SourceLocation{path.string(), static_cast<int>(n), static_cast<int>(e.byte)},
                       "corrupt or truncated JSON line: " + std::string(e.what()));
    }
    visit(std::move(value), n);
  }
  if (in.bad()) throw SystemError(path.string() + ": read failed");
}

Json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(SourceLocation{path.string(), 0, 0}, "cannot open for reading");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  try {
    return parse_json(text, path.string());
  } catch (const Json::parse_error& e) {
    // Translate the byte offset into line:col.
    int line = 1;
    int col = 1;
    for (std::size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw InputError(SourceLocation{path.string(), line, col}, std::string("invalid JSON: ") + e.what());
  }
}

void write_json_file(const std::filesystem::path& path, const OrderedJson& value) {
  auto tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw SystemError(tmp.string() + ": cannot open for writing: " + std::strerror(errno));
    out << value.dump(2) << '\n';
    if (!out) throw SystemError(tmp.string() + ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw SystemError(path.string() + ": rename failed: " + ec.message());
}

void append_json_number(std::string& out, double v, int digits) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  if (v == std::floor(v) && std::fabs(v) < 9.007199254740992e15) {
    char buf[32];
    auto [p, ec] = std::to_chars(buf, buf + sizeof buf, static_cast<long long>(v));
    out.append(buf, p);
    return;
  }
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, digits);
  out.append(buf, p);
}

namespace {

// A double-quoted string literal with quote, backslash, \n, \t, \r and the other control characters
// escaped (\uXXXX); `escape_del` also escapes DEL (0x7f), which TOML requires and JSON allows.
void append_quoted(std::string& out, std::string_view s, bool escape_del) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || (escape_del && c == 0x7f)) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) { append_quoted(out, s, false); }

std::string toml_basic_string(std::string_view s) {
  std::string out;
  append_quoted(out, s, true);
  return out;
}

}  // namespace threewalls
