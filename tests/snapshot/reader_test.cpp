// The snapshot reader on pickles as Python writes them and on hostile ones: both readings make
// the same snapshot, or refuse it for the same named reason, and give back every reference.
#include <gtest/gtest.h>

#include <string>

#include "tests/snapshot/reading_support.hpp"
#include "tests/snapshot/seed_pickles.hpp"

namespace stowage::snapshot::testing {
namespace {

using namespace std::string_literals;

TEST(SnapshotReader, EveryLayoutPythonWritesReadsAlikeAndStreamsUnlessAnEventIsWrittenTwice) {
  for (const auto& [name, pickle] : seed_pickles()) {
    TreeObjects objects;
    const Outcome plain = read_plain(pickle, objects);
    const Outcome columns = read_columns(pickle, objects);
    ASSERT_TRUE(plain.read) << name << ": " << plain.text;
    EXPECT_EQ(plain.text, columns.text) << name;
    EXPECT_EQ(columns.read_twice, std::string_view(name).find("twice") != std::string_view::npos) << name;
    EXPECT_NE(plain.text.find("trace 1"), std::string::npos) << name;  // both devices' rows
    EXPECT_EQ(objects.live(), 0U) << name;
  }
}

// The reason each loader gives for a pickle, which must be the same.
std::string refusal(const std::string& pickle) {
  TreeObjects objects;
  const Outcome plain = read_plain(pickle, objects);
  const Outcome columns = read_columns(pickle, objects);
  EXPECT_EQ(plain.text, columns.text);
  EXPECT_EQ(objects.live(), 0U);
  return plain.text;
}

TEST(SnapshotReader, HostileOpcodesAndValuesAreRefusedByName) {
  EXPECT_EQ(refusal("\x80\x04\x63os\nsystem\n."s), "refused: opcode GLOBAL at byte 2 would build objects beyond plain data; refused");
  EXPECT_EQ(refusal("\x80\x04Nr\x00\x00\x00\x10."s), "refused: memo index 268435456 at byte 3 is beyond the file");
  EXPECT_EQ(refusal("\x80\x04\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x10."s),
            "refused: number 1152921504606846976 at byte 2 is out of any snapshot's range");
  EXPECT_EQ(refusal("\x80\x04G\x7f\xf8\x00\x00\x00\x00\x00\x00."s).substr(0, 16), "refused: number ");
  EXPECT_EQ(refusal("\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00NJ\x01\x00\x00\x00."s),
            "refused: an opcode runs past the end of its frame (the frame at byte 2); refused, as the "
            "unpickler would read other opcodes than those checked");
  EXPECT_EQ(refusal("\x80\x04\x95\x01\x00\x00\x00\x00\x00\x00\x00\x95\x00\x00\x00\x00\x00\x00\x00\x00N."s),
            "refused: a frame begins at byte 11 before the frame at byte 2 ends");
  EXPECT_EQ(refusal("\x80\x04."s), "refused: not a readable pickle (pickle data was truncated); is the file truncated?");
  EXPECT_EQ(refusal("\x80\x04\xff."s), "refused: not a readable pickle (unknown opcode b'\\xff' at byte 2); is the file truncated?");
  EXPECT_EQ(refusal("\x80\x04N.N."s), "refused: 2 bytes after the pickle's end at byte 3 (several files joined?): a snapshot is one pickle");
}

TEST(SnapshotReader, TuplesAreHeldToTheirDepthAndNeverKeysButTheEmptyOne) {
  EXPECT_EQ(refusal("\x80\x04}N)"s + std::string(100, '\x85') + "s."),
            "refused: tuples nested deeper than 64 levels: not a snapshot");
  EXPECT_EQ(refusal("\x80\x04}(K\x01K\x02\x86Nu."s),
            "refused: a dict key is a tuple: snapshots key dicts by strings (tuples can be built to collide in "
            "hash tables)");
  EXPECT_EQ(refusal("\x80\x04}()Nu."s), "refused: snapshot: has neither 'segments' nor 'device_traces'");
}

// A list holding twice a list holding twice ... `levels` deep, as the value of "segments".
std::string memo_bomb(int levels) {
  std::string ops = "\x80\x04]q\x00"s;
  for (int level = 1; level <= levels; ++level) {
    ops += "(h"s + static_cast<char>(level - 1) + "h" + static_cast<char>(level - 1) + "lq" + static_cast<char>(level);
  }
  return ops + "}(\x8c\x08segmentsh"s + static_cast<char>(levels) + "u.";
}

TEST(SnapshotReader, WhatTheGraphStandsForIsMeasuredWithoutExpandingIt) {
  EXPECT_EQ(refusal(memo_bomb(40)),
            "refused: expands to more than 1,000,000 values: not a snapshot (a memo bomb expands a few bytes into a "
            "huge graph)");
  EXPECT_EQ(refusal("\x80\x04}(\x8c\x08segments"s + std::string(100, ']') + std::string(99, 'a') + "u."),
            "refused: nested deeper than 64 levels: not a snapshot");
  EXPECT_EQ(refusal("\x80\x04}(\x8c\x08segments]\x94h\x00\x61u."s), "refused: contains itself: not a snapshot");
  // Past the first of the children the walk takes at a time (PlainWalk::kChunk): a list of 10,000
  // and a dict of 3,001 entries that hold themselves last, and a memo bomb after 5,000 Nones.
  EXPECT_EQ(refusal("\x80\x04}(\x8c\x08segments]\x94("s + std::string(10000, 'N') + "h\x00\x65u."s),
            "refused: contains itself: not a snapshot");
  std::string keys;
  for (int i = 0; i < 3000; ++i) keys += "\x8c\x06k"s + std::to_string(10000 + i) + "N";
  EXPECT_EQ(refusal("\x80\x04}\x94("s + keys + "\x8c\x08segmentsh\x00u."s), "refused: contains itself: not a snapshot");
  std::string late_bomb = memo_bomb(40);
  late_bomb.replace(late_bomb.rfind("}("), std::string::npos,
                    "}(\x8c\x08segments("s + std::string(5000, 'N') + "h" + static_cast<char>(40) + "lu.");
  EXPECT_EQ(refusal(late_bomb),
            "refused: expands to more than 1,000,000 values: not a snapshot (a memo bomb expands a few bytes into a "
            "huge graph)");
  // In an event read into columns: its user_metadata is the snapshot itself.
  EXPECT_EQ(refusal("\x80\x04}\x94(\x8c\rdevice_traces]]}(\x8c\x06\x61\x63tion\x8c\x08snapshot"
                    "\x8c\ruser_metadatah\x00u\x61\x61u."s),
            "refused: contains itself: not a snapshot");
}

TEST(SnapshotReader, TheFirstBadEventIsNamedByBothReadings) {
  const std::string pickle =
      "\x80\x04}(\x8c\rdevice_traces](](}(\x8c\x06\x61\x63tion\x8c\x05\x61llocu}(\x8c\x06\x61\x63tion"
      "\x8c\x05\x61lloc\x8c\x04\x61\x64\x64rK\x01\x8c\x04sizeK\x02ueeu."s;
  EXPECT_EQ(refusal(pickle), "refused: device_traces[0][0]: missing 'addr'");
}

TEST(SnapshotReader, ProgressIsHeardAsTheMachineGoesAndAtTheEnd) {
  const std::string& pickle = seed_pickles()[5].second;
  TreeObjects objects;
  MemoryBytes source(reinterpret_cast<const std::uint8_t*>(pickle.data()), pickle.size());
  ReadOptions options = test_options();
  options.report_every = 256;
  std::vector<std::uint64_t> heard;
  options.progress = [&](std::uint64_t done, std::uint64_t total) {
    EXPECT_EQ(total, pickle.size());
    heard.push_back(done);
  };
  Reading reading(objects);
  reading.columns(source, options);
  ASSERT_GE(heard.size(), pickle.size() / 256);
  EXPECT_TRUE(std::is_sorted(heard.begin(), heard.end()));
  EXPECT_EQ(heard.back(), pickle.size());
}

}  // namespace
}  // namespace stowage::snapshot::testing
