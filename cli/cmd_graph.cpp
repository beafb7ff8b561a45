#include "command.hpp"

namespace threewalls::cli {
void register_graph(CLI::App&, Commands&) {}
}  // namespace threewalls::cli
