#include "snapshot/refusal.hpp"

#include "snapshot/objects.hpp"

namespace stowage::snapshot {

void refuse_unreadable(const std::string& reason) {
  SNAPSHOT_REFUSE("not a readable pickle (", reason, "); is the file truncated?");
}

const char* type_name(Kind kind) {
  switch (kind) {
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return "tuple";
    case Kind::kList:
    case Kind::kEventList: return "list";
    case Kind::kDict:
    case Kind::kEvent: return "dict";
    case Kind::kTrace:
    case Kind::kDeviceTraces: return "list";
    case Kind::kOther:
    case Kind::kDead: break;
  }
  return "object";
}

}  // namespace stowage::snapshot
