// Memory-mapped input files that may shrink under a run: a read past the new end of such a file raises SIGBUS,
// whose default action ends the process with "Bus error" and no word on which file. A guarded mapping turns that
// into one line naming the file and exit 1, like any other data error.
#pragma once

#include <cstddef>
#include <string>

namespace gt {

/// Guards [addr, addr + bytes), a read-only mapping of `path`, until unguard_mapping(addr): a SIGBUS inside it
/// writes "error: PATH: the file was cut short while this run read it …" to stderr and exits with 1 (from the signal
/// handler: nothing else is written, so the last complete checkpoint stays as it was). At most 256 mappings at once;
/// past that a mapping goes unguarded. A SIGBUS anywhere else takes the default action.
void guard_mapping(const void* addr, size_t bytes, const std::string& path);
void unguard_mapping(const void* addr);

}  // namespace gt
