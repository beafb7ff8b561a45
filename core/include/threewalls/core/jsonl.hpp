#pragma once
// JSON and JSON Lines I/O. One JSON library (nlohmann::json) for the whole project.
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace threewalls {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Appends one JSON value per line to a file. Buffered; flush() or destruction writes it out.
// Not thread-safe: one writer per file.
class JsonlWriter {
 public:
  // Creates or truncates `path`. Throws SystemError when the file cannot be opened.
  explicit JsonlWriter(const std::filesystem::path& path);
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  JsonlWriter(JsonlWriter&& other) noexcept;
  JsonlWriter& operator=(JsonlWriter&& other) noexcept;

  void write(const OrderedJson& value);
  void write(const Json& value);
  // `line` must be one complete JSON value without the trailing newline.
  void write_raw(std::string_view line);
  void flush();
  void close();
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  [[nodiscard]] std::size_t lines() const { return lines_; }

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::size_t lines_ = 0;
};

// Reads a JSONL file line by line. `visit(json, line_number)` is called for each non-empty line.
// A line that is not valid JSON throws InputError("file:line: ...") naming the line.
void read_jsonl(const std::filesystem::path& path, const std::function<void(Json&&, std::size_t)>& visit);

// Parses one JSON text as Json::parse does (Json::parse_error on malformed text), but refuses an
// object that names a key twice, which Json::parse accepts keeping the last value: InputError
// "WHERE: duplicate key "k" in one JSON object". Every reader of the project's JSON files uses it.
Json parse_json(std::string_view text, const std::string& where);

// Reads a whole JSON file (parse_json); throws InputError with file:line:col on a parse error.
Json read_json_file(const std::filesystem::path& path);
// Writes pretty JSON (2-space indent) atomically (write to temp, rename).
void write_json_file(const std::filesystem::path& path, const OrderedJson& value);

// Formats a double for JSON output with up to `digits` significant digits, never "nan"/"inf"
// (those become null). Used by hand-written fast record formatting.
void append_json_number(std::string& out, double v, int digits = 9);
void append_json_string(std::string& out, std::string_view s);

}  // namespace threewalls
