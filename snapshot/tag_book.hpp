// TagBook: one recording's notes and module spans (tag_resolution.hpp's inputs) as its hooks make
// them, kept bounded, and resolved to a trace's allocations at a snapshot.
//
// Module paths are numbered as first seen (0: "", none). Owners are keys the caller gives (its
// identity of a parameter or buffer), each owned by the path of the first module that listed it.
// A span opens as a module's forward begins and closes as it ends; spans nest. Notes and spans
// about events older than the history keeps (the newest `max_entries`) are dropped once either
// grows past 4 x max_entries + 1024.
//
// Contract: not thread-safe (tagging's hooks append under the GIL); positions never decrease.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "snapshot/tag_resolution.hpp"

namespace stowage {

class TagBook {
 public:
  explicit TagBook(std::int64_t max_entries);

  // Module `paths[i]` owns the tensors keyed `keys[i]` that have no owner yet.
  void own(const std::vector<std::string>& paths, const std::vector<std::vector<std::uint64_t>>& keys);
  // Notes the storages at `addresses` as `category` at `position`, each owned by the module that
  // owns `owner_keys[i]` (none if no module does).
  void note(std::int64_t position, const std::vector<std::uint64_t>& addresses, std::int64_t category,
            const std::vector<std::uint64_t>& owner_keys);
  // A module's forward began at `position`: named `path`, or without one its enclosing span's path
  // followed by "." and `type_name` (`type_name` alone outside any).
  void enter(std::int64_t position, const std::optional<std::string>& path, const std::string& type_name);
  // The innermost open span ends at `position`; returns whether it was the outermost. Refuses
  // (LogicError) when none is open.
  bool leave(std::int64_t position);
  bool in_forward() const noexcept { return !open_.empty(); }

  const std::vector<std::string>& paths() const noexcept { return paths_; }
  const std::vector<TagNote>& notes() const noexcept { return notes_; }
  const std::vector<ModuleSpan>& spans() const noexcept { return spans_; }
  // The notes resolved to the allocation events at `positions` (ascending) and `addresses`.
  ResolvedTags resolve(const std::vector<std::int64_t>& positions, const std::vector<std::uint64_t>& addresses,
                       std::int64_t num_categories) const;

 private:
  std::int64_t path_id(const std::string& path);
  // Drops notes before `oldest` and spans that ended before it (renumbering the rest's parents).
  void forget_before(std::int64_t oldest);
  bool over_bound(std::size_t size) const noexcept;

  std::int64_t max_entries_;
  std::vector<TagNote> notes_;
  std::vector<ModuleSpan> spans_;
  std::vector<std::int64_t> open_;  // indices of the open spans, innermost last
  std::vector<std::string> paths_{""};
  std::unordered_map<std::string, std::int64_t> path_ids_{{"", 0}};
  std::unordered_map<std::uint64_t, std::int64_t> owners_;  // owner key -> path id
};

}  // namespace stowage
