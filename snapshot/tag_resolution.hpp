// resolve_tags: stowage's notes on what each allocation is, resolved to a trace's events.
//
// While stowage records history, hooks note (position, address, category, owner): the
// history's event count when the note was made, a storage's address, what it is (an index into
// the caller's category order; lower wins) and the module that owns it (a parameter's,
// gradient's or state's; -1 for none). Module spans (begin, end, path, parent) say which module
// ran between two positions (end -1: still open; parent: the enclosing span's index, -1 none;
// spans are in order of begin). A note is about the latest allocation at its address recorded
// before its position. Each allocation takes the lowest category of the notes about it, and the
// module of the innermost span open at its position, unless a note about it names an owner (the
// last such note wins).
//
// Contract: a pure function of its inputs; O((allocations + notes) log(allocations + notes)).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace stowage {

struct TagNote {
  std::int64_t position = 0;
  std::uint64_t address = 0;
  std::int64_t category = 0;
  std::int64_t owner = -1;
};

using ModuleSpan = std::array<std::int64_t, 4>;  // begin, end (-1: open), path, parent (-1: none)

// The allocations something is known about: indices into the allocations given, each with its
// category (-1: none noted) and module path id (0: none).
struct ResolvedTags {
  std::vector<std::int64_t> allocation;
  std::vector<std::int64_t> category;
  std::vector<std::int64_t> module;
};

// `positions` (ascending) and `addresses` are the allocation events'; categories run from 0 to
// `num_categories` - 1.
ResolvedTags resolve_tags(const std::vector<std::int64_t>& positions, const std::vector<std::uint64_t>& addresses,
                          const std::vector<TagNote>& notes, const std::vector<ModuleSpan>& spans,
                          std::int64_t num_categories);

}  // namespace stowage
