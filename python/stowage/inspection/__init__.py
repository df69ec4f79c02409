"""``stowage inspect``: what held the memory, from a memory snapshot. The findings are C++, in one
call (stowage._core.inspect, snapshot/inspection.hpp); this package reads a snapshot's tags for
it and formats what it finds:

- findings: the call, and its JSON form (the report the formatters read);
- text: the terminal's tables; html: the self-contained HTML report, drawing the timelines of
  timelines; tags: stowage's own notes on what each allocation is;
- command: the ``stowage inspect`` command.
"""
