"""The one validation layer every reader of a file from elsewhere goes through.

- ``errors``: InputError, what every refusal raises (the snapshot reader's SnapshotError is
  one): it names the file, the field, the value and the bound;
- ``json_files``: reading a JSON file with its size, density and nesting bounded before it is
  parsed.

The formats' schemas, with their bounds, are checked in C++ where the formats are read
(planner/schema.hpp and planner/file_formats.hpp for lifetime traces, sized traces and plans, through
stowage.plan.file_formats; the snapshot reader's format checks for snapshots).
"""

from stowage.validation.errors import InputError, shown
from stowage.validation.json_files import MAX_JSON_BYTES, parse_json, read_json

__all__ = ["InputError", "MAX_JSON_BYTES", "parse_json", "read_json", "shown"]
