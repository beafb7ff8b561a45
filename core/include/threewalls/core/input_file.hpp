#pragma once
// Reading a whole input file (scenario, calibration profile, importer input) into memory, refusing
// what is not one: a directory, a FIFO or device (which could block or never end), a file larger
// than the input limit, or a path the file system rejects. Every refusal is an InputError that names
// the path (shortened when very long) and the reason.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace threewalls {

// Input files are text written by people or by threewalls; the largest shipped one is a few hundred
// KiB. 64 MiB leaves room for generated inputs while a wrong path (a disk image, /dev/zero) fails fast.
inline constexpr std::uintmax_t kMaxInputFileBytes = 64ULL << 20;

// The path as error messages show it: whole up to 200 characters, else its first and last 80
// characters and the length.
[[nodiscard]] std::string display_path(const std::filesystem::path& path);

// The contents of the regular file `path`. `what` names the kind of file in messages ("scenario file").
[[nodiscard]] std::string read_input_file(const std::filesystem::path& path, std::string_view what,
                                          std::uintmax_t max_bytes = kMaxInputFileBytes);

}  // namespace threewalls
