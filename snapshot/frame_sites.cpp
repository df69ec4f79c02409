#include "snapshot/frame_sites.hpp"

#include <array>
#include <string_view>

#include "base/byte_units.hpp"

namespace stowage::snapshot {

namespace {

constexpr std::array<std::string_view, 5> kLibraryParts = {"site-packages/", "dist-packages/", "/lib/python3",
                                                           "<frozen ", "/torch/"};

}  // namespace

FrameKind frame_kind(std::string_view filename) {
  if (!filename.ends_with(".py")) return FrameKind::kOther;  // C++ frames and frames without a file
  for (const std::string_view part : kLibraryParts) {
    if (filename.find(part) != std::string_view::npos) return FrameKind::kLibrary;
  }
  return FrameKind::kUser;
}

std::string site_name(const Frame& frame) {
  return frame.filename + ":" + frame.line + " in " + (frame.has_name ? frame.name : std::string("?"));
}

std::optional<std::size_t> site_frame(std::span<const Frame> frames) {
  std::optional<std::size_t> python;
  for (std::size_t k = 0; k < frames.size(); ++k) {
    const FrameKind kind = frame_kind(frames[k].filename);
    if (kind == FrameKind::kUser) return k;
    if (!python && kind == FrameKind::kLibrary) python = k;
  }
  return python;
}

std::optional<std::string> frame_site(std::span<const Frame> frames) {
  const std::optional<std::size_t> chosen = site_frame(frames);
  if (!chosen) return std::nullopt;
  return site_name(frames[*chosen]);
}

std::int64_t size_class_number(std::uint64_t size) {
  if (size <= 512) return -1;
  std::int64_t k = 0;
  std::uint64_t low = 512;
  while (low * 4 < size && low < (std::uint64_t{1} << 60)) {
    low *= 4;
    ++k;
  }
  return k;
}

std::string size_class_name(std::int64_t number) {
  if (number < 0) return "size <= 512 B";
  const std::uint64_t low = std::uint64_t{512} << (2 * number);
  return "size " + format_bytes(low) + "-" + format_bytes(low * 4);
}

std::string size_class(std::uint64_t size) { return size_class_name(size_class_number(size)); }

}  // namespace stowage::snapshot
