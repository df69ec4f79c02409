// stowage's tags read from a snapshot: the categories and module paths stowage noted while
// recording (the snapshot's "stowage_tags", stowage.tagging's format 1), for one device, checked
// as they are read. A field that does not fit is refused (Refused) with the field named and the
// value quoted (`stowage_tags.0.events[3]: expected an integer in [0, 120), got 'x'`): a snapshot
// is input from elsewhere, and a wrong answer is worse than none.
//
// The tags of device d, `stowage_tags["d"]`: {"format": 1, "categories": [names of
// kCategoryNames], "modules": [module paths, at least one], "events": [allocation events, trace
// indexes], "category": [an index into categories, or -1: no hook saw it], "module": [an index
// into modules]}, the last three of one length. Module paths are kept to kMaxPath characters;
// the model's blocks among them are found (recompute_estimate.hpp's block_of_paths).
//
// Contract: reads through `objects` (which holds the interpreter's lock, if any); no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "snapshot/objects.hpp"
#include "snapshot/trace_findings.hpp"

namespace stowage::snapshot {

inline constexpr std::size_t kMaxPath = 4096;  // characters of a module path kept

// `tags`: the snapshot's stowage_tags (nullptr or None: none); `action`: the device's trace's
// action codes. None where the snapshot carries no tags for the device.
std::optional<ExactTags> read_tags(Objects& objects, Handle tags, std::int64_t device,
                                   std::span<const std::uint8_t> action);

}  // namespace stowage::snapshot
