// The snapshot reader on seeded mutations of pickles Python writes: whatever the bytes, both
// readings make the same snapshot or both refuse it, nothing else escapes, and every reference
// is given back (under the sanitizers: no read or write out of bounds).
//
// STOWAGE_SNAPSHOT_FUZZ_CASES (default 800) mutations a seed pickle; STOWAGE_SNAPSHOT_FUZZ_SEED
// (default 20261126) seeds them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>

#include "tests/snapshot/reading_support.hpp"
#include "tests/snapshot/seed_pickles.hpp"

namespace stowage::snapshot::testing {
namespace {

std::uint64_t from_environment(const char* name, std::uint64_t otherwise) {
  const char* text = std::getenv(name);
  return text != nullptr ? std::strtoull(text, nullptr, 10) : otherwise;
}

// The bytes, for a failure's message (bytes.fromhex in Python).
std::string hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const char c : bytes) {
    out += kDigits[static_cast<unsigned char>(c) >> 4];
    out += kDigits[static_cast<unsigned char>(c) & 15];
  }
  return out;
}

// One to four changes: a byte replaced or flipped, bytes cut, an opcode or a memo reference put
// in, a frame's length off by a little, a piece of the pickle itself put in again.
std::string mutate(const std::string& pickle, std::mt19937_64& random) {
  static const char* const kOpcodes[] = {"h", "j", "q", "r", "\x94", "(", ")", "}", "]", "e", "u", "a", "s",
                                         "0", "1", "2", "\x85", "\x86", "\x87", "t", "l", "d", "N", "K\x00",
                                         "\x95", ".", "c", "R", "\x8f", "2", "G\x7f\xf8\x00\x00\x00\x00\x00\x00"};
  std::string out = pickle;
  const auto below = [&](std::size_t bound) { return bound == 0 ? 0 : static_cast<std::size_t>(random() % bound); };
  const int changes = 1 + static_cast<int>(random() % 4);
  for (int i = 0; i < changes && !out.empty(); ++i) {
    const std::size_t at = below(out.size());
    switch (random() % 7) {
      case 0: out[at] = static_cast<char>(random()); break;
      case 1: out[at] = static_cast<char>(out[at] ^ (1 << below(8))); break;
      case 2: out.erase(at, 1 + below(8)); break;
      case 3: out.insert(at, kOpcodes[below(std::size(kOpcodes))]); break;
      case 4: {
        const std::string slot(1, static_cast<char>(below(48)));
        const std::string key(1, static_cast<char>(below(48)));
        const std::string inserted[] = {"h" + slot + "h" + key + "K\x05s", "h" + slot + "}a", "h" + slot + "0",
                                        "h" + slot + "a", "h" + slot + "2"};
        out.insert(at, inserted[below(std::size(inserted))]);
        break;
      }
      case 5: {
        const std::size_t frame = out.find('\x95', below(out.size()));
        if (frame != std::string::npos && frame + 9 <= out.size()) out[frame + 1] = static_cast<char>(out[frame + 1] + static_cast<char>(below(19)) - 9);
        break;
      }
      default: out.insert(at, out.substr(below(out.size()), 1 + below(40))); break;
    }
  }
  return out;
}

TEST(SnapshotReaderFuzz, MutatedPicklesReadAlikeOrAreRefusedAlikeAndLeakNothing) {
  const std::uint64_t cases = from_environment("STOWAGE_SNAPSHOT_FUZZ_CASES", 800);
  std::mt19937_64 random(from_environment("STOWAGE_SNAPSHOT_FUZZ_SEED", 20261126));
  std::size_t read = 0;
  std::size_t refused = 0;
  for (const auto& [name, seed] : seed_pickles()) {
    for (std::uint64_t n = 0; n < cases; ++n) {
      const std::string pickle = mutate(seed, random);
      TreeObjects objects;
      const Outcome plain = read_plain(pickle, objects);
      const Outcome columns = read_columns(pickle, objects);
      ASSERT_EQ(plain.read, columns.read) << name << " case " << n << ": " << plain.text << " / " << columns.text
                                          << "\n" << hex(pickle);
      if (plain.read) {
        ASSERT_EQ(plain.text, columns.text) << name << " case " << n << "\n" << hex(pickle);
      }
      ASSERT_EQ(objects.live(), 0U) << name << " case " << n << ": " << plain.text << " / " << columns.text
                                    << "\n" << hex(pickle);
      (plain.read ? read : refused) += 1;
    }
  }
  EXPECT_GT(read, cases / 4);
  EXPECT_GT(refused, cases);
}

}  // namespace
}  // namespace stowage::snapshot::testing
