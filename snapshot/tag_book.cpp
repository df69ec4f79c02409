#include "snapshot/tag_book.hpp"

#include <utility>

#include "base/errors.hpp"

namespace stowage {

TagBook::TagBook(std::int64_t max_entries) : max_entries_(max_entries) {
  STOWAGE_CHECK(max_entries >= 0, "max_entries ", max_entries, " is negative");
}

std::int64_t TagBook::path_id(const std::string& path) {
  const auto [at, added] = path_ids_.try_emplace(path, static_cast<std::int64_t>(paths_.size()));
  if (added) paths_.push_back(path);
  return at->second;
}

void TagBook::own(const std::vector<std::string>& paths, const std::vector<std::vector<std::uint64_t>>& keys) {
  STOWAGE_CHECK(paths.size() == keys.size(), paths.size(), " paths for ", keys.size(), " key lists");
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const std::int64_t id = path_id(paths[i]);
    for (const std::uint64_t key : keys[i]) owners_.try_emplace(key, id);
  }
}

bool TagBook::over_bound(std::size_t size) const noexcept {
  return static_cast<std::int64_t>(size) > 4 * max_entries_ + 1024;
}

void TagBook::note(std::int64_t position, const std::vector<std::uint64_t>& addresses, std::int64_t category,
                   const std::vector<std::uint64_t>& owner_keys) {
  STOWAGE_CHECK(addresses.size() == owner_keys.size(), addresses.size(), " addresses for ", owner_keys.size(),
                " owners");
  for (std::size_t i = 0; i < addresses.size(); ++i) {
    const auto owner = owners_.find(owner_keys[i]);
    notes_.push_back({position, addresses[i], category, owner == owners_.end() ? -1 : owner->second});
  }
  if (over_bound(notes_.size())) forget_before(position - max_entries_);
}

void TagBook::enter(std::int64_t position, const std::optional<std::string>& path, const std::string& type_name) {
  std::string named = type_name;
  if (path) {
    named = *path;
  } else if (!open_.empty()) {
    named = paths_[static_cast<std::size_t>(spans_[static_cast<std::size_t>(open_.back())][2])] + "." + type_name;
  }
  spans_.push_back({position, -1, path_id(named), open_.empty() ? -1 : open_.back()});
  open_.push_back(static_cast<std::int64_t>(spans_.size()) - 1);
  if (over_bound(spans_.size())) forget_before(position - max_entries_);
}

bool TagBook::leave(std::int64_t position) {
  STOWAGE_CHECK(!open_.empty(), "no module span is open");
  spans_[static_cast<std::size_t>(open_.back())][1] = position;
  open_.pop_back();
  return open_.empty();
}

void TagBook::forget_before(std::int64_t oldest) {
  std::erase_if(notes_, [oldest](const TagNote& note) { return note.position < oldest; });
  // A span kept has its parent kept (spans nest: a parent ends at or after its children).
  std::vector<std::int64_t> renumbered(spans_.size(), -1);
  std::vector<ModuleSpan> kept;
  for (std::size_t i = 0; i < spans_.size(); ++i) {
    ModuleSpan span = spans_[i];
    if (span[1] >= 0 && span[1] < oldest) continue;
    renumbered[i] = static_cast<std::int64_t>(kept.size());
    span[3] = span[3] < 0 ? -1 : renumbered[static_cast<std::size_t>(span[3])];
    kept.push_back(span);
  }
  spans_ = std::move(kept);
  for (std::int64_t& span : open_) span = renumbered[static_cast<std::size_t>(span)];
}

ResolvedTags TagBook::resolve(const std::vector<std::int64_t>& positions, const std::vector<std::uint64_t>& addresses,
                              std::int64_t num_categories) const {
  return resolve_tags(positions, addresses, notes_, spans_, num_categories);
}

}  // namespace stowage
