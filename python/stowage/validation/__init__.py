"""The one validation layer every reader of a file from elsewhere goes through.

- ``errors``: InputError, what every refusal raises (the snapshot reader's SnapshotError is
  one): it names the file, the field, the value and the bound;
- ``json_files``: reading a JSON file with its size, density and nesting bounded before it is
  parsed;
- ``schema``: a schema with bounds (types, ranges, counts, bounds the document sets for itself)
  that a document is checked against before anything sized by it is built.

The formats' schemas live with the formats (stowage.plan.file_formats for profiles, sized
profiles and plans; stowage.snapshot_reader.schema for snapshots).
"""

from stowage.validation.errors import InputError, shown
from stowage.validation.json_files import MAX_JSON_BYTES, parse_json, read_json
from stowage.validation.schema import (Bool, Choice, Int, ListOf, Number, Record, Ref, Refused, Row, Spec, Text,
                                       check,
                                       field_path, refuse)

__all__ = ["Bool", "Choice", "InputError", "Int", "ListOf", "MAX_JSON_BYTES", "Number", "Record", "Ref", "Refused", "Row",
           "Spec", "Text", "check", "field_path", "parse_json", "read_json", "refuse", "shown"]
