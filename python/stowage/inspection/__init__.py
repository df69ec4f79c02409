"""``stowage inspect``: the findings are C++, in one call (stowage._core.inspect,
snapshot/inspection.hpp); findings gives their JSON form, text and html format it, command is the
command."""
