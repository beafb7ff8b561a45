// Megatron-LM launch -> scenario draft (docs/import.md lists every mapping). Megatron's own defaults
// (megatron/training/arguments.py) are applied where a flag is absent and they differ from the
// registry's, and each such choice is written into the report's notes.
#include <algorithm>
#include <cctype>
#include <climits>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "threewalls/core/error.hpp"
#include "threewalls/core/input_file.hpp"
#include "threewalls/core/strings.hpp"
#include "threewalls/scenarios/import.hpp"
#include "threewalls/scenarios/registry.hpp"

namespace threewalls::scenarios {
namespace {

std::vector<std::int64_t> int_list(const std::vector<int>& v) { return {v.begin(), v.end()}; }

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::string strip_quotes(std::string s) {
  for (int i = 0; i < 2; ++i) {  // "'([1]*48)'" is quoted twice in some scripts
    s = trim(s);
    if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) {
      s = s.substr(1, s.size() - 2);
    }
  }
  return s;
}

// ---- variables: ${VAR}, ${VAR:-default}, $VAR, $((arithmetic)) ----

using Vars = std::map<std::string, std::string>;

// How deeply parentheses of $((...)) and ${VAR:-default} references may nest (the parsers recurse).
constexpr int kMaxNesting = 200;

// Integer arithmetic of $((...)): + - * / and parentheses over integers and variable names. An
// unresolvable name leaves the reference as written; division by zero, overflow and nesting past
// kMaxNesting are InputErrors.
class Arith {
 public:
  Arith(const std::string& s, const Vars& vars) : s_(s), vars_(vars) {}
  std::optional<long long> eval() {
    auto v = sum();
    skip();
    if (!v || p_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void skip() {
    while (p_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[p_]))) ++p_;
  }
  std::optional<long long> atom() {
    skip();
    if (p_ < s_.size() && s_[p_] == '(') {
      ++p_;
      if (++depth_ > kMaxNesting) fail("parentheses nested more than " + std::to_string(kMaxNesting) + " deep");
      auto v = sum();
      --depth_;
      skip();
      if (p_ >= s_.size() || s_[p_] != ')') return std::nullopt;
      ++p_;
      return v;
    }
    if (p_ < s_.size() && s_[p_] == '$') ++p_;
    const std::size_t b = p_;
    while (p_ < s_.size() && is_name_char(s_[p_])) ++p_;
    const std::string w = s_.substr(b, p_ - b);
    if (w.empty()) return std::nullopt;
    std::string text = w;
    if (!std::isdigit(static_cast<unsigned char>(w[0]))) {
      auto it = vars_.find(w);
      if (it == vars_.end()) return std::nullopt;
      text = it->second;
    }
    try {
      std::size_t used = 0;
      long long v = std::stoll(text, &used);
      if (used != text.size()) return std::nullopt;
      return v;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  std::optional<long long> product() {
    auto v = atom();
    for (;;) {
      skip();
      if (!v || p_ >= s_.size() || (s_[p_] != '*' && s_[p_] != '/')) return v;
      const char op = s_[p_++];
      auto r = atom();
      if (!r) return std::nullopt;
      if (op == '/' && *r == 0) fail("division by zero");
      long long out = 0;
      if (op == '*' ? __builtin_mul_overflow(*v, *r, &out) : (*r == -1 && *v == LLONG_MIN)) fail("overflows 64 bits");
      v = op == '*' ? out : *v / *r;
    }
  }
  std::optional<long long> sum() {
    auto v = product();
    for (;;) {
      skip();
      if (!v || p_ >= s_.size() || (s_[p_] != '+' && s_[p_] != '-')) return v;
      const char op = s_[p_++];
      auto r = product();
      if (!r) return std::nullopt;
      long long out = 0;
      if (op == '+' ? __builtin_add_overflow(*v, *r, &out) : __builtin_sub_overflow(*v, *r, &out)) {
        fail("overflows 64 bits");
      }
      v = out;
    }
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw InputError("$((" + (s_.size() > 60 ? s_.substr(0, 60) + "..." : s_) + ")): " + why);
  }
  const std::string& s_;
  const Vars& vars_;
  std::size_t p_ = 0;
  int depth_ = 0;
};

// Expands the variable reference starting at s[i] == '$'; advances i past it. Unresolvable references
// are returned as written (the importer reports arguments whose values still hold a '$').
std::string expand_reference(const std::string& s, std::size_t& i, const Vars& vars, int nesting = 0) {
  if (nesting > kMaxNesting) {
    throw InputError("${...:-default} references nested more than " + std::to_string(kMaxNesting) + " deep");
  }
  const std::size_t start = i;
  if (s.compare(i, 3, "$((") == 0) {
    // The "))" that closes this reference: parentheses inside the expression nest.
    auto end = std::string::npos;
    for (std::size_t j = i + 3, open = 2; j < s.size(); ++j) {
      if (s[j] == '(') ++open;
      if (s[j] == ')' && --open == 0) {
        if (s[j - 1] == ')') end = j - 1;
        break;
      }
    }
    if (end != std::string::npos) {
      i = end + 2;
      if (auto v = Arith(s.substr(start + 3, end - start - 3), vars).eval()) return std::to_string(*v);
      return s.substr(start, i - start);
    }
  }
  if (i + 1 < s.size() && s[i + 1] == '{') {
    int depth = 0;
    std::size_t j = i + 1;
    for (; j < s.size(); ++j) {
      if (s[j] == '{') ++depth;
      if (s[j] == '}' && --depth == 0) break;
    }
    if (j >= s.size()) {
      i = s.size();
      return s.substr(start);
    }
    i = j + 1;
    const std::string body = s.substr(start + 2, j - start - 2);
    std::size_t n = 0;
    while (n < body.size() && is_name_char(body[n])) ++n;
    const std::string name = body.substr(0, n);
    const std::string rest = body.substr(n);
    auto it = vars.find(name);
    if (rest.empty() && it != vars.end()) return it->second;
    if (rest.rfind(":-", 0) == 0 || rest.rfind('-', 0) == 0) {
      if (it != vars.end() && !(rest[0] == ':' && it->second.empty())) return it->second;
      std::string def = rest.substr(rest[0] == ':' ? 2 : 1);
      std::string out;
      for (std::size_t k = 0; k < def.size(); ++k) {
        if (def[k] == '$') {
          out += expand_reference(def, k, vars, nesting + 1);
          --k;
        } else {
          out += def[k];
        }
      }
      return strip_quotes(out);
    }
    return s.substr(start, i - start);
  }
  std::size_t j = i + 1;
  while (j < s.size() && is_name_char(s[j])) ++j;
  if (j == i + 1) {
    i = j + (j < s.size() ? 1 : 0);  // "$@", "$1": positional, never resolvable here
    return s.substr(start, i - start);
  }
  i = j;
  auto it = vars.find(s.substr(start + 1, j - start - 1));
  return it != vars.end() ? it->second : s.substr(start, j - start);
}

std::string substitute(const std::string& s, const Vars& vars) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] == '$') {
      out += expand_reference(s, i, vars);
    } else {
      out += s[i++];
    }
  }
  return out;
}

// The variable a reference `$NAME` or `${NAME}` at s[i] == '$' names, or "" for any other form.
std::string plain_reference(const std::string& s, std::size_t i) {
  std::size_t b = i + 1;
  const bool braced = b < s.size() && s[b] == '{';
  if (braced) ++b;
  std::size_t e = b;
  while (e < s.size() && is_name_char(s[e])) ++e;
  if (e == b || (braced && (e >= s.size() || s[e] != '}'))) return "";
  return s.substr(b, e - b);
}

// Variables that hold Megatron flags in a quoted string (MODEL_ARGS="--num-layers 24 ..."): their
// flags are taken where they are assigned, so a later $MODEL_ARGS adds nothing.
using FlagVars = std::set<std::string>;

// The one environment variable of a launch that the importer maps (run.cuda_device_max_connections);
// the parsers hand it on as an argument of this name.
constexpr const char* kMaxConnections = "CUDA_DEVICE_MAX_CONNECTIONS";
constexpr const char* kMaxConnectionsArg = "ENV:CUDA_DEVICE_MAX_CONNECTIONS";

// Shell words of one logical line: quotes removed, variables substituted outside single quotes,
// a '#' at the start of a word begins a comment. A reference to one of `flag_vars` is dropped.
std::vector<std::string> shell_words(const std::string& line, const Vars& vars, const FlagVars* flag_vars = nullptr) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  for (std::size_t i = 0; i < line.size();) {
    const char c = line[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (in_word) words.push_back(cur);
      cur.clear();
      in_word = false;
      ++i;
    } else if (c == '#' && !in_word) {
      break;
    } else if (c == '\'') {
      const auto end = line.find('\'', i + 1);
      cur += line.substr(i + 1, (end == std::string::npos ? line.size() : end) - i - 1);
      in_word = true;
      i = end == std::string::npos ? line.size() : end + 1;
    } else if (c == '"') {
      std::size_t j = i + 1;
      std::string inner;
      while (j < line.size() && line[j] != '"') {
        if (line[j] == '\\' && j + 1 < line.size()) ++j;
        inner += line[j++];
      }
      cur += substitute(inner, vars);
      in_word = true;
      i = j + 1;
    } else if (c == '\\' && i + 1 < line.size()) {
      cur += line[i + 1];
      in_word = true;
      i += 2;
    } else if (c == '$') {
      if (flag_vars != nullptr && flag_vars->count(plain_reference(line, i)) > 0) {
        expand_reference(line, i, vars);  // only to step over it
        continue;
      }
      cur += expand_reference(line, i, vars);
      in_word = true;
    } else {
      cur += c;
      in_word = true;
      ++i;
    }
  }
  if (in_word) words.push_back(cur);
  return words;
}

bool is_flag(const std::string& w) { return w.size() > 2 && w[0] == '-' && w[1] == '-' && std::isalpha(static_cast<unsigned char>(w[2])); }

std::string normalize_flag(std::string f) {
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

// Commands whose own flags come before the program they start (`srun --mpi=pmix ... bash -c "..."`):
// their flags are the launcher's, not Megatron-LM's.
bool is_launcher(const std::string& w) {
  static const std::set<std::string> k = {"srun",   "sbatch", "salloc",    "mpirun",      "mpiexec", "docker",
                                          "podman", "enroot", "apptainer", "singularity", "nsys",    "numactl"};
  return k.count(w) > 0;
}

// A word that starts a program after a launcher's flags (`bash`, `python`, `pretrain_gpt.py`).
bool is_program(const std::string& w) {
  static const std::set<std::string> k = {"bash", "sh", "python", "python3", "torchrun", "env", "uv"};
  const auto slash = w.rfind('/');
  const std::string base = slash == std::string::npos ? w : w.substr(slash + 1);
  return k.count(base) > 0 || (base.size() > 3 && (base.ends_with(".py") || base.ends_with(".sh")));
}

// Appends the arguments found in `words` (one logical line) to `out`; records VAR=value assignments
// in `script_vars` unless `forced` (the --var values) names the variable.
// A quoted array element or string holding several words ("--fp8-format hybrid") is split as the
// shell splits an unquoted expansion. An assignment whose value holds flags (MODEL_ARGS="--num-layers
// 24 ...") contributes them here, at its line, and its name joins `flag_vars`. The flags of a launcher
// (srun, mpirun, docker, ...) up to the program it starts are kept apart as one "LAUNCHER:<name>"
// argument; echo/printf lines and case patterns (`--tokenizer)`) hold no arguments.
void collect_args(const std::vector<std::string>& words, int line, Vars& script_vars, const Vars& forced,
                  std::vector<MegatronArg>& out, FlagVars* flag_vars = nullptr) {
  bool seen_flag = false;
  bool seen_command = false;
  std::string launcher;  // the launcher whose flags are being skipped
  for (std::size_t k = 0; k < words.size(); ++k) {
    const std::string& w = words[k];
    if (!launcher.empty()) {
      if (w.size() > 1 && w[0] == '-') {
        MegatronArg& a = out.back();
        a.values.push_back(w.substr(0, w.find('=')));
        continue;
      }
      if (!is_program(w)) continue;  // a flag's value or a subcommand (`nsys profile`, `docker run`)
      launcher.clear();
      continue;  // the program itself
    }
    if (is_flag(w) && w.find_first_of(" \t\n") != std::string::npos) {
      std::vector<MegatronArg> inner;
      collect_args(shell_words(w, {}), line, script_vars, forced, inner);
      for (auto& a : inner) out.push_back(std::move(a));
      seen_flag = seen_flag || !inner.empty();
      continue;
    }
    if (is_flag(w) && w.back() == ')') continue;  // a case pattern
    if (is_flag(w)) {
      seen_flag = true;
      MegatronArg a;
      const auto eq = w.find('=');
      a.flag = normalize_flag(w.substr(0, eq));
      a.line = line;
      if (eq != std::string::npos) a.values.push_back(w.substr(eq + 1));
      out.push_back(std::move(a));
      continue;
    }
    if (!seen_flag) {
      // Leading NAME=value words (with or without `export`) set variables for later lines.
      const auto eq = w.find('=');
      if (!seen_command && eq != std::string::npos && eq > 0 &&
          std::all_of(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(eq), is_name_char) &&
          !std::isdigit(static_cast<unsigned char>(w[0]))) {
        const std::string name = w.substr(0, eq);
        const std::string value = w.substr(eq + 1);
        if (value != "(" && forced.count(name) == 0) script_vars[name] = value;
        if (name == kMaxConnections) out.push_back({kMaxConnectionsArg, {value}, line});
        if (flag_vars != nullptr && value.find("--") != std::string::npos) {
          const std::vector<std::string> pieces = shell_words(value, {});
          if (std::any_of(pieces.begin(), pieces.end(), is_flag)) {
            collect_args(pieces, line, script_vars, forced, out);
            flag_vars->insert(name);
          }
        }
        continue;
      }
      if (w == "export" || w == "local" || w == "declare" || w == "readonly") continue;
      if (!seen_command) {
        seen_command = true;
        if (w == "echo" || w == "printf") return;
        if (is_launcher(w)) {
          launcher = w;
          MegatronArg a;
          a.flag = "LAUNCHER:" + w;
          a.line = line;
          out.push_back(std::move(a));
        }
      }
      continue;
    }
    if (w == ")" || w == "(" || w == "\\" || w.find("[@]") != std::string::npos || w == "$@" ||
        w == "&&" || w == "||" || w == ";" || w == "|") {
      continue;
    }
    if (!out.empty() && out.back().line == line && out.back().flag.rfind("LAUNCHER:", 0) != 0) {
      out.back().values.push_back(w);
    }
  }
}

std::vector<MegatronArg> parse_shell(const std::string& text, const Vars& forced) {
  std::vector<MegatronArg> out;
  // The script's assignments over the forced values: collect_args never overwrites a forced one, so
  // one map serves every line (a merged copy per line made the parse quadratic or worse).
  Vars vars = forced;
  FlagVars flag_vars;
  const auto words_of = [&](const std::string& logical, int line) {
    try {
      return shell_words(logical, vars, &flag_vars);
    } catch (const InputError& e) {
      throw InputError("line " + std::to_string(line) + ": " + e.what());
    }
  };
  std::istringstream in(text);
  std::string raw;
  std::string logical;
  int line_no = 0;
  int start_line = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    if (logical.empty()) start_line = line_no;
    std::string t = raw;
    while (!t.empty() && (t.back() == '\r' || t.back() == ' ' || t.back() == '\t')) t.pop_back();
    // A comment line inside a continued command does not end it (as in bash arrays).
    if (!logical.empty() && trim(t).rfind('#', 0) == 0) continue;
    if (!t.empty() && t.back() == '\\') {
      logical += t.substr(0, t.size() - 1) + " ";
      continue;
    }
    logical += t;
    collect_args(words_of(logical, start_line), start_line, vars, forced, out, &flag_vars);
    logical.clear();
  }
  if (!logical.empty()) {
    collect_args(words_of(logical, start_line), start_line, vars, forced, out, &flag_vars);
  }
  return out;
}

std::vector<MegatronArg> parse_yaml(const std::string& text, const Vars& vars) {
  std::vector<MegatronArg> out;
  std::istringstream in(text);
  std::string raw;
  int line_no = 0;
  std::string section;
  int env_vars = 0;
  int env_line = 0;
  std::string harness_keys;
  int harness_line = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    // Comments: '#' at the start or after whitespace, outside quotes.
    std::string line;
    char quote = 0;
    for (std::size_t i = 0; i < raw.size(); ++i) {
      const char c = raw[i];
      if (quote) {
        if (c == quote) quote = 0;
      } else if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == '#' && (i == 0 || std::isspace(static_cast<unsigned char>(raw[i - 1])))) {
        break;
      }
      line += c;
    }
    if (trim(line).empty()) continue;
    const bool top = !std::isspace(static_cast<unsigned char>(line[0]));
    std::string body = trim(line);
    if (body.rfind("- ", 0) == 0) continue;  // block-list items: not used by Megatron's configs
    const auto colon = body.find(": ") != std::string::npos ? body.find(": ") : (body.back() == ':' ? body.size() - 1 : std::string::npos);
    if (colon == std::string::npos) continue;
    std::string key = trim(body.substr(0, colon));
    std::string value = trim(body.substr(colon + 1));
    if (value.empty()) {
      if (top) section = key;
      continue;
    }
    // Upper-case top-level keys with a value (TEST_TYPE, MODE, LAUNCHER) belong to Megatron-LM's
    // functional-test harness, not to the training script.
    if (top && std::all_of(key.begin(), key.end(), [](char c) {
          return std::isupper(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_';
        })) {
      harness_keys += harness_keys.empty() ? key : ", " + key;
      harness_line = harness_line ? harness_line : line_no;
      continue;
    }
    if (section == "ENV_VARS") {
      if (key == kMaxConnections) {
        out.push_back({kMaxConnectionsArg, {strip_quotes(substitute(value, vars))}, line_no});
        continue;
      }
      ++env_vars;
      env_line = env_line ? env_line : line_no;
      continue;
    }
    value = substitute(value, vars);
    const std::string unq = strip_quotes(value);
    if (unq == "false" || unq == "False" || unq == "null" || unq == "~" || unq == "None") continue;
    MegatronArg a;
    while (!key.empty() && key[0] == '-') key.erase(0, 1);
    a.flag = "--" + normalize_flag(key);
    a.line = line_no;
    if (unq == "true" || unq == "True") {
      // flag given, no value
    } else if (unq.size() >= 2 && unq.front() == '[' && unq.back() == ']' && a.flag != "--moe-layer-freq") {
      std::stringstream items(unq.substr(1, unq.size() - 2));
      std::string item;
      while (std::getline(items, item, ',')) {
        if (!trim(item).empty()) a.values.push_back(strip_quotes(item));
      }
    } else {
      std::stringstream words(unq);
      std::string w;
      // "mla_up_proj mlp" style space-separated lists; keep expressions with spaces whole.
      if (unq.find_first_of("[(") != std::string::npos) {
        a.values.push_back(unq);
      } else {
        while (words >> w) a.values.push_back(strip_quotes(w));
      }
    }
    out.push_back(std::move(a));
  }
  if (!harness_keys.empty()) {
    MegatronArg a;
    a.flag = "HARNESS";
    a.values.push_back(harness_keys);
    a.line = harness_line;
    out.push_back(std::move(a));
  }
  if (env_vars > 0) {
    MegatronArg a;
    a.flag = "ENV_VARS";
    a.values.push_back(std::to_string(env_vars));
    a.line = env_line;
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

std::vector<MegatronArg> parse_megatron_launch(const std::string& text, bool yaml, const Vars& vars) {
  return yaml ? parse_yaml(text, vars) : parse_shell(text, vars);
}

std::vector<MegatronArg> parse_megatron_argv(const std::vector<std::string>& argv, const Vars& vars) {
  std::vector<MegatronArg> out;
  Vars none;
  std::vector<std::string> words;
  words.reserve(argv.size());
  for (const auto& a : argv) words.push_back(substitute(a, vars));
  collect_args(words, 0, none, vars, out);
  return out;
}

// ---- expressions of the arguments ----

namespace {

// A per-layer 0/1 argument of Megatron (`flag`): an integer N, whose layer l (0-based) is
// on_integer(l, N), or a Python list expression such as ([0]*3+[1]*58) or [1,0,1,0] with one entry
// per layer.
template <class OnInteger>
std::vector<int> expand_layer_pattern(const char* flag, const std::string& text, int num_layers,
                                      const OnInteger& on_integer) {
  const std::string e = strip_quotes(text);
  auto fail = [&](const std::string& why) -> InputError {
    return InputError(std::string(flag) + " '" + e + "': " + why +
                      " (an integer N, or a list expression such as ([0]*3+[1]*58) with one 0/1 per layer)");
  };
  std::string s;
  for (char c : e) {
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  }
  if (!s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    if (s.size() > 9) throw fail("too large");
    const int n = std::stoi(s);
    if (n < 1) throw fail("must be >= 1");
    std::vector<int> out(static_cast<std::size_t>(std::max(num_layers, 0)));
    for (int l = 0; l < num_layers; ++l) out[static_cast<std::size_t>(l)] = on_integer(l, n) ? 1 : 0;
    return out;
  }
  while (s.size() >= 2 && s.front() == '(' && s.back() == ')') s = s.substr(1, s.size() - 2);
  std::vector<int> out;
  std::size_t p = 0;
  while (p < s.size()) {
    if (s[p] != '[') throw fail("expected '[' at position " + std::to_string(p + 1));
    const auto close = s.find(']', p);
    if (close == std::string::npos) throw fail("missing ']'");
    std::vector<int> items;
    std::stringstream ss(s.substr(p + 1, close - p - 1));
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item != "0" && item != "1") throw fail("list items must be 0 or 1, not '" + item + "'");
      items.push_back(item == "1" ? 1 : 0);
    }
    p = close + 1;
    long long times = 1;
    if (p < s.size() && s[p] == '*') {
      std::size_t q = ++p;
      while (q < s.size() && std::isdigit(static_cast<unsigned char>(s[q]))) ++q;
      if (q == p) throw fail("expected a count after '*'");
      times = std::stoll(s.substr(p, q - p));
      if (times > 1000000) throw fail("count too large");
      p = q;
    }
    for (long long t = 0; t < times; ++t) out.insert(out.end(), items.begin(), items.end());
    if (p < s.size()) {
      if (s[p] != '+') throw fail("expected '+' at position " + std::to_string(p + 1));
      ++p;
    }
  }
  if (static_cast<int>(out.size()) != num_layers) {
    throw fail("has " + std::to_string(out.size()) + " entries but --num-layers is " + std::to_string(num_layers));
  }
  return out;
}

}  // namespace

std::vector<int> expand_moe_layer_freq(const std::string& text, int num_layers) {
  return expand_layer_pattern("--moe-layer-freq", text, num_layers, [](int l, int n) { return l % n == 0; });
}

std::vector<int> expand_window_attn_skip_freq(const std::string& text, int num_layers) {
  return expand_layer_pattern("--window-attn-skip-freq", text, num_layers,
                              [](int l, int n) { return (l + 1) % n != 0; });
}

namespace {

// Expands Megatron's layout grammar: a sequence of items, each a letter or "|" or a parenthesised
// group, optionally followed by "*N".
std::string expand_layout(const std::string& s, std::size_t& p, int depth) {
  if (depth > 16) throw InputError("--pipeline-model-parallel-layout: nested too deeply");
  std::string out;
  while (p < s.size() && s[p] != ')') {
    std::string item;
    if (s[p] == '(') {
      ++p;
      item = expand_layout(s, p, depth + 1);
      if (p >= s.size() || s[p] != ')') throw InputError("--pipeline-model-parallel-layout '" + s + "': missing ')'");
      ++p;
    } else if (std::string("EtmL|").find(s[p]) != std::string::npos) {
      item = s.substr(p++, 1);
    } else {
      throw InputError("--pipeline-model-parallel-layout '" + s + "': unexpected '" + s.substr(p, 1) +
                       "' (allowed: E, t, m, L, |, (...), *N)");
    }
    if (p < s.size() && s[p] == '*') {
      std::size_t q = ++p;
      while (q < s.size() && std::isdigit(static_cast<unsigned char>(s[q]))) ++q;
      if (q == p) throw InputError("--pipeline-model-parallel-layout '" + s + "': expected a count after '*'");
      const long long n = std::stoll(s.substr(p, q - p));
      if (n > 100000) throw InputError("--pipeline-model-parallel-layout: repeat count too large");
      std::string rep;
      for (long long k = 0; k < n; ++k) rep += item;
      item = rep;
      p = q;
    }
    out += item;
  }
  return out;
}

}  // namespace

PipelineLayout parse_pipeline_layout(const std::string& text) {
  std::string s;
  for (char c : strip_quotes(text)) {
    if (!std::isspace(static_cast<unsigned char>(c)) && c != ',') s += c;
  }
  std::size_t p = 0;
  const std::string flat = expand_layout(s, p, 0);
  if (p != s.size()) throw InputError("--pipeline-model-parallel-layout '" + s + "': unbalanced ')'");
  PipelineLayout out;
  out.layers_per_stage.push_back(0);
  for (char c : flat) {
    if (c == '|') out.layers_per_stage.push_back(0);
    if (c == 't') ++out.layers_per_stage.back();
    if (c == 'm') ++out.mtp_layers;
  }
  return out;
}

namespace {

// ---- what is known but not mapped ----

const std::vector<std::pair<std::vector<std::string>, std::string>>& ignored_flags() {
  static const std::vector<std::pair<std::vector<std::string>, std::string>> k = {
      {{"--lr",
        "--min-lr",
        "--lr-decay-style",
        "--lr-decay-iters",
        "--lr-decay-samples",
        "--lr-warmup-iters",
        "--lr-warmup-samples",
        "--lr-warmup-fraction",
        "--lr-warmup-init",
        "--weight-decay",
        "--clip-grad",
        "--adam-beta1",
        "--adam-beta2",
        "--adam-eps",
        "--init-method-std",
        "--seed",
        "--loss-scale",
        "--initial-loss-scale",
        "--min-loss-scale",
        "--start-weight-decay",
        "--end-weight-decay",
        "--weight-decay-incr-style",
        "--optimizer",
        "--decoupled-min-lr",
        "--decoupled-lr"},
       "optimizer hyper-parameters and learning-rate schedule: no effect on step time"},
      {{"--train-iters", "--train-samples", "--exit-duration-in-mins", "--exit-interval", "--eval-iters",
        "--eval-interval", "--skip-train"},
       "run length and evaluation: threewalls times single steps ([run] steps)"},
      {{"--log-interval",
        "--log-throughput",
        "--log-timers-to-tensorboard",
        "--log-memory-to-tensorboard",
        "--log-num-zeros-in-grad",
        "--log-params-norm",
        "--log-validation-ppl-to-tensorboard",
        "--logging-level",
        "--tensorboard-dir",
        "--tensorboard-log-interval",
        "--wandb-project",
        "--wandb-exp-name",
        "--wandb-save-dir",
        "--timing-log-level",
        "--timing-log-option",
        "--log-progress",
        "--profile",
        "--profile-step-start",
        "--profile-step-end",
        "--profile-ranks",
        "--use-pytorch-profiler",
        "--record-memory-history"},
       "logging and profiling of the training script"},
      {{"--save", "--load", "--save-interval", "--no-save-optim", "--no-save-rng", "--no-load-optim", "--no-load-rng",
        "--finetune", "--auto-detect-ckpt-format", "--dist-ckpt-strictness", "--ckpt-format", "--pretrained-checkpoint",
        "--use-checkpoint-args", "--async-save", "--ckpt-fully-parallel-save", "--ckpt-fully-parallel-load"},
       "checkpointing: not part of a step"},
      {{"--data-path", "--data-cache-path", "--split", "--mock-data", "--num-workers", "--no-mmap-bin-files",
        "--no-create-attention-mask-in-dataloader", "--train-data-path", "--valid-data-path", "--test-data-path",
        "--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file", "--dataloader-type",
        "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"},
       "data and tokenizer files: the tokenizer's size is what matters (--vocab-size)"},
      {{"--attention-dropout",
        "--hidden-dropout",
        "--norm-epsilon",
        "--rotary-base",
        "--rotary-percent",
        "--rotary-scaling-factor",
        "--rotary-seq-len-interpolation-factor",
        "--mscale",
        "--mscale-all-dim",
        "--max-position-embeddings",
        "--no-position-embedding",
        "--disable-bias-linear",
        "--apply-layernorm-1p",
        "--no-rope-fusion",
        "--rope-type",
        "--yarn-original-max-position-embeddings",
        "--yarn-beta-fast",
        "--yarn-beta-slow",
        "--no-yarn-correction-range-round-to-int",
        "--glu-linear-offset",
        "--activation-func-clamp-value",
        "--calculate-per-token-loss"},
       "numerics of layers threewalls models by shape only (biases, dropout, rotary settings)"},
      {{"--moe-router-load-balancing-type", "--moe-aux-loss-coeff", "--moe-z-loss-coeff", "--moe-router-score-function",
        "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "--moe-router-topk-scaling-factor",
        "--moe-router-group-topk", "--moe-router-num-groups", "--moe-router-dtype", "--moe-router-pre-softmax",
        "--moe-router-force-load-balancing", "--moe-token-drop-policy", "--moe-router-padding-for-fp8",
        "--moe-router-padding-for-quantization", "--moe-hybridep-num-sms", "--moe-input-jitter-eps"},
       "router numerics: threewalls routes with its seeded model ([train] routing_imbalance)"},
      {{"--moe-permute-fusion", "--moe-router-fusion", "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl",
        "--use-flash-attn", "--transformer-impl", "--use-mcore-models", "--no-masked-softmax-fusion",
        "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-gradient-accumulation-fusion",
        "--attention-backend", "--enable-experimental", "--bias-swiglu-fusion", "--use-legacy-models",
        "--cuda-graph-warmup-steps", "--no-bias-gelu-fusion", "--export-force-local-attention",
        "--no-persist-layer-norm"},
       "kernel implementation choices: the calibration profile holds what the kernels cost"},
      {{"--distributed-timeout-minutes", "--distributed-backend", "--no-check-for-nan-in-loss-and-grad",
        "--check-for-nan-in-loss-and-grad", "--use-cpu-initialization", "--nproc-per-node", "--nnodes", "--node-rank",
        "--master-addr", "--master-port", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--mtp-loss-scaling-factor",
        "--empty-unused-memory-level", "--enable-gpt-oss"},
       "launcher and process settings (the cluster comes from --cluster/--gpus)"},
      {{"--tiktoken-pattern", "--null-tokenizer-vocab-size"},
       "data and tokenizer files: the tokenizer's size is what matters (--vocab-size)"},
      {{"--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin"},
       "fp8 scaling numerics: the calibration profile holds what fp8 GEMMs cost"},
      {{"--temperature", "--top-k", "--top-p", "--return-log-probs", "--num-tokens-to-generate"},
       "sampling settings of text generation: no effect on the modelled step"},
      {{"--fsdp-double-buffer", "--megatron-fsdp-grad-comm-dtype", "--megatron-fsdp-main-grads-dtype", "--use-nccl-ub",
        "--init-model-with-meta-device", "--suggested-communication-unit-size"},
       "Megatron-FSDP buffer and communication settings (the sharding itself is "
       "train.data_parallel_sharding_strategy; two layers are gathered at once)"},
      {{"--attention-softmax-in-fp32", "--disable-bf16-reduced-precision-matmul", "--deterministic-mode"},
       "numerics and kernel choices: the calibration profile holds what the kernels cost"},
      {{"--moe-per-layer-logging"}, "logging and profiling of the training script"},
      {{"--inference-ckpt-non-strict", "--no-use-tokenizer-model-from-checkpoint-args"},
       "checkpointing: not part of a step"},
      {{"--prompts", "--output-path", "--incoming-requests-per-step", "--inference-repeat-n",
        "--inference-logging-step-interval", "--inference-max-seq-length",
        "--inference-dynamic-batching-buffer-size-gb", "--max-tokens-to-oom"},
       "settings of Megatron-LM's inference scripts (prompts, outputs, request batching): a threewalls inference "
       "step comes from [infer]"},
      {{"--manual-gc", "--manual-gc-interval"},
       "Python garbage collection at fixed steps: threewalls models no GC pauses, which is what manual-gc aims at"},
  };
  return k;
}

const std::vector<std::pair<std::vector<std::string>, std::string>>& unrepresented_flags() {
  static const std::vector<std::pair<std::vector<std::string>, std::string>> k = {
      {{"--reuse-grad-buf-for-mxfp8-param-ag"},
       "MXFP8 parameter all-gather through the gradient buffer: not modelled (train.fp8_param_gather keeps its own "
       "buffer)"},
      {{"--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--optimizer-offload-fraction"},
       "optimizer offload to the CPU: not modelled"},
      {{"--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity"},
       "token dropping with a capacity factor: threewalls models dropless routing"},
      {{"--context-parallel-size-for-experts", "--cp-comm-type", "--hierarchical-context-parallel-sizes"},
       "context-parallel details: only the cp size is modelled"},
      {{"--expert-data-parallel-size"}, "edp is derived: world / (etp x ep x pp)"},
      {{"--softmax-type"}, "learnable softmax offsets (attention sinks): not modelled"},
  };
  return k;
}

std::optional<std::string> lookup(const std::vector<std::pair<std::vector<std::string>, std::string>>& table,
                                  const std::string& flag) {
  for (const auto& [flags, reason] : table) {
    if (std::find(flags.begin(), flags.end(), flag) != flags.end()) return reason;
  }
  return std::nullopt;
}

class MegatronImporter {
 public:
  MegatronImporter(const std::vector<MegatronArg>& args, const MegatronImportOptions& o) : opt_(o) {
    for (const auto& a : args) {
      bool unresolved = false;
      for (const auto& v : a.values) unresolved = unresolved || v.find('$') != std::string::npos;
      if (unresolved && !lookup(ignored_flags(), a.flag)) {  // an ignored flag's value does not matter
        std::string joined;
        for (const auto& v : a.values) joined += (joined.empty() ? "" : " ") + v;
        d_.report.not_understood.push_back(
            {a.flag, where(a) + "value '" + joined + "' refers to a variable that is not set; give --var NAME=VALUE"});
        args_.erase(a.flag);
        continue;
      }
      args_[a.flag] = a;
    }
  }

  ScenarioDraft run() {
    d_.name = opt_.name.empty() ? "imported_megatron" : opt_.name;
    d_.description = "Imported from Megatron-LM arguments" + (opt_.source.empty() ? "" : " (" + opt_.source + ")");
    d_.header.push_back("Generated by `threewalls import megatron` from " +
                        (opt_.source.empty() ? std::string("command-line arguments") : opt_.source) +
                        "; see docs/import.md.");
    map_model();
    map_parallel();
    check_vocab_padding();
    map_pipeline_split();
    map_train();
    map_environment();
    classify_rest();
    return std::move(d_);
  }

 private:
  static std::string where(const MegatronArg& a) {
    return a.line > 0 ? "line " + std::to_string(a.line) + ": " : "";
  }
  bool has(const std::string& f) {
    used_.insert(f);
    return args_.count(f) > 0;
  }
  const MegatronArg* arg(const std::string& f) {
    used_.insert(f);
    auto it = args_.find(f);
    return it == args_.end() ? nullptr : &it->second;
  }
  std::optional<std::string> str(const std::string& f) {
    const auto* a = arg(f);
    if (!a) return std::nullopt;
    if (a->values.size() != 1) {
      throw InputError(src() + where(*a) + f + " takes one value, got " + std::to_string(a->values.size()));
    }
    return a->values[0];
  }
  std::optional<int> integer(const std::string& f) {
    auto s = str(f);
    if (!s) return std::nullopt;
    try {
      std::size_t used = 0;
      const long long v = std::stoll(*s, &used);
      if (used == s->size() && v >= 0 && v <= 1000000000) return static_cast<int>(v);
    } catch (const std::exception&) {
    }
    throw InputError(src() + where(*arg(f)) + f + " '" + *s + "' is not a non-negative integer");
  }
  std::vector<std::string> list(const std::string& f) {
    const auto* a = arg(f);
    return a ? a->values : std::vector<std::string>{};
  }
  std::string src() const { return opt_.source.empty() ? "" : opt_.source + ": "; }
  void note(const std::string& n) { d_.report.notes.push_back(n); }
  void unrepresented(const std::string& f, const std::string& why) { d_.report.not_represented.push_back({f, why}); }
  void set_int(const std::string& t, const std::string& k, int v) { d_.set(t, k, v); }
  void set_bool(const std::string& t, const std::string& k, bool v) { d_.set(t, k, v); }
  void copy_int(const std::string& flag, const std::string& table, const std::string& key) {
    if (auto v = integer(flag)) set_int(table, key, *v);
  }

  // The launch's exported CUDA_DEVICE_MAX_CONNECTIONS (Megatron-LM's examples export 1): the process's
  // hardware work queues.
  void map_environment() {
    const auto v = str(kMaxConnectionsArg);
    if (!v) return;
    const auto bad = [&] {
      return InputError(src() + where(*arg(kMaxConnectionsArg)) + kMaxConnections + "='" + *v +
                        "': CUDA takes an integer from 1 to 32 (run.cuda_device_max_connections)");
    };
    int n = 0;
    try {
      n = *integer(kMaxConnectionsArg);
    } catch (const InputError&) {
      throw bad();
    }
    if (n < 1 || n > 32) throw bad();
    set_int("run", "cuda_device_max_connections", n);
  }

  // Megatron-FSDP (--use-megatron-fsdp, sharding by --data-parallel-sharding-strategy, Megatron's default
  // optim_grads_params; it turns the distributed optimizer on) and PyTorch FSDP2 (--use-torch-fsdp2:
  // parameters, gradients and optimizer state sharded, gathered per layer, as optim_grads_params).
  void map_fsdp() {
    const auto strategy = str("--data-parallel-sharding-strategy");
    const bool fsdp2 = has("--use-torch-fsdp2");
    const bool no_reshard = has("--torch-fsdp2-no-reshard-after-forward");
    if (has("--use-megatron-fsdp")) {
      const std::string st = strategy.value_or("optim_grads_params");
      static const std::set<std::string> kAllowed = {"no_shard", "optim", "optim_grads", "optim_grads_params"};
      if (kAllowed.count(st) == 0) {
        throw InputError(src() + where(*arg("--data-parallel-sharding-strategy")) +
                         "--data-parallel-sharding-strategy '" + st +
                         "' (allowed: no_shard, optim, optim_grads, optim_grads_params)");
      }
      if (!strategy)
        note("--use-megatron-fsdp without --data-parallel-sharding-strategy: Megatron's default optim_grads_params");
      d_.set("train", "data_parallel_sharding_strategy", st);
      if (!has("--use-distributed-optimizer")) {
        set_bool("train", "use_distributed_optimizer", true);
        note("--use-megatron-fsdp: Megatron-FSDP turns on the distributed optimizer");
      }
      if (fsdp2) d_.report.ignored.push_back({"--use-torch-fsdp2", "--use-megatron-fsdp is mapped"});
      if (no_reshard)
        d_.report.ignored.push_back({"--torch-fsdp2-no-reshard-after-forward", "only used with --use-torch-fsdp2"});
      return;
    }
    if (fsdp2) {
      auto refuse = [&](const std::string& why) {
        throw InputError(src() + "--use-torch-fsdp2 with " + why + ": Megatron refuses it");
      };
      if (pp_ > 1) refuse("--pipeline-model-parallel-size " + std::to_string(pp_));
      if (integer("--expert-model-parallel-size").value_or(1) > 1) refuse("--expert-model-parallel-size > 1");
      if (has("--use-distributed-optimizer")) refuse("--use-distributed-optimizer");
      d_.set("train", "data_parallel_sharding_strategy", "optim_grads_params");
      set_bool("train", "use_distributed_optimizer", true);
      note(
          "--use-torch-fsdp2: modelled as data_parallel_sharding_strategy = \"optim_grads_params\" (FSDP2 shards the "
          "optimizer state itself; the key reads use_distributed_optimizer = true)");
      if (no_reshard) {
        unrepresented("--torch-fsdp2-no-reshard-after-forward",
                      "parameters kept gathered from the forward to the backward: modelled as gathered again before "
                      "the backward");
      }
    } else if (no_reshard) {
      d_.report.ignored.push_back({"--torch-fsdp2-no-reshard-after-forward", "only used with --use-torch-fsdp2"});
    }
    if (strategy)
      d_.report.ignored.push_back({"--data-parallel-sharding-strategy", "only used with --use-megatron-fsdp"});
  }

  // Precision of the parameter state: gradients reduced in bf16 (--grad-reduce-in-bf16; fp32 is Megatron's
  // default with bf16), fp8 weights (--fp8-param-gather), Adam's moments (--exp-avg-dtype and
  // --exp-avg-sq-dtype, which take effect with --use-precision-aware-optimizer).
  void map_parameter_precision() {
    if (has("--grad-reduce-in-bf16")) {
      set_bool("train", "grad_reduce_in_fp32", false);
      if (has("--accumulate-allreduce-grads-in-fp32"))
        d_.report.ignored.push_back({"--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16 turns it off"});
    } else if (has("--accumulate-allreduce-grads-in-fp32")) {
      d_.report.ignored.push_back(
          {"--accumulate-allreduce-grads-in-fp32", "Megatron's default with bf16 (grad_reduce_in_fp32 = true)"});
    }
    if (has("--fp8-param-gather")) set_bool("train", "fp8_param_gather", true);
    // --first-last-layers-bf16 keeps the first and last layers of an fp8 model in bf16 (the counts
    // default to 1 each, as Megatron-Core's); the counts alone change nothing.
    if (has("--first-last-layers-bf16") && !has("--fp8-format")) {
      d_.report.ignored.push_back({"--first-last-layers-bf16", "without --fp8-format fp8 is off: every layer is bf16"});
    } else if (has("--first-last-layers-bf16")) {
      set_bool("train", "first_last_layers_bf16", true);
      copy_int("--num-layers-at-start-in-bf16", "train", "num_layers_at_start_in_bf16");
      copy_int("--num-layers-at-end-in-bf16", "train", "num_layers_at_end_in_bf16");
    } else {
      for (const char* f : {"--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16"}) {
        if (has(f))
          d_.report.ignored.push_back({f, "without --first-last-layers-bf16 every layer follows --fp8-format"});
      }
    }
    const bool aware = has("--use-precision-aware-optimizer");
    // The optimizer's main gradients and parameters: fp32 is what threewalls models.
    for (const char* flag : {"--main-grads-dtype", "--main-params-dtype"}) {
      const auto v = str(flag);
      if (!v) continue;
      if (*v == "fp32") {
        d_.report.ignored.push_back({flag, "fp32, as modelled"});
      } else {
        unrepresented(flag,
                      "the optimizer's main gradients and parameters are modelled in fp32 (the gradient buffer "
                      "follows train.grad_reduce_in_fp32)");
      }
    }
    static const std::set<std::string> kMoment = {"fp32", "bf16", "fp16", "fp8"};
    for (const auto& [flag, key] : {std::pair<std::string, std::string>{"--exp-avg-dtype", "exp_avg_dtype"},
                                    {"--exp-avg-sq-dtype", "exp_avg_sq_dtype"}}) {
      const auto v = str(flag);
      if (!v) continue;
      if (kMoment.count(*v) == 0) {
        throw InputError(src() + where(*arg(flag)) + flag + " '" + *v + "' (allowed: fp32, fp16, bf16, fp8)");
      }
      if (aware) {
        d_.set("train", key, *v);
      } else {
        d_.report.ignored.push_back({flag, "takes effect only with --use-precision-aware-optimizer"});
      }
    }
  }

  void map_model() {
    const auto layers = integer("--num-layers");
    const auto hidden = integer("--hidden-size");
    const auto heads = integer("--num-attention-heads");
    if (!opt_.name.empty()) d_.set("model", "name", opt_.name);
    if (layers) set_int("model", "num_layers", *layers);
    if (hidden) set_int("model", "hidden_size", *hidden);
    if (heads) set_int("model", "num_attention_heads", *heads);
    if (!layers || !hidden || !heads) {
      note("the model is incomplete: --num-layers, --hidden-size and --num-attention-heads are all needed");
    }
    const bool mla = has("--multi-latent-attention");
    const bool gqa = has("--group-query-attention");
    if (mla) {
      d_.set("model", "attention", "mla");
      // Megatron's MLATransformerConfig defaults when a rank or dimension is not given.
      const auto q_lora = integer("--q-lora-rank");
      set_int("model", "q_lora_rank", q_lora.value_or(0));
      if (!q_lora) note("--q-lora-rank not given: queries are not compressed (Megatron's default None)");
      const std::pair<const char*, int> dims[] = {{"--kv-lora-rank", 32}, {"--qk-head-dim", 128},
                                                  {"--qk-pos-emb-head-dim", 64}, {"--v-head-dim", 128}};
      for (const auto& [flag, def] : dims) {
        std::string key = std::string(flag + 2);
        std::replace(key.begin(), key.end(), '-', '_');
        const auto v = integer(flag);
        if (!v) note(std::string(flag) + " not given: Megatron's default " + std::to_string(def));
        set_int("model", key, v.value_or(def));
      }
      if (has("--kv-channels")) {
        d_.report.ignored.push_back({"--kv-channels", "unused with --multi-latent-attention (qk/v head dims apply)"});
      }
      if (has("--num-query-groups")) {
        d_.report.ignored.push_back({"--num-query-groups", "unused with --multi-latent-attention"});
      }
    } else {
      for (const char* f : {"--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim"}) {
        if (has(f)) d_.report.ignored.push_back({f, "MLA dimension without --multi-latent-attention"});
      }
      if (gqa) {
        d_.set("model", "attention", "gqa");
        const auto groups = integer("--num-query-groups");
        if (groups) {
          set_int("model", "num_query_groups", *groups);
        } else {
          note("--group-query-attention without --num-query-groups: Megatron's default 1 group");
          set_int("model", "num_query_groups", 1);
        }
      } else if (has("--num-query-groups")) {
        d_.report.ignored.push_back({"--num-query-groups", "Megatron uses it only with --group-query-attention"});
      }
      copy_int("--kv-channels", "model", "kv_channels");
    }
    // Vocabulary: explicit sizes, else the size given to the importer.
    std::optional<int> vocab = integer("--padded-vocab-size");
    if (!vocab) vocab = integer("--vocab-size");
    if (opt_.vocab_size) {
      if (vocab && *vocab != *opt_.vocab_size) {
        note("--vocab-size " + std::to_string(*opt_.vocab_size) + " given to the importer overrides " +
             std::to_string(*vocab) + " from the arguments");
      }
      vocab = opt_.vocab_size;
    }
    if (vocab) {
      set_int("model", "vocab_size", *vocab);
    } else {
      std::string tok = has("--tokenizer-model") ? " (" + str("--tokenizer-model").value_or("") + ")" : "";
      note("vocab_size: the arguments name no size" + tok + "; give the tokenizer's size with --vocab-size N");
    }
    // Megatron's defaults differ from the registry's: write them explicitly.
    // --quick-geglu (GPT-OSS) is gated like --swiglu: the same three weight matrices per MLP, with a
    // QuickGELU gate instead of SiLU, which the model times alike.
    const bool quick_geglu = has("--quick-geglu");
    const bool swiglu = has("--swiglu") || quick_geglu;
    set_bool("model", "swiglu", swiglu);
    if (quick_geglu)
      note("--quick-geglu: a gated MLP (swiglu = true: the same shapes, a QuickGELU gate instead of SiLU)");
    if (!swiglu) note("no --swiglu: Megatron's default GeLU MLP (swiglu = false)");
    const bool untie = has("--untie-embeddings-and-output-weights");
    set_bool("model", "untie_embeddings_and_output_weights", untie);
    if (!untie) note("no --untie-embeddings-and-output-weights: Megatron ties them by default");
    if (auto n = str("--normalization")) {
      if (*n == "RMSNorm") {
        d_.set("model", "normalization", "rmsnorm");
      } else if (*n == "LayerNorm") {
        d_.set("model", "normalization", "layernorm");
      } else {
        throw InputError(src() + "--normalization '" + *n + "' (allowed: LayerNorm, RMSNorm)");
      }
    } else {
      d_.set("model", "normalization", "layernorm");
      note("no --normalization: Megatron's default LayerNorm");
    }
    // Position embedding: the rotary ones are timed (one fused op over the queries and keys: rope, and
    // yarn and mrope, rotary with other frequencies or sections); Megatron's default learned absolute
    // embedding (an add at the input), relative (T5's bias) and none are not.
    const auto pos = str("--position-embedding-type");
    const bool rope =
        (pos && (*pos == "rope" || *pos == "yarn" || *pos == "mrope")) || has("--use-rotary-position-embeddings");
    if (pos && !rope && *pos != "learned_absolute" && *pos != "relative" && *pos != "none") {
      throw InputError(src() + "--position-embedding-type '" + *pos +
                       "' (allowed: rope, yarn, mrope, learned_absolute, relative, none)");
    }
    d_.set("model", "position_embedding_type", rope ? "rope" : "none");
    if (!rope)
      note("position embedding " + pos.value_or("learned_absolute") +
           ": not timed (position_embedding_type = \"none\")");
    // --qk-layernorm: the query and key head norms of MHA / GQA; with --multi-latent-attention it is the
    // latents' norms, which an MLA scenario always has.
    if (has("--qk-layernorm")) {
      if (has("--multi-latent-attention")) {
        note("--qk-layernorm with --multi-latent-attention: MLA's latent norms (always timed)");
      } else {
        set_bool("model", "qk_layernorm", true);
      }
    }
    map_window(layers);
    // Multi-token prediction depths: on the last virtual stage, where a --pipeline-model-parallel-layout
    // places its 'm'.
    if (const auto mtp = integer("--mtp-num-layers"); mtp && *mtp > 0) set_int("model", "mtp_num_layers", *mtp);
    // Experts.
    const int experts = integer("--num-experts").value_or(0);
    std::optional<int> ffn = integer("--ffn-hidden-size");
    if (!ffn && hidden) {
      // Megatron: 4h, or for SwiGLU 2/3 of it rounded down to a multiple of 64.
      ffn = swiglu ? (*hidden * 8 / 3) / 64 * 64 : 4 * *hidden;
      note("no --ffn-hidden-size: Megatron's default " + std::to_string(*ffn));
    }
    std::vector<int> pattern;
    if (experts > 0) {
      set_int("model", "num_experts", experts);
      const auto topk = integer("--moe-router-topk");
      set_int("model", "moe_router_topk", topk.value_or(2));
      if (!topk) note("no --moe-router-topk: Megatron's default 2");
      auto moe_ffn = integer("--moe-ffn-hidden-size");
      if (!moe_ffn && ffn) {
        moe_ffn = ffn;
        note("no --moe-ffn-hidden-size: experts use --ffn-hidden-size " + std::to_string(*ffn) + " as Megatron does");
      }
      if (moe_ffn) set_int("model", "moe_ffn_hidden_size", *moe_ffn);
      copy_int("--moe-shared-expert-intermediate-size", "model", "moe_shared_expert_intermediate_size");
      copy_int("--moe-router-num-groups", "model", "moe_router_num_groups");
      copy_int("--moe-router-group-topk", "model", "moe_router_group_topk");
      if (auto freq = str("--moe-layer-freq"); freq && layers) {
        pattern = expand_moe_layer_freq(*freq, *layers);
        map_layer_pattern(pattern);
      }
    } else {
      for (const char* f : {"--moe-router-topk", "--moe-router-num-groups", "--moe-router-group-topk",
                            "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--moe-layer-freq",
                            "--moe-token-dispatcher-type", "--moe-grouped-gemm"}) {
        if (has(f)) d_.report.ignored.push_back({f, "no --num-experts: a dense model"});
      }
    }
    const bool any_dense = experts == 0 || std::find(pattern.begin(), pattern.end(), 0) != pattern.end();
    if (ffn && any_dense) {
      set_int("model", "ffn_hidden_size", *ffn);
    } else if (ffn && has("--ffn-hidden-size")) {
      note("--ffn-hidden-size " + std::to_string(*ffn) + ": every layer is MoE, so no dense MLP uses it");
    }
  }

  // Sliding-window attention: --window-size (left, right) of a causal mask is a window of left + 1 keys
  // per query (right has nothing to add: the keys after the diagonal are masked); left < 0 is
  // unbounded (Transformer Engine's convention). --window-attn-skip-freq says which layers keep full
  // attention.
  void map_window(std::optional<int> layers) {
    const auto* a = arg("--window-size");
    if (a == nullptr) {
      if (has("--window-attn-skip-freq")) d_.report.ignored.push_back({"--window-attn-skip-freq", "no --window-size"});
      return;
    }
    std::string text;
    for (const auto& v : a->values) text += (text.empty() ? "" : ",") + v;
    std::vector<long long> parts;
    {
      std::string t;
      for (char c : text) {
        if (c != '(' && c != ')' && !std::isspace(static_cast<unsigned char>(c))) t += c;
      }
      std::stringstream ss(t);
      std::string item;
      while (std::getline(ss, item, ',')) {
        try {
          std::size_t used = 0;
          parts.push_back(std::stoll(item, &used));
          if (used != item.size()) parts.clear();
        } catch (const std::exception&) {
          parts.clear();
        }
        if (parts.empty()) break;
      }
    }
    if (parts.size() != 2) {
      throw InputError(src() + where(*a) + "--window-size '" + text +
                       "': expected two integers LEFT,RIGHT (the keys before and after each query)");
    }
    if (parts[0] < 0) {
      note("--window-size " + text + ": an unbounded window (full causal attention)");
      return;
    }
    if (parts[0] + 1 > (1LL << 24)) throw InputError(src() + where(*a) + "--window-size '" + text + "': too large");
    if (parts[1] != 0) note("--window-size " + text + ": the right part has no effect on a causal mask");
    if (auto freq = str("--window-attn-skip-freq"); freq && layers) {
      const WindowLayers w = window_layers_of(expand_window_attn_skip_freq(*freq, *layers));
      if (!w.any) {
        note("--window-attn-skip-freq " + *freq + ": no layer is windowed (full attention everywhere)");
        return;
      }
      if (!w.skip_freq) {
        unrepresented("--window-attn-skip-freq",
                      "a pattern of sliding-window layers other than 'every n-th layer full' (the scenario's "
                      "model.window_attn_skip_freq): modelled as full causal attention in every layer");
        return;
      }
      if (*w.skip_freq > 0) set_int("model", "window_attn_skip_freq", *w.skip_freq);
    }
    set_int("model", "window_size", static_cast<int>(parts[0] + 1));
  }

  // A 0/1 pattern per layer -> first_dense_layers + moe_layer_freq, or refused.
  void map_layer_pattern(const std::vector<int>& pattern) {
    const int n = static_cast<int>(pattern.size());
    int first = 0;
    while (first < n && pattern[static_cast<std::size_t>(first)] == 0) ++first;
    if (first == n) throw InputError(src() + "--moe-layer-freq leaves no MoE layer");
    int freq = 0;
    for (int l = first + 1; l < n && freq == 0; ++l) {
      if (pattern[static_cast<std::size_t>(l)] == 1) freq = l - first;
    }
    if (freq == 0) freq = n - first;  // a single MoE layer
    for (int l = first; l < n; ++l) {
      const int want = (l - first) % freq == 0 ? 1 : 0;
      if (pattern[static_cast<std::size_t>(l)] != want) {
        throw InputError(src() + "--moe-layer-freq: the pattern of MoE layers is not 'first k dense, then every n-th "
                         "layer MoE' (layer " + std::to_string(l) + " breaks it); the scenario language "
                         "(model.first_dense_layers, model.moe_layer_freq) cannot express it");
      }
    }
    if (first > 0) set_int("model", "first_dense_layers", first);
    if (freq != 1) set_int("model", "moe_layer_freq", freq);
  }

  void map_parallel() {
    tp_ = integer("--tensor-model-parallel-size").value_or(1);
    pp_ = integer("--pipeline-model-parallel-size").value_or(1);
    set_int("parallel", "tp", tp_);
    set_int("parallel", "pp", pp_);
    copy_int("--context-parallel-size", "parallel", "cp");
    copy_int("--expert-model-parallel-size", "parallel", "ep");
    if (auto etp = integer("--expert-tensor-parallel-size")) {
      set_int("parallel", "etp", *etp);
    } else {
      set_int("parallel", "etp", tp_);
      if (tp_ > 1) note("no --expert-tensor-parallel-size: Megatron's default is the tensor-parallel size " + std::to_string(tp_));
    }
    if (has("--sequence-parallel")) {
      if (tp_ > 1) {
        set_bool("parallel", "sequence_parallel", true);
      } else {
        note("--sequence-parallel with tp = 1: Megatron turns it off");
      }
    }
    if (auto dp = integer("--data-parallel-size")) set_int("parallel", "dp", *dp);
  }

  // Megatron pads the vocabulary to a multiple of make-vocab-size-divisible-by x tp; threewalls to
  // 128 x tp. Reported only when the padded sizes differ.
  void check_vocab_padding() {
    const auto div = integer("--make-vocab-size-divisible-by");
    const auto vocab = d_.get("model", "vocab_size");
    if (!div || *div == 128) return;
    if (*div < 1) throw InputError(src() + "--make-vocab-size-divisible-by must be >= 1");
    auto padded = [&](long long v, long long m) { return (v + m - 1) / m * m; };
    if (vocab) {
      const long long v = std::get<std::int64_t>(*vocab);
      const long long megatron = padded(v, 1LL * *div * tp_);
      const long long ours = padded(v, 128LL * tp_);
      if (megatron == ours) {
        note("--make-vocab-size-divisible-by " + std::to_string(*div) + ": the padded vocabulary is " +
             std::to_string(ours) + " either way");
        return;
      }
      unrepresented("--make-vocab-size-divisible-by", std::to_string(*div) + ": Megatron pads the vocabulary to " +
                                                         std::to_string(megatron) + ", threewalls (128 x tp) to " +
                                                         std::to_string(ours) + "; FLOPs and the output layer use " +
                                                         std::to_string(ours));
      return;
    }
    unrepresented("--make-vocab-size-divisible-by", std::to_string(*div) + ": threewalls pads to a multiple of 128 x tp");
  }

  void map_pipeline_split() {
    const auto layers = d_.get("model", "num_layers");
    const int num_layers = layers ? static_cast<int>(std::get<std::int64_t>(*layers)) : 0;
    const bool acc_emb = has("--account-for-embedding-in-pipeline-split");
    const bool acc_loss = has("--account-for-loss-in-pipeline-split");
    const auto per_vstage = integer("--num-layers-per-virtual-pipeline-stage");
    const auto vstages = integer("--num-virtual-stages-per-pipeline-rank");
    const auto first = integer("--decoder-first-pipeline-num-layers");
    const auto last = integer("--decoder-last-pipeline-num-layers");
    if (auto layout = str("--pipeline-model-parallel-layout")) {
      const auto pl = parse_pipeline_layout(*layout);
      const int n = static_cast<int>(pl.layers_per_stage.size());
      if (n % pp_ != 0) {
        throw InputError(src() + "--pipeline-model-parallel-layout has " + std::to_string(n) +
                         " stages, not a multiple of pp = " + std::to_string(pp_));
      }
      const int vpp = n / pp_;
      if (vpp > 1) set_int("parallel", "vpp", vpp);
      if (pl.mtp_layers > 0 && args_.count("--mtp-num-layers") == 0) {
        unrepresented("--pipeline-model-parallel-layout", std::to_string(pl.mtp_layers) + " MTP layer(s) ('m'): not modelled");
      }
      d_.set("parallel", "layers_per_stage", int_list(pl.layers_per_stage));
      note("--pipeline-model-parallel-layout " + *layout + ": transformer layers per virtual stage");
      for (const char* f : {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                            "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"}) {
        if (has(f)) d_.report.ignored.push_back({f, "superseded by --pipeline-model-parallel-layout"});
      }
      return;
    }
    // Megatron counts the embedding and the loss as one layer each when asked to.
    const int total = num_layers + (acc_emb ? 1 : 0) + (acc_loss ? 1 : 0);
    int vpp = 1;
    if (per_vstage && vstages) {
      throw InputError(src() + "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank "
                               "cannot be used together (Megatron refuses it too)");
    }
    if (per_vstage) {
      if (*per_vstage < 1 || total % (pp_ * *per_vstage) != 0) {
        throw InputError(src() + "--num-layers-per-virtual-pipeline-stage " + std::to_string(*per_vstage) +
                         " does not divide " + std::to_string(total) + " layers over pp = " + std::to_string(pp_));
      }
      vpp = total / (pp_ * *per_vstage);
    } else if (vstages) {
      vpp = *vstages;
    }
    if (vpp > 1) set_int("parallel", "vpp", vpp);
    if (first || last) {
      if (vpp > 1) {
        unrepresented("--decoder-first/last-pipeline-num-layers",
                      "with virtual pipeline stages: give the split as --pipeline-model-parallel-layout");
        return;
      }
      if (first) set_int("parallel", "first_stage_layers", *first);
      if (last) set_int("parallel", "last_stage_layers", *last);
      return;
    }
    if ((acc_emb || acc_loss) && num_layers > 0) {
      const int stages = pp_ * vpp;
      if (total % stages != 0) {
        throw InputError(src() + std::to_string(total) + " layers (with embedding/loss accounted) do not split over " +
                         std::to_string(stages) + " virtual stages");
      }
      std::vector<int> split(static_cast<std::size_t>(stages), total / stages);
      if (acc_emb) --split.front();
      if (acc_loss) --split.back();
      d_.set("parallel", "layers_per_stage", int_list(split));
      note("--account-for-embedding/loss-in-pipeline-split: the embedding and the loss count as a layer each on "
           "the first and last virtual stage");
    }
  }

  void map_train() {
    copy_int("--micro-batch-size", "train", "micro_batch_size");
    copy_int("--global-batch-size", "train", "global_batch_size");
    copy_int("--seq-length", "train", "seq_length");
    if (!has("--micro-batch-size")) note("no --micro-batch-size: give it (Megatron requires it too)");
    if (!has("--global-batch-size")) note("no --global-batch-size: give it (Megatron would use micro-batch x dp)");
    // Precision.
    if (has("--fp8-format") || has("--fp8")) {
      d_.set("train", "precision", "fp8");
      // --fp8-recipe (Megatron's default: delayed) and --fp8-format map one to one; the scenario's
      // rules check a recipe against the cluster (mxfp8 needs Blackwell) and the model's sizes.
      const std::string recipe = str("--fp8-recipe").value_or("delayed");
      static const std::set<std::string> kRecipes = {"delayed", "tensorwise", "blockwise", "mxfp8"};
      if (kRecipes.count(recipe) != 0) {
        d_.set("train", "fp8_recipe", recipe);
      } else if (recipe == "custom") {
        unrepresented("--fp8-recipe custom", "a user-supplied quantizer factory: modelled as delayed scaling");
      } else {
        throw InputError(src() + where(*arg("--fp8-recipe")) + "--fp8-recipe '" + recipe +
                         "' (allowed: delayed, tensorwise, blockwise, mxfp8, custom)");
      }
      if (auto format = str("--fp8-format")) {
        if (*format != "e4m3" && *format != "hybrid") {
          throw InputError(src() + where(*arg("--fp8-format")) + "--fp8-format '" + *format +
                           "' (allowed: e4m3, hybrid)");
        }
        d_.set("train", "fp8_format", *format);
      }
      if (!has("--bf16")) note("fp8 without --bf16: the rest of the model is modelled in bf16");
    } else if (has("--bf16")) {
      d_.set("train", "precision", "bf16");
      if (has("--fp8-recipe")) d_.report.ignored.push_back({"--fp8-recipe", "without --fp8-format fp8 is off"});
    } else if (has("--fp16")) {
      unrepresented("--fp16", "fp16 is modelled as bf16 (same GEMM rate on Hopper)");
      d_.set("train", "precision", "bf16");
    } else {
      unrepresented("precision", "neither --bf16, --fp16 nor --fp8-format: an fp32 run, modelled as bf16");
      d_.set("train", "precision", "bf16");
    }
    // Recomputation.
    if (auto g = str("--recompute-granularity")) {
      if (*g != "full" && *g != "selective") {
        throw InputError(src() + "--recompute-granularity '" + *g + "' (allowed: full, selective)");
      }
      d_.set("train", "recompute_granularity", *g);
      if (*g == "full") {
        if (auto m = str("--recompute-method")) {
          if (*m != "uniform" && *m != "block") {
            throw InputError(src() + "--recompute-method '" + *m + "' (allowed: uniform, block)");
          }
          d_.set("train", "recompute_method", *m);
        }
        copy_int("--recompute-num-layers", "train", "recompute_num_layers");
      } else {
        const auto mods = list("--recompute-modules");
        if (!mods.empty()) d_.set("train", "recompute_modules", mods);
        for (const char* f : {"--recompute-method", "--recompute-num-layers"}) {
          if (has(f)) d_.report.ignored.push_back({f, "only used with --recompute-granularity full"});
        }
      }
    } else {
      for (const char* f : {"--recompute-method", "--recompute-num-layers", "--recompute-modules"}) {
        if (has(f)) d_.report.ignored.push_back({f, "no --recompute-granularity: Megatron recomputes nothing"});
      }
    }
    if (has("--recompute-activations")) d_.set("train", "recompute_granularity", "selective");
    // Optimizer and overlaps: Megatron's defaults are all off.
    set_bool("train", "use_distributed_optimizer", has("--use-distributed-optimizer"));
    map_fsdp();
    if (has("--overlap-grad-reduce")) set_bool("train", "overlap_grad_reduce", true);
    if (has("--overlap-param-gather")) set_bool("train", "overlap_param_gather", true);
    if (has("--tp-comm-overlap")) set_bool("train", "tp_comm_overlap", true);
    map_parameter_precision();
    // MoE execution.
    if (d_.get("model", "num_experts")) {
      std::string disp = str("--moe-token-dispatcher-type").value_or("allgather");
      if (!has("--moe-token-dispatcher-type")) note("no --moe-token-dispatcher-type: Megatron's default allgather");
      if (has("--moe-enable-deepep")) disp = "flex";
      if (disp == "alltoall_seq") {
        note("--moe-token-dispatcher-type alltoall_seq: modelled as alltoall");
        disp = "alltoall";
      }
      if (disp != "alltoall" && disp != "allgather" && disp != "flex") {
        throw InputError(src() + "--moe-token-dispatcher-type '" + disp + "' (allowed: alltoall, allgather, flex, alltoall_seq)");
      }
      d_.set("train", "token_dispatcher", disp);
      if (auto backend = str("--moe-flex-dispatcher-backend")) {
        note("--moe-flex-dispatcher-backend " + *backend +
             ": flex is modelled as a DeepEP-style dispatch (one network copy per token and destination node, "
             "forwarded over NVLink)");
      }
      if (has("--moe-grouped-gemm")) {
        // Megatron-Core's TEGroupedMLP (Transformer Engine, the default --transformer-impl) runs the local
        // experts through TE's GroupedLinear, whose grouped GEMM is one cuBLAS GEMM per expert over 4
        // streams (nvte_multi_tensor_gemm) in bf16 and fp8 alike; the legacy GroupedMLP
        // (--moe-use-legacy-grouped-gemm, or --transformer-impl local) one grouped kernel.
        const bool te = str("--transformer-impl").value_or("transformer_engine") == "transformer_engine";
        if (te && !has("--moe-use-legacy-grouped-gemm")) {
          d_.set("train", "expert_execution", "split:4");
          note(
              "--moe-grouped-gemm with Transformer Engine: expert_execution = \"split:4\" (TE's GroupedLinear: one "
              "cuBLAS GEMM per local expert over 4 streams; a TE build on its cuBLASLt grouped GEMM runs one "
              "kernel: \"grouped\")");
        } else {
          d_.set("train", "expert_execution", "grouped");
        }
      } else {
        d_.set("train", "expert_execution", "sequential");
        note("no --moe-grouped-gemm: Megatron's SequentialMLP runs the local experts one after another");
      }
    }
    if (has("--moe-shared-expert-overlap")) set_bool("train", "moe_shared_expert_overlap", true);
    if (has("--overlap-moe-expert-parallel-comm")) set_bool("train", "overlap_moe_expert_parallel_comm", true);
    if (has("--delay-wgrad-compute")) {
      if (has("--overlap-moe-expert-parallel-comm")) {
        set_bool("train", "delay_wgrad_compute", true);
      } else {
        unrepresented("--delay-wgrad-compute",
                      "without --overlap-moe-expert-parallel-comm: weight gradients are not delayed");
      }
    }
    map_cuda_graphs();
    if (auto bucket = integer("--ddp-bucket-size")) {
      d_.set("train", "grad_bucket_size", *bucket);
      used_.insert("--ddp-bucket-size");
    }
  }

  void map_cuda_graphs() {
    const auto impl = str("--cuda-graph-impl");
    const bool enabled = has("--enable-cuda-graph") || has("--external-cuda-graph") ||
                         (impl && *impl != "none");
    const auto scopes = list("--cuda-graph-scope");
    if (!enabled) {
      if (!scopes.empty()) {
        d_.report.ignored.push_back({"--cuda-graph-scope", "no --cuda-graph-impl / --enable-cuda-graph: nothing is captured"});
      }
      return;
    }
    const auto& known = Registry::instance().find_param("train.cuda_graph_scope")->choices;
    std::vector<std::string> mapped;
    for (const auto& s : scopes) {
      if (std::find(known.begin(), known.end(), s) != known.end()) {
        mapped.push_back(s);
      } else {
        unrepresented("--cuda-graph-scope " + s,
                      "no such scope in the scenario language (allowed: " + join(known) + ")");
      }
    }
    if (scopes.empty()) {
      unrepresented("--enable-cuda-graph/--cuda-graph-impl", "whole-layer graphs (Megatron's default scope) have no "
                                                             "registry equivalent; give --cuda-graph-scope");
    }
    if (!mapped.empty()) d_.set("train", "cuda_graph_scope", mapped);
  }

  void classify_rest() {
    for (const auto& [flag, a] : args_) {
      if (used_.count(flag)) continue;
      if (auto r = lookup(ignored_flags(), flag)) {
        d_.report.ignored.push_back({flag, *r});
      } else if (auto u = lookup(unrepresented_flags(), flag)) {
        unrepresented(flag, *u);
      } else if (flag == "ENV_VARS") {
        d_.report.ignored.push_back({"ENV_VARS", a.values.front() + " environment variable" +
                                                     (a.values.front() == "1" ? "" : "s") + " of the launch"});
      } else if (flag == "HARNESS") {
        d_.report.ignored.push_back({a.values.front(), "keys of Megatron-LM's functional-test harness"});
      } else if (flag.rfind("LAUNCHER:", 0) == 0) {
        if (a.values.empty()) continue;
        std::vector<std::string> names = a.values;
        std::sort(names.begin(), names.end());
        names.erase(std::unique(names.begin(), names.end()), names.end());
        d_.report.ignored.push_back(
            {flag.substr(9) + " " + join(names), "flags of the " + flag.substr(9) + " launcher (" + where(a) +
                                                     "before the program it starts), not of Megatron-LM"});
      } else {
        d_.report.not_understood.push_back({flag, where(a) + "unknown to the importer"});
      }
    }
  }

  MegatronImportOptions opt_;
  std::map<std::string, MegatronArg> args_;
  std::set<std::string> used_;
  ScenarioDraft d_;
  int tp_ = 1;
  int pp_ = 1;
};

}  // namespace

ScenarioDraft import_megatron(const std::vector<MegatronArg>& args, const MegatronImportOptions& options) {
  return MegatronImporter(args, options).run();
}

ScenarioDraft import_megatron_file(const std::filesystem::path& path, MegatronImportOptions options) {
  const std::string text = read_input_file(path, "Megatron arguments file");
  const std::string ext = path.extension().string();
  const bool yaml = ext == ".yaml" || ext == ".yml";
  if (options.source.empty()) options.source = path.string();
  std::vector<MegatronArg> args = parse_megatron_launch(text, yaml, options.vars);
  if (args.empty()) {
    throw InputError(path.string() + ": no Megatron-LM argument found (expected a launch script or argument list with "
                     "--flag [value] words, or Megatron YAML with key: value lines" +
                     std::string(ext == ".json" ? "; a Hugging Face config.json goes to `threewalls import hf`" : "") +
                     ")");
  }
  return import_megatron(args, options);
}

}  // namespace threewalls::scenarios
