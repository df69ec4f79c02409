// The plain-data walk: what a reading built, measured as the tree it stands for.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "snapshot/objects.hpp"
#include "snapshot/trace_columns.hpp"

namespace stowage::snapshot {

// Checks what a reading built, once, without recursion and in time linear in its distinct
// containers: the tree it stands for (a value shared through the memo counted each time it is
// reached) holds at most `budget` values, nests at most kMaxDepth deep, and holds no container
// inside itself. A memo bomb, whose few bytes stand for a tree of billions, is measured from its
// graph without being expanded, and refused. Traces read into columns are walked as the lists
// of event dicts they were (TraceShape: what each trace's events counted, then its stacks, empty
// frames lists and metadata containers as often as events held them), so that both readings
// refuse alike. Its memory is a table of the shared containers and, for each level of the path,
// at most kChunk of a container's children (Objects::children). Throws Refused. Not thread-safe;
// one use.
class PlainWalk {
 public:
  PlainWalk(Objects& objects, std::uint64_t budget);

  // The traces read into columns, which `device_traces` (an object of the result) stands for.
  void set_traces(Handle device_traces, std::vector<const TraceColumnsBuilder*> traces,
                  const StackTable& stacks);
  void check(Handle root);

 private:
  struct Child {
    std::uint64_t key;
    std::uint64_t weight;
  };
  struct Frame {
    std::uint64_t key;
    std::size_t begin;  // its children at hand: children_[begin, end)
    std::size_t end;
    std::size_t next;
    std::uint64_t weight;  // how often its parent holds it
    std::uint64_t size = 0;
    int depth = 0;
    bool memoized;
    bool more = false;    // an object's children beyond those at hand, from `cursor` on
    std::size_t cursor = 0;
  };
  static constexpr std::uint64_t kShapeTag = 1, kStackTag = 2, kEmptyTag = 3;
  // An object's children are taken this many at a time (Objects::children), so that the walk
  // holds at most this many a level, not a copy of a list of millions.
  static constexpr std::size_t kChunk = 4096;

  bool is_leaf(std::uint64_t key);
  void push(std::uint64_t key, std::uint64_t weight);
  // Appends a node's children to children_ (an object's: kChunk from `cursor`, which moves past
  // them); returns whether the node has more.
  bool add_children(std::uint64_t key, std::size_t& cursor);
  void finish();
  std::uint64_t* find(std::uint64_t key);
  void remember(std::uint64_t key, std::uint64_t packed);

  Objects& objects_;
  std::uint64_t budget_;
  Handle device_traces_ = nullptr;
  std::vector<const TraceColumnsBuilder*> traces_;
  const StackTable* stacks_ = nullptr;
  std::vector<Frame> path_;
  std::vector<Child> children_;
  std::vector<Handle> scratch_;
  // Open addressing: key -> size << 8 | depth (kOnPath while it is being walked); 0 is no key.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> table_;
  std::size_t used_ = 0;
};

}  // namespace stowage::snapshot
