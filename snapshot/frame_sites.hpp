// Where an allocation came from, as `stowage inspect` names it (its "site"): a stack's innermost
// user frame ("file:line in function"; frames of torch, of installed packages and of Python's own
// library left out), else its innermost Python frame, else the allocation's size class (requests
// by powers of four: "size 64 KiB-256 KiB").
//
// Pure functions over frames as the snapshot holds them (str() of each field, UTF-8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace stowage::snapshot {

// One frame of a stack: str() of its "filename", "line" and "name" fields ("" and "0" where the
// first two are missing; `name` empty and `has_name` false where the last is).
struct Frame {
  std::string filename, line, name;
  bool has_name = false;
};

// What a frame's filename says of it: not Python's (C++, or no file), Python's library or torch's
// (site-packages, the standard library, torch), or the user's own Python.
enum class FrameKind { kOther, kLibrary, kUser };
FrameKind frame_kind(std::string_view filename);

// The frame that names the site: the innermost user frame, else the innermost Python frame (a
// filename ending in .py); none when the stack has neither. Reads filenames alone.
std::optional<std::size_t> site_frame(std::span<const Frame> frames);

// "file:line in function" of a frame.
std::string site_name(const Frame& frame);

// site_name() of site_frame(), where there is one.
std::optional<std::string> frame_site(std::span<const Frame> frames);

// "size <= 512 B", or "size A-B" for A < size <= B = 4 A, A = 512 * 4**k.
std::string size_class(std::uint64_t size);

// The size class number of size_class(): -1 for <= 512 B, else k.
std::int64_t size_class_number(std::uint64_t size);

// size_class() of the sizes of class `number`.
std::string size_class_name(std::int64_t number);

}  // namespace stowage::snapshot
