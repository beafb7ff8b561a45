#include "threewalls/core/input_file.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include "threewalls/core/error.hpp"

namespace threewalls {

std::string display_path(const std::filesystem::path& path) {
  const std::string s = path.string();
  if (s.size() <= 200) return s;
  return s.substr(0, 80) + "..." + s.substr(s.size() - 80) + " (a path of " + std::to_string(s.size()) + " characters)";
}

std::string read_input_file(const std::filesystem::path& path, std::string_view what, std::uintmax_t max_bytes) {
  const SourceLocation where{display_path(path), 0, 0};
  const std::string kind(what);
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) throw InputError(where, "cannot open " + kind + " (no such file)");
    throw InputError(where, "cannot open " + kind + " (" + ec.message() + ")");
  }
  if (st.type() == std::filesystem::file_type::directory) {
    throw InputError(where, "cannot read " + kind + " (a directory; give a file)");
  }
  if (st.type() != std::filesystem::file_type::regular) {
    throw InputError(where, "cannot read " + kind +
                                " (not a regular file but a FIFO, socket or device; give a file, or copy the input "
                                "into one first)");
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw InputError(where, "cannot read " + kind + " (" + ec.message() + ")");
  if (size > max_bytes) {
    throw InputError(where, "cannot read " + kind + " (" + std::to_string(size) + " bytes; input files are at most " +
                                std::to_string(max_bytes) + " bytes)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(where, "cannot open " + kind + " (" + std::strerror(errno) + ")");
  std::string text(static_cast<std::size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  text.resize(static_cast<std::size_t>(in.gcount()));
  // A file that grew while being read is taken up to its size when opened; one more byte tells.
  if (in.peek() != std::ifstream::traits_type::eof()) {
    throw InputError(where, "cannot read " + kind + " (it changed size while being read)");
  }
  if (in.bad()) throw InputError(where, "cannot read " + kind + " (read failed)");
  return text;
}

}  // namespace threewalls
