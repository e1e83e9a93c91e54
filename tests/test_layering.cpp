// Dependencies point one way (docs/design.md): every #include "folder/…" in lib/ and apps/ names a
// folder below the including file's level, or one of its level that kSameLevel lists (without a cycle).
#include "helpers.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

namespace {

// The levels, lowest first: each folder's level is one more than the highest level it includes from, as the
// includes are today (a folder moved up a level when it starts to include from its own). config/ and text/ (the
// tokenizers) need only core/;
// layers/, log/ and profile/ need ops/ and config/; data/ (time spans through profile/), graph/ (layers) and optim/
// (parameters) sit on those; io/ reads and writes a graph's tensors and parallel/ synchronises an optimizer's; train/
// puts them together, and apps/ is the command line on top.
const std::map<std::string, int> kLevels = {
    {"core", 0}, {"text", 1},  {"ops", 1},   {"config", 1}, {"layers", 2},   {"log", 2},   {"profile", 2},
    {"data", 3}, {"graph", 3}, {"optim", 3}, {"io", 4},     {"parallel", 4}, {"train", 5}, {"apps", 6},
};

/// Includes between two folders of one level, each allowed edge listed (from, to): none today. An unlisted one
/// fails, so that a level's folders stay independent, and a listed pair that cycles fails too.
const std::set<std::pair<std::string, std::string>> kSameLevel = {};

/// An include that breaks the rule and stays, with why. Each entry must still exist (the test fails otherwise), so
/// the list cannot outlive what it excuses.
struct Allowed {
  std::string file;     ///< as "lib/graph/model.h"
  std::string include;  ///< as written between the quotes
  std::string reason;
};
// Empty: every violation found when the test was written was fixed (graph/ → profile/ by core/span_timer.h, io/ and
// profile/ → log/ by moving the JSON writer to core/json.h).
const std::vector<Allowed> kAllowed = {};

struct SourceFile {
  std::string path;  ///< relative to the source root: lib/<folder>/… or apps/…
  std::string text;
};

// "lib/graph/model.h" → "graph"; "apps/gputrain/main.cpp" → "apps".
std::string folder_of(const std::string& path) {
  if (path.rfind("apps/", 0) == 0) return "apps";
  const size_t a = path.find('/'), b = path.find('/', a + 1);
  return b == std::string::npos ? "" : path.substr(a + 1, b - a - 1);
}

struct Include {
  std::string file;
  int line = 0;
  std::string target;  ///< "profile/profiler.h"
  std::string where() const { return file + ":" + std::to_string(line) + " includes \"" + target + "\""; }
};

/// Everything wrong with `files` under the rules above, one message a problem, naming the file and the include.
std::vector<std::string> layering_problems(const std::vector<SourceFile>& files, const std::vector<Allowed>& allowed,
                                           const std::set<std::pair<std::string, std::string>>& same_level) {
  std::vector<std::string> problems;
  std::vector<bool> allowed_seen(allowed.size(), false);
  std::map<std::string, std::map<std::string, Include>> edges;  // folder → folder → the first include that does it
  const std::regex include_re(R"(^\s*#\s*include\s*"([^"]+)\")");
  for (const SourceFile& f : files) {
    const std::string from = folder_of(f.path);
    const auto from_level = kLevels.find(from);
    if (from_level == kLevels.end()) {
      problems.push_back(f.path + ": folder \"" + from + "\" has no level in tests/test_layering.cpp (kLevels)");
      continue;
    }
    std::istringstream in(f.text);
    int line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      std::smatch m;
      if (!std::regex_search(line, m, include_re)) continue;
      const Include inc{f.path, line_no, m[1].str()};
      const size_t slash = inc.target.find('/');
      if (slash == std::string::npos) continue;  // beside the file: its own folder
      const std::string to = inc.target.substr(0, slash);
      if (to == from) continue;
      bool excused = false;
      for (size_t i = 0; i < allowed.size(); ++i)
        if (allowed[i].file == f.path && allowed[i].include == inc.target) excused = allowed_seen[i] = true;
      if (excused) continue;
      const auto to_level = kLevels.find(to);
      if (to_level == kLevels.end()) {
        problems.push_back(inc.where() + ": folder \"" + to + "\" has no level in tests/test_layering.cpp (kLevels)");
        continue;
      }
      if (to_level->second > from_level->second) {
        problems.push_back(inc.where() + ": " + from + " (level " + std::to_string(from_level->second) +
                           ") must not include from " + to + " (level " + std::to_string(to_level->second) +
                           "); declare what it needs lower down (an interface in core/, a forward declaration)");
        continue;
      }
      if (to_level->second == from_level->second && !same_level.count({from, to})) {
        if (!edges[from].count(to))  // (once per pair of folders)
          problems.push_back(inc.where() + ": " + from + " and " + to + " are both level " +
                             std::to_string(from_level->second) +
                             ": an include between folders of one level is listed in kSameLevel, or one of them "
                             "moves up a level");
        edges[from].emplace(to, inc);
        continue;
      }
      edges[from].emplace(to, inc);
    }
  }
  for (size_t i = 0; i < allowed.size(); ++i)
    if (!allowed_seen[i])
      problems.push_back("allowed exception " + allowed[i].file + " includes \"" + allowed[i].include +
                         "\" no longer exists: remove it from kAllowed");

  // Cycles: upward includes are reported above, so what is left can only cycle within a level. Depth-first search;
  // each cycle is reported once, by the folders on it.
  std::set<std::set<std::string>> reported;
  std::vector<std::string> stack;
  std::set<std::string> done;
  std::function<void(const std::string&)> visit = [&](const std::string& folder) {
    stack.push_back(folder);
    for (const auto& [to, inc] : edges[folder]) {
      const auto on_stack = std::find(stack.begin(), stack.end(), to);
      if (on_stack != stack.end()) {
        const std::vector<std::string> cycle(on_stack, stack.end());
        if (!reported.insert(std::set<std::string>(cycle.begin(), cycle.end())).second) continue;
        std::string msg = "cycle between folders of one level:";
        for (size_t i = 0; i < cycle.size(); ++i)
          msg += (i ? "; " : " ") + edges[cycle[i]].at(i + 1 < cycle.size() ? cycle[i + 1] : cycle[0]).where();
        problems.push_back(msg);
      } else if (!done.count(to)) {
        visit(to);
      }
    }
    stack.pop_back();
    done.insert(folder);
  };
  for (const auto& [folder, level] : kLevels)
    if (!done.count(folder)) visit(folder);
  return problems;
}

std::vector<SourceFile> source_tree() {
  std::vector<SourceFile> files;
  const fs::path root(gt::test::source_path(""));
  for (const char* top : {"lib", "apps"})
    for (const auto& e : fs::recursive_directory_iterator(root / top)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".cu")) continue;
      std::ifstream in(e.path(), std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      files.push_back({fs::relative(e.path(), root).generic_string(), text.str()});
    }
  return files;
}

}  // namespace

TEST_CASE("layering: every include in lib/ and apps/ points to the file's level or below, without cycles", "[cpu]") {
  const std::vector<SourceFile> files = source_tree();
  // The walk did find the tree (a wrong root would pass with nothing to check).
  size_t includes = 0;
  for (const auto& f : files)
    for (size_t at = f.text.find("#include \""); at != std::string::npos; at = f.text.find("#include \"", at + 1))
      ++includes;
  REQUIRE(files.size() > 100);
  REQUIRE(includes > 300);
  for (const std::string& p : layering_problems(files, kAllowed, kSameLevel)) FAIL_CHECK(p);
}

TEST_CASE("layering: the check names upward includes, cycles, unknown folders and stale exceptions", "[cpu]") {
  auto problems = [](const std::vector<SourceFile>& files, const std::vector<Allowed>& allowed = {},
                     const std::set<std::pair<std::string, std::string>>& same_level = {}) {
    std::string all;
    for (const auto& p : layering_problems(files, allowed, same_level)) all += p + "\n";
    return all;
  };
  // Downward and same-folder includes are fine.
  CHECK(problems({{"lib/graph/model.h", "#include \"core/tensor.h\"\n#include \"graph/x.h\"\n#include \"y.h\""},
                  {"lib/data/a.cpp", "#include \"profile/profiler.h\""},
                  {"apps/gputrain/main.cpp", "#include \"train/trainer.h\""}})
            .empty());
  // Upward: named with the file, the line and the levels.
  CHECK_THAT(problems({{"lib/graph/model.h", "// x\n  #  include \"parallel/comm.h\"\n"}}),
             Catch::Contains("lib/graph/model.h:2 includes \"parallel/comm.h\": graph (level 3) must not include "
                             "from parallel (level 4)"));
  CHECK_THAT(problems({{"lib/core/tensor.h", "#include \"ops/dispatch.h\""}}),
             Catch::Contains("core (level 0) must not include from ops (level 1)"));
  // Sideways, within a level, unless the pair is listed.
  CHECK_THAT(problems({{"lib/log/a.cpp", "#include \"profile/p.h\""}}),
             Catch::Contains("lib/log/a.cpp:1 includes \"profile/p.h\": log and profile are both level 2"));
  CHECK(problems({{"lib/log/a.cpp", "#include \"profile/p.h\""}}, {}, {{"log", "profile"}}).empty());
  // A cycle among listed pairs of one level, through three folders.
  const std::string cycle = problems({{"lib/layers/a.cpp", "#include \"profile/p.h\""},
                                      {"lib/profile/p.cpp", "#include \"log/l.h\""},
                                      {"lib/log/l.cpp", "#include \"layers/a.h\""}},
                                     {}, {{"layers", "profile"}, {"profile", "log"}, {"log", "layers"}});
  CHECK_THAT(cycle, Catch::Contains("cycle") && Catch::Contains("lib/layers/a.cpp:1 includes \"profile/p.h\"") &&
                        Catch::Contains("lib/profile/p.cpp:1 includes \"log/l.h\"") &&
                        Catch::Contains("lib/log/l.cpp:1 includes \"layers/a.h\""));
  CHECK(std::count(cycle.begin(), cycle.end(), '\n') == 1);  // one cycle, reported once
  // Folders without a level.
  CHECK_THAT(problems({{"lib/newthing/a.cpp", ""}}), Catch::Contains("folder \"newthing\" has no level"));
  CHECK_THAT(problems({{"lib/train/a.cpp", "#include \"plugins/p.h\""}}), Catch::Contains("\"plugins\" has no level"));
  // An exception excuses its include, and fails once the include is gone.
  const std::vector<Allowed> allow = {{"lib/graph/model.h", "parallel/comm.h", "a reason"}};
  CHECK(problems({{"lib/graph/model.h", "#include \"parallel/comm.h\""}}, allow).empty());
  CHECK_THAT(problems({{"lib/graph/model.h", "#include \"core/span_timer.h\""}}, allow),
             Catch::Contains("allowed exception lib/graph/model.h includes \"parallel/comm.h\" no longer exists"));
}
