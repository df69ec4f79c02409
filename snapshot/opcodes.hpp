// The pickle opcodes: their bytes, their names, and which the reader runs.
#pragma once

#include <cstdint>
#include <string_view>

namespace stowage::snapshot::op {

// The opcodes the reader runs: those that build plain data (no global, reduce, build, extension,
// persistent id, set, frozenset or buffer).
inline constexpr std::uint8_t kMark = '(', kStop = '.', kPop = '0', kPopMark = '1', kDup = '2';
inline constexpr std::uint8_t kFloat = 'F', kInt = 'I', kBinInt = 'J', kBinInt1 = 'K', kLong = 'L';
inline constexpr std::uint8_t kBinInt2 = 'M', kNone = 'N', kString = 'S', kBinString = 'T';
inline constexpr std::uint8_t kShortBinString = 'U', kUnicode = 'V', kBinUnicode = 'X';
inline constexpr std::uint8_t kAppend = 'a', kDict = 'd', kEmptyDict = '}', kAppends = 'e';
inline constexpr std::uint8_t kGet = 'g', kBinGet = 'h', kLongBinGet = 'j', kList = 'l';
inline constexpr std::uint8_t kEmptyList = ']', kPut = 'p', kBinPut = 'q', kLongBinPut = 'r';
inline constexpr std::uint8_t kSetItem = 's', kTuple = 't', kEmptyTuple = ')', kSetItems = 'u';
inline constexpr std::uint8_t kBinFloat = 'G', kProto = 0x80, kNewTrue = 0x88, kNewFalse = 0x89;
inline constexpr std::uint8_t kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87, kLong1 = 0x8a;
inline constexpr std::uint8_t kLong4 = 0x8b, kBinBytes = 'B', kShortBinBytes = 'C';
inline constexpr std::uint8_t kShortBinUnicode = 0x8c, kBinUnicode8 = 0x8d, kBinBytes8 = 0x8e;
inline constexpr std::uint8_t kMemoize = 0x94, kFrame = 0x95;

// pickletools' name of an opcode ("STACK_GLOBAL"), or "" for a byte that is none.
std::string_view name_of(std::uint8_t opcode);

}  // namespace stowage::snapshot::op
