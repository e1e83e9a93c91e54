// Which command owns an output folder, and the one rule every writer follows: a command writes only into a folder it
// creates or one its own kind of output already owns, never into another command's output, into files it did not
// write, or over its own input. docs/files.md lists each command, what it writes and what it refuses.
//
// Each owned folder carries gputrain-output.json (kManifestFile): which command wrote it, whether that command
// finished, and, for the outputs a re-run replaces (a tokenization, an llm.c import), the files it wrote, so a re-run
// knows what is stale. Folders written before manifests existed are recognised by their files (summary.json,
// sweep.json, tokenizer.json, config.yaml beside model.safetensors).
#pragma once

#include <string>
#include <vector>

namespace gt {

/// The commands whose output is a folder.
enum class Owner { run, sweep, tokenization, import };

inline constexpr const char* kManifestFile = "gputrain-output.json";

/// "run", "sweep", "tokenize", "import": the manifest's "owner" value.
const char* owner_word(Owner owner);

/// What a folder is to the writer rule.
struct FolderOwnership {
  enum class State {
    missing,       ///< nothing at the path
    empty,         ///< an empty folder
    owned,         ///< one of gputrain's outputs: `owner`
    foreign,       ///< a folder holding files gputrain did not write
    not_a_folder,  ///< a file, a device, a broken link
  };
  State state = State::missing;
  Owner owner = Owner::run;
  bool has_manifest = false;       ///< false: recognised by its files
  bool complete = true;            ///< false: its command was still writing it, or was cut short
  bool finished_run = false;       ///< a run that ended (summary.json)
  bool run_data = false;           ///< a run that wrote anything (holds config.resolved.yaml, metrics, checkpoints …)
  std::vector<std::string> files;  ///< the manifest's files, or the ones that identify an older output
  std::string evidence;            ///< the file that tells what it is (sweep.json, the manifest, a foreign entry)
  std::string run_evidence;        ///< run_data: the run file that shows it (summary.json, checkpoints …)
};

/// Whether `dir` holds a run's files (config.resolved.yaml, metrics.jsonl, summary.json or checkpoints/).
bool holds_run_files(const std::string& dir);

/// Looks at `dir` (no side effects). A manifest that cannot be read counts as foreign: it is not trusted.
FolderOwnership folder_ownership(const std::string& dir);

/// "a finished run (summary.json)", "a sweep (sweep.json)", "files gputrain did not write (notes.txt, …)": for
/// messages.
std::string describe_ownership(const FolderOwnership& o);

/// How a command treats a folder its own kind of output already owns.
enum class Reuse {
  never,    ///< refused (a new sweep into an old sweep's folder)
  resume,   ///< kept as it is: the command continues it (sweep --resume; train into a folder of a run)
  replace,  ///< the earlier output's files are removed first (tokenize and import with --force)
};

/// What claim_output_folder did.
struct ClaimedFolder {
  std::string dir;
  bool created = false;              ///< the folder was missing or empty
  std::vector<std::string> removed;  ///< Reuse::replace (or an output its command never finished): the files removed
};

/// Whether `owner`'s command may write into `dir` (nothing is written): throws ConfigError, naming `flag` and `dir`,
/// what owns the folder and what to do instead, when the folder (or a folder above it) is another command's output,
/// holds files gputrain did not write, or is the same kind of output and `reuse` does not allow taking it (`hint`
/// then says what would: "--force replaces it"). An output of the same kind whose command never finished may always
/// be replaced. Returns what the folder is now.
FolderOwnership check_output_folder(const std::string& flag, const std::string& dir, Owner owner, Reuse reuse,
                                    const std::string& hint = "");

/// check_output_folder, then takes the folder: creates it and writes its manifest, or removes the earlier output's
/// files (Reuse::replace, or an output never finished) and marks it not yet complete, or leaves it as it is to be
/// continued (Reuse::resume).
ClaimedFolder claim_output_folder(const std::string& flag, const std::string& dir, Owner owner, Reuse reuse,
                                  const std::string& hint = "");

/// Writes `dir`'s manifest (atomically): `owner`, the files written so far (names inside `dir`), and whether the
/// command is done. A command that writes files one by one records each before writing it, so that an output cut
/// short still lists what a later replacement must remove.
void write_manifest(const std::string& dir, Owner owner, const std::vector<std::string>& files, bool complete);

/// Refuses (ConfigError naming `flag` and `dir`) an output folder that holds one of the command's `inputs`: a
/// replacement would remove it, and a new output would mix with it.
void refuse_input_inside(const std::string& flag, const std::string& dir, const std::vector<std::string>& inputs);

/// Refuses (ConfigError naming `flag` and `path`) an output file that is the same file as one of `inputs`, or lies in
/// a folder another command owns, unless it is one of that owner's `allowed` names (a run's report.html).
void refuse_output_file(const std::string& flag, const std::string& path, const std::vector<std::string>& inputs,
                        const std::vector<std::string>& allowed = {});

}  // namespace gt
