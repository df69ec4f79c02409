#!/usr/bin/env python3
"""Writes tests/snapshot/seed_pickles.hpp: the pickles the snapshot reader's C++ tests start from,
as Python's pickler writes them (each protocol's layout, torch's among them, and one laid out
unlike it). Run it again if the seeds change:

    python3 tests/snapshot/make_seeds.py > tests/snapshot/seed_pickles.hpp
"""

from __future__ import annotations

import io
import pickle


def event(action, addr, size, **more):
    return {"action": action, "addr": addr, "size": size, "stream": 0, **more}


def small(protocol: int) -> bytes:
    """The fuzz tests' small snapshot (tests/python/test_snapshot_loader_fuzz.py): its second trace
    holds the first's first two events, written twice (as memo references)."""
    pool = [{"filename": "/src/a.py", "line": i, "name": "f"} for i in range(3)]
    trace = [event(("alloc", "free_requested", "free_completed")[i % 3], 4096 * i, 512 * i + 1,
                   time_us=1000 + i, frames=[pool[i % 3], pool[(i + 1) % 3]]) for i in range(8)]
    trace += [{"action": "oom", "size": 1 << 20, "device_free": 7, "stream": 0},
              {"action": "snapshot", "user_metadata": "stowage.mark_step"}, dict(event("alloc", 1, 2), time_us=0.5)]
    segment = {"device": 0, "address": 1 << 32, "total_size": 2 << 20, "segment_pool_id": (0, 0), "frames": pool[:1],
               "blocks": [{"address": 1 << 32, "size": 4096, "state": "active_allocated"}]}
    return pickle.dumps({"segments": [segment], "device_traces": [trace, trace[:2]], "allocator_settings": {"x": 1.5}},
                        protocol=protocol)


def varied(protocol: int, shared_event: bool = False, memo: bool = True) -> bytes:
    """What snapshots vary in: shared frames lists (a segment's too), frames None, empty or absent,
    float and missing times, fields the columns do not keep, user_metadata as a str and a dict."""
    frames = [{"filename": f"/home/u/train{i}.py", "line": i, "name": f"f{i}"} for i in range(4)]
    stacks = [frames[:2], frames[1:], [frames[3]]]
    traces = []
    for device in range(2):
        trace = []
        for i in range(14):
            entry = event(("alloc", "free_completed", "free_requested", "segment_alloc")[i % 4], 4096 * (i % 5),
                          (i * 7919) % (1 << 20), stream=i % 3)
            if i % 5:
                entry["time_us"] = 1_700_000_000_000_000 + i if i % 3 else i / 4
            entry["frames"] = (list(stacks[i % 3]), [], None)[i % 3] if i % 4 else stacks[i % 3]
            if i % 6 == 0:
                entry["compile_context"] = "N/A"
            trace.append(entry)
        trace.append({"action": "oom", "size": 1 << 30, "addr": 9})
        trace.append({"action": "snapshot", "user_metadata": "stowage.mark_step"})
        trace.append(dict(event("alloc", 8192, 512), user_metadata={"note": [1, 2]}))
        if shared_event:
            trace.append(trace[0])
        traces.append(trace)
    segment = {"device": 0, "address": 1 << 32, "total_size": 2 << 20, "frames": stacks[1],
               "blocks": [{"address": 1 << 32, "size": 2 << 20, "frames": stacks[1]}]}
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=protocol)
    pickler.fast = not memo
    pickler.dump({"segments": [segment], "device_traces": traces, "allocator_settings": {"x": [1.5, None]}})
    return out.getvalue()


SEEDS = [("small, its events twice, protocol 2", small(2)), ("small, its events twice, protocol 4", small(4)),
         ("small, its events twice, protocol 5", small(5)),
         ("varied, protocol 0", varied(0)), ("varied, protocol 1", varied(1)), ("varied, protocol 4", varied(4)),
         ("varied, protocol 4, no memo", varied(4, memo=False)), ("varied, an event twice", varied(4, True))]


def literal(data: bytes) -> str:
    lines, line = [], ""
    for byte in data:
        line += f"\\x{byte:02x}"
        if len(line) >= 88:
            lines.append(f'      "{line}"')
            line = ""
    if line:
        lines.append(f'      "{line}"')
    return "\n".join(lines)


def main() -> None:
    print("// The pickles the snapshot reader's C++ tests start from. Written by tests/snapshot/make_seeds.py;")
    print("// do not edit.")
    print("#pragma once\n\n#include <string>\n#include <string_view>\n#include <utility>\n#include <vector>\n")
    print("namespace stowage::snapshot::testing {\n")
    print("inline const std::vector<std::pair<std::string_view, std::string>>& seed_pickles() {")
    print("  static const std::vector<std::pair<std::string_view, std::string>> seeds = {")
    for name, data in SEEDS:
        print(f'    {{"{name}", std::string(\n{literal(data)},\n      {len(data)})}},')
    print("  };\n  return seeds;\n}\n\n}  // namespace stowage::snapshot::testing")


if __name__ == "__main__":
    main()
